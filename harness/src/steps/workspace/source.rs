//! Proofs that live in the source tree: where a crate may be used, the README,
//! the dependency tree, builds without a CUDA toolkit, and embedded kernels.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use cucumber::then;
use regex::Regex;

use super::commands::run_shell;
use crate::check;
use crate::steps::params::Names;
use crate::steps::StepResult;
use crate::world::{tail, TestWorld};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
}

/// Whether a line of code (not a comment) names `word`.
fn code_mentions(text: &str, word: &str) -> bool {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//") && !l.starts_with('*') && !l.starts_with("/*"))
        .any(|l| l.split("//").next().unwrap_or("").contains(word))
}

#[then(expr = "no source file under {string} outside {string} mentions {string}")]
async fn source_boundary(
    w: &mut TestWorld,
    under: String,
    outside: String,
    word: String,
) -> StepResult {
    let root = &w.cfg.workspace;
    let mut files = Vec::new();
    rust_files(&root.join(&under), &mut files);
    check!(!files.is_empty(), "no Rust files under {under}");
    let allowed = root.join(&outside);
    let allowed_file = allowed.with_extension("rs");
    let bad: Vec<String> = files
        .iter()
        .filter(|p| !p.starts_with(&allowed) && **p != allowed_file)
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| code_mentions(&t, &word)))
        .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
        .collect();
    check!(bad.is_empty(), "{word} is used outside {outside}: {bad:?}");
    Ok(())
}

#[then(expr = "the workspace README has a section matching {string} that mentions {names}")]
async fn readme_section(w: &mut TestWorld, heading: String, names: Names) -> StepResult {
    let path = w.cfg.workspace.join("README.md");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let re = Regex::new(&format!("(?i){heading}")).unwrap();
    let mut section: Option<String> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            if section.is_some() {
                break;
            }
            if re.is_match(line) {
                section = Some(String::new());
            }
        } else if let Some(s) = section.as_mut() {
            s.push_str(line);
            s.push('\n');
        }
    }
    let s = section.ok_or_else(|| anyhow!("README.md has no heading matching {heading:?}"))?;
    let missing: Vec<String> = names
        .0
        .into_iter()
        .filter(|m| !s.to_lowercase().contains(&m.to_lowercase()))
        .collect();
    check!(
        missing.is_empty(),
        "the {heading} section does not mention {missing:?}"
    );
    Ok(())
}

#[then(expr = "{string} lists no {names}")]
async fn no_native(w: &mut TestWorld, line: String, names: Names) -> StepResult {
    let o = run_shell(w, &line, &[])?;
    check!(o.code == Some(0), "{line} failed: {}", tail(&o.output, 10));
    let crates: Vec<String> = o
        .output
        .lines()
        .filter_map(|l| {
            l.trim_start_matches(|c: char| !c.is_alphanumeric())
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .collect();
    let found: Vec<String> = names.0.into_iter().filter(|c| crates.contains(c)).collect();
    check!(found.is_empty(), "native crates in the tree: {found:?}");
    check!(
        crates.iter().any(|c| c == "tokenizers"),
        "tokenizers is not in the tree; wrong command?"
    );
    Ok(())
}

#[then(expr = "{string} succeeds without a CUDA toolkit in the environment")]
async fn builds_without_cuda(w: &mut TestWorld, line: String) -> StepResult {
    let o = run_shell(
        w,
        &line,
        &[
            "CUDA_PATH",
            "CUDA_HOME",
            "CUDA_ROOT",
            "CUDA_TOOLKIT_ROOT_DIR",
            "NVCC",
        ],
    )?;
    check!(
        o.code == Some(0),
        "{line} failed without CUDA variables: {}",
        tail(&o.output, 20)
    );
    Ok(())
}

#[then(expr = "no build script in the workspace mentions {names}")]
async fn build_scripts(w: &mut TestWorld, words: Names) -> StepResult {
    let root = w.cfg.workspace.clone();
    let mut bad = Vec::new();
    for member in ["worker", "harness", "benches"] {
        let p = root.join(member).join("build.rs");
        if let Ok(t) = std::fs::read_to_string(&p) {
            if words.0.iter().any(|x| t.contains(x.as_str())) {
                bad.push(p.display().to_string());
            }
        }
    }
    check!(
        bad.is_empty(),
        "build scripts calling {}: {bad:?}",
        words.0.join("/")
    );
    Ok(())
}

#[then(expr = "every file in {string} ending {string} is embedded by the worker with include_str!")]
async fn kernels_embedded(w: &mut TestWorld, dir: String, ext: String) -> StepResult {
    let root = w.cfg.workspace.clone();
    let kernels: Vec<String> = std::fs::read_dir(root.join(&dir))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&ext))
        .collect();
    check!(!kernels.is_empty(), "no {ext} files in {dir}");
    let mut files = Vec::new();
    rust_files(&root.join("worker/src"), &mut files);
    // The files that embed something: a kernel is named there as a string
    // literal (`include_str!("...name.cu")`, or a list a macro embeds).
    let embedding: Vec<String> = files
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter(|s| s.contains("include_str!"))
        .collect();
    let missing: Vec<&String> = kernels
        .iter()
        .filter(|k| {
            let (literal, path) = (format!("\"{k}\""), format!("/{k}\""));
            !embedding
                .iter()
                .any(|s| s.contains(&literal) || s.contains(&path))
        })
        .collect();
    check!(
        missing.is_empty(),
        "kernels not embedded with include_str!: {missing:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_do_not_count_as_use() {
        assert!(!code_mentions(
            "//! touches cudarc\n/// cudarc too\nfn f() {} // cudarc",
            "cudarc"
        ));
        assert!(code_mentions("use cudarc::driver;", "cudarc"));
    }
}

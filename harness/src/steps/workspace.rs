//! Proofs that live in the source tree: the worker's unit tests (named after the
//! requirement they prove: `m0_w_1001_*`, `ext_004_*`; tests that need a GPU carry
//! `cuda` in their path), source and dependency checks, cargo builds and benches,
//! and nested runs of this harness.
//!
//! The unit tests run once per suite (`cargo test -p worker-orcd --no-fail-fast`);
//! `HARNESS_UNIT_TEST_LOG=FILE` reads a saved `cargo test` or `cargo nextest`
//! output instead (how a GPU host without cargo reports them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, Context};
use cucumber::{given, then, when};
use regex::Regex;

use super::{quoted_list, StepResult};
use crate::check;
use crate::proof::Recorder;
use crate::world::{read_json, CommandOutcome, TestWorld};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestOutcome {
    Passed,
    Failed,
    Ignored,
}

/// Parses `cargo test` (`test NAME ... ok`) and `cargo nextest` (`PASS [..] crate NAME`) output.
pub fn parse_test_output(text: &str) -> BTreeMap<String, TestOutcome> {
    let libtest = Regex::new(r"^test (\S+(?: - .+?)?) \.\.\. (ok|FAILED|ignored)").unwrap();
    let nextest = Regex::new(r"^\s*(PASS|FAIL|SKIP|TIMEOUT|SIGSEGV|SIGABRT|LEAK)\s+\[[^\]]*\]\s+(?:\([^)]*\)\s+)?\S+\s+(\S+)").unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(c) = libtest.captures(line) {
            let o = match &c[2] {
                "ok" => TestOutcome::Passed,
                "ignored" => TestOutcome::Ignored,
                _ => TestOutcome::Failed,
            };
            out.insert(c[1].to_owned(), o);
        } else if let Some(c) = nextest.captures(line) {
            let o = match &c[1] {
                "PASS" => TestOutcome::Passed,
                "SKIP" => TestOutcome::Ignored,
                _ => TestOutcome::Failed,
            };
            out.insert(c[2].to_owned(), o);
        }
    }
    out
}

static UNIT_TESTS: tokio::sync::OnceCell<Result<BTreeMap<String, TestOutcome>, String>> =
    tokio::sync::OnceCell::const_new();

async fn unit_tests(w: &TestWorld) -> anyhow::Result<BTreeMap<String, TestOutcome>> {
    let workspace = w.cfg.workspace.clone();
    let r = UNIT_TESTS
        .get_or_init(|| async move {
            let text = match std::env::var_os("HARNESS_UNIT_TEST_LOG") {
                Some(p) => std::fs::read_to_string(&p).map_err(|e| format!("reading {p:?}: {e}"))?,
                None => {
                    println!("(running the worker's unit tests once: cargo test -p worker-orcd --no-fail-fast)");
                    let o = tokio::process::Command::new("cargo")
                        .args(["test", "-p", "worker-orcd", "--no-fail-fast", "--color", "never"])
                        .current_dir(&workspace)
                        .output()
                        .await
                        .map_err(|e| format!("running cargo test: {e}"))?;
                    format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
                }
            };
            if let Some(dir) = Recorder::dir() {
                let _ = std::fs::write(dir.join("unit-tests.log"), &text);
            }
            let map = parse_test_output(&text);
            if map.is_empty() {
                return Err(format!("no test results in the unit-test output:\n{}", crate::world::tail(&text, 30)));
            }
            Ok(map)
        })
        .await;
    r.clone().map_err(|e| anyhow!(e))
}

fn needs_gpu(name: &str) -> bool {
    name.to_lowercase().contains("cuda")
}

async fn named_pass(w: &mut TestWorld, pattern: &str, this_backend_only: bool) -> StepResult {
    let all = unit_tests(w).await?;
    let pat = pattern.to_lowercase();
    let gpu = w.cfg.gpu;
    let chosen: Vec<(&String, &TestOutcome)> = all
        .iter()
        .filter(|(n, _)| n.to_lowercase().contains(&pat))
        .filter(|(n, _)| !(this_backend_only && !gpu && needs_gpu(n)))
        .collect();
    check!(!chosen.is_empty(), "no unit test of the worker is named like {pattern:?} (name the tests that prove a requirement after its ID)");
    let failed: Vec<&String> = chosen
        .iter()
        .filter(|(_, o)| **o == TestOutcome::Failed)
        .map(|(n, _)| *n)
        .collect();
    let ignored: Vec<&String> = chosen
        .iter()
        .filter(|(_, o)| **o == TestOutcome::Ignored)
        .map(|(n, _)| *n)
        .collect();
    check!(failed.is_empty(), "failed: {failed:?}");
    check!(
        ignored.is_empty(),
        "skipped/ignored (never counted as passed): {ignored:?}"
    );
    Ok(())
}

#[then(regex = r#"^the worker's unit tests named "([^"]+)" pass$"#)]
async fn tests_pass(w: &mut TestWorld, pattern: String) -> StepResult {
    named_pass(w, &pattern, false).await
}

#[then(regex = r#"^the worker's unit tests named "([^"]+)" pass on this backend$"#)]
async fn tests_pass_here(w: &mut TestWorld, pattern: String) -> StepResult {
    named_pass(w, &pattern, true).await
}

#[then(regex = r"^all of the worker's unit tests pass on this backend$")]
async fn all_pass(w: &mut TestWorld) -> StepResult {
    let all = unit_tests(w).await?;
    let gpu = w.cfg.gpu;
    let failed: Vec<&String> = all
        .iter()
        .filter(|(n, o)| **o == TestOutcome::Failed && (gpu || !needs_gpu(n)))
        .map(|(n, _)| n)
        .collect();
    let passed = all.values().filter(|o| **o == TestOutcome::Passed).count();
    check!(
        failed.is_empty(),
        "{} unit tests failed: {failed:?}",
        failed.len()
    );
    check!(passed > 0, "no unit test passed");
    Ok(())
}

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

#[then(regex = r#"^no source file under "([^"]+)" outside "([^"]+)" mentions "([^"]+)"$"#)]
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

#[then(regex = r#"^the workspace README has a section matching "([^"]+)" that mentions (.+)$"#)]
async fn readme_section(w: &mut TestWorld, heading: String, list: String) -> StepResult {
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
    let missing: Vec<String> = quoted_list(&list)
        .into_iter()
        .filter(|m| !s.to_lowercase().contains(&m.to_lowercase()))
        .collect();
    check!(
        missing.is_empty(),
        "the {heading} section does not mention {missing:?}"
    );
    Ok(())
}

fn run_shell(w: &mut TestWorld, line: &str, env_remove: &[&str]) -> anyhow::Result<CommandOutcome> {
    let out = run_line(&w.cfg.workspace, line, env_remove)?;
    w.command = Some(out.clone());
    Ok(out)
}

/// Runs `line` (words split on whitespace, no shell) in `workspace`; where its
/// program is not installed, reads the build host's record of it (`recorded`).
pub fn run_line(
    workspace: &Path,
    line: &str,
    env_remove: &[&str],
) -> anyhow::Result<CommandOutcome> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let (prog, args) = words
        .split_first()
        .ok_or_else(|| anyhow!("empty command"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args).current_dir(workspace);
    for k in env_remove {
        cmd.env_remove(k);
    }
    let out = match cmd.output() {
        Ok(o) => CommandOutcome {
            line: line.to_owned(),
            code: o.status.code(),
            output: format!(
                "{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            proof_dir: None,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            recorded(line).with_context(|| format!("{prog} is not installed here ({e})"))?
        }
        Err(e) => return Err(e).with_context(|| format!("running {line}")),
    };
    Ok(out)
}

/// The outcome of `line` as `ci/cargo-records` saved it on the build host, for
/// a host without a Rust toolchain (the GPU machine): `HARNESS_CARGO_RECORDS`
/// names the folder. The record says which commit it was made from, and that is
/// printed, so the proof bundle shows where the evidence came from.
fn recorded(line: &str) -> anyhow::Result<CommandOutcome> {
    let dir = std::env::var_os("HARNESS_CARGO_RECORDS")
        .ok_or_else(|| anyhow!("no HARNESS_CARGO_RECORDS folder of build-host records is set"))?;
    let path = Path::new(&dir).join(record_name(line));
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no build-host record {}", path.display()))?;
    let (head, output) = text
        .split_once("\n---\n")
        .ok_or_else(|| anyhow!("{}: no header", path.display()))?;
    let field = |key: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(key).map(str::trim))
            .ok_or_else(|| anyhow!("{}: no {key:?} line", path.display()))
    };
    check_field(field("command:")? == line, &path, "records another command")?;
    let code: i32 = field("exit:")?.parse().context("exit code")?;
    println!(
        "(\"{line}\": build-host record of commit {}, made {})",
        field("commit:")?,
        field("date:")?
    );
    Ok(CommandOutcome {
        line: line.to_owned(),
        code: Some(code),
        output: output.to_owned(),
        proof_dir: None,
    })
}

fn check_field(ok: bool, path: &Path, what: &str) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(anyhow!("{} {what}", path.display()))
    }
}

/// File name of a command's record: its words joined by `_`, other characters dropped.
pub fn record_name(line: &str) -> String {
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == ',')
                .collect()
        })
        .collect();
    format!("{}.log", words.join("_"))
}

#[then(regex = r#"^"(cargo tree [^"]+)" lists no (.+)$"#)]
async fn no_native(w: &mut TestWorld, line: String, list: String) -> StepResult {
    let o = run_shell(w, &line, &[])?;
    check!(
        o.code == Some(0),
        "{line} failed: {}",
        crate::world::tail(&o.output, 10)
    );
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
    let found: Vec<String> = quoted_list(&list)
        .into_iter()
        .filter(|c| crates.contains(c))
        .collect();
    check!(found.is_empty(), "native crates in the tree: {found:?}");
    check!(
        crates.iter().any(|c| c == "tokenizers"),
        "tokenizers is not in the tree; wrong command?"
    );
    Ok(())
}

#[then(regex = r#"^"(cargo build [^"]+)" succeeds without a CUDA toolkit in the environment$"#)]
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
        crate::world::tail(&o.output, 20)
    );
    Ok(())
}

#[then(regex = r#"^no build script in the workspace mentions "([^"]+)" or "([^"]+)"$"#)]
async fn build_scripts(w: &mut TestWorld, a: String, b: String) -> StepResult {
    let root = w.cfg.workspace.clone();
    let mut bad = Vec::new();
    for member in ["worker", "harness", "benches"] {
        let p = root.join(member).join("build.rs");
        if let Ok(t) = std::fs::read_to_string(&p) {
            if t.contains(&a) || t.contains(&b) {
                bad.push(p.display().to_string());
            }
        }
    }
    check!(bad.is_empty(), "build scripts calling {a}/{b}: {bad:?}");
    Ok(())
}

#[then(
    regex = r#"^every file in "([^"]+)" ending "([^"]+)" is embedded by the worker with include_str!$"#
)]
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
    let source: String = files
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    let missing: Vec<&String> = kernels
        .iter()
        .filter(|k| !source.contains(&format!("{k}\")")) || !source.contains("include_str!"))
        .collect();
    check!(
        missing.is_empty(),
        "kernels not embedded with include_str!: {missing:?}"
    );
    Ok(())
}

// ---- nested harness runs ----

fn harness_command(
    w: &mut TestWorld,
    args: &str,
    env: &[(&str, String)],
) -> anyhow::Result<CommandOutcome> {
    let exe = std::env::current_exe()?;
    let args = w.expand(args)?;
    let mut cmd = Command::new(&exe);
    cmd.arg("suite")
        .args([
            "--worker",
            &w.cfg.worker_bin.display().to_string(),
            "--backend",
            &w.cfg.backend,
            "--model",
            &w.cfg.model.display().to_string(),
        ])
        .args([
            "--workspace",
            &w.cfg.workspace.display().to_string(),
            "--requirements",
            &w.cfg.requirements.display().to_string(),
        ])
        .args(args.split_whitespace())
        .current_dir(&w.cfg.workspace)
        .env_remove("LLORCH_PROOF_DIR")
        .env_remove("LLORCH_RUN_ID");
    if !args.contains("--budgets") {
        cmd.args(["--budgets", &w.cfg.budgets_path.display().to_string()]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd
        .output()
        .with_context(|| format!("running {} suite", exe.display()))?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let proof_dir = Regex::new(r"proof bundle: (\S+)")
        .unwrap()
        .captures_iter(&text)
        .last()
        .map(|c| PathBuf::from(&c[1]));
    let out = CommandOutcome {
        line: format!("harness suite {args}"),
        code: o.status.code(),
        output: text,
        proof_dir,
    };
    w.command = Some(out.clone());
    Ok(out)
}

#[when(regex = r#"^I run the harness suite with "([^"]+)"$"#)]
async fn nested(w: &mut TestWorld, args: String) -> StepResult {
    harness_command(w, &args, &[])?;
    Ok(())
}

#[when(
    regex = r#"^I run the harness suite with "([^"]+)" and LLORCH_PROOF_DIR "([^"]+)" and LLORCH_RUN_ID "([^"]+)"$"#
)]
async fn nested_env(w: &mut TestWorld, args: String, dir: String, id: String) -> StepResult {
    let dir = w.expand(&dir)?;
    harness_command(
        w,
        &args,
        &[("LLORCH_PROOF_DIR", dir), ("LLORCH_RUN_ID", id)],
    )?;
    Ok(())
}

fn command(w: &TestWorld) -> anyhow::Result<&CommandOutcome> {
    w.command.as_ref().ok_or_else(|| anyhow!("no command ran"))
}

#[then(regex = r"^the harness exited (zero|non-zero)$")]
async fn harness_exit(w: &mut TestWorld, which: String) -> StepResult {
    let c = command(w)?;
    let ok = c.code == Some(0);
    check!(
        ok == (which == "zero"),
        "{} exited {:?}, want {which}:\n{}",
        c.line,
        c.code,
        crate::world::tail(&c.output, 30)
    );
    Ok(())
}

#[then(
    regex = r#"^its proof bundle's timings.json has a missed "([^"]+)" verdict with p50, p95 and p99$"#
)]
async fn missed_verdict(w: &mut TestWorld, key: String) -> StepResult {
    let c = command(w)?;
    let dir = c.proof_dir.clone().ok_or_else(|| {
        anyhow!(
            "the nested run printed no proof bundle path:\n{}",
            crate::world::tail(&c.output, 20)
        )
    })?;
    let t = read_json(&dir.join("timings.json"))?;
    let missed = t["budgets"].as_array().is_some_and(|a| {
        a.iter()
            .any(|v| v["verdict"]["key"] == key.as_str() && v["verdict"]["met"] == false)
    });
    check!(
        missed,
        "no missed {key} verdict in {}",
        dir.join("timings.json").display()
    );
    let with_pcts = t["measurements"].as_array().is_some_and(|a| {
        a.iter().any(|m| {
            ["p50", "p95", "p99"]
                .iter()
                .all(|p| m["summary"][p].is_number())
        })
    });
    check!(with_pcts, "no measurement with p50/p95/p99 in timings.json");
    Ok(())
}

#[then(regex = r#"^"([^"]+)" holds (.+)$"#)]
async fn dir_holds(w: &mut TestWorld, dir: String, list: String) -> StepResult {
    let dir = PathBuf::from(w.expand(&dir)?);
    let missing: Vec<String> = quoted_list(&list)
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    check!(missing.is_empty(), "{} lacks {missing:?}", dir.display());
    Ok(())
}

#[then(
    regex = r"^its matrix.json lists every requirement ID of REQUIREMENTS.md exactly once with a result$"
)]
async fn matrix_complete(w: &mut TestWorld) -> StepResult {
    let c = command(w)?;
    let dir = c
        .proof_dir
        .clone()
        .ok_or_else(|| anyhow!("the nested run printed no proof bundle path"))?;
    let m = read_json(&dir.join("matrix.json"))?;
    let reqs =
        crate::catalogue::parse_requirements(&std::fs::read_to_string(&w.cfg.requirements)?)?;
    let rows = m["rows"]
        .as_array()
        .ok_or_else(|| anyhow!("matrix.json has no rows"))?;
    let mut bad = Vec::new();
    for r in &reqs {
        let n = rows.iter().filter(|row| row["id"] == r.id.as_str()).count();
        if n != 1 {
            bad.push(format!("{} appears {n} times", r.id));
        }
    }
    for row in rows {
        let st = row["status"].as_str().unwrap_or("");
        if !["passed", "failed", "skipped", "pending"].contains(&st) {
            bad.push(format!("{} has no result ({st:?})", row["id"]));
        }
        if st != "passed" && row["reason"].as_str().is_none_or(str::is_empty) {
            bad.push(format!("{} is {st} without a reason", row["id"]));
        }
    }
    check!(
        rows.len() == reqs.len(),
        "{} rows for {} requirements",
        rows.len(),
        reqs.len()
    );
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[given(
    regex = r#"^a budgets file "([^"]+)" where every ceiling is ([\d.]+) and every floor is ([\d.]+)$"#
)]
async fn impossible_budgets(
    w: &mut TestWorld,
    name: String,
    ceiling: f64,
    floor: f64,
) -> StepResult {
    let text = std::fs::read_to_string(&w.cfg.budgets_path)?;
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let backends = doc
        .get_mut("backends")
        .and_then(serde_yaml::Value::as_mapping_mut)
        .ok_or_else(|| anyhow!("no backends"))?;
    for (_, b) in backends.iter_mut() {
        let Some(m) = b.as_mapping_mut() else {
            continue;
        };
        for (k, v) in m.iter_mut() {
            let key = k.as_str().unwrap_or("");
            let value = if key.starts_with("decode_tok_s_min") {
                floor
            } else {
                ceiling
            };
            if let Some(inner) = v.as_mapping_mut() {
                inner
                    .iter_mut()
                    .for_each(|(_, x)| *x = serde_yaml::Value::from(value));
            } else {
                *v = serde_yaml::Value::from(value);
            }
        }
    }
    std::fs::create_dir_all(&w.scratch)?;
    std::fs::write(w.scratch.join(name), serde_yaml::to_string(&doc)?)?;
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

    #[test]
    fn parses_libtest_and_nextest_lines() {
        let text = "test gguf::tests::m0_w_1211_reads ... ok\ntest backend::cuda::m0_w_1010_ctx ... ignored, needs a GPU\ntest x ... FAILED\n        PASS [   0.004s] worker-orcd backend::cuda::tests::m0_w_1400_init\n        FAIL [   1.000s] (1/2) worker-orcd sampling::m0_w_1421_chi\n";
        let m = parse_test_output(text);
        assert_eq!(m["gguf::tests::m0_w_1211_reads"], TestOutcome::Passed);
        assert_eq!(m["backend::cuda::m0_w_1010_ctx"], TestOutcome::Ignored);
        assert_eq!(m["x"], TestOutcome::Failed);
        assert_eq!(
            m["backend::cuda::tests::m0_w_1400_init"],
            TestOutcome::Passed
        );
        assert_eq!(m["sampling::m0_w_1421_chi"], TestOutcome::Failed);
    }

    /// `ci/cargo-records` writes what `recorded` reads, under the same name.
    #[test]
    fn reads_a_record_written_by_ci_cargo_records() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = std::env::temp_dir().join(format!("cargo-records-{}", std::process::id()));
        let o = Command::new(root.join("ci/cargo-records"))
            .arg(&dir)
            .arg("cargo tree") // the release build is too slow for a unit test
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::env::set_var("HARNESS_CARGO_RECORDS", &dir);
        let line = "cargo tree -p tokenizers -e normal,build";
        assert_eq!(
            record_name(line),
            "cargo_tree_-p_tokenizers_-e_normal,build.log"
        );
        let r = recorded(line).unwrap();
        assert_eq!(r.code, Some(0));
        assert!(r.output.contains("tokenizers v"), "{}", r.output);
        assert!(recorded("cargo tree --nothing-recorded").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

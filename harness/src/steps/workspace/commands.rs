//! Running a command line in the workspace, or reading the build host's record
//! of it where its program is not installed (a GPU host without cargo).

use std::path::Path;
use std::process::Command;

use anyhow::{anyhow, Context};

use crate::world::{CommandOutcome, TestWorld};

/// Runs `line` in the workspace and keeps its outcome as the scenario's command.
pub fn run_shell(
    w: &mut TestWorld,
    line: &str,
    env_remove: &[&str],
) -> anyhow::Result<CommandOutcome> {
    let out = run_line(&w.cfg.workspace, line, env_remove)?;
    w.workspace.command = Some(out.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

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

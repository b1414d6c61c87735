//! The README's quick start and the documents' examples, run as written
//! (issue 48): a command a document shows is kept true by running it.
//!
//! A runnable block is a fenced block whose info string is `sh TAG`
//! (GitHub highlights it as `sh` and ignores the tag): `sh quick-start` is
//! the README's command that starts the worker, `sh example` a command
//! against a worker started as the quick start says (`localhost:8080`).

use std::path::Path;

use anyhow::{anyhow, Context};
use cucumber::{then, when};

use crate::check;
use crate::process::{free_port, Launch};
use crate::steps::StepResult;
use crate::world::TestWorld;

/// Where the documents' examples expect the worker.
const DOCUMENTED_ADDRESS: &str = "localhost:8080";
/// What the quick start runs the worker with, and how a host without
/// cargo (a GPU machine given the built binary) runs it instead.
const CARGO_RUN: &str = "cargo run --release -p worker-orcd --";

/// The command lines of `text`'s blocks tagged `sh TAG`: comment lines
/// dropped, lines ending in `\` joined with the next.
pub fn commands(text: &str, tag: &str) -> Vec<String> {
    let opening = format!("```sh {tag}");
    let mut out = Vec::new();
    let mut inside = false;
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if !inside {
            inside = trimmed == opening;
            continue;
        }
        if trimmed == "```" {
            inside = false;
        } else if !trimmed.is_empty() && !trimmed.starts_with('#') {
            match trimmed.strip_suffix('\\') {
                Some(part) => current.push_str(part),
                None => {
                    current.push_str(trimmed);
                    out.push(std::mem::take(&mut current));
                }
            }
        }
    }
    out
}

fn read(workspace: &Path, file: &str) -> anyhow::Result<String> {
    let path = workspace.join(file);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// Runs the README's quick-start command in the workspace, as a terminal
/// would (a process group of its own, for Ctrl-C), with `--port` added so
/// it does not depend on port 8080 being free.
#[when(expr = "I start the README's quick-start command in a terminal of its own")]
async fn quick_start(w: &mut TestWorld) -> StepResult {
    let readme = read(&w.cfg.workspace, "README.md")?;
    let found = commands(&readme, "quick-start");
    let [command] = found.as_slice() else {
        return Err(anyhow!(
            "the README has {} quick-start commands, want 1",
            found.len()
        )
        .into());
    };
    check!(
        command.contains(CARGO_RUN),
        "the quick start does not run {CARGO_RUN:?}: {command}"
    );
    let port = free_port()?;
    let mut line = format!("{command} --port {port}");
    if which("cargo").is_none() {
        let bin = w.cfg.worker_bin.display().to_string();
        println!("(no cargo on this host: the quick start runs {bin} for {CARGO_RUN:?})");
        line = line.replace(CARGO_RUN, &bin);
    }
    let launch = Launch {
        bin: "bash".into(),
        args: vec![("-c".into(), Some(line))],
        env: w.process.env.clone(),
        host: "127.0.0.1".into(),
        port,
        cwd: Some(w.cfg.workspace.clone()),
        own_group: true,
    };
    w.process.spawn(launch)?;
    Ok(())
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[when(expr = "I press Ctrl-C in its terminal")]
async fn ctrl_c(w: &mut TestWorld) -> StepResult {
    w.process.worker()?.signal_group(libc::SIGINT)?;
    Ok(())
}

/// Every `sh TAG` command of `file`, pointed at the running worker, exits 0
/// with an answer of 2xx (curl's `--fail-with-body`); a streamed one
/// (`curl -N`) gives SSE `data:` lines.
#[then(expr = "every {string} command of {string} succeeds against the worker")]
async fn examples_succeed(w: &mut TestWorld, tag: String, file: String) -> StepResult {
    let text = read(&w.cfg.workspace, &file)?;
    let found = commands(&text, &tag);
    check!(!found.is_empty(), "{file} has no `sh {tag}` block");
    let client = w.process.worker()?.launch.clone();
    let address = format!("{}:{}", client.host, client.port);
    let mut failures = Vec::new();
    for command in &found {
        check!(
            command.starts_with("curl "),
            "{file}: an example that is not a curl command: {command}"
        );
        let line = command
            .replacen("curl ", "curl -sS --fail-with-body --max-time 300 ", 1)
            .replace(DOCUMENTED_ADDRESS, &address);
        let out = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(&line)
            .current_dir(&w.cfg.workspace)
            .output()
            .await
            .with_context(|| format!("running {line}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let streamed = !command.contains(" -N ") || stdout.contains("data:");
        if !out.status.success() || !streamed {
            failures.push(format!(
                "{command}\n  exit {:?}: {}{}",
                out.status.code(),
                stdout.chars().take(400).collect::<String>(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    check!(
        failures.is_empty(),
        "{} of {} examples of {file} failed:\n{}",
        failures.len(),
        found.len(),
        failures.join("\n")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_blocks_become_command_lines() {
        let text = "intro\n```sh example\n# a comment\ncurl a \\\n  -d '{}'\ncurl b\n```\n\
                    ```sh\ncurl not-tagged\n```\n```sh quick-start\nrun it\n```\n";
        assert_eq!(commands(text, "example"), ["curl a -d '{}'", "curl b"]);
        assert_eq!(commands(text, "quick-start"), ["run it"]);
        assert!(commands(text, "other").is_empty());
    }

    /// The workspace's own documents hold what the suite runs.
    #[test]
    fn the_documents_hold_runnable_blocks() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let readme = read(&root, "README.md").unwrap();
        let quick = commands(&readme, "quick-start");
        assert_eq!(quick.len(), 1, "{quick:?}");
        assert!(quick[0].contains(CARGO_RUN), "{}", quick[0]);
        assert!(!commands(&readme, "example").is_empty());
        let api = read(&root, "docs/API.md").unwrap();
        assert!(commands(&api, "example").len() >= 8);
    }
}

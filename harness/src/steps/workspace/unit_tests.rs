//! The worker's unit tests as evidence: they are named after the requirement they
//! prove (`m0_w_1001_*`, `ext_004_*`); tests that need a GPU carry `cuda` in their path.
//!
//! They run once per suite (`cargo test -p worker-orcd --no-fail-fast`);
//! `HARNESS_UNIT_TEST_LOG=FILE` reads a saved `cargo test` or `cargo nextest`
//! output instead (how a GPU host without cargo reports them).

use std::collections::BTreeMap;

use anyhow::anyhow;
use cucumber::then;
use regex::Regex;

use crate::check;
use crate::proof::Recorder;
use crate::steps::params::ThisBackend;
use crate::steps::StepResult;
use crate::world::{tail, TestWorld};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestOutcome {
    Passed,
    Failed,
    Ignored,
}

/// Parses `cargo test` (`test NAME ... ok`) and `cargo nextest` (`PASS [..] crate NAME`) output.
/// A test run with `--nocapture` (one thread) may print between its name and
/// its result: the result is then the next line that is `ok`, `FAILED` or
/// `ignored` alone.
pub fn parse_test_output(text: &str) -> BTreeMap<String, TestOutcome> {
    let libtest = Regex::new(r"^test (\S+(?: - .+?)?) \.\.\. (ok|FAILED|ignored)").unwrap();
    let started = Regex::new(r"^test (\S+(?: - .+?)?) \.\.\. ").unwrap();
    let nextest = Regex::new(r"^\s*(PASS|FAIL|SKIP|TIMEOUT|SIGSEGV|SIGABRT|LEAK)\s+\[[^\]]*\]\s+(?:\([^)]*\)\s+)?\S+\s+(\S+)").unwrap();
    let outcome = |word: &str| match word {
        "ok" => TestOutcome::Passed,
        "ignored" => TestOutcome::Ignored,
        _ => TestOutcome::Failed,
    };
    let mut out = BTreeMap::new();
    let mut awaiting: Option<String> = None;
    for line in text.lines() {
        if let Some(c) = libtest.captures(line) {
            out.insert(c[1].to_owned(), outcome(&c[2]));
            awaiting = None;
        } else if let Some(c) = started.captures(line) {
            awaiting = Some(c[1].to_owned());
        } else if let (Some(name), true) = (
            awaiting.as_ref(),
            matches!(line.trim_end(), "ok" | "FAILED" | "ignored"),
        ) {
            out.insert(name.clone(), outcome(line.trim_end()));
            awaiting = None;
        } else if let Some(c) = nextest.captures(line) {
            let o = match &c[1] {
                "PASS" => TestOutcome::Passed,
                "SKIP" => TestOutcome::Ignored,
                _ => TestOutcome::Failed,
            };
            out.insert(c[2].to_owned(), o);
            awaiting = None;
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
                return Err(format!("no test results in the unit-test output:\n{}", tail(&text, 30)));
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

#[then(expr = "the worker's unit tests named {string} pass{here}")]
async fn tests_pass(w: &mut TestWorld, pattern: String, here: ThisBackend) -> StepResult {
    named_pass(w, &pattern, here.0).await
}

#[then(expr = "all of the worker's unit tests pass on this backend")]
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// With `--nocapture`, what a test prints comes between its name and
    /// its result; a line that only mentions "ok" inside is not a result.
    #[test]
    fn parses_results_after_a_tests_own_output() {
        let text = "running 3 tests\ntest a::m0_w_1431_memcheck ... compute-sanitizer over 11 tests: 17 s\nok\ntest b::chatty ... it is ok here\nmore output\nFAILED\ntest c::quiet ... ok\n";
        let m = parse_test_output(text);
        assert_eq!(m["a::m0_w_1431_memcheck"], TestOutcome::Passed);
        assert_eq!(m["b::chatty"], TestOutcome::Failed);
        assert_eq!(m["c::quiet"], TestOutcome::Passed);
        assert_eq!(m.len(), 3);
    }
}

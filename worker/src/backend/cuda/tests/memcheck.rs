//! Kernel safety (M0-W-1431) under compute-sanitizer: memcheck re-runs the
//! kernel tests of this binary and must find no bad access.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

// -------------------------------------------------------- compute-sanitizer

/// The kernel tests memcheck re-runs: every kernel, every weight format, odd
/// shapes. Full names, run with `--exact`, so that a renamed test fails
/// this one instead of silently dropping out.
const MEMCHECK_TESTS: [&str; 11] = [
    "backend::cuda::tests::matmul::matmul_matches_cpu_for_every_format_and_shape",
    "backend::cuda::tests::matmul::embed_matches_cpu_for_every_format",
    "backend::cuda::tests::norm::rms_norm_matches_cpu",
    "backend::cuda::tests::norm::norm_add_rms_norm_matches_two_launches_bit_for_bit",
    "backend::cuda::tests::attention::attend_fuses_norms_rope_and_store_bit_for_bit",
    "backend::cuda::tests::sample::gpu_greedy_choice_matches_cpu_argmax_at_every_vocabulary_size",
    "backend::cuda::tests::norm::m0_w_1432_cuda_layer_norm_matches_cpu_at_widths_768_1600_577",
    "backend::cuda::tests::attention::rope_matches_cpu_in_both_styles",
    "backend::cuda::tests::attention::attention_matches_cpu_over_prefill_and_decode",
    "backend::cuda::tests::elementwise::swiglu_and_add_match_cpu",
    "backend::cuda::tests::elementwise::m0_w_1433_cuda_gelu_matches_f64_over_minus_10_to_10",
];

/// Every name memcheck re-runs is a test of this binary, so a test moved or
/// renamed is caught here, without a GPU, rather than on the GPU machine.
#[test]
fn memcheck_test_names_exist_in_this_binary() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--list", "--exact"])
        .args(MEMCHECK_TESTS)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    for name in MEMCHECK_TESTS {
        assert!(
            listed.lines().any(|l| l == format!("{name}: test")),
            "{name} is not a test here:\n{listed}"
        );
    }
}

/// How long the memcheck run may take (the quick kernel tests take about a
/// minute under memcheck; far longer means something hangs).
const MEMCHECK_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// `compute-sanitizer` on `PATH`, under `$CUDA_HOME/bin` or `$CUDA_PATH/bin`,
/// or in `/usr/local/cuda/bin`.
fn find_compute_sanitizer() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(PathBuf::from(root).join("bin"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    dirs.into_iter()
        .map(|d| d.join("compute-sanitizer"))
        .find(|p| p.is_file())
}

/// Re-runs this test binary's kernel tests under `compute-sanitizer --tool
/// memcheck` (quick mode: smaller shapes, fewer repeats) and requires a clean
/// report. Without compute-sanitizer this fails: on the GPU machine the
/// check is required, not optional.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1431_compute_sanitizer_memcheck_is_clean() {
    let _gpu = shared_gpu();
    let sanitizer = find_compute_sanitizer().expect(
        "compute-sanitizer (CUDA toolkit) is needed: not on PATH, under $CUDA_HOME/bin or in /usr/local/cuda/bin",
    );
    let exe = std::env::current_exe().expect("the test binary's path");
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("memcheck.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(&sanitizer)
        // Device memory accesses are what is checked here. API calls that
        // return an error are typed errors the worker already handles (and
        // set-up ignores a refused heap limit on purpose), so they are not
        // counted as memcheck errors.
        .args([
            "--tool",
            "memcheck",
            "--error-exitcode",
            "1",
            "--report-api-errors",
            "no",
        ])
        .arg(&exe)
        .args(MEMCHECK_TESTS)
        .args(["--exact", "--include-ignored", "--test-threads", "1"])
        .env(QUICK_ENV, "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", sanitizer.display()));
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > MEMCHECK_TIMEOUT {
            child.kill().ok();
            child.wait().ok();
            panic!(
                "memcheck ran past {MEMCHECK_TIMEOUT:?}; log in {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: String = {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    eprintln!(
        "compute-sanitizer memcheck over {} kernel tests: {:.0} s",
        MEMCHECK_TESTS.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "memcheck (or a kernel test under it) failed: {status}\n{tail}"
    );
    assert!(
        text.contains("ERROR SUMMARY: 0 errors"),
        "memcheck did not report 0 errors:\n{tail}"
    );
    let ran = format!("test result: ok. {} passed", MEMCHECK_TESTS.len());
    assert!(
        text.contains(&ran),
        "every kernel test ran and passed under memcheck ({ran:?} expected):\n{tail}"
    );
}

//! Report and gate on small hand-made runs.

use serde_json::json;

use super::gate::{self, Verdict};
use super::record::Records;
use super::{report, slug};

/// A run of two programs on one model: decode tok/s and first-token ms.
fn run(id: &str, worker_tg: [f64; 3], worker_ttft: [f64; 3]) -> String {
    let fig = |program: &str,
               figure: &str,
               unit: &str,
               better: &str,
               [median, min, max]: [f64; 3]| {
        json!({
            "kind": "figure", "run": id, "gpu": "H100", "model": "smollm2 Q4_1", "program": program,
            "figure": figure, "unit": unit, "better": better, "median": median, "min": min, "max": max,
            "samples": [min, median, max],
        })
        .to_string()
    };
    [
        format!(
            r#"{{"kind":"run","run":"{id}","gpu":"H100","driver":"580.1","worker_commit":"abc"}}"#
        ),
        r#"{"kind":"llama-bench","raw":true}"#.to_string(),
        fig("worker-orcd", "tg128", "tok/s", "higher", worker_tg),
        fig(
            "llama.cpp",
            "tg128",
            "tok/s",
            "higher",
            [900.0, 890.0, 910.0],
        ),
        fig("worker-orcd", "ttft_chat_ms", "ms", "lower", worker_ttft),
        fig("llama.cpp", "ttft_chat_ms", "ms", "lower", [5.5, 5.3, 5.8]),
    ]
    .join("\n")
}

fn base() -> Records {
    Records::parse(&run("r1", [780.0, 770.0, 790.0], [7.0, 6.8, 7.3])).unwrap()
}

#[test]
fn records_skip_other_kinds_and_keep_header_fields() {
    let r = base();
    assert_eq!(r.runs.len(), 1);
    assert_eq!(r.runs[0].extra["driver"], "580.1");
    assert_eq!(r.figures.len(), 4);
    assert_eq!(r.run_ids(), ["r1"]);
    assert!(
        Records::parse("{\"kind\":\"figure\",\"run\":\"x\"}").is_err(),
        "a figure without its fields"
    );
}

#[test]
fn an_unchanged_run_passes() {
    let again = Records::parse(&run("r2", [781.0, 772.0, 788.0], [7.05, 6.9, 7.2])).unwrap();
    let checks = gate::check(&again, &base(), "worker-orcd", 0.02);
    assert_eq!(checks.len(), 2);
    assert!(
        checks.iter().all(|c| c.verdict == Verdict::Pass),
        "{}",
        gate::human(&checks)
    );
    assert!(gate::passes(&checks, false));
}

#[test]
fn a_slowed_run_fails() {
    // Decode 10% slower: far outside the 20 tok/s spread.
    let slow = Records::parse(&run("r2", [702.0, 695.0, 710.0], [7.0, 6.8, 7.3])).unwrap();
    let checks = gate::check(&slow, &base(), "worker-orcd", 0.02);
    let tg = checks.iter().find(|c| c.base.figure == "tg128").unwrap();
    assert_eq!(tg.verdict, Verdict::Regressed);
    assert!(!gate::passes(&checks, false));
    assert!(gate::human(&checks).contains("REGRESSED"));
}

#[test]
fn a_later_first_token_fails_and_an_earlier_one_passes() {
    let late = Records::parse(&run("r2", [780.0, 770.0, 790.0], [8.0, 7.9, 8.2])).unwrap();
    let c = gate::check(&late, &base(), "worker-orcd", 0.02);
    assert_eq!(
        c.iter()
            .find(|c| c.base.figure == "ttft_chat_ms")
            .unwrap()
            .verdict,
        Verdict::Regressed
    );
    let early = Records::parse(&run("r2", [780.0, 770.0, 790.0], [5.0, 4.9, 5.2])).unwrap();
    assert!(gate::passes(
        &gate::check(&early, &base(), "worker-orcd", 0.02),
        false
    ));
}

#[test]
fn a_drop_within_the_spread_passes() {
    // 15 tok/s lower, the baseline's spread is 20.
    let noisy = Records::parse(&run("r2", [765.0, 760.0, 770.0], [7.0, 6.8, 7.3])).unwrap();
    assert!(gate::passes(
        &gate::check(&noisy, &base(), "worker-orcd", 0.0),
        false
    ));
}

#[test]
fn a_missing_figure_fails_unless_allowed() {
    let text = run("r2", [780.0, 770.0, 790.0], [7.0, 6.8, 7.3]);
    let partial: Vec<&str> = text.lines().filter(|l| !l.contains("ttft")).collect();
    let partial = Records::parse(&partial.join("\n")).unwrap();
    let checks = gate::check(&partial, &base(), "worker-orcd", 0.02);
    assert!(checks.iter().any(|c| c.verdict == Verdict::Missing));
    assert!(!gate::passes(&checks, false));
    assert!(gate::passes(&checks, true));
}

#[test]
fn a_figure_measured_once_is_reported_not_gated() {
    let once = |v: f64| {
        json!({
            "kind": "figure", "run": "r", "model": "m", "program": "worker-orcd", "figure": "load_s",
            "unit": "s", "better": "lower", "median": v, "min": v, "max": v, "samples": [v],
        })
        .to_string()
    };
    let checks = gate::check(
        &Records::parse(&once(9.0)).unwrap(),
        &Records::parse(&once(1.0)).unwrap(),
        "all",
        0.02,
    );
    assert_eq!(checks[0].verdict, Verdict::NoSpread);
    assert!(gate::passes(&checks, false));
    assert!(gate::human(&checks).starts_with("ungated"));
}

#[test]
fn report_table_has_ratios_and_spread() {
    let md = report::markdown(&base());
    let tg = md.lines().find(|l| l.contains("| tg128 |")).unwrap();
    assert!(tg.contains("780 (770–790)"), "{tg}");
    assert!(tg.contains("| 0.87 | llama.cpp |"), "{tg}");
    let ttft = md.lines().find(|l| l.contains("ttft_chat_ms")).unwrap();
    assert!(ttft.contains("| 1.27 | llama.cpp |"), "{ttft}");
    assert!(md.contains("driver: 580.1"));
}

#[test]
fn report_writes_charts_and_appends_history_once() {
    let dir = std::env::temp_dir().join(format!("harness-bench-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let history = dir.join("history.jsonl");
    for (id, tg) in [("r1", 780.0), ("r2", 800.0)] {
        let path = dir.join(format!("{id}.jsonl"));
        std::fs::write(&path, run(id, [tg, tg - 10.0, tg + 10.0], [7.0, 6.8, 7.3])).unwrap();
        let args = report::ReportArgs {
            run: path,
            history: Some(history.clone()),
            append: true,
            out: dir.join("out"),
        };
        report::run(&args).unwrap();
        report::run(&args).unwrap();
    }
    assert_eq!(Records::read(&history).unwrap().run_ids(), ["r1", "r2"]);
    let md = std::fs::read_to_string(dir.join("out/report.md")).unwrap();
    assert!(md.contains("run `r2`"), "the last run is reported");
    let bars = std::fs::read_to_string(dir.join("out/charts/smollm2-q4-1-throughput.svg")).unwrap();
    assert!(bars.starts_with("<svg") && bars.contains("<rect x=") && bars.contains("worker-orcd"));
    let line =
        std::fs::read_to_string(dir.join("out/charts/history-smollm2-q4-1-tg128.svg")).unwrap();
    assert_eq!(
        line.matches("<circle").count(),
        4,
        "two runs of two programs"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn slugs_are_file_names() {
    assert_eq!(slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
    assert_eq!(slug("smollm2 Q4_1"), "smollm2-q4-1");
}

#[test]
fn the_baseline_dir_is_searched_by_gpu_name() {
    let dir = std::env::temp_dir().join(format!("harness-bench-gate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let slow = dir.join("slow.jsonl");
    std::fs::write(&slow, run("r2", [702.0, 695.0, 710.0], [7.0, 6.8, 7.3])).unwrap();
    let args = |baseline_dir: &std::path::Path| gate::GateArgs {
        run: slow.clone(),
        baseline: None,
        baseline_dir: Some(baseline_dir.to_path_buf()),
        program: "worker-orcd".into(),
        min_tolerance: 0.02,
        allow_missing: false,
    };
    assert_eq!(
        gate::run(&args(&dir.join("none"))).unwrap(),
        0,
        "no baseline for this GPU: nothing to compare"
    );
    std::fs::write(
        dir.join("h100.jsonl"),
        run("r1", [780.0, 770.0, 790.0], [7.0, 6.8, 7.3]),
    )
    .unwrap();
    assert_eq!(
        gate::run(&args(&dir)).unwrap(),
        1,
        "the slowed run fails against the H100 baseline"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `harness bench gate`: compares a run with a stored baseline.
//!
//! The rule (also in benches/README.md): for every figure of the gated
//! program in the baseline, with `tol = max(baseline max − min, run max − min,
//! min_tolerance × baseline median)`, a figure where higher is better
//! regresses when `run median < baseline median − tol`, one where lower is
//! better when `run median > baseline median + tol`. A baseline figure the
//! run lacks fails too, unless missing figures are allowed (short runs). A
//! figure measured once in the baseline (`load_s`) has no measured spread and
//! is reported, not gated.

use std::fmt::Write;
use std::path::PathBuf;

use anyhow::Context;

use super::record::{baseline_path, Better, Figure, Records, WORKER};

#[derive(clap::Args, Debug)]
pub struct GateArgs {
    /// JSON lines of the run to check (its last run).
    #[arg(long)]
    pub run: PathBuf,
    /// JSON lines of the baseline (its last run), e.g. benches/baseline/<gpu>.jsonl.
    #[arg(
        long,
        required_unless_present = "baseline_dir",
        conflicts_with = "baseline_dir"
    )]
    pub baseline: Option<PathBuf>,
    /// Folder of baselines named by GPU (`<slug of the run's GPU name>.jsonl`); when the
    /// run's GPU has none there, the gate says so and passes (nothing to compare with).
    #[arg(long)]
    pub baseline_dir: Option<PathBuf>,
    /// Program whose figures are gated: worker-orcd, llama.cpp, or all.
    #[arg(long, default_value = WORKER)]
    pub program: String,
    /// Smallest tolerance, as a fraction of the baseline median, for figures
    /// whose repetitions barely vary.
    #[arg(long, default_value_t = 0.02)]
    pub min_tolerance: f64,
    /// Baseline figures that the run did not measure pass.
    #[arg(long)]
    pub allow_missing: bool,
}

/// What the gate concluded about one figure.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Within tolerance, or better.
    Pass,
    /// Worse than the baseline by more than the tolerance.
    Regressed,
    /// In the baseline, not in the run.
    Missing,
    /// One sample in the baseline: no spread to judge by; reported only.
    NoSpread,
}

/// One baseline figure and the run's counterpart.
#[derive(Clone, Debug)]
pub struct Check {
    pub base: Figure,
    pub run: Option<Figure>,
    pub tolerance: f64,
    pub verdict: Verdict,
}

/// `max(spreads, min_tolerance × |baseline median|)`.
pub fn tolerance(base: &Figure, run: &Figure, min_tolerance: f64) -> f64 {
    base.spread()
        .max(run.spread())
        .max(min_tolerance * base.median.abs())
}

/// Whether `run` is worse than `base` by more than `tol`.
pub fn regressed(base: &Figure, run: &Figure, tol: f64) -> bool {
    match base.better {
        Better::Higher => run.median < base.median - tol,
        Better::Lower => run.median > base.median + tol,
    }
}

/// Checks every baseline figure of `program` (`all`: every program).
pub fn check(run: &Records, base: &Records, program: &str, min_tolerance: f64) -> Vec<Check> {
    base.figures
        .iter()
        .filter(|b| program == "all" || b.program == program)
        .map(|b| {
            let r = run
                .figures
                .iter()
                .find(|f| f.model == b.model && f.program == b.program && f.figure == b.figure);
            match r {
                None => Check {
                    base: b.clone(),
                    run: None,
                    tolerance: 0.0,
                    verdict: Verdict::Missing,
                },
                Some(r) => {
                    let tol = tolerance(b, r, min_tolerance);
                    let verdict = if b.samples.len() < 2 {
                        Verdict::NoSpread
                    } else if regressed(b, r, tol) {
                        Verdict::Regressed
                    } else {
                        Verdict::Pass
                    };
                    Check {
                        base: b.clone(),
                        run: Some(r.clone()),
                        tolerance: tol,
                        verdict,
                    }
                }
            }
        })
        .collect()
}

/// One line per check.
pub fn human(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let b = &c.base;
        let what = format!("{} {} {} ({})", b.model, b.program, b.figure, b.unit);
        let _ = match &c.run {
            None => writeln!(
                out,
                "MISSING   {what}: baseline {:.3}, not measured",
                b.median
            ),
            Some(r) => writeln!(
                out,
                "{:<9} {what}: {:.3} vs baseline {:.3} (tolerance {:.3}, {:+.1}%)",
                match c.verdict {
                    Verdict::Regressed => "REGRESSED",
                    Verdict::NoSpread => "ungated",
                    _ => "ok",
                },
                r.median,
                b.median,
                c.tolerance,
                100.0 * (r.median - b.median) / b.median.abs().max(f64::MIN_POSITIVE)
            ),
        };
    }
    out
}

/// Whether the checks pass as a whole.
pub fn passes(checks: &[Check], allow_missing: bool) -> bool {
    checks.iter().all(|c| match c.verdict {
        Verdict::Pass | Verdict::NoSpread => true,
        Verdict::Missing => allow_missing,
        Verdict::Regressed => false,
    })
}

pub fn run(args: &GateArgs) -> anyhow::Result<i32> {
    let run = Records::read(&args.run)?
        .last_run()
        .with_context(|| format!("{}: no run", args.run.display()))?;
    let baseline = match (&args.baseline, &args.baseline_dir) {
        (Some(b), _) => b.clone(),
        (None, Some(dir)) => {
            let gpu = run.runs.first().map(|r| r.gpu.clone()).unwrap_or_default();
            let path = baseline_path(dir, &gpu);
            if !path.exists() {
                println!(
                    "gate: skipped: no baseline for {gpu:?} ({} does not exist)",
                    path.display()
                );
                return Ok(0);
            }
            path
        }
        (None, None) => anyhow::bail!("give --baseline or --baseline-dir"),
    };
    let base = Records::read(&baseline)?
        .last_run()
        .with_context(|| format!("{}: no run", baseline.display()))?;
    let checks = check(&run, &base, &args.program, args.min_tolerance);
    if checks.is_empty() {
        anyhow::bail!("the baseline holds no figure of {}", args.program);
    }
    print!("{}", human(&checks));
    let ok = passes(&checks, args.allow_missing);
    println!("gate: {}", if ok { "pass" } else { "FAIL" });
    Ok(if ok { 0 } else { 1 })
}

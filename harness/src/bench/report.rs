//! `harness bench report`: one run's markdown table of worker ÷ llama.cpp
//! ratios (medians, with each side's min–max spread) and its charts: per
//! model, throughput (tok/s) and latency (ms, s) as grouped bars, and per
//! model and figure the history of medians across the runs of a history file.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::record::{slug, Better, Figure, Records, RunInfo, LLAMA, WORKER};
use super::svg::{self, Point, Series};

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// JSON lines from ci/gpu-bench (the last run in the file is reported).
    #[arg(long)]
    pub run: PathBuf,
    /// History of runs (JSON lines); the history charts are drawn from it.
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Append the run to --history first (skipped when its id is already there).
    #[arg(long, requires = "history")]
    pub append: bool,
    /// Folder for report.md and charts/.
    #[arg(long)]
    pub out: PathBuf,
}

fn point(f: &Figure) -> Point {
    Point {
        median: f.median,
        min: f.min,
        max: f.max,
    }
}

/// `median (min–max)` with a precision fit for the size of the value.
pub fn cell(f: Option<&Figure>) -> String {
    match f {
        None => "–".into(),
        Some(f) => format!("{} ({}–{})", num(f.median), num(f.min), num(f.max)),
    }
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// worker ÷ llama.cpp of the medians, and which program the figure favours.
pub fn ratio(worker: &Figure, llama: &Figure) -> Option<(f64, &'static str)> {
    if llama.median == 0.0 {
        return None;
    }
    let r = worker.median / llama.median;
    let worker_ahead = match worker.better {
        Better::Higher => r > 1.0,
        Better::Lower => r < 1.0,
    };
    let ahead = if r == 1.0 {
        "even"
    } else if worker_ahead {
        WORKER
    } else {
        LLAMA
    };
    Some((r, ahead))
}

fn header_lines(out: &mut String, runs: &[RunInfo]) {
    for r in runs {
        let _ = writeln!(
            out,
            "- run `{}` on {}",
            r.run,
            if r.gpu.is_empty() { "?" } else { &r.gpu }
        );
        for (k, v) in &r.extra {
            if k == "kind" {
                continue;
            }
            let v = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            let _ = writeln!(out, "  - {k}: {v}");
        }
    }
}

/// The markdown table of one run's figures.
pub fn markdown(run: &Records) -> String {
    let mut out = String::from("# worker-orcd and llama.cpp, side by side\n\n");
    header_lines(&mut out, &run.runs);
    out.push_str(
        "\nMedians of the repetitions, (min–max) across them; the ratio is worker-orcd ÷ llama.cpp \
         of the medians (for tok/s higher is better, for ms and s lower is better).\n\n",
    );
    out.push_str(
        "| model | figure | unit | worker-orcd | llama.cpp | worker ÷ llama.cpp | ahead |\n",
    );
    out.push_str("| --- | --- | --- | ---: | ---: | ---: | --- |\n");
    let id = run.run_ids().first().cloned().unwrap_or_default();
    for model in run.distinct(|f| &f.model) {
        let figures = run
            .figures
            .iter()
            .filter(|f| f.model == model)
            .cloned()
            .collect();
        let figs = Records {
            runs: vec![],
            figures,
        };
        for figure in figs.distinct(|f| &f.figure) {
            let w = run.find(&id, &model, WORKER, &figure);
            let l = run.find(&id, &model, LLAMA, &figure);
            let unit = w.or(l).map(|f| f.unit.as_str()).unwrap_or("");
            let (r, ahead) = match (w, l) {
                (Some(w), Some(l)) => {
                    ratio(w, l).map_or(("–".into(), ""), |(r, a)| (format!("{r:.2}"), a))
                }
                _ => ("–".into(), ""),
            };
            let _ = writeln!(
                out,
                "| {model} | {figure} | {unit} | {} | {} | {r} | {ahead} |",
                cell(w),
                cell(l)
            );
        }
    }
    out
}

/// The two programs' values of `figures` on `model` in `run`.
fn program_series(run: &Records, id: &str, model: &str, figures: &[String]) -> Vec<Series> {
    [WORKER, LLAMA]
        .iter()
        .map(|p| Series {
            name: p.to_string(),
            values: figures
                .iter()
                .map(|f| run.find(id, model, p, f).map(point))
                .collect(),
        })
        .collect()
}

/// Per model: throughput and latency bar charts. Returns (file name, title) pairs.
pub fn model_charts(run: &Records, dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let id = run.run_ids().first().cloned().unwrap_or_default();
    let mut written = Vec::new();
    for model in run.distinct(|f| &f.model) {
        for (kind, units) in [
            ("throughput", &["tok/s"][..]),
            ("latency", &["ms"][..]),
            ("load", &["s"][..]),
        ] {
            let figures: Vec<String> = run
                .distinct(|f| &f.figure)
                .into_iter()
                .filter(|fig| {
                    let of_kind = |f: &&Figure| units.contains(&f.unit.as_str());
                    run.figures
                        .iter()
                        .filter(of_kind)
                        .any(|f| &f.figure == fig && f.model == model)
                })
                .collect();
            if figures.is_empty() {
                continue;
            }
            let name = format!("{}-{kind}.svg", slug(&model));
            let title = format!("{model}: {kind} ({})", units.join(", "));
            let chart = svg::bar_chart(
                &title,
                units[0],
                &figures,
                &program_series(run, &id, &model, &figures),
            );
            std::fs::write(dir.join(&name), chart)?;
            written.push((name, title));
        }
    }
    Ok(written)
}

/// Per model and figure: medians across the runs of `history`.
pub fn history_charts(history: &Records, dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let runs = history.run_ids();
    let mut written = Vec::new();
    for model in history.distinct(|f| &f.model) {
        let mut figures: Vec<(String, String)> = Vec::new();
        for f in history.figures.iter().filter(|f| f.model == model) {
            if !figures.iter().any(|(n, _)| n == &f.figure) {
                figures.push((f.figure.clone(), f.unit.clone()));
            }
        }
        for (figure, unit) in figures {
            let series = [WORKER, LLAMA]
                .iter()
                .map(|p| Series {
                    name: p.to_string(),
                    values: runs
                        .iter()
                        .map(|r| history.find(r, &model, p, &figure).map(point))
                        .collect(),
                })
                .collect::<Vec<_>>();
            let name = format!("history-{}-{}.svg", slug(&model), slug(&figure));
            let title = format!("{model}: {figure} over {} runs", runs.len());
            std::fs::write(
                dir.join(&name),
                svg::line_chart(&title, &unit, &runs, &series),
            )?;
            written.push((name, title));
        }
    }
    Ok(written)
}

/// Appends `run`'s lines to `history` unless a run of that id is there already.
pub fn append_history(run_path: &Path, run: &Records, history: &Path) -> anyhow::Result<bool> {
    let id = run
        .run_ids()
        .first()
        .cloned()
        .context("the run has no records")?;
    if history.exists() && Records::read(history)?.run_ids().contains(&id) {
        return Ok(false);
    }
    let text = std::fs::read_to_string(run_path)?;
    let lines: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .is_some_and(|v| v.get("run").and_then(|r| r.as_str()) == Some(id.as_str()))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(history)?;
    f.write_all(lines.as_bytes())?;
    Ok(true)
}

pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let all = Records::read(&args.run)?;
    let run = all
        .last_run()
        .with_context(|| format!("{} holds no run", args.run.display()))?;
    let charts = args.out.join("charts");
    std::fs::create_dir_all(&charts)?;
    let mut md = markdown(&run);
    md.push_str("\n## Charts\n\n");
    for (name, title) in model_charts(&run, &charts)? {
        let _ = writeln!(md, "![{title}](charts/{name})");
    }
    if let Some(h) = &args.history {
        if args.append && append_history(&args.run, &run, h)? {
            eprintln!("appended the run to {}", h.display());
        }
        if h.exists() {
            md.push_str("\n## History\n\n");
            for (name, title) in history_charts(&Records::read(h)?, &charts)? {
                let _ = writeln!(md, "![{title}](charts/{name})");
            }
        }
    }
    let path = args.out.join("report.md");
    std::fs::write(&path, &md)?;
    print!("{}", markdown(&run));
    eprintln!("wrote {}", path.display());
    Ok(())
}

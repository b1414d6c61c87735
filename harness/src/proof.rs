//! The proof bundle of one run (EXT-002, M0-W-1840):
//! `<root>/<type>/<run_id>/` with `metadata.json`, `seeds.ndjson`, `transcript.ndjson`
//! (every SSE event of every job with its arrival time), `timings.json`, `junit.xml`,
//! `matrix.md`, `matrix.json`, a generated `README.md`, plus named notes (`haiku.json`,
//! parity reports) and the worker logs of failed scenarios under `logs/`.
//! `LLORCH_RUN_ID` names the run; `LLORCH_PROOF_DIR` moves the root.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::budgets::Verdict;
use crate::client::Transcript;
use crate::matrix::Matrix;
use crate::stats::Summary;

/// Where the bundle goes: `--proof-dir`, else `LLORCH_PROOF_DIR`, else `<workspace>/.proof_bundle`.
pub fn bundle_dir(explicit_root: Option<&Path>, workspace: &Path, kind: &str) -> PathBuf {
    let root = explicit_root
        .map(Path::to_path_buf)
        .or_else(|| {
            std::env::var_os("LLORCH_PROOF_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| workspace.join(".proof_bundle"));
    root.join(kind).join(run_id())
}

/// `LLORCH_RUN_ID`, else a UTC timestamp plus our pid.
pub fn run_id() -> String {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        std::env::var("LLORCH_RUN_ID")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| {
                format!(
                    "{}-{}",
                    chrono::Utc::now().format("%Y%m%dT%H%M%SZ"),
                    std::process::id()
                )
            })
    })
    .clone()
}

#[derive(Debug, Default, Serialize)]
struct ScenarioTiming {
    scenario: String,
    seconds: f64,
    outcome: String,
}

#[derive(Debug, Default, Serialize)]
struct Measurement {
    scenario: String,
    name: String,
    unit: String,
    summary: Option<Summary>,
    samples: Vec<f64>,
}

/// Collects a run's evidence; written as it goes (transcripts) and at the end.
pub struct Recorder {
    dir: PathBuf,
    transcript: BufWriter<File>,
    seeds: BufWriter<File>,
    scenarios: Vec<ScenarioTiming>,
    measurements: Vec<Measurement>,
    verdicts: Vec<(String, Verdict)>,
    notes: BTreeMap<String, Vec<Value>>,
}

static RECORDER: OnceLock<Mutex<Recorder>> = OnceLock::new();

impl Recorder {
    /// Opens the bundle directory; the first call wins for the process.
    pub fn open(dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir.join("logs"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let rec = Recorder {
            dir: dir.to_path_buf(),
            transcript: BufWriter::new(File::create(dir.join("transcript.ndjson"))?),
            seeds: BufWriter::new(File::create(dir.join("seeds.ndjson"))?),
            scenarios: Vec::new(),
            measurements: Vec::new(),
            verdicts: Vec::new(),
            notes: BTreeMap::new(),
        };
        let _ = RECORDER.set(Mutex::new(rec));
        Ok(())
    }

    fn with<T>(f: impl FnOnce(&mut Recorder) -> T) -> Option<T> {
        RECORDER.get().map(|m| f(&mut m.lock().unwrap()))
    }

    pub fn dir() -> Option<PathBuf> {
        Self::with(|r| r.dir.clone())
    }

    /// Every event of a job, one line each, plus its seed line.
    pub fn transcript(scenario: &str, request: &Value, t: &Transcript) {
        Self::with(|r| {
            for e in &t.events {
                let line = json!({"scenario": scenario, "job_id": t.job_id, "sent_at": t.sent_at, "at_ms": e.at.as_secs_f64() * 1e3, "event": e.kind, "data": e.data});
                let _ = writeln!(r.transcript, "{line}");
            }
            let started_seed = t.first("started").and_then(|e| e.data.get("seed")).cloned();
            let line = json!({"scenario": scenario, "job_id": t.job_id, "requested_seed": request.get("seed"), "started_seed": started_seed, "temperature": request.get("temperature")});
            let _ = writeln!(r.seeds, "{line}");
        });
    }

    /// A refused `/execute` (no stream), kept in the transcript for completeness.
    pub fn refusal(scenario: &str, job_id: &str, status: u16, body: &str) {
        Self::with(|r| {
            let line = json!({"scenario": scenario, "job_id": job_id, "http_status": status, "body": body});
            let _ = writeln!(r.transcript, "{line}");
        });
    }

    pub fn scenario_finished(scenario: &str, seconds: f64, outcome: &str) {
        Self::with(|r| {
            r.scenarios.push(ScenarioTiming {
                scenario: scenario.into(),
                seconds,
                outcome: outcome.into(),
            })
        });
    }

    pub fn measurement(scenario: &str, name: &str, unit: &str, samples: &[f64]) {
        Self::with(|r| {
            r.measurements.push(Measurement {
                scenario: scenario.into(),
                name: name.into(),
                unit: unit.into(),
                summary: Summary::of(samples),
                samples: samples.to_vec(),
            })
        });
    }

    pub fn verdict(scenario: &str, v: Verdict) {
        Self::with(|r| r.verdicts.push((scenario.into(), v)));
    }

    /// A named piece of evidence (e.g. `haiku`), written at once to `<name>.json` as a list.
    pub fn note(name: &str, value: Value) -> Option<PathBuf> {
        Self::with(|r| {
            let list = r.notes.entry(name.into()).or_default();
            list.push(value);
            let path = r.dir.join(format!("{name}.json"));
            write_json(&path, &Value::Array(list.clone()))
                .ok()
                .map(|_| path)
        })
        .flatten()
    }

    pub fn worker_log(scenario: &str, text: &str) {
        Self::with(|r| {
            let file: String = scenario
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(100)
                .collect();
            let _ = std::fs::write(r.dir.join("logs").join(format!("{file}.log")), text);
        });
    }

    /// Writes everything collected; `matrix` and `metadata` come from the runner.
    pub fn finish(
        metadata: &Value,
        matrix: &Matrix,
        readme_extra: &str,
    ) -> Result<Option<PathBuf>> {
        let Some(m) = RECORDER.get() else {
            return Ok(None);
        };
        let mut r = m.lock().unwrap();
        r.transcript.flush()?;
        r.seeds.flush()?;
        let dir = r.dir.clone();
        write_json(&dir.join("metadata.json"), metadata)?;
        let verdicts: Vec<Value> = r
            .verdicts
            .iter()
            .map(|(s, v)| json!({"scenario": s, "verdict": v}))
            .collect();
        write_json(
            &dir.join("timings.json"),
            &json!({"scenarios": r.scenarios, "measurements": r.measurements, "budgets": verdicts}),
        )?;
        write_json(&dir.join("matrix.json"), &serde_json::to_value(matrix)?)?;
        std::fs::write(dir.join("matrix.md"), matrix.markdown())?;
        std::fs::write(
            dir.join("README.md"),
            readme(metadata, matrix, &r, readme_extra),
        )?;
        Ok(Some(dir))
    }
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

fn readme(meta: &Value, matrix: &Matrix, r: &Recorder, extra: &str) -> String {
    let g = |k: &str| {
        meta.get(k)
            .filter(|v| !v.is_null())
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string())
            })
            .unwrap_or_else(|| "none".into())
    };
    let missed: Vec<String> = r
        .verdicts
        .iter()
        .filter(|(_, v)| !v.met)
        .map(|(s, v)| {
            format!(
                "- {}: {} = {:.3} against {} ({:?}, slack {})",
                s, v.key, v.measured, v.budget, v.bound, v.slack
            )
        })
        .collect();
    format!(
        "# Conformance proof bundle `{run}`\n\n\
         Generated by `harness suite`. Worker `{worker}` ({version}; workspace commit {commit}), backend `{backend}`, \
         model `{model}` (sha256 `{sha}`), GPU {gpu}, tags `{tags}`.\n\n\
         **Result:** {summary}.\n\n\
         ## Files\n\
         - `metadata.json`: worker, commit, model and hash, backend, GPU and driver, run options.\n\
         - `seeds.ndjson`: one line per job: requested seed and the seed `started` reported.\n\
         - `transcript.ndjson`: every SSE event of every job (`at_ms` from the request), and refused requests.\n\
         - `timings.json`: scenario durations, measurements (p50/p95/p99) and budget verdicts.\n\
         - `junit.xml`: the cucumber run as JUnit.\n\
         - `matrix.md`, `matrix.json`: requirement ID -> scenario -> passed/failed/skipped/pending.\n\
         - `logs/`: the worker's log for each failed scenario; other `*.json` files are named evidence (haiku, parity).\n\n\
         ## Budgets missed\n{missed}\n\n\
         ## Measured figures\n{figures}\n\n\
         {extra}\n## Requirement matrix\n\n{table}",
        run = g("run_id"),
        worker = g("worker_bin"),
        version = g("worker_version"),
        commit = g("workspace_commit"),
        backend = g("backend"),
        model = g("model_file"),
        sha = g("model_sha256"),
        gpu = g("gpu"),
        tags = g("tags"),
        summary = matrix.summary(),
        missed = if missed.is_empty() { "none".to_owned() } else { missed.join("\n") },
        figures = figures_md(&r.measurements),
        table = matrix.markdown(),
    )
}

/// One line per measurement: a single sample as its value (e.g. M0-W-1221's
/// peak RssAnon), several as p50/p95/max.
fn figures_md(measurements: &[Measurement]) -> String {
    let lines: Vec<String> = measurements
        .iter()
        .filter_map(|m| {
            let s = m.summary.as_ref()?;
            let value = if s.n == 1 {
                format!("{:.3} {}", s.p50, m.unit)
            } else {
                format!(
                    "p50 {:.3}, p95 {:.3}, max {:.3} {} (n = {})",
                    s.p50, s.p95, s.max, m.unit, s.n
                )
            };
            Some(format!("- {}: `{}` = {value}", m.scenario, m.name))
        })
        .collect();
    if lines.is_empty() {
        "none".to_owned()
    } else {
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurement(name: &str, unit: &str, samples: &[f64]) -> Measurement {
        Measurement {
            scenario: "A 2 GB model loads".into(),
            name: name.into(),
            unit: unit.into(),
            summary: Summary::of(samples),
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn measured_figures_show_their_values() {
        let md = figures_md(&[
            measurement("load_peak_rss_anon_mib", "MiB", &[87.25]),
            measurement("ttft_ms", "ms", &[1.0, 2.0, 3.0]),
        ]);
        assert_eq!(
            md,
            "- A 2 GB model loads: `load_peak_rss_anon_mib` = 87.250 MiB\n\
             - A 2 GB model loads: `ttft_ms` = p50 2.000, p95 3.000, max 3.000 ms (n = 3)"
        );
        assert_eq!(figures_md(&[]), "none");
    }

    #[test]
    fn the_root_moves_with_the_explicit_dir() {
        let d = bundle_dir(Some(Path::new("/tmp/x")), Path::new("/w"), "conformance");
        assert!(d.starts_with("/tmp/x/conformance"));
        assert_eq!(d.file_name().unwrap().to_string_lossy(), run_id());
    }
}

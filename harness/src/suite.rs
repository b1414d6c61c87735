//! `harness suite`: checks coverage, runs the selected scenarios one at a time
//! against the worker binary, and writes the proof bundle with its requirement matrix.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cucumber::event::ScenarioFinished;
use cucumber::writer::{self, Coloring};
use cucumber::{World as _, WriterExt as _};
use futures::FutureExt as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::budgets::BudgetFile;
use crate::catalogue::{self, Plan, Selection};
use crate::matrix::{self, Outcome, RunResult};
use crate::proof::{self, Recorder};
use crate::world::{install_config, SuiteConfig, TestWorld};

/// Options of `harness suite`, which are its command-line flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Worker binary under test (default: $WORKER_BIN, else the newest target/{release,debug}/worker-orcd).
    #[arg(long)]
    pub worker: Option<PathBuf>,
    /// Backend to launch the worker with; `@cuda` scenarios need `cuda` and a GPU.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Reference model (default: .models/smollm2-135m-instruct-q4_1.gguf).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tag expression. The default leaves out the slow `@bench` scenarios (CI runs it so);
    /// `--tags @bench` runs the budgets, `--tags ''` everything.
    #[arg(long, default_value = "not @bench")]
    pub tags: String,
    /// Proof bundle root (default: $LLORCH_PROOF_DIR, else <workspace>/.proof_bundle).
    #[arg(long)]
    pub proof_dir: Option<PathBuf>,
    /// Workspace root (default: found from the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Requirement catalogue (default: ../shared/REQUIREMENTS.md, else testdata/REQUIREMENTS.md).
    #[arg(long)]
    pub requirements: Option<PathBuf>,
    /// Budgets file (default: <workspace>/budgets.yaml).
    #[arg(long)]
    pub budgets: Option<PathBuf>,
    /// Also run `@pending:<capability>` scenarios selected by --tags (still reported pending).
    #[arg(long)]
    pub run_pending: bool,
    /// Seconds to wait for a worker to become healthy.
    #[arg(long, default_value_t = 120)]
    pub start_timeout_s: u64,
}

impl Options {
    /// The tag expression, if any (an empty `--tags` selects everything).
    fn tag_expr(&self) -> Option<&str> {
        Some(self.tags.as_str()).filter(|t| !t.trim().is_empty())
    }
}

/// Where `ci/fetch-model` puts the reference model.
pub fn default_model(workspace: &Path) -> PathBuf {
    workspace.join(".models/smollm2-135m-instruct-q4_1.gguf")
}

/// The workspace root: the nearest ancestor of the current directory with `features/`
/// and a `Cargo.toml`, else this crate's parent.
pub fn find_workspace(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return absolute(p);
    }
    let mut dir = std::env::current_dir().ok();
    while let Some(d) = dir {
        if d.join("features").is_dir() && d.join("Cargo.toml").is_file() {
            return d;
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    })
}

/// Requirements the project added from its issues, always read after the catalogue.
pub const PROJECT_REQUIREMENTS: &str = "testdata/REQUIREMENTS-project.md";

/// `--requirements`, else `../shared/REQUIREMENTS.md` beside the workspace, else the copy in `testdata/`.
pub fn requirements_path(workspace: &Path, explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return absolute(p);
    }
    let shared = workspace.join("../shared/REQUIREMENTS.md");
    if shared.is_file() {
        return absolute(&shared);
    }
    workspace.join("testdata/REQUIREMENTS.md")
}

/// The catalogue the suite checks against: `requirements`, then the
/// project's own requirements (from its issues) from [`PROJECT_REQUIREMENTS`].
pub fn catalogue_text(workspace: &Path, requirements: &Path) -> Result<String> {
    let mut text = std::fs::read_to_string(requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let project = workspace.join(PROJECT_REQUIREMENTS);
    text.push('\n');
    text.push_str(
        &std::fs::read_to_string(&project)
            .with_context(|| format!("reading {}", project.display()))?,
    );
    Ok(text)
}

/// Fails (with every problem listed) when an ID lacks its scenario or a scenario carries an unknown ID.
pub fn coverage(
    workspace: &Path,
    requirements: &Path,
) -> Result<(Vec<catalogue::Requirement>, Vec<catalogue::ScenarioInfo>)> {
    let text = catalogue_text(workspace, requirements)?;
    let reqs = catalogue::parse_requirements(&text)?;
    let scenarios = catalogue::parse_features(&workspace.join("features"))?;
    let cov = catalogue::check_coverage(&reqs, &scenarios);
    if !cov.problems.is_empty() {
        bail!(
            "coverage check failed against {} ({} problems):\n{}",
            requirements.display(),
            cov.problems.len(),
            cov.problems.join("\n")
        );
    }
    println!(
        "coverage: {} requirements, {} scenarios, every ID traced once ({})",
        cov.requirements,
        cov.scenarios,
        requirements.display()
    );
    Ok((reqs, scenarios))
}

/// GPUs nvidia-smi lists (0 when it is absent or fails).
pub fn gpu_count() -> u32 {
    Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count() as u32
        })
        .unwrap_or(0)
}

pub fn gpu_present() -> bool {
    gpu_count() > 0
}

/// The worker binary and the model a run drives: the flags' (`worker`,
/// `model`), else the defaults ($WORKER_BIN or the newest build; the
/// reference model); both must exist.
pub fn worker_and_model(
    workspace: &Path,
    worker: Option<&Path>,
    model: Option<&Path>,
) -> Result<(PathBuf, PathBuf)> {
    let worker_bin = absolute(&worker.map_or_else(|| default_worker(workspace), Path::to_path_buf));
    if !worker_bin.is_file() {
        bail!("no worker binary at {} (build it with `cargo build --release -p worker-orcd`, or pass --worker / WORKER_BIN)", worker_bin.display());
    }
    let model = absolute(&model.map_or_else(|| default_model(workspace), Path::to_path_buf));
    if !model.is_file() {
        bail!("no model at {} (run ci/fetch-model)", model.display());
    }
    Ok((worker_bin, model))
}

fn default_worker(workspace: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("WORKER_BIN").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let candidates = [
        target.join("release/worker-orcd"),
        target.join("debug/worker-orcd"),
    ];
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p.clone())))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| candidates[0].clone())
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn output_of(cmd: &mut Command) -> Option<String> {
    cmd.output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

fn metadata(cfg: &SuiteConfig, opts: &Options) -> Value {
    let git = |args: &[&str]| output_of(Command::new("git").args(args).current_dir(&cfg.workspace));
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    let gpu = output_of(Command::new("nvidia-smi").args([
        "--query-gpu=name,driver_version,memory.total",
        "--format=csv,noheader",
    ]));
    json!({
        "run_id": proof::run_id(),
        "started_at": chrono::Utc::now().to_rfc3339(),
        "harness_version": env!("CARGO_PKG_VERSION"),
        "worker_bin": cfg.worker_bin,
        "worker_version": output_of(Command::new(&cfg.worker_bin).arg("--version")),
        "workspace_commit": git(&["rev-parse", "HEAD"]).map(|c| if dirty { format!("{c}-dirty") } else { c }),
        "branch": git(&["rev-parse", "--abbrev-ref", "HEAD"]),
        "model_file": cfg.model,
        "model_sha256": sha256_file(&cfg.model).ok(),
        "backend": cfg.backend,
        "gpu": gpu,
        "gpu_count": cfg.gpu_count,
        "tags": opts.tag_expr(),
        "run_pending": opts.run_pending,
        "requirements": cfg.requirements,
        "budgets": cfg.budgets_path,
        "host": output_of(&mut Command::new("hostname")),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    })
}

/// Runs the suite; returns the process exit code.
pub async fn run(opts: Options) -> Result<i32> {
    let workspace = find_workspace(opts.workspace.as_deref());
    let requirements = requirements_path(&workspace, opts.requirements.as_deref());
    let (reqs, scenarios) = coverage(&workspace, &requirements)?;

    if !["cpu", "cuda"].contains(&opts.backend.as_str()) {
        bail!("--backend must be cpu or cuda");
    }
    let (worker_bin, model) =
        worker_and_model(&workspace, opts.worker.as_deref(), opts.model.as_deref())?;
    let budgets_path = absolute(
        &opts
            .budgets
            .clone()
            .unwrap_or_else(|| workspace.join("budgets.yaml")),
    );
    let budgets = BudgetFile::load(&budgets_path)?;
    let gpu_count = gpu_count();
    let gpu = opts.backend == "cuda" && gpu_count > 0;
    let bundle = proof::bundle_dir(opts.proof_dir.as_deref(), &workspace, "conformance");
    Recorder::open(&bundle)?;
    let cfg = SuiteConfig {
        workspace: workspace.clone(),
        worker_bin,
        backend: opts.backend.clone(),
        model,
        gpu,
        gpu_count,
        budgets,
        budgets_path,
        fixtures_dir: std::env::temp_dir().join(format!("harness-fixtures-{}", proof::run_id())),
        golden_dir: workspace.join("testdata/golden"),
        requirements: requirements.clone(),
        start_timeout: Duration::from_secs(opts.start_timeout_s),
    };
    let meta = metadata(&cfg, &opts);
    let fixtures_dir = cfg.fixtures_dir.clone();
    install_config(cfg);

    let selection = Selection::new(opts.tag_expr(), gpu, opts.run_pending)?;
    let selected: usize = scenarios
        .iter()
        .flat_map(|s| &s.expansions)
        .filter(|e| selection.plan(&e.tags) == Plan::Run)
        .count();
    println!(
        "backend {}, GPU {}, {selected} scenario runs selected; proof bundle: {}",
        opts.backend,
        if gpu { "yes" } else { "no" },
        bundle.display()
    );

    let results: Arc<Mutex<Vec<RunResult>>> = Arc::default();
    let sink = results.clone();
    let junit = std::fs::File::create(bundle.join("junit.xml"))?;
    let filter_sel = selection.clone();
    let writer = TestWorld::cucumber()
        .max_concurrent_scenarios(1)
        .before(|feature, _rule, scenario, world| {
            async move {
                let file = feature
                    .path
                    .as_ref()
                    .and_then(|p| p.file_name())
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                world.scenario = format!("{file}:{} {}", scenario.position.line, scenario.name);
                world.began = std::time::Instant::now();
            }
            .boxed_local()
        })
        .after(move |feature, _rule, scenario, finished, world| {
            let sink = sink.clone();
            async move {
                let outcome = match finished {
                    ScenarioFinished::StepPassed => Outcome::Passed,
                    ScenarioFinished::StepSkipped => Outcome::StepsSkipped,
                    ScenarioFinished::StepFailed(_, _, e) => {
                        Outcome::Failed(first_line(&e.to_string()))
                    }
                    ScenarioFinished::BeforeHookFailed(_) => {
                        Outcome::Failed("the before hook failed".into())
                    }
                };
                let mut seconds = 0.0;
                if let Some(w) = world {
                    seconds = w.began.elapsed().as_secs_f64();
                    if outcome != Outcome::Passed {
                        for (label, worker) in [
                            ("worker", w.process.worker.as_ref()),
                            ("second worker", w.process.second.as_ref()),
                        ] {
                            if let Some(worker) = worker {
                                let log = worker.log_text();
                                println!(
                                    "---- {label} log ({}) ----\n{}\n---- end of {label} log ----",
                                    worker.launch.command_line(),
                                    crate::world::tail(&log, 60)
                                );
                                Recorder::worker_log(&format!("{} {label}", w.scenario), &log);
                            }
                        }
                    }
                    w.stop_all().await;
                    let _ = std::fs::remove_dir_all(&w.scratch);
                }
                let word = match &outcome {
                    Outcome::Passed => "passed",
                    Outcome::Failed(_) => "failed",
                    Outcome::StepsSkipped => "skipped steps",
                };
                Recorder::scenario_finished(&scenario.name, seconds, word);
                let file = feature.path.clone().unwrap_or_default();
                sink.lock().unwrap().push(RunResult {
                    file,
                    line: scenario.position.line,
                    name: scenario.name.clone(),
                    outcome,
                    seconds,
                });
            }
            .boxed_local()
        })
        .with_writer(
            writer::Basic::raw(std::io::stdout(), Coloring::Never, 0)
                .summarized()
                .tee::<TestWorld, _>(writer::JUnit::for_tee(junit, 0))
                .normalized(),
        )
        .fail_on_skipped_with(|_, _, sc| !sc.tags.iter().any(|t| t == "allow-skip"))
        .with_default_cli()
        .filter_run(workspace.join("features"), move |_, _, sc| {
            filter_sel.plan(&sc.tags) == Plan::Run
        })
        .await;

    let failed_run = {
        use cucumber::writer::Stats as _;
        writer.execution_has_failed()
    };
    let results = results.lock().unwrap().clone();
    let m = matrix::build(&reqs, &scenarios, &selection, &results, &workspace);
    let extra = format!(
        "Selected scenario runs: {selected}; finished: {}.\n",
        results.len()
    );
    let dir = Recorder::finish(&meta, &m, &extra)?.ok_or_else(|| anyhow!("no proof bundle"))?;
    let _ = std::fs::remove_dir_all(&fixtures_dir);
    println!("\nrequirement matrix: {}", m.summary());
    for r in m.rows.iter().filter(|r| r.status == matrix::Status::Failed) {
        println!("  FAILED {}: {}", r.id, r.reason.as_deref().unwrap_or(""));
    }
    println!("proof bundle: {}", dir.display());
    let failed = failed_run || m.rows.iter().any(|r| r.status == matrix::Status::Failed);
    Ok(if failed { 1 } else { 0 })
}

fn first_line(s: &str) -> String {
    s.lines().take(12).collect::<Vec<_>>().join(" / ")
}

#[cfg(test)]
mod tests {
    use cucumber::feature::Ext as _;
    use cucumber::gherkin::{Feature, GherkinEnv};
    use cucumber::World as _;

    use crate::world::TestWorld;

    /// Every step of every feature matches exactly one definition (no skipped or ambiguous steps).
    #[test]
    fn every_feature_step_has_one_definition() {
        let steps = TestWorld::collection();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../features");
        let mut bad = Vec::new();
        let mut checked = 0;
        for file in crate::catalogue::feature_files(&dir).unwrap() {
            let f = Feature::parse_path(&file, GherkinEnv::default())
                .unwrap()
                .expand_examples()
                .unwrap();
            let scenarios = f
                .scenarios
                .iter()
                .chain(f.rules.iter().flat_map(|r| r.scenarios.iter()));
            for sc in scenarios {
                for st in f
                    .background
                    .iter()
                    .flat_map(|b| b.steps.iter())
                    .chain(sc.steps.iter())
                {
                    checked += 1;
                    match steps.find(st) {
                        Ok(Some(_)) => {}
                        Ok(None) => bad.push(format!(
                            "{}:{} undefined: {:?} {}",
                            file.display(),
                            st.position.line,
                            st.ty,
                            st.value
                        )),
                        Err(e) => bad.push(format!(
                            "{}:{} ambiguous: {} ({e})",
                            file.display(),
                            st.position.line,
                            st.value
                        )),
                    }
                }
            }
        }
        assert!(checked > 400, "only {checked} steps checked");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}

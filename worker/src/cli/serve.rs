//! Serve mode: start-up in the order of M0-W-1110, serving, and graceful
//! shutdown (M0-W-1340).
//!
//! 1. check the flags (the model file is readable, the port is free);
//! 2. initialise the backend and load the model and tokenizer, logging
//!    `model_load_progress` at 0/25/50/75/100 %;
//! 3. start the engine thread, bind HTTP, log `ready`, and POST the ready
//!    callback when `--callback-url` is given.
//!
//! Nothing listens before the model is loaded. A failed start logs one
//! `error` record (code, message, GPU, model path and, for lack of memory,
//! bytes needed and free) and exits 1; what was allocated is dropped first.
//!
//! Shutdown (`POST /shutdown`, SIGTERM or Ctrl-C): `/execute` answers 503
//! `SHUTTING_DOWN` at once; queued jobs end with `CANCELLED` (retriable); the
//! running job gets `--shutdown-grace-sec`, then is cancelled; the engine
//! thread drops the backend; open streams end; exit 0. A watchdog exits the
//! process if all this has not finished within [`SHUTDOWN_WATCHDOG`].
//!
//! A lost GPU (issue #47: a kernel fault or another sticky CUDA error) ends
//! every job with `INFERENCE_FAILED` (retriable), `/health` turns unhealthy,
//! and the same shutdown runs at once, ending in exit [`DEVICE_LOST_EXIT`] so
//! that a supervisor restarts the worker.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::CommandFactory;

use crate::backend::{BackendError, BackendKind};
use crate::cli::config::{self, ConfigError, Fallbacks, ServeArgs, ServeConfig};
use crate::cli::Cli;
use crate::constraint::Compiler;
use crate::engine::load_error_code;
use crate::engine::parity::{ParitySender, ParityWriter};
use crate::engine::runner::EngineParts;
use crate::engine::{Engine, EngineConfig, EngineStatus};
use crate::load::{load_model, LoadError, LoadOptions, LoadProgress, LoadedModel};
use crate::narrate;
use crate::server::{AppInner, AppState, Caps, Constraints, Limits, ModelFacts, Shutdown};
use crate::telemetry::logging::{self, LogContext};
use crate::telemetry::metrics::{Experts, InfoLabels, Metrics};
use crate::tokenizer::Tokenizer;

/// The outer limit on a graceful shutdown; M0-W-1340 allows 30 s.
pub const SHUTDOWN_WATCHDOG: Duration = Duration::from_secs(25);
/// The exit status after the GPU was lost.
pub const DEVICE_LOST_EXIT: u8 = 3;
/// How often serving looks whether the engine lost the device.
const DEVICE_WATCH: Duration = Duration::from_millis(100);
/// Timeout of the ready callback's POST.
pub const CALLBACK_TIMEOUT: Duration = Duration::from_secs(10);

/// What a failed start logs, once (M0-W-1111).
struct StartFailure<'a> {
    code: &'a str,
    message: String,
    flag: Option<&'static str>,
    model_path: String,
    vram: Option<(u64, u64)>,
}

fn start_failed(f: StartFailure<'_>) -> ExitCode {
    narrate!(
        error,
        "error",
        code = f.code,
        message = %f.message,
        flag = f.flag,
        model_path = %f.model_path,
        vram_needed_bytes = f.vram.map(|v| v.0),
        vram_free_bytes = f.vram.map(|v| v.1),
    );
    // The record is the one report: a line of text on a terminal, JSON
    // otherwise (issue 48: every start-up error printed once).
    ExitCode::FAILURE
}

/// The requests' limits for the loaded model's `context` (the effective
/// one); a `--max-tokens-out` that leaves no room for a prompt is refused
/// before the worker is ready.
fn limits(
    cfg: &ServeConfig,
    vocab_size: usize,
    context: usize,
) -> Result<Limits, StartFailure<'static>> {
    if let Some(n) = cfg.max_tokens_out.filter(|&n| n >= context) {
        return Err(StartFailure {
            code: "INVALID_CONFIG",
            message: format!(
                "--max-tokens-out {n} leaves no room for a prompt in the {context}-token context \
                 (at most {}; a longer context needs --ctx-size)",
                context - 1
            ),
            flag: Some("--max-tokens-out"),
            model_path: cfg.model.display().to_string(),
            vram: None,
        });
    }
    let max_tokens_in = cfg.max_tokens_in.unwrap_or(context).min(context);
    Ok(Limits {
        execute: Caps::execute(cfg.max_prompt_chars, cfg.max_tokens_out),
        v1: Caps::v1(cfg.max_prompt_chars, cfg.max_tokens_out),
        ..Limits::new(max_tokens_in, vocab_size, context)
    })
}

/// Runs the worker until it is shut down; `fallbacks` stand in for required
/// flags given nowhere (none on the orchestrator's command line).
pub fn run(args: ServeArgs, fallbacks: &Fallbacks) -> ExitCode {
    logging::init(config::log_format(&args));
    let raw_model = args
        .model
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    // Until the configuration is resolved, records carry the raw flags.
    logging::set_context(LogContext {
        worker_id: args.worker_id.clone().unwrap_or_default(),
        model_ref: raw_model.clone(),
        gpu_device: args.gpu_device.unwrap_or(0) as u64,
        backend: args
            .options
            .backend
            .unwrap_or(config::DEFAULT_BACKEND)
            .as_str()
            .into(),
    });
    let cfg = match config::resolve_with(args, fallbacks) {
        Ok(cfg) => cfg,
        Err(e @ ConfigError::Missing(_)) => Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                e.to_string(),
            )
            .exit(),
        Err(e @ ConfigError::Invalid { flag, .. }) => {
            let code = if flag == "--model" {
                "MODEL_LOAD_FAILED"
            } else {
                "INVALID_CONFIG"
            };
            return start_failed(StartFailure {
                code,
                message: e.to_string(),
                flag: Some(flag),
                model_path: raw_model,
                vram: None,
            });
        }
    };
    logging::set_context(LogContext {
        worker_id: cfg.worker_id.clone(),
        model_ref: cfg.model.display().to_string(),
        gpu_device: cfg.gpu_device as u64,
        backend: cfg.backend.as_str().into(),
    });
    narrate!(
        info,
        "startup",
        version = env!("CARGO_PKG_VERSION"),
        host = %cfg.host,
        port = cfg.port,
        queue_depth = cfg.queue_depth,
        parallel = cfg.parallel,
        ctx_size = cfg.ctx_size,
        max_tokens_in = cfg.max_tokens_in,
        max_tokens_out = cfg.max_tokens_out,
        max_prompt_chars = cfg.max_prompt_chars,
        inference_timeout_sec = cfg.inference_timeout.as_secs(),
        parity_log = cfg.parity_log.is_some(),
    );

    let model = match load(&cfg) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let LoadedModel {
        backend,
        tokenizer,
        info,
        config: model_config,
    } = model;
    let device = backend.device().clone();
    let kv = backend.kv_layout();
    let vram_bytes = backend.memory_use().total();
    let metrics = Arc::new(Metrics::new(
        InfoLabels {
            model: model_file_name(&cfg.model),
            quant_kind: info.quant_kind.clone(),
            backend: cfg.backend.as_str().into(),
            architecture: info.architecture.clone(),
            tokenizer_kind: tokenizer.kind().as_str().into(),
        },
        model_config.moe.map(|m| Experts {
            count: m.count,
            active: m.used,
        }),
    ));

    let mut parity_writer = None;
    let mut parity_sender: Option<ParitySender> = None;
    if let Some(path) = &cfg.parity_log {
        match ParityWriter::spawn(path, metrics.parity_dropped_counter()) {
            Ok((sender, writer)) => {
                parity_sender = Some(sender);
                parity_writer = Some(writer);
            }
            Err(e) => {
                return start_failed(StartFailure {
                    code: "INVALID_CONFIG",
                    message: format!("--parity-log: cannot create {}: {e}", path.display()),
                    flag: Some("--parity-log"),
                    model_path: cfg.model.display().to_string(),
                    vram: None,
                })
            }
        }
    }

    let limits = match limits(&cfg, info.vocab_size, info.context_length) {
        Ok(limits) => limits,
        Err(f) => return start_failed(f),
    };
    let status = Arc::new(EngineStatus::new(vram_bytes, false));
    let engine = match Engine::start(
        EngineConfig {
            queue_depth: cfg.queue_depth,
            inference_timeout: cfg.inference_timeout,
            residency_check: Some(cfg.residency_check),
        },
        EngineParts {
            backend,
            tokenizer: tokenizer.clone(),
            metrics: metrics.clone(),
            status,
            parity: parity_sender,
        },
    ) {
        Ok(engine) => engine,
        Err(e) => {
            return start_failed(StartFailure {
                code: "INTERNAL",
                message: format!("cannot start the engine thread: {e}"),
                flag: None,
                model_path: cfg.model.display().to_string(),
                vram: None,
            })
        }
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("http")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            engine.shutdown(Duration::ZERO);
            return start_failed(StartFailure {
                code: "INTERNAL",
                message: format!("cannot start the async runtime: {e}"),
                flag: None,
                model_path: cfg.model.display().to_string(),
                vram: None,
            });
        }
    };
    let constraints = constraint_compiler(tokenizer.clone(), info.vocab_size);
    let state = AppState::new(AppInner {
        engine: engine.handle(),
        constraints,
        tokenizer,
        model: ModelFacts {
            worker_id: cfg.worker_id.clone(),
            model_ref: model_file_name(&cfg.model),
            info,
            device,
            kv,
        },
        limits,
        metrics,
        shutdown: Shutdown::default(),
        started: Instant::now(),
    });
    let code = runtime.block_on(serve(&cfg, state, engine, vram_bytes));
    if let Some(writer) = parity_writer {
        writer.join();
    }
    // Leave stuck blocking tasks (none expected) behind rather than hang.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

/// The compiler of constrained requests over the model's vocabulary, built
/// on a thread of its own from start-up (hundreds of milliseconds and tens of
/// MB for a large vocabulary), so that readiness does not wait for it and a
/// request's first schema costs only its own compilation. A vocabulary it
/// cannot take leaves the worker serving, and refusing constraints.
fn constraint_compiler(tokenizer: Arc<Tokenizer>, n_vocab: usize) -> Constraints {
    let cell: Constraints = Arc::default();
    let filled = cell.clone();
    let built = std::thread::Builder::new()
        .name("constraints".into())
        .spawn(move || {
            let t = Instant::now();
            let result = match Compiler::new(&tokenizer, n_vocab) {
                Ok(c) => {
                    let ms = t.elapsed().as_millis() as u64;
                    narrate!(info, "constraints_ready", vocab = n_vocab, ms = ms);
                    Ok(Arc::new(c))
                }
                Err(e) => {
                    narrate!(warn, "constraints_unavailable", vocab = n_vocab, reason = %e);
                    Err(e.to_string())
                }
            };
            let _ = filled.set(result);
        });
    if let Err(e) = built {
        let _ = cell.set(Err(format!("its thread did not start: {e}")));
    }
    cell
}

/// Steps 2 of start-up: backend and model, with progress records.
fn load(cfg: &ServeConfig) -> Result<LoadedModel, ExitCode> {
    let model_path = cfg.model.display().to_string();
    narrate!(info, "model_load_start", model_path = %model_path, upload_chunk_bytes = cfg.upload_chunk_bytes);
    let started = Instant::now();
    let opts = LoadOptions {
        backend: cfg.backend,
        gpu_device: cfg.gpu_device,
        kv_cache_size_mb: cfg.kv_cache_size_mb,
        kv_type: cfg.kv_type,
        upload_chunk_bytes: cfg.upload_chunk_bytes,
        max_context: cfg.max_context(),
        chat_template: cfg.chat_template.clone(),
        tokenizer: cfg.tokenizer,
        parallel: cfg.parallel,
        prefix_cache: cfg.prefix_cache,
    };
    let mut report = |p: LoadProgress| {
        narrate!(
            info,
            "model_load_progress",
            percent = p.percent as u64,
            bytes_done = p.bytes_done,
            bytes_total = p.bytes_total,
        );
    };
    match load_model(&cfg.model, &opts, &mut report) {
        Ok(mut model) => {
            let warm = Instant::now();
            if let Err(e) = model.backend.warm_up() {
                // Not fatal: the first job then pays for what it would have done.
                narrate!(warn, "warm_up_failed", message = %e.to_string());
            }
            narrate!(
                info,
                "model_load_complete",
                vram_bytes = model.backend.memory_use().total(),
                load_ms = started.elapsed().as_millis() as u64,
                warm_up_ms = warm.elapsed().as_millis() as u64,
                model_name = %model.info.name,
                architecture = %model.info.architecture,
                quant_kind = %model.info.quant_kind,
                tensor_bytes = model.info.tensor_bytes,
                context_length = model.info.context_length,
                vocab_size = model.info.vocab_size,
                tokenizer_kind = model.tokenizer.kind().as_str(),
                device = %model.backend.device().name,
            );
            Ok(model)
        }
        Err(e) => Err(start_failed(StartFailure {
            code: load_error_code(&e, cfg.backend).as_str(),
            message: load_failure_message(&e, cfg),
            flag: load_failure_flag(&e),
            model_path,
            vram: e.vram(),
        })),
    }
}

fn load_failure_flag(e: &LoadError) -> Option<&'static str> {
    match e {
        LoadError::Backend(BackendError::InvalidDevice(_)) => Some("--gpu-device"),
        LoadError::Backend(BackendError::DeviceNotFound(_)) => Some("--backend"),
        _ => None,
    }
}

fn load_failure_message(e: &LoadError, cfg: &ServeConfig) -> String {
    let message = e.to_string();
    match e {
        LoadError::Backend(BackendError::InvalidDevice(_)) => {
            format!("--gpu-device {}: {message}", cfg.gpu_device)
        }
        LoadError::Backend(BackendError::DeviceNotFound(_))
            if cfg.backend == BackendKind::Cuda && !message.contains("--backend cpu") =>
        {
            format!("{message}; use --backend cpu to run on the CPU")
        }
        _ => message,
    }
}

/// Step 3 and the serving life: bind, announce, serve, shut down.
async fn serve(cfg: &ServeConfig, state: AppState, engine: Engine, vram_bytes: u64) -> ExitCode {
    // Signal handlers go in before the port opens, so a client that can
    // connect can also stop the worker gracefully.
    let signals = match Signals::register() {
        Ok(s) => s,
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || engine.shutdown(Duration::ZERO)).await;
            return start_failed(StartFailure {
                code: "INTERNAL",
                message: format!("cannot install signal handlers: {e}"),
                flag: None,
                model_path: cfg.model.display().to_string(),
                vram: None,
            });
        }
    };
    let addr = SocketAddr::new(cfg.host, cfg.port);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || engine.shutdown(Duration::ZERO)).await;
            return start_failed(StartFailure {
                code: "INVALID_CONFIG",
                message: format!("--port: cannot listen on {addr}: {e}"),
                flag: Some("--port"),
                model_path: cfg.model.display().to_string(),
                vram: None,
            });
        }
    };
    let uri = format!("http://{addr}");
    let shutdown = state.shutdown.clone();
    tokio::spawn(signals.wait(shutdown.clone()));
    // Before `ready`: whoever waits for it (a supervisor, the tests) has the warning too.
    warn_if_open(cfg);
    narrate!(info, "ready", vram_bytes, uri = %uri, queue_depth = cfg.queue_depth, "worker ready");
    if let Some(url) = cfg.callback_url.clone() {
        let body = serde_json::json!({
            "worker_id": cfg.worker_id,
            "model_ref": cfg.model.display().to_string(),
            "vram_bytes": vram_bytes,
            "uri": uri,
        });
        tokio::spawn(ready_callback(url, body));
    }

    let watchdog_signal = shutdown.clone();
    let watched = state.clone();
    tokio::spawn(async move {
        watchdog_signal.triggered().await;
        start_watchdog(watched);
    });
    tokio::spawn(watch_device(state.clone()));
    #[cfg(feature = "fault-injection")]
    tokio::spawn(arm_fault_on_sigusr1());
    let lost = state.clone();
    let served = crate::server::serve_with(listener, state, engine, cfg.shutdown_grace, &cfg.http);
    let served = served.await;
    if lost.engine.status().device_lost() {
        return ExitCode::from(DEVICE_LOST_EXIT);
    }
    match served {
        Ok(outcome) => {
            narrate!(
                info,
                "shutdown",
                phase = "complete",
                reason = outcome.reason,
                elapsed_ms = outcome.drain.as_millis() as u64,
                running_job_cancelled = outcome.running_job_cancelled,
                "worker stopped"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            narrate!(error, "error", code = "INTERNAL", message = %format!("the HTTP server failed: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// What clients see of the model (`/health`, `/metrics`, `started`): its file
/// name; the path says how the host is laid out and stays in the log.
fn model_file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Issue #15: anyone who can reach a non-loopback address can run jobs
/// and stop the worker unless a key is required.
fn warn_if_open(cfg: &ServeConfig) {
    if cfg.http.api_key.is_none() && !cfg.host.is_loopback() {
        narrate!(
            warn,
            "startup",
            host = %cfg.host,
            message = "listening on a non-loopback address without --api-key: every client that can reach it may run jobs and stop the worker",
        );
    }
}

/// SIGTERM and SIGINT, registered at once.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Triggers the shutdown on the first signal.
    async fn wait(mut self, shutdown: Shutdown) {
        let reason = tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        };
        shutdown.trigger(reason);
    }
}

fn start_watchdog(state: AppState) {
    let _ = std::thread::Builder::new().name("shutdown-watchdog".into()).spawn(move || {
        std::thread::sleep(SHUTDOWN_WATCHDOG);
        narrate!(
            error,
            "error",
            code = "INTERNAL",
            message = %format!("graceful shutdown did not finish within {} s; exiting", SHUTDOWN_WATCHDOG.as_secs()),
        );
        let lost = state.engine.status().device_lost();
        std::process::exit(if lost { i32::from(DEVICE_LOST_EXIT) } else { 0 });
    });
}

/// Test builds (feature `fault-injection`, issue #47): each SIGUSR1 makes the
/// next kernel launch fail as a kernel fault does.
#[cfg(feature = "fault-injection")]
async fn arm_fault_on_sigusr1() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        return;
    };
    while usr1.recv().await.is_some() {
        narrate!(
            warn,
            "fault_injection",
            message = "SIGUSR1: the next kernel launch fails"
        );
        crate::backend::cuda::fault::arm();
    }
}

/// Starts the shutdown once the engine has lost the device (issue #47): by
/// then every job has its terminal event, and nothing more can run here.
async fn watch_device(state: AppState) {
    let mut tick = tokio::time::interval(DEVICE_WATCH);
    loop {
        tick.tick().await;
        if state.engine.status().device_lost() {
            narrate!(
                error,
                "shutdown",
                phase = "device_lost",
                message = "the GPU failed; exiting so that the worker can be restarted"
            );
            state.shutdown.trigger("device lost");
            return;
        }
    }
}

async fn ready_callback(url: String, body: serde_json::Value) {
    let client = match reqwest::Client::builder().timeout(CALLBACK_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            narrate!(warn, "callback_failed", url = %url, message = %e.to_string());
            return;
        }
    };
    match client.post(&url).json(&body).send().await {
        Ok(resp) if resp.status().is_success() => {
            narrate!(info, "callback", url = %url, status = resp.status().as_u16());
        }
        Ok(resp) => narrate!(warn, "callback_failed", url = %url, status = resp.status().as_u16()),
        Err(e) => narrate!(warn, "callback_failed", url = %url, message = %e.to_string()),
    }
}

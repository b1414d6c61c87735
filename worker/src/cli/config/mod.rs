//! Serve-mode flags (M0-W-1100, M0-W-1101), the optional YAML file
//! (M0-W-1701) and their checks before anything is loaded.
//!
//! Two command lines lead here: the orchestrator's (the top-level flags,
//! [`ServeArgs`], every required flag by long name) and a person's
//! (`worker-orcd serve MODEL`, [`ServeCommand`], in `by_hand.rs`: short
//! flags, a relative path, defaults for the rest). Both end in the same
//! [`resolve_with`] and the same checks (`checks.rs`).
//!
//! Every flag may also be given in `--config FILE.yaml` under its long name
//! (`worker-id`, `gpu-device`, `max-tokens-out`, ...); a flag on the command
//! line wins over the file, and an unknown key in the file is an error.
//! A missing required flag is a usage error (exit 2, like clap's own); a
//! value that fails its check exits 1 with a message naming the flag.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::backend::BackendKind;
use crate::load::TokenizerChoice;
use crate::server::validation::MAX_TOKENS_LIMIT;
use crate::telemetry::logging::LogFormat;

mod by_hand;
mod checks;

pub use by_hand::{preprocess_args, ServeCommand};
pub use checks::{chat_template_source, API_KEY_ENV, MAX_CHAT_TEMPLATE_BYTES};
use checks::{
    check_model_path, check_parity_path, check_port_free, check_tokenizer_json, http_options,
};

pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_BACKEND: BackendKind = BackendKind::Cuda;
pub const DEFAULT_MAX_TOKENS_OUT: usize = MAX_TOKENS_LIMIT;
pub const DEFAULT_INFERENCE_TIMEOUT_SEC: u64 = 300;
pub const DEFAULT_QUEUE_DEPTH: usize = 8;
pub const MAX_QUEUE_DEPTH: usize = 4096;
/// Most jobs `--parallel` lets run at once.
pub const MAX_PARALLEL: usize = 256;
pub const DEFAULT_RESIDENCY_CHECK_SEC: u64 = 60;
pub const DEFAULT_SHUTDOWN_GRACE_SEC: u64 = 3;
pub const DEFAULT_UPLOAD_CHUNK_BYTES: usize = 1 << 20;
pub const MIN_PORT: u32 = 1024;
/// `serve`'s port when none is given (llama-server's).
pub const DEFAULT_SERVE_PORT: u32 = 8080;
/// Smallest `--ctx-size`: one prompt token and one generated.
pub const MIN_CTX_SIZE: usize = 2;

/// The orchestrator's command line (M0-W-1100): the four required flags
/// by long name only, the rest optional. Everything is optional here so the
/// YAML file can supply it; required flags are checked after merging.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServeArgs {
    /// Worker id, a UUID (required).
    #[arg(long, value_name = "UUID")]
    pub worker_id: Option<String>,
    /// Absolute path of the GGUF model file (required).
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// GPU ordinal, 0 to count-1 (required).
    #[arg(long, value_name = "N")]
    pub gpu_device: Option<usize>,
    /// HTTP port, 1024-65535, must be free (required).
    #[arg(long)]
    pub port: Option<u32>,
    /// Jobs that run at once, decoded together, at most 256 [default: 1: one at a time].
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// Tokens of context a job may use, prompt and output together [default: the model's].
    #[arg(long, value_name = "N")]
    pub ctx_size: Option<usize>,
    #[command(flatten)]
    pub options: Options,
}

/// The flags the orchestrator's command line and `serve` share.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Options {
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long, value_name = "IP")]
    pub host: Option<String>,
    /// Compute backend: cuda or cpu [default: cuda]. There is no fallback.
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// When given, POST {worker_id, model_ref, vram_bytes, uri} here once ready (http:// only).
    #[arg(long, value_name = "URL")]
    pub callback_url: Option<String>,
    /// Longest prompt in tokens [default: the model's context length].
    #[arg(long, value_name = "N")]
    pub max_tokens_in: Option<usize>,
    /// Most tokens one job may generate, at most 2048 [default: 2048].
    #[arg(long, value_name = "N")]
    pub max_tokens_out: Option<usize>,
    /// A running job ends with INFERENCE_TIMEOUT after this many seconds [default: 300].
    #[arg(long, value_name = "SECONDS")]
    pub inference_timeout_sec: Option<u64>,
    /// Upper bound in MiB of the KV caches of the running jobs together [default: computed].
    #[arg(long, value_name = "MIB")]
    pub kv_cache_size_mb: Option<u64>,
    /// Jobs that may wait behind the running ones [default: 8].
    #[arg(long, value_name = "N")]
    pub queue_depth: Option<usize>,
    /// Write one JSONL parity record per generated token to this file.
    #[arg(long, value_name = "FILE")]
    pub parity_log: Option<PathBuf>,
    /// Interval of the weight residency check on cuda [default: 60].
    #[arg(long, value_name = "SECONDS")]
    pub residency_check_sec: Option<u64>,
    /// At shutdown, how long the running job may go on before it is cancelled [default: 3].
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace_sec: Option<u64>,
    /// Host-to-device copy chunk in bytes [default: 1048576].
    #[arg(long, value_name = "BYTES")]
    pub upload_chunk_bytes: Option<usize>,
    /// Log records on stderr: json (one object per line), pretty (one line of
    /// text), or auto: pretty when stderr is a terminal, json otherwise [default: auto].
    #[arg(long, value_name = "FORMAT", hide_possible_values = true)]
    pub log_format: Option<LogFormat>,
    /// Longest wait for a request's headers, also for the next request on an
    /// idle keep-alive connection [default: 10].
    #[arg(long, value_name = "SECONDS")]
    pub header_timeout_sec: Option<u64>,
    /// Longest time to receive a whole request body; 408 after it [default: 30].
    #[arg(long, value_name = "SECONDS")]
    pub body_timeout_sec: Option<u64>,
    /// Connections served at once; more wait in the listen backlog [default: 512].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    /// [default: the WORKER_API_KEY environment variable; none: open].
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Chat template for `messages`, replacing the model file's: one of the
    /// built-in names (chatml, llama3, gemma, phi3) [default: the file's].
    #[arg(long, value_name = "NAME", conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// Chat template for `messages` from a Jinja file, replacing the model file's.
    #[arg(long, value_name = "FILE.jinja")]
    pub chat_template_file: Option<PathBuf>,
    /// Tokenizer: gguf (built from the model file's metadata: gguf-bpe or
    /// gguf-spm) or hf-json (tokenizer.json in the model file's folder) [default: gguf].
    #[arg(long, value_name = "KIND")]
    pub tokenizer: Option<TokenizerChoice>,
    /// YAML file with any of the flags above, keyed by long name.
    #[arg(long, value_name = "FILE.yaml")]
    pub config: Option<PathBuf>,
}

/// The YAML file: the same keys as the long flags.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub worker_id: Option<String>,
    pub model: Option<PathBuf>,
    pub gpu_device: Option<usize>,
    pub port: Option<u32>,
    pub host: Option<String>,
    pub backend: Option<BackendKind>,
    pub callback_url: Option<String>,
    pub max_tokens_in: Option<usize>,
    pub max_tokens_out: Option<usize>,
    pub inference_timeout_sec: Option<u64>,
    pub kv_cache_size_mb: Option<u64>,
    pub queue_depth: Option<usize>,
    pub parallel: Option<usize>,
    pub ctx_size: Option<usize>,
    pub parity_log: Option<PathBuf>,
    pub residency_check_sec: Option<u64>,
    pub shutdown_grace_sec: Option<u64>,
    pub upload_chunk_bytes: Option<usize>,
    pub log_format: Option<LogFormat>,
    pub header_timeout_sec: Option<u64>,
    pub body_timeout_sec: Option<u64>,
    pub max_connections: Option<usize>,
    pub api_key: Option<String>,
    pub chat_template: Option<String>,
    pub chat_template_file: Option<PathBuf>,
    pub tokenizer: Option<TokenizerChoice>,
}

/// The checked configuration the worker runs with.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub worker_id: String,
    pub model: PathBuf,
    pub gpu_device: usize,
    pub port: u16,
    pub host: IpAddr,
    pub backend: BackendKind,
    pub callback_url: Option<String>,
    /// `None`: the model's context length.
    pub max_tokens_in: Option<usize>,
    pub max_tokens_out: usize,
    /// `None`: the model's context length.
    pub ctx_size: Option<usize>,
    pub inference_timeout: Duration,
    pub kv_cache_size_mb: Option<u64>,
    pub queue_depth: usize,
    /// Jobs that run at once (1: one at a time).
    pub parallel: usize,
    pub parity_log: Option<PathBuf>,
    pub residency_check: Duration,
    pub shutdown_grace: Duration,
    pub upload_chunk_bytes: usize,
    pub log_format: LogFormat,
    /// Timeouts, connection limit and API key of the HTTP server.
    pub http: crate::server::guard::HttpOptions,
    /// The source of a chat template replacing the model file's.
    pub chat_template: Option<String>,
    pub tokenizer: TokenizerChoice,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Required flags are missing everywhere: a usage error (exit 2), naming
    /// all of them at once.
    #[error("{}", missing_message(.0))]
    Missing(Vec<&'static str>),
    /// A value failed its check (exit 1).
    #[error("{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

fn missing_message(flags: &[&'static str]) -> String {
    let (last, rest) = flags.split_last().unwrap_or((&"", &[]));
    let names = match rest {
        [] => format!("the flag {last} is"),
        _ => format!("the flags {} and {last} are", rest.join(", ")),
    };
    format!(
        "{names} required (on the command line or in --config); to start the worker by hand, \
         run `worker-orcd serve MODEL.gguf` (see `worker-orcd serve --help`)"
    )
}

pub(crate) fn invalid(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        message: message.into(),
    }
}

/// What stands in for a required flag given neither on the command line nor
/// in the file. The orchestrator's command line has none (M0-W-1100: each
/// is required); `serve` fills them in for a person.
#[derive(Clone, Debug, Default)]
pub struct Fallbacks {
    pub worker_id: Option<String>,
    pub gpu_device: Option<usize>,
    pub port: Option<u32>,
    /// A relative `--model` is taken from the working folder rather than
    /// refused.
    pub relative_model: bool,
}

/// Reads the YAML file.
pub fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid("--config", format!("cannot read {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    serde_yaml::from_str(&text).map_err(|e| invalid("--config", format!("{}: {e}", path.display())))
}

/// The log format, known before the rest is checked so that a failed start
/// is logged in it: the flag, else the file's `log-format` (a file that does
/// not read is reported by [`resolve`], logged in the default format).
pub fn log_format(args: &ServeArgs) -> LogFormat {
    let from_file = || {
        args.options
            .config
            .as_deref()
            .and_then(|path| read_file(path).ok())
            .and_then(|f| f.log_format)
    };
    args.options
        .log_format
        .or_else(from_file)
        .unwrap_or_default()
}

/// Merges the file under the flags and checks every value, including that
/// the model file is readable and the port is free (the orchestrator's
/// command line: every required flag must be given).
pub fn resolve(args: ServeArgs) -> Result<ServeConfig, ConfigError> {
    resolve_with(args, &Fallbacks::default())
}

/// [`resolve`] with `fallbacks` for required flags given nowhere.
pub fn resolve_with(args: ServeArgs, fallbacks: &Fallbacks) -> Result<ServeConfig, ConfigError> {
    let file = match &args.options.config {
        Some(path) => read_file(path)?,
        None => FileConfig::default(),
    };
    let http = http_options(&args.options, &file)?;
    let front = front(&args, &file, fallbacks)?;
    let jobs = job_limits(&args, &file)?;
    let opts = args.options;
    let callback_url = opts.callback_url.or(file.callback_url);
    if let Some(url) = &callback_url {
        if !url.starts_with("http://") || url.len() <= "http://".len() {
            return Err(invalid(
                "--callback-url",
                format!("{url:?} is not an http:// URL (https is not supported)"),
            ));
        }
    }
    let queue_depth = opts
        .queue_depth
        .or(file.queue_depth)
        .unwrap_or(DEFAULT_QUEUE_DEPTH);
    if queue_depth > MAX_QUEUE_DEPTH {
        return Err(invalid(
            "--queue-depth",
            format!("{queue_depth} is above {MAX_QUEUE_DEPTH}"),
        ));
    }
    let parity_log = opts.parity_log.or(file.parity_log);
    if let Some(path) = &parity_log {
        check_parity_path(path)?;
    }
    let residency_s = opts
        .residency_check_sec
        .or(file.residency_check_sec)
        .unwrap_or(DEFAULT_RESIDENCY_CHECK_SEC);
    if residency_s == 0 {
        return Err(invalid("--residency-check-sec", "must be at least 1"));
    }
    let grace_s = opts
        .shutdown_grace_sec
        .or(file.shutdown_grace_sec)
        .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SEC);
    if grace_s > 20 {
        return Err(invalid(
            "--shutdown-grace-sec",
            "must be at most 20 (shutdown must end within 30 s)",
        ));
    }
    let upload_chunk_bytes = opts
        .upload_chunk_bytes
        .or(file.upload_chunk_bytes)
        .unwrap_or(DEFAULT_UPLOAD_CHUNK_BYTES);
    if upload_chunk_bytes < 4096 {
        return Err(invalid("--upload-chunk-bytes", "must be at least 4096"));
    }
    let chat_template = chat_template_source(
        opts.chat_template.or(file.chat_template).as_deref(),
        opts.chat_template_file
            .or(file.chat_template_file)
            .as_deref(),
    )?;
    let tokenizer = opts.tokenizer.or(file.tokenizer).unwrap_or_default();
    if tokenizer == TokenizerChoice::HfJson {
        check_tokenizer_json(&front.model)?;
    }

    Ok(ServeConfig {
        worker_id: front.worker_id,
        model: front.model,
        gpu_device: front.gpu_device,
        port: front.port,
        host: front.host,
        backend: opts.backend.or(file.backend).unwrap_or(DEFAULT_BACKEND),
        callback_url,
        max_tokens_in: jobs.max_tokens_in,
        max_tokens_out: jobs.max_tokens_out,
        ctx_size: jobs.ctx_size,
        inference_timeout: jobs.inference_timeout,
        kv_cache_size_mb: jobs.kv_cache_size_mb,
        queue_depth,
        parallel: jobs.parallel,
        parity_log,
        residency_check: Duration::from_secs(residency_s),
        shutdown_grace: Duration::from_secs(grace_s),
        upload_chunk_bytes,
        log_format: opts.log_format.or(file.log_format).unwrap_or_default(),
        http,
        chat_template,
        tokenizer,
    })
}

/// Who the worker is, what it serves and where it listens.
struct Front {
    worker_id: String,
    model: PathBuf,
    gpu_device: usize,
    port: u16,
    host: IpAddr,
}

/// The required flags (every missing one named in one error), then their
/// checks in M0-W-1100's order.
fn front(args: &ServeArgs, file: &FileConfig, fallbacks: &Fallbacks) -> Result<Front, ConfigError> {
    let worker_id = args
        .worker_id
        .clone()
        .or_else(|| file.worker_id.clone())
        .or_else(|| fallbacks.worker_id.clone());
    let model = args.model.clone().or_else(|| file.model.clone());
    let gpu_device = args.gpu_device.or(file.gpu_device).or(fallbacks.gpu_device);
    let port = args.port.or(file.port).or(fallbacks.port);
    let (Some(worker_id), Some(model), Some(gpu_device), Some(port)) =
        (worker_id.clone(), model.clone(), gpu_device, port)
    else {
        let given = [
            ("--worker-id", worker_id.is_some()),
            ("--model", model.is_some()),
            ("--gpu-device", gpu_device.is_some()),
            ("--port", port.is_some()),
        ];
        let missing = given.iter().filter(|(_, g)| !g).map(|(f, _)| *f).collect();
        return Err(ConfigError::Missing(missing));
    };
    uuid::Uuid::parse_str(&worker_id)
        .map_err(|e| invalid("--worker-id", format!("{worker_id:?} is not a UUID: {e}")))?;
    let model = match fallbacks.relative_model {
        true => std::path::absolute(&model)
            .map_err(|e| invalid("--model", format!("{}: {e}", model.display())))?,
        false => model,
    };
    check_model_path(&model)?;
    let host = args
        .options
        .host
        .clone()
        .or_else(|| file.host.clone())
        .unwrap_or_else(|| DEFAULT_HOST.to_string());
    let host: IpAddr = match host.as_str() {
        "localhost" => IpAddr::from([127, 0, 0, 1]),
        h => h
            .parse()
            .map_err(|_| invalid("--host", format!("{h:?} is not an IP address")))?,
    };
    if !(MIN_PORT..=u16::MAX as u32).contains(&port) {
        return Err(invalid(
            "--port",
            format!("{port} is outside {MIN_PORT}-65535"),
        ));
    }
    let port = port as u16;
    check_port_free(host, port)?;
    Ok(Front {
        worker_id,
        model,
        gpu_device,
        port,
        host,
    })
}

/// What bounds the jobs: token caps, context, time, KV memory, slots.
struct JobLimits {
    max_tokens_in: Option<usize>,
    max_tokens_out: usize,
    ctx_size: Option<usize>,
    inference_timeout: Duration,
    kv_cache_size_mb: Option<u64>,
    parallel: usize,
}

fn job_limits(args: &ServeArgs, file: &FileConfig) -> Result<JobLimits, ConfigError> {
    let opts = &args.options;
    let max_tokens_in = opts.max_tokens_in.or(file.max_tokens_in);
    if max_tokens_in == Some(0) {
        return Err(invalid("--max-tokens-in", "must be at least 1"));
    }
    let max_tokens_out = opts
        .max_tokens_out
        .or(file.max_tokens_out)
        .unwrap_or(DEFAULT_MAX_TOKENS_OUT);
    if !(1..=MAX_TOKENS_LIMIT).contains(&max_tokens_out) {
        return Err(invalid(
            "--max-tokens-out",
            format!("{max_tokens_out} is outside 1-{MAX_TOKENS_LIMIT}"),
        ));
    }
    let ctx_size = args.ctx_size.or(file.ctx_size);
    if ctx_size.is_some_and(|n| n < MIN_CTX_SIZE) {
        return Err(invalid(
            "--ctx-size",
            format!("must be at least {MIN_CTX_SIZE} (a prompt token and a generated one)"),
        ));
    }
    let timeout_s = opts
        .inference_timeout_sec
        .or(file.inference_timeout_sec)
        .unwrap_or(DEFAULT_INFERENCE_TIMEOUT_SEC);
    if timeout_s == 0 {
        return Err(invalid("--inference-timeout-sec", "must be at least 1"));
    }
    let kv_cache_size_mb = opts.kv_cache_size_mb.or(file.kv_cache_size_mb);
    if kv_cache_size_mb == Some(0) {
        return Err(invalid("--kv-cache-size-mb", "must be at least 1"));
    }
    let parallel = args.parallel.or(file.parallel).unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        return Err(invalid(
            "--parallel",
            format!("{parallel} is not between 1 and {MAX_PARALLEL}"),
        ));
    }
    Ok(JobLimits {
        max_tokens_in,
        max_tokens_out,
        ctx_size,
        inference_timeout: Duration::from_secs(timeout_s),
        kv_cache_size_mb,
        parallel,
    })
}

impl ServeConfig {
    /// The most tokens of context the backend is sized for: `--ctx-size`,
    /// and no more than the longest prompt plus the longest output
    /// (`None`: the model's own context length).
    pub fn max_context(&self) -> Option<usize> {
        let by_caps = self.max_tokens_in.map(|n| n + self.max_tokens_out);
        match (self.ctx_size, by_caps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests;

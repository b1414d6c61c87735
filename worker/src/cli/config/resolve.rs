//! The flags merged over the YAML file and checked, into the
//! [`ServeConfig`] the worker runs with.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::backend::{BackendKind, KvType};
use crate::cli::config::checks::{
    chat_template_source, check_model_path, check_parity_path, check_port_free,
    check_tokenizer_json, http_options,
};
use crate::cli::config::{
    invalid, ConfigError, Fallbacks, FileConfig, ServeArgs, DEFAULT_BACKEND, DEFAULT_HOST,
    DEFAULT_INFERENCE_TIMEOUT_SEC, DEFAULT_QUEUE_DEPTH, DEFAULT_RESIDENCY_CHECK_SEC,
    DEFAULT_SHUTDOWN_GRACE_SEC, DEFAULT_UPLOAD_CHUNK_BYTES, MAX_PARALLEL, MAX_QUEUE_DEPTH,
    MIN_CTX_SIZE, MIN_PORT,
};
use crate::cli::config::{OnOff, Options, DEFAULT_PREFIX_CACHE_SHARE};
use crate::load::TokenizerChoice;
use crate::server::validation::DEFAULT_MAX_TOKENS_OUT;
use crate::telemetry::logging::LogFormat;

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
    /// `--max-tokens-out`, checked against the context once the model is
    /// loaded; `None`: `/execute`'s default, the context on `/v1`.
    pub max_tokens_out: Option<usize>,
    /// `--max-prompt-chars`; `None`: `/execute`'s default, the context on `/v1`.
    pub max_prompt_chars: Option<usize>,
    /// `None`: the model's context length.
    pub ctx_size: Option<usize>,
    pub inference_timeout: Duration,
    pub kv_cache_size_mb: Option<u64>,
    pub kv_type: KvType,
    pub queue_depth: usize,
    /// Jobs that run at once (1: one at a time).
    pub parallel: usize,
    /// The prefix cache's share of the KV memory; `None`: off.
    pub prefix_cache: Option<f64>,
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
        max_prompt_chars: jobs.max_prompt_chars,
        ctx_size: jobs.ctx_size,
        inference_timeout: jobs.inference_timeout,
        kv_cache_size_mb: jobs.kv_cache_size_mb,
        kv_type: opts.kv_type.or(file.kv_type).unwrap_or_default(),
        queue_depth,
        parallel: jobs.parallel,
        prefix_cache: jobs.prefix_cache,
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
    max_tokens_out: Option<usize>,
    max_prompt_chars: Option<usize>,
    ctx_size: Option<usize>,
    inference_timeout: Duration,
    kv_cache_size_mb: Option<u64>,
    parallel: usize,
    prefix_cache: Option<f64>,
}

fn job_limits(args: &ServeArgs, file: &FileConfig) -> Result<JobLimits, ConfigError> {
    let opts = &args.options;
    let max_tokens_in = opts.max_tokens_in.or(file.max_tokens_in);
    if max_tokens_in == Some(0) {
        return Err(invalid("--max-tokens-in", "must be at least 1"));
    }
    // The context bounds --max-tokens-out too, checked once it is known.
    let max_tokens_out = opts.max_tokens_out.or(file.max_tokens_out);
    if max_tokens_out == Some(0) {
        return Err(invalid("--max-tokens-out", "must be at least 1"));
    }
    let max_prompt_chars = opts.max_prompt_chars.or(file.max_prompt_chars);
    if max_prompt_chars == Some(0) {
        return Err(invalid("--max-prompt-chars", "must be at least 1"));
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
        max_prompt_chars,
        ctx_size,
        inference_timeout: Duration::from_secs(timeout_s),
        kv_cache_size_mb,
        parallel,
        prefix_cache: prefix_cache(opts, file)?,
    })
}

/// `--prefix-cache` and `--prefix-cache-share`: the cache's share of the KV
/// memory, or `None` when it is off.
fn prefix_cache(opts: &Options, file: &FileConfig) -> Result<Option<f64>, ConfigError> {
    let share = opts.prefix_cache_share.or(file.prefix_cache_share);
    if let Some(f) = share.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
        return Err(invalid(
            "--prefix-cache-share",
            format!("{f} is not above 0 and at most 1"),
        ));
    }
    Ok(match opts.prefix_cache.or(file.prefix_cache) {
        Some(OnOff::Off) => None,
        _ => Some(share.unwrap_or(DEFAULT_PREFIX_CACHE_SHARE)),
    })
}

impl ServeConfig {
    /// The most tokens of context the backend is sized for: `--ctx-size`,
    /// and no more than the longest prompt plus the longest output
    /// (`None`: the model's own context length).
    pub fn max_context(&self) -> Option<usize> {
        let out = self.max_tokens_out.unwrap_or(DEFAULT_MAX_TOKENS_OUT);
        let by_caps = self.max_tokens_in.map(|n| n.saturating_add(out));
        match (self.ctx_size, by_caps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

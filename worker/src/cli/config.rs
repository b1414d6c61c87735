//! Serve-mode flags (M0-W-1100, M0-W-1101), the optional YAML file
//! (M0-W-1701) and their checks before anything is loaded.
//!
//! Every flag may also be given in `--config FILE.yaml` under its long name
//! (`worker-id`, `gpu-device`, `max-tokens-out`, ...); a flag on the command
//! line wins over the file, and an unknown key in the file is an error.
//! A missing required flag is a usage error (exit 2, like clap's own); a
//! value that fails its check exits 1 with a message naming the flag.

use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::backend::BackendKind;
use crate::load::TokenizerChoice;
use crate::server::guard::HttpOptions;
use crate::server::validation::MAX_TOKENS_LIMIT;
use crate::telemetry::logging::LogFormat;

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

/// The serve-mode command line. Everything is optional here so the YAML file
/// can supply it; required flags are checked after merging.
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
    /// Jobs that run at once, decoded together, at most 256 [default: 1: one at a time].
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
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
    /// A required flag is missing everywhere: a usage error (exit 2).
    #[error("the flag {0} is required (on the command line or in --config)")]
    Missing(&'static str),
    /// A value failed its check (exit 1).
    #[error("{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

fn invalid(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        message: message.into(),
    }
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
        args.config
            .as_deref()
            .and_then(|path| read_file(path).ok())
            .and_then(|f| f.log_format)
    };
    args.log_format.or_else(from_file).unwrap_or_default()
}

/// Merges the file under the flags and checks every value, including that
/// the model file is readable and the port is free.
pub fn resolve(args: ServeArgs) -> Result<ServeConfig, ConfigError> {
    let file = match &args.config {
        Some(path) => read_file(path)?,
        None => FileConfig::default(),
    };
    let http = http_options(&args, &file)?;
    let worker_id = args
        .worker_id
        .or(file.worker_id)
        .ok_or(ConfigError::Missing("--worker-id"))?;
    let model = args
        .model
        .or(file.model)
        .ok_or(ConfigError::Missing("--model"))?;
    let gpu_device = args
        .gpu_device
        .or(file.gpu_device)
        .ok_or(ConfigError::Missing("--gpu-device"))?;
    let port = args
        .port
        .or(file.port)
        .ok_or(ConfigError::Missing("--port"))?;
    let host = args
        .host
        .or(file.host)
        .unwrap_or_else(|| DEFAULT_HOST.to_string());
    let backend = args.backend.or(file.backend).unwrap_or(DEFAULT_BACKEND);

    uuid::Uuid::parse_str(&worker_id)
        .map_err(|e| invalid("--worker-id", format!("{worker_id:?} is not a UUID: {e}")))?;
    check_model_path(&model)?;
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

    let callback_url = args.callback_url.or(file.callback_url);
    if let Some(url) = &callback_url {
        if !url.starts_with("http://") || url.len() <= "http://".len() {
            return Err(invalid(
                "--callback-url",
                format!("{url:?} is not an http:// URL (https is not supported)"),
            ));
        }
    }
    let max_tokens_in = args.max_tokens_in.or(file.max_tokens_in);
    if max_tokens_in == Some(0) {
        return Err(invalid("--max-tokens-in", "must be at least 1"));
    }
    let max_tokens_out = args
        .max_tokens_out
        .or(file.max_tokens_out)
        .unwrap_or(DEFAULT_MAX_TOKENS_OUT);
    if !(1..=MAX_TOKENS_LIMIT).contains(&max_tokens_out) {
        return Err(invalid(
            "--max-tokens-out",
            format!("{max_tokens_out} is outside 1-{MAX_TOKENS_LIMIT}"),
        ));
    }
    let timeout_s = args
        .inference_timeout_sec
        .or(file.inference_timeout_sec)
        .unwrap_or(DEFAULT_INFERENCE_TIMEOUT_SEC);
    if timeout_s == 0 {
        return Err(invalid("--inference-timeout-sec", "must be at least 1"));
    }
    let kv_cache_size_mb = args.kv_cache_size_mb.or(file.kv_cache_size_mb);
    if kv_cache_size_mb == Some(0) {
        return Err(invalid("--kv-cache-size-mb", "must be at least 1"));
    }
    let queue_depth = args
        .queue_depth
        .or(file.queue_depth)
        .unwrap_or(DEFAULT_QUEUE_DEPTH);
    if queue_depth > MAX_QUEUE_DEPTH {
        return Err(invalid(
            "--queue-depth",
            format!("{queue_depth} is above {MAX_QUEUE_DEPTH}"),
        ));
    }
    let parallel = args.parallel.or(file.parallel).unwrap_or(1);
    if !(1..=MAX_PARALLEL).contains(&parallel) {
        return Err(invalid(
            "--parallel",
            format!("{parallel} is not between 1 and {MAX_PARALLEL}"),
        ));
    }
    let parity_log = args.parity_log.or(file.parity_log);
    if let Some(path) = &parity_log {
        check_parity_path(path)?;
    }
    let residency_s = args
        .residency_check_sec
        .or(file.residency_check_sec)
        .unwrap_or(DEFAULT_RESIDENCY_CHECK_SEC);
    if residency_s == 0 {
        return Err(invalid("--residency-check-sec", "must be at least 1"));
    }
    let grace_s = args
        .shutdown_grace_sec
        .or(file.shutdown_grace_sec)
        .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SEC);
    if grace_s > 20 {
        return Err(invalid(
            "--shutdown-grace-sec",
            "must be at most 20 (shutdown must end within 30 s)",
        ));
    }
    let log_format = args.log_format.or(file.log_format).unwrap_or_default();
    let upload_chunk_bytes = args
        .upload_chunk_bytes
        .or(file.upload_chunk_bytes)
        .unwrap_or(DEFAULT_UPLOAD_CHUNK_BYTES);
    if upload_chunk_bytes < 4096 {
        return Err(invalid("--upload-chunk-bytes", "must be at least 4096"));
    }
    let chat_template = chat_template_source(
        args.chat_template.or(file.chat_template).as_deref(),
        args.chat_template_file
            .or(file.chat_template_file)
            .as_deref(),
    )?;
    let tokenizer = args.tokenizer.or(file.tokenizer).unwrap_or_default();
    if tokenizer == TokenizerChoice::HfJson {
        check_tokenizer_json(&model)?;
    }

    Ok(ServeConfig {
        worker_id,
        model,
        gpu_device,
        port,
        host,
        backend,
        callback_url,
        max_tokens_in,
        max_tokens_out,
        inference_timeout: Duration::from_secs(timeout_s),
        kv_cache_size_mb,
        queue_depth,
        parallel,
        parity_log,
        residency_check: Duration::from_secs(residency_s),
        shutdown_grace: Duration::from_secs(grace_s),
        upload_chunk_bytes,
        log_format,
        http,
        chat_template,
        tokenizer,
    })
}

/// `--tokenizer hf-json` reads `tokenizer.json` from the model file's folder:
/// a start without one fails here, naming the path, before anything loads.
fn check_tokenizer_json(model: &Path) -> Result<(), ConfigError> {
    let path = model
        .parent()
        .unwrap_or(Path::new("/"))
        .join(crate::tokenizer::HF_TOKENIZER_FILE);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(invalid(
            "--tokenizer",
            format!("hf-json reads {}, which is not a file", path.display()),
        )),
        Err(e) => Err(invalid(
            "--tokenizer",
            format!("hf-json reads {}: {e}", path.display()),
        )),
    }
}

/// Largest `--chat-template-file` read: real templates are a few KB.
pub const MAX_CHAT_TEMPLATE_BYTES: u64 = 1 << 20;

/// The chat template `--chat-template NAME` or `--chat-template-file PATH`
/// asks for (not both), checked to compile.
pub fn chat_template_source(
    name: Option<&str>,
    path: Option<&Path>,
) -> Result<Option<String>, ConfigError> {
    let (flag, source) = match (name, path) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(invalid(
                "--chat-template",
                "give a name or --chat-template-file, not both",
            ))
        }
        (Some(name), None) => {
            let source = crate::tokenizer::builtin_template(name).ok_or_else(|| {
                invalid(
                    "--chat-template",
                    format!(
                        "{name:?} is not a built-in template (known: {})",
                        crate::tokenizer::builtin_template_names()
                    ),
                )
            })?;
            ("--chat-template", source.to_string())
        }
        (None, Some(path)) => {
            let shown = path.display();
            let flag = "--chat-template-file";
            let meta =
                std::fs::metadata(path).map_err(|e| invalid(flag, format!("{shown}: {e}")))?;
            if meta.len() > MAX_CHAT_TEMPLATE_BYTES {
                return Err(invalid(
                    flag,
                    format!("{shown} is larger than {MAX_CHAT_TEMPLATE_BYTES} bytes"),
                ));
            }
            let source = std::fs::read_to_string(path)
                .map_err(|e| invalid(flag, format!("{shown}: {e}")))?;
            (flag, source)
        }
    };
    crate::tokenizer::ChatTemplate::new(&source, "", "")
        .map_err(|e| invalid(flag, format!("does not compile: {e}")))?;
    Ok(Some(source))
}

/// The environment variable `--api-key` falls back to.
pub const API_KEY_ENV: &str = "WORKER_API_KEY";

fn http_options(args: &ServeArgs, file: &FileConfig) -> Result<HttpOptions, ConfigError> {
    let d = HttpOptions::default();
    let secs = |flag: &'static str, v: Option<u64>, default: Duration| match v {
        Some(0) => Err(invalid(flag, "must be at least 1")),
        Some(s) => Ok(Duration::from_secs(s)),
        None => Ok(default),
    };
    let header_timeout = secs(
        "--header-timeout-sec",
        args.header_timeout_sec.or(file.header_timeout_sec),
        d.header_timeout,
    )?;
    let body_timeout = secs(
        "--body-timeout-sec",
        args.body_timeout_sec.or(file.body_timeout_sec),
        d.body_timeout,
    )?;
    let max_connections = args
        .max_connections
        .or(file.max_connections)
        .unwrap_or(d.max_connections);
    if max_connections == 0 {
        return Err(invalid("--max-connections", "must be at least 1"));
    }
    let api_key = args
        .api_key
        .clone()
        .or_else(|| file.api_key.clone())
        .or_else(|| std::env::var(API_KEY_ENV).ok())
        .filter(|k| !k.is_empty());
    Ok(HttpOptions {
        header_timeout,
        body_timeout,
        max_connections,
        api_key,
    })
}

fn check_model_path(path: &Path) -> Result<(), ConfigError> {
    let shown = path.display();
    if !path.is_absolute() {
        return Err(invalid(
            "--model",
            format!("{shown} is not an absolute path"),
        ));
    }
    let meta = std::fs::metadata(path).map_err(|e| invalid("--model", format!("{shown}: {e}")))?;
    if !meta.is_file() {
        return Err(invalid("--model", format!("{shown} is not a file")));
    }
    let is_gguf = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if !is_gguf {
        return Err(invalid("--model", format!("{shown} is not a .gguf file")));
    }
    std::fs::File::open(path)
        .map_err(|e| invalid("--model", format!("{shown} is not readable: {e}")))?;
    Ok(())
}

fn check_port_free(host: IpAddr, port: u16) -> Result<(), ConfigError> {
    TcpListener::bind((host, port))
        .map(drop)
        .map_err(|e| invalid("--port", format!("cannot listen on {host}:{port}: {e}")))
}

fn check_parity_path(path: &Path) -> Result<(), ConfigError> {
    if path.is_dir() {
        return Err(invalid(
            "--parity-log",
            format!("{} is a directory", path.display()),
        ));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(invalid(
            "--parity-log",
            format!("the folder {} does not exist", parent.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        dir: tempfile::TempDir,
        model: PathBuf,
        port: u32,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"GGUF").unwrap();
        let port = free_port() as u32;
        Fixture { dir, model, port }
    }

    fn free_port() -> u16 {
        TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn args(f: &Fixture) -> ServeArgs {
        ServeArgs {
            worker_id: Some("0b8b5a63-3c0d-4f6e-9a51-2d6a3f1f9c11".into()),
            model: Some(f.model.clone()),
            gpu_device: Some(0),
            port: Some(f.port),
            ..ServeArgs::default()
        }
    }

    fn flag_of(r: Result<ServeConfig, ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { flag, .. }) => flag,
            Err(ConfigError::Missing(flag)) => flag,
            Ok(_) => "ok",
        }
    }

    #[test]
    fn defaults() {
        let f = fixture();
        let c = resolve(args(&f)).unwrap();
        assert_eq!(c.backend, BackendKind::Cuda);
        assert_eq!(c.host.to_string(), "127.0.0.1");
        assert_eq!(c.max_tokens_out, 2048);
        assert_eq!(c.max_tokens_in, None);
        assert_eq!(c.inference_timeout, Duration::from_secs(300));
        assert_eq!(c.queue_depth, DEFAULT_QUEUE_DEPTH);
        assert_eq!(c.residency_check, Duration::from_secs(60));
    }

    /// M0-W-1100: each bad value names its flag.
    #[test]
    fn bad_values_name_their_flag() {
        let f = fixture();
        let busy = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let busy_port = busy.local_addr().unwrap().port() as u32;
        let not_gguf = f.dir.path().join("m.bin");
        std::fs::write(&not_gguf, b"x").unwrap();
        let rows: Vec<(ServeArgs, &str)> = vec![
            (
                ServeArgs {
                    worker_id: Some("not-a-uuid".into()),
                    ..args(&f)
                },
                "--worker-id",
            ),
            (
                ServeArgs {
                    model: Some(f.dir.path().join("missing.gguf")),
                    ..args(&f)
                },
                "--model",
            ),
            (
                ServeArgs {
                    model: Some("relative/m.gguf".into()),
                    ..args(&f)
                },
                "--model",
            ),
            (
                ServeArgs {
                    model: Some(f.dir.path().to_path_buf()),
                    ..args(&f)
                },
                "--model",
            ),
            (
                ServeArgs {
                    model: Some(not_gguf),
                    ..args(&f)
                },
                "--model",
            ),
            (
                ServeArgs {
                    port: Some(80),
                    ..args(&f)
                },
                "--port",
            ),
            (
                ServeArgs {
                    port: Some(70000),
                    ..args(&f)
                },
                "--port",
            ),
            (
                ServeArgs {
                    port: Some(busy_port),
                    ..args(&f)
                },
                "--port",
            ),
            (
                ServeArgs {
                    host: Some("nowhere".into()),
                    ..args(&f)
                },
                "--host",
            ),
            (
                ServeArgs {
                    max_tokens_out: Some(0),
                    ..args(&f)
                },
                "--max-tokens-out",
            ),
            (
                ServeArgs {
                    max_tokens_out: Some(2049),
                    ..args(&f)
                },
                "--max-tokens-out",
            ),
            (
                ServeArgs {
                    max_tokens_in: Some(0),
                    ..args(&f)
                },
                "--max-tokens-in",
            ),
            (
                ServeArgs {
                    inference_timeout_sec: Some(0),
                    ..args(&f)
                },
                "--inference-timeout-sec",
            ),
            (
                ServeArgs {
                    callback_url: Some("ftp://x".into()),
                    ..args(&f)
                },
                "--callback-url",
            ),
            (
                ServeArgs {
                    parity_log: Some("/no/such/dir/p.jsonl".into()),
                    ..args(&f)
                },
                "--parity-log",
            ),
            (
                ServeArgs {
                    worker_id: None,
                    ..args(&f)
                },
                "--worker-id",
            ),
            (
                ServeArgs {
                    model: None,
                    ..args(&f)
                },
                "--model",
            ),
            (
                ServeArgs {
                    gpu_device: None,
                    ..args(&f)
                },
                "--gpu-device",
            ),
            (
                ServeArgs {
                    port: None,
                    ..args(&f)
                },
                "--port",
            ),
        ];
        for (a, flag) in rows {
            let shown = format!("{a:?}");
            assert_eq!(flag_of(resolve(a)), flag, "{shown}");
        }
        drop(busy);
    }

    /// M0-W-1701: the file supplies values, flags win, unknown keys fail.
    #[test]
    fn yaml_file_under_flags() {
        let f = fixture();
        let other_port = free_port();
        let path = f.dir.path().join("w.yaml");
        std::fs::write(
            &path,
            format!(
                "worker-id: 0b8b5a63-3c0d-4f6e-9a51-2d6a3f1f9c11\nmodel: {}\ngpu-device: 0\nport: {}\nmax-tokens-out: 5\nbackend: cpu\n",
                f.model.display(),
                other_port
            ),
        )
        .unwrap();
        let from_file = resolve(ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        })
        .unwrap();
        assert_eq!(from_file.port, other_port);
        assert_eq!(from_file.max_tokens_out, 5);
        assert_eq!(from_file.backend, BackendKind::Cpu);
        let overridden = resolve(ServeArgs {
            config: Some(path.clone()),
            port: Some(f.port),
            ..ServeArgs::default()
        })
        .unwrap();
        assert_eq!(overridden.port as u32, f.port);
        assert_eq!(overridden.max_tokens_out, 5);

        std::fs::write(&path, "port: 8080\nbogus-key: 1\n").unwrap();
        let err = resolve(ServeArgs {
            config: Some(path.clone()),
            ..args(&f)
        })
        .unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { flag: "--config", message } if message.contains("bogus-key")),
            "{err}"
        );
        let err = resolve(ServeArgs {
            config: Some(f.dir.path().join("none.yaml")),
            ..args(&f)
        })
        .unwrap_err();
        assert!(matches!(
            err,
            ConfigError::Invalid {
                flag: "--config",
                ..
            }
        ));
    }

    /// `--log-format`: auto by default, from the file under the flag, known
    /// before the rest is checked (and when the rest fails).
    #[test]
    fn log_format_from_flag_or_file() {
        let f = fixture();
        assert_eq!(resolve(args(&f)).unwrap().log_format, LogFormat::Auto);
        assert_eq!(log_format(&args(&f)), LogFormat::Auto);
        let path = f.dir.path().join("w.yaml");
        std::fs::write(
            &path,
            "log-format: pretty
",
        )
        .unwrap();
        let with_file = ServeArgs {
            config: Some(path.clone()),
            ..args(&f)
        };
        assert_eq!(
            resolve(with_file.clone()).unwrap().log_format,
            LogFormat::Pretty
        );
        assert_eq!(log_format(&with_file), LogFormat::Pretty);
        let flag_wins = ServeArgs {
            log_format: Some(LogFormat::Json),
            ..with_file.clone()
        };
        assert_eq!(
            resolve(flag_wins.clone()).unwrap().log_format,
            LogFormat::Json
        );
        assert_eq!(log_format(&flag_wins), LogFormat::Json);
        let broken = ServeArgs {
            worker_id: Some("not-a-uuid".into()),
            ..with_file
        };
        assert_eq!(
            log_format(&broken),
            LogFormat::Pretty,
            "known even when the start will fail"
        );
        std::fs::write(
            &path,
            "log-format: fancy
",
        )
        .unwrap();
        let err = resolve(ServeArgs {
            config: Some(path),
            ..args(&f)
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Invalid {
                    flag: "--config",
                    ..
                }
            ),
            "{err}"
        );
    }

    /// M0-W-1360: `--tokenizer hf-json` (flag or file) needs tokenizer.json
    /// beside the model; its absence fails the start naming the path.
    #[test]
    fn tokenizer_hf_json_needs_the_file_beside_the_model() {
        let f = fixture();
        assert_eq!(resolve(args(&f)).unwrap().tokenizer, TokenizerChoice::Gguf);
        let hf = ServeArgs {
            tokenizer: Some(TokenizerChoice::HfJson),
            ..args(&f)
        };
        let json = f.dir.path().join("tokenizer.json");
        match resolve(hf.clone()) {
            Err(ConfigError::Invalid { flag, message }) => {
                assert_eq!(flag, "--tokenizer");
                assert!(message.contains(&json.display().to_string()), "{message}");
            }
            other => panic!("{other:?}"),
        }
        std::fs::write(&json, "{}").unwrap();
        assert_eq!(resolve(hf).unwrap().tokenizer, TokenizerChoice::HfJson);
        let yaml = f.dir.path().join("w.yaml");
        std::fs::write(&yaml, "tokenizer: hf-json\n").unwrap();
        let from_file = resolve(ServeArgs {
            config: Some(yaml),
            ..args(&f)
        });
        assert_eq!(from_file.unwrap().tokenizer, TokenizerChoice::HfJson);
    }

    /// Issue #13: a chat template by built-in name or from a file, checked
    /// before anything loads; a name or a file, not both.
    #[test]
    fn chat_templates_by_name_or_file() {
        let f = fixture();
        let c = resolve(ServeArgs {
            chat_template: Some("gemma".into()),
            ..args(&f)
        })
        .unwrap();
        assert!(c.chat_template.unwrap().contains("<start_of_turn>"));
        assert_eq!(resolve(args(&f)).unwrap().chat_template, None);

        let good = f.dir.path().join("t.jinja");
        std::fs::write(&good, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
        let c = resolve(ServeArgs {
            chat_template_file: Some(good.clone()),
            ..args(&f)
        })
        .unwrap();
        assert!(c.chat_template.unwrap().starts_with("{% for m"));

        let broken = f.dir.path().join("broken.jinja");
        std::fs::write(&broken, "{% for m in messages %}").unwrap();
        let cases = [
            (
                Some("vicuna"),
                None,
                "--chat-template",
                "known: chatml, llama3, gemma, phi3",
            ),
            (Some("chatml"), Some(good), "--chat-template", "not both"),
            (
                None,
                Some(broken),
                "--chat-template-file",
                "does not compile",
            ),
            (
                None,
                Some(f.dir.path().join("absent.jinja")),
                "--chat-template-file",
                "absent",
            ),
        ];
        for (name, file, want_flag, want) in cases {
            let err = resolve(ServeArgs {
                chat_template: name.map(str::to_string),
                chat_template_file: file,
                ..args(&f)
            })
            .unwrap_err();
            match &err {
                ConfigError::Invalid { flag, message } => {
                    assert_eq!(*flag, want_flag, "{err}");
                    assert!(message.contains(want), "{err}");
                }
                _ => panic!("{err}"),
            }
        }
    }
}

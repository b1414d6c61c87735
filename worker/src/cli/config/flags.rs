//! The flags of the two command lines and the keys of the YAML file, with
//! their defaults and bounds.

use std::path::PathBuf;

use serde::Deserialize;

use crate::backend::{BackendKind, KvType};
use crate::load::TokenizerChoice;
use crate::telemetry::logging::LogFormat;

pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_BACKEND: BackendKind = BackendKind::Cuda;
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
/// `--prefix-cache-share` unless given: half the KV memory.
pub const DEFAULT_PREFIX_CACHE_SHARE: f64 = 0.5;

/// A feature's switch: `on` or `off`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    On,
    Off,
}

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
    /// Most tokens one job may generate, below the context length [default: 2048 on
    /// /execute; the context on /v1 routes].
    #[arg(long, value_name = "N")]
    pub max_tokens_out: Option<usize>,
    /// Longest prompt (or messages' text) in characters [default: 32768 on /execute;
    /// the context on /v1 routes].
    #[arg(long, value_name = "N")]
    pub max_prompt_chars: Option<usize>,
    /// A running job ends with INFERENCE_TIMEOUT after this many seconds [default: 300].
    #[arg(long, value_name = "SECONDS")]
    pub inference_timeout_sec: Option<u64>,
    /// Upper bound in MiB of the KV caches of the running jobs together [default: computed].
    #[arg(long, value_name = "MIB")]
    pub kv_cache_size_mb: Option<u64>,
    /// How the KV cache stores K and V: f16, or llama.cpp's block formats q8_0
    /// (about half the memory) and q4_0 (about a quarter) [default: f16].
    #[arg(long, value_name = "TYPE")]
    pub kv_type: Option<KvType>,
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
    /// Prompt reuse: prompts' whole chunks' KV kept after their jobs, so
    /// that a prompt starting with the same tokens computes only the rest
    /// (its tokens the same bits either way): on or off [default: on].
    #[arg(long, value_name = "on|off", hide_possible_values = true)]
    pub prefix_cache: Option<OnOff>,
    /// The prefix cache's bound: at most this fraction, above 0 and at most
    /// 1, of the KV memory of `--parallel` full contexts (on the GPU, of the
    /// paged KV pool); sequences take it back when they need it [default: 0.5].
    #[arg(long, value_name = "FRACTION")]
    pub prefix_cache_share: Option<f64>,
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
    pub max_prompt_chars: Option<usize>,
    pub inference_timeout_sec: Option<u64>,
    pub kv_cache_size_mb: Option<u64>,
    pub kv_type: Option<KvType>,
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
    pub prefix_cache: Option<OnOff>,
    pub prefix_cache_share: Option<f64>,
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

//! The checks of single values that read the disk or the network: the model
//! file, the port, the parity log's folder, `tokenizer.json`, chat templates,
//! and the HTTP options.

use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use super::{invalid, ConfigError, FileConfig, Options};
use crate::server::guard::HttpOptions;

/// `--tokenizer hf-json` reads `tokenizer.json` from the model file's folder:
/// a start without one fails here, naming the path, before anything loads.
pub(super) fn check_tokenizer_json(model: &Path) -> Result<(), ConfigError> {
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

pub(super) fn http_options(args: &Options, file: &FileConfig) -> Result<HttpOptions, ConfigError> {
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

pub(super) fn check_model_path(path: &Path) -> Result<(), ConfigError> {
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

pub(super) fn check_port_free(host: IpAddr, port: u16) -> Result<(), ConfigError> {
    TcpListener::bind((host, port))
        .map(drop)
        .map_err(|e| invalid("--port", format!("cannot listen on {host}:{port}: {e}")))
}

pub(super) fn check_parity_path(path: &Path) -> Result<(), ConfigError> {
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

//! The flags' and the YAML file's checks.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::backend::BackendKind;
use crate::load::TokenizerChoice;
use crate::telemetry::logging::LogFormat;

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

/// [`args`] with `change` made.
fn with(f: &Fixture, change: impl FnOnce(&mut ServeArgs)) -> ServeArgs {
    let mut a = args(f);
    change(&mut a);
    a
}

/// Nothing but `--config path`.
fn only_file(path: &Path) -> ServeArgs {
    let mut a = ServeArgs::default();
    a.options.config = Some(path.to_path_buf());
    a
}

fn flag_of(r: Result<ServeConfig, ConfigError>) -> &'static str {
    match r {
        Err(ConfigError::Invalid { flag, .. }) => flag,
        Err(ConfigError::Missing(flags)) if flags.len() == 1 => flags[0],
        Err(ConfigError::Missing(_)) => "several",
        Ok(_) => "ok",
    }
}

#[test]
fn defaults() {
    let f = fixture();
    let c = resolve(args(&f)).unwrap();
    assert_eq!(c.backend, BackendKind::Cuda);
    assert_eq!(c.host.to_string(), "127.0.0.1");
    assert_eq!(c.max_tokens_out, None);
    assert_eq!(c.max_prompt_chars, None);
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
            with(&f, |a| a.worker_id = Some("not-a-uuid".into())),
            "--worker-id",
        ),
        (
            with(&f, |a| a.model = Some(f.dir.path().join("missing.gguf"))),
            "--model",
        ),
        (
            with(&f, |a| a.model = Some("relative/m.gguf".into())),
            "--model",
        ),
        (
            with(&f, |a| a.model = Some(f.dir.path().to_path_buf())),
            "--model",
        ),
        (with(&f, |a| a.model = Some(not_gguf)), "--model"),
        (with(&f, |a| a.port = Some(80)), "--port"),
        (with(&f, |a| a.port = Some(70000)), "--port"),
        (with(&f, |a| a.port = Some(busy_port)), "--port"),
        (
            with(&f, |a| a.options.host = Some("nowhere".into())),
            "--host",
        ),
        (
            with(&f, |a| a.options.max_tokens_out = Some(0)),
            "--max-tokens-out",
        ),
        (
            with(&f, |a| a.options.max_prompt_chars = Some(0)),
            "--max-prompt-chars",
        ),
        (
            with(&f, |a| a.options.max_tokens_in = Some(0)),
            "--max-tokens-in",
        ),
        (
            with(&f, |a| a.options.inference_timeout_sec = Some(0)),
            "--inference-timeout-sec",
        ),
        (
            with(&f, |a| a.options.callback_url = Some("ftp://x".into())),
            "--callback-url",
        ),
        (
            with(&f, |a| {
                a.options.parity_log = Some("/no/such/dir/p.jsonl".into())
            }),
            "--parity-log",
        ),
        (with(&f, |a| a.worker_id = None), "--worker-id"),
        (with(&f, |a| a.model = None), "--model"),
        (with(&f, |a| a.gpu_device = None), "--gpu-device"),
        (with(&f, |a| a.port = None), "--port"),
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
    let from_file = resolve(only_file(&path)).unwrap();
    assert_eq!(from_file.port, other_port);
    assert_eq!(from_file.max_tokens_out, Some(5));
    assert_eq!(from_file.backend, BackendKind::Cpu);
    let overridden = resolve(ServeArgs {
        port: Some(f.port),
        ..only_file(&path)
    })
    .unwrap();
    assert_eq!(overridden.port as u32, f.port);
    assert_eq!(overridden.max_tokens_out, Some(5));

    std::fs::write(&path, "port: 8080\nbogus-key: 1\n").unwrap();
    let err = resolve(with(&f, |a| a.options.config = Some(path.clone()))).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { flag: "--config", message } if message.contains("bogus-key")),
        "{err}"
    );
    let err = resolve(with(&f, |a| {
        a.options.config = Some(f.dir.path().join("none.yaml"))
    }))
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
    let with_file = with(&f, |a| a.options.config = Some(path.clone()));
    assert_eq!(
        resolve(with_file.clone()).unwrap().log_format,
        LogFormat::Pretty
    );
    assert_eq!(log_format(&with_file), LogFormat::Pretty);
    let mut flag_wins = with_file.clone();
    flag_wins.options.log_format = Some(LogFormat::Json);
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
    let err = resolve(with(&f, |a| a.options.config = Some(path))).unwrap_err();
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
    let hf = with(&f, |a| a.options.tokenizer = Some(TokenizerChoice::HfJson));
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
    let from_file = resolve(with(&f, |a| a.options.config = Some(yaml)));
    assert_eq!(from_file.unwrap().tokenizer, TokenizerChoice::HfJson);
}

/// Issue #13: a chat template by built-in name or from a file, checked
/// before anything loads; a name or a file, not both.
#[test]
fn chat_templates_by_name_or_file() {
    let f = fixture();
    let c = resolve(with(&f, |a| a.options.chat_template = Some("gemma".into()))).unwrap();
    assert!(c.chat_template.unwrap().contains("<start_of_turn>"));
    assert_eq!(resolve(args(&f)).unwrap().chat_template, None);

    let good = f.dir.path().join("t.jinja");
    std::fs::write(&good, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let c = resolve(with(&f, |a| {
        a.options.chat_template_file = Some(good.clone())
    }))
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
        let err = resolve(with(&f, |a| {
            a.options.chat_template = name.map(str::to_string);
            a.options.chat_template_file = file;
        }))
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

/// Issue 48: every missing required flag is named in one error that points
/// at `serve`; a usage error, not a failed check.
#[test]
fn missing_required_flags_are_named_together() {
    let err = resolve(ServeArgs::default()).unwrap_err();
    assert_eq!(
        err,
        ConfigError::Missing(vec!["--worker-id", "--model", "--gpu-device", "--port"])
    );
    let text = err.to_string();
    assert!(
        text.starts_with("the flags --worker-id, --model, --gpu-device and --port are required")
            && text.contains("worker-orcd serve MODEL.gguf"),
        "{text}"
    );
    let one = ConfigError::Missing(vec!["--port"]).to_string();
    assert!(one.starts_with("the flag --port is required"), "{one}");
}

/// `--ctx-size` caps the context the backend is sized for, with
/// `--max-tokens-in` plus `--max-tokens-out` when both are given.
#[test]
fn ctx_size_bounds_the_context() {
    let f = fixture();
    assert_eq!(resolve(args(&f)).unwrap().max_context(), None);
    let c = resolve(with(&f, |a| a.ctx_size = Some(4096))).unwrap();
    assert_eq!((c.ctx_size, c.max_context()), (Some(4096), Some(4096)));
    let c = resolve(with(&f, |a| {
        a.ctx_size = Some(4096);
        a.options.max_tokens_in = Some(100);
        a.options.max_tokens_out = Some(28);
    }))
    .unwrap();
    assert_eq!(c.max_context(), Some(128));
    let err = resolve(with(&f, |a| a.ctx_size = Some(1))).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Invalid {
                flag: "--ctx-size",
                ..
            }
        ),
        "{err}"
    );
}

/// `serve`'s fallbacks: a relative model path taken from the working
/// folder, a new worker id, GPU 0 and the fallback port, each only where
/// neither a flag nor the file gives one.
#[test]
fn serve_fills_in_what_a_person_leaves_out() {
    let f = fixture();
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(&f.model, &cwd);
    let fallbacks = Fallbacks {
        worker_id: Some("6f1d7a2e-0000-4000-8000-000000000001".into()),
        gpu_device: Some(0),
        port: Some(f.port),
        relative_model: true,
    };
    let mut a = ServeArgs {
        model: Some(relative.clone()),
        ..ServeArgs::default()
    };
    let c = resolve_with(a.clone(), &fallbacks).unwrap();
    assert!(c.model.is_absolute(), "{}", c.model.display());
    let same = c.model.canonicalize().unwrap() == f.model.canonicalize().unwrap();
    assert!(same, "{} from {}", c.model.display(), relative.display());
    assert_eq!(c.port as u32, f.port);
    assert_eq!(c.worker_id, "6f1d7a2e-0000-4000-8000-000000000001");
    assert_eq!(c.gpu_device, 0);
    // The orchestrator's command line refuses the same relative path.
    let strict = resolve(ServeArgs {
        worker_id: Some("6f1d7a2e-0000-4000-8000-000000000001".into()),
        gpu_device: Some(0),
        port: Some(f.port),
        ..a.clone()
    });
    assert_eq!(flag_of(strict), "--model");
    // The file's port wins over the fallback.
    let other_port = free_port();
    let yaml = f.dir.path().join("w.yaml");
    std::fs::write(&yaml, format!("port: {other_port}\n")).unwrap();
    a.options.config = Some(yaml);
    assert_eq!(resolve_with(a, &fallbacks).unwrap().port, other_port);

    let (args, fallbacks) = parse_serve(&["m.gguf", "-c", "512", "-p", "9000", "-np", "4"]);
    assert_eq!(args.model, Some(PathBuf::from("m.gguf")));
    assert_eq!(
        (args.ctx_size, args.port, args.parallel),
        (Some(512), Some(9000), Some(4))
    );
    assert_eq!(fallbacks.port, Some(DEFAULT_SERVE_PORT));
    assert!(uuid::Uuid::parse_str(fallbacks.worker_id.as_deref().unwrap()).is_ok());
    let (args, _) = parse_serve(&["-m", "m.gguf", "--parallel", "2", "--backend", "cpu"]);
    assert_eq!(args.model, Some(PathBuf::from("m.gguf")));
    assert_eq!(
        (args.parallel, args.options.backend),
        (Some(2), Some(BackendKind::Cpu))
    );
}

/// `worker-orcd serve ARGS` as the binary parses it, `-np` included.
fn parse_serve(args: &[&str]) -> (ServeArgs, Fallbacks) {
    use clap::Parser;
    let argv = ["worker-orcd", "serve"].iter().chain(args).map(Into::into);
    let cli = crate::cli::Cli::try_parse_from(preprocess_args(argv)).unwrap();
    match cli.command {
        Some(crate::cli::Command::Serve(cmd)) => cmd.into_args(),
        other => panic!("{other:?}"),
    }
}

/// `path` relative to `base` (both absolute), with `..` as needed.
fn pathdiff(path: &Path, base: &Path) -> PathBuf {
    let (path, base): (Vec<_>, Vec<_>) = (path.components().collect(), base.components().collect());
    let common = path.iter().zip(&base).take_while(|(a, b)| a == b).count();
    let ups = base.len() - common;
    let mut out: PathBuf = std::iter::repeat_n("..", ups).collect();
    out.extend(&path[common..]);
    out
}

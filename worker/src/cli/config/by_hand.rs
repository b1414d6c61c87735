//! `worker-orcd serve MODEL`: the worker started by a person, with
//! llama-server's spelling (`-m`, `-c`, `-p`, `-np`, `--host`), a relative
//! path, port 8080, GPU 0 and a new worker id (logged at start) when none is
//! given. It fills in what the orchestrator's command line requires and
//! then goes through the very same checks ([`super::resolve_with`]).

use std::ffi::OsString;
use std::path::PathBuf;

use super::{Fallbacks, Options, ServeArgs, DEFAULT_SERVE_PORT};

const EXAMPLES: &str = "\
Examples:
  worker-orcd serve model.gguf --backend cpu     serve on the CPU at http://127.0.0.1:8080
  worker-orcd serve model.gguf                   serve from GPU 0
  worker-orcd serve -m model.gguf -c 4096 -p 9000 -np 4
                                                 4096 tokens of context, port 9000, 4 jobs at once
  worker-orcd serve model.gguf --host 0.0.0.0 --api-key KEY
                                                 reachable from other machines, with a key

Then, for instance:
  curl -N localhost:8080/v1/chat/completions -H 'content-type: application/json' \\
    -d '{\"model\":\"model\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"stream\":true}'";

/// The command line of `worker-orcd serve`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct ServeCommand {
    /// The GGUF model file, a relative or absolute path.
    #[arg(value_name = "MODEL", required_unless_present_any = ["model", "config"])]
    pub model_path: Option<PathBuf>,
    /// The GGUF model file, instead of MODEL.
    #[arg(short = 'm', long, value_name = "FILE", conflicts_with = "model_path")]
    pub model: Option<PathBuf>,
    /// Tokens of context a job may use, prompt and output together [default: the model's].
    #[arg(short = 'c', long, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// HTTP port, 1024-65535 [default: 8080].
    #[arg(short = 'p', long)]
    pub port: Option<u32>,
    /// Jobs that run at once, decoded together, at most 256; `-np N` as in
    /// llama-server [default: 1].
    #[arg(long, visible_alias = "np", value_name = "N")]
    pub parallel: Option<usize>,
    /// GPU ordinal [default: 0].
    #[arg(long, value_name = "N")]
    pub gpu_device: Option<usize>,
    /// Worker id, a UUID [default: a new one, logged at start].
    #[arg(long, value_name = "UUID")]
    pub worker_id: Option<String>,
    #[command(flatten)]
    pub options: Options,
}

impl ServeCommand {
    /// The orchestrator's flags this command line amounts to, and what
    /// stands in for the required ones it leaves out.
    pub fn into_args(self) -> (ServeArgs, Fallbacks) {
        let args = ServeArgs {
            worker_id: self.worker_id,
            model: self.model_path.or(self.model),
            gpu_device: self.gpu_device,
            port: self.port,
            parallel: self.parallel,
            ctx_size: self.ctx_size,
            options: self.options,
        };
        let fallbacks = Fallbacks {
            worker_id: Some(uuid::Uuid::new_v4().to_string()),
            gpu_device: Some(0),
            port: Some(DEFAULT_SERVE_PORT),
            relative_model: true,
        };
        (args, fallbacks)
    }
}

/// llama-server spells `--parallel` `-np`, a short flag of two letters,
/// which clap cannot declare: in `worker-orcd serve ...`, a `-np` (or
/// `-np=N`) before any `--` becomes `--np`, `--parallel`'s alias. Nothing
/// else is touched, and other command lines not at all.
pub fn preprocess_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    if args.get(1).is_none_or(|a| a != "serve") {
        return args;
    }
    for arg in args.iter_mut().skip(2) {
        if arg == "--" {
            break;
        }
        if let Some(rest) = arg.to_str().and_then(|a| a.strip_prefix("-np")) {
            if rest.is_empty() || rest.starts_with('=') {
                *arg = format!("--np{rest}").into();
            }
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn np_becomes_the_long_alias_in_serve_only() {
        assert_eq!(
            preprocess_args(os(&["w", "serve", "m.gguf", "-np", "4", "-np=2"])),
            os(&["w", "serve", "m.gguf", "--np", "4", "--np=2"])
        );
        let untouched = [
            &["w", "--model", "m.gguf", "-np", "4"][..],
            &["w", "generate", "-np"],
            &["w", "serve", "m.gguf", "--", "-np"],
            &["w", "serve", "-npx"],
            &["w"],
        ];
        for args in untouched {
            assert_eq!(preprocess_args(os(args)), os(args), "{args:?}");
        }
    }
}

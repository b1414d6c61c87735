//! `worker-orcd generate`: runs the engine once, without HTTP, and prints each
//! token with its id (and, when asked, its top-K log-probabilities).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};

use crate::backend::BackendKind;
use crate::engine::generate::{AbortReason, GeneratedToken, GenerationObserver, GenerationRequest};
use crate::engine::round::generate;
use crate::load::{load_model, LoadOptions, TokenizerChoice};
use crate::sampling::SamplingParams;
use crate::tokenizer::ChatMessage;

#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// Compute backend.
    #[arg(long, default_value = "cuda")]
    pub backend: BackendKind,
    /// GGUF model file.
    #[arg(long)]
    pub model: PathBuf,
    /// Raw prompt text (special tokens in it are recognised).
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    pub prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    pub chat: Option<String>,
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// 0 picks the most likely token at each step.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the K most likely tokens with their log-probabilities at each step.
    #[arg(long, default_value_t = 0)]
    pub logprobs: usize,
    /// GPU ordinal for the cuda backend.
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// Chat template for --chat, replacing the file's: chatml, llama3, gemma or phi3.
    #[arg(long, value_name = "NAME", conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// Chat template for --chat from a Jinja file.
    #[arg(long, value_name = "FILE.jinja")]
    pub chat_template_file: Option<PathBuf>,
    /// Tokenizer: gguf (from the model file's metadata) or hf-json
    /// (tokenizer.json in the model file's folder).
    #[arg(long, value_name = "KIND", default_value = "gguf")]
    pub tokenizer: TokenizerChoice,
}

struct Printer<'a> {
    tokenizer: &'a crate::tokenizer::Tokenizer,
    out: std::io::StdoutLock<'a>,
}

impl GenerationObserver for Printer<'_> {
    fn should_abort(&mut self) -> Option<AbortReason> {
        None
    }

    fn on_token(&mut self, token: GeneratedToken) -> Option<AbortReason> {
        let mut line = format!("{}\t{}\t{:?}", token.index, token.id, token.text);
        if let Some(lps) = &token.logprobs {
            line.push('\t');
            for lp in lps {
                let text = self.tokenizer.decode(&[lp.id]).unwrap_or_default();
                line.push_str(&format!("{}:{:?}:{:.4} ", lp.id, text, lp.logprob));
            }
        }
        let _ = writeln!(self.out, "{}", line.trim_end());
        let _ = self.out.flush();
        None
    }
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let opts = LoadOptions {
        backend: args.backend,
        gpu_device: args.gpu_device,
        chat_template: super::config::chat_template_source(
            args.chat_template.as_deref(),
            args.chat_template_file.as_deref(),
        )?,
        tokenizer: args.tokenizer,
        ..LoadOptions::default()
    };
    let mut model = load_model(&args.model, &opts, &mut |_| {})
        .with_context(|| format!("loading {}", args.model.display()))?;
    let tokenizer = model.tokenizer.clone();
    let prompt = match (&args.prompt, &args.chat) {
        (Some(p), None) => p.clone(),
        (None, Some(c)) => {
            let template = tokenizer.chat_template().context(
                "the model has no chat template: give --chat-template NAME or --chat-template-file",
            )?;
            let rendered = template.render(&[ChatMessage::new("user", c.clone())], true)?;
            tokenizer.without_added_specials(&rendered).to_string()
        }
        _ => bail!("give exactly one of --prompt and --chat"),
    };
    let prompt_tokens = tokenizer.encode(&prompt, true, true)?;
    eprintln!(
        "prompt: {} tokens: {:?}",
        prompt_tokens.len(),
        prompt_tokens
    );

    let req = GenerationRequest {
        prompt_tokens,
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repetition_penalty,
            seed: args.seed,
        },
        stop: Vec::new(),
        logprobs: args.logprobs,
        ignore_eos: false,
        accepted_at: None,
        constraint: None,
        bias: Default::default(),
    };
    let mut printer = Printer {
        tokenizer: &tokenizer,
        out: std::io::stdout().lock(),
    };
    let summary = generate(model.backend.as_mut(), &tokenizer, &req, &mut printer)?;
    eprintln!(
        "tokens_in={} tokens_out={} first_token_ms={} decode_time_ms={} stop_reason={}",
        summary.tokens_in,
        summary.tokens_out,
        summary.first_token_ms,
        summary.decode_time_ms,
        summary.stop_reason.as_str()
    );
    Ok(())
}

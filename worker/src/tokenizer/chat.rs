//! Chat templates: a GGUF's `tokenizer.chat_template` (Jinja) rendered with
//! minijinja the way Hugging Face transformers renders it with jinja2:
//! `trim_blocks` and `lstrip_blocks` on, trailing newline dropped,
//! `raise_exception(msg)`, `strftime_now(fmt)`, an HF-style `tojson`, Python string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`...) through
//! minijinja-contrib's `pycompat`, and the variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (the request's
//! tool definitions, or none) and `documents` (none), as transformers passes them,
//! beside the request's own ([`TemplateInputs::vars`]: `chat_template_kwargs`,
//! as transformers' `apply_chat_template(**kwargs)` passes them, e.g. Qwen3's
//! `enable_thinking`). Tool calls and results in the conversation, and
//! templates that ignore `tools`: `chat_tools.rs`.

use std::sync::OnceLock;

use minijinja::limits::{self, RenderLimits};
use minijinja::{Environment, Error, ErrorKind, State, Value};

use super::chat_json::tojson;
use super::chat_message::ChatMessage;
use super::chat_tools;
use super::TokenizerError;

const TEMPLATE_NAME: &str = "chat_template";

/// The variables the worker gives every rendering.
pub const WORKER_VARIABLES: [&str; 6] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "tools",
    "documents",
];

/// What a request gives the template besides its conversation.
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateInputs<'a> {
    /// OpenAI-shaped tool definitions: the template's `tools`.
    pub tools: Option<&'a [serde_json::Value]>,
    /// The request's own variables (its `chat_template_kwargs`, and
    /// `reasoning_effort`: gpt-oss's template writes `low`, `medium` or
    /// `high` into its system message). The worker's variables win over
    /// them; see [`is_reserved_variable`].
    pub vars: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// Whether a request's variable `name` would hide one the template needs
/// from the worker: one of [`WORKER_VARIABLES`], or a function every
/// template may call (minijinja's `range`, `namespace`, `dict`..., the
/// worker's `raise_exception`, `strftime_now`).
pub fn is_reserved_variable(name: &str) -> bool {
    // minijinja's own globals, listed once (an environment per check would
    // register every built-in again for each key of each request).
    static BUILT_IN: OnceLock<Vec<String>> = OnceLock::new();
    let built_in = BUILT_IN.get_or_init(|| {
        Environment::new()
            .globals()
            .map(|(global, _)| global.to_string())
            .collect()
    });
    WORKER_VARIABLES.contains(&name)
        || WORKER_FUNCTIONS.contains(&name)
        || built_in.iter().any(|global| global == name)
}

/// The functions the worker adds to minijinja's own.
const WORKER_FUNCTIONS: [&str; 2] = ["raise_exception", "strftime_now"];

/// Bounds on one rendering (issue #15): a template comes from the model file
/// and messages from clients, so neither may loop, recurse or grow without
/// end. Real templates spend a few hundred instructions per message; the
/// fuel allows thousands of messages and stops a runaway loop in well under
/// a second.
pub const TEMPLATE_FUEL: u64 = 2_000_000;
/// Nesting depth of macros, includes and expressions.
pub const TEMPLATE_RECURSION: usize = 64;
/// Largest rendered prompt, in bytes: far above the request's own limits
/// (32 768 characters of content) plus any template's markup.
pub const MAX_RENDERED_BYTES: usize = 4 << 20;
/// Wall-clock time for one rendering. Real templates take well under a
/// millisecond; fuel alone does not bound time, since one instruction can
/// scan a string of megabytes.
pub const TEMPLATE_TIME: std::time::Duration = std::time::Duration::from_millis(500);
/// Bytes one rendering may create (values and output, counted as if every
/// lazy sequence were materialised). One instruction can double a string
/// (`{% set x = x ~ x %}`), so neither fuel nor the output cap bounds memory.
pub const TEMPLATE_BYTES: usize = 128 << 20;

/// A `String` writer that refuses to grow past [`MAX_RENDERED_BYTES`].
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other(format!(
                "the rendered prompt is longer than {MAX_RENDERED_BYTES} bytes"
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A compiled chat template. Compile once per model; render per request.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The probe conversation rendered with a tool, when the template
    /// writes tools into the prompt (see [`ChatTemplate::tool_probe`]).
    tool_probe: OnceLock<Option<String>>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors come back as [`TokenizerError::Template`].
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION);
        env.set_render_limits(RenderLimits {
            time: Some(TEMPLATE_TIME),
            bytes: Some(TEMPLATE_BYTES),
        });
        env.set_unknown_method_callback(python_methods);
        env.set_formatter(python_formatter);
        let [raise, strftime] = WORKER_FUNCTIONS;
        env.add_function(raise, raise_exception);
        env.add_function(strftime, strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, python_line_continuations(source))
            .map_err(template_error)?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            tool_probe: OnceLock::new(),
        })
    }

    /// Renders the conversation; with `add_generation_prompt` the template appends
    /// the opening of the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(messages, add_generation_prompt, TemplateInputs::default())
    }

    /// [`ChatTemplate::render`] with the request's tools and variables
    /// ([`TemplateInputs`]). A template that does not write tools, given
    /// tools or a tool exchange, renders the conversation rewritten the
    /// Hermes way instead (`chat_tools::hermes_messages`).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        inputs: TemplateInputs<'_>,
    ) -> Result<String, TokenizerError> {
        let tools = inputs.tools.filter(|t| !t.is_empty());
        let tool_exchange = tools.is_some() || messages.iter().any(ChatMessage::is_tool_exchange);
        if tool_exchange && self.tool_probe().is_none() {
            let rewritten = chat_tools::hermes_messages(messages, tools);
            let inputs = TemplateInputs {
                tools: None,
                ..inputs
            };
            return self.render_raw(&rewritten, add_generation_prompt, inputs);
        }
        self.render_raw(
            messages,
            add_generation_prompt,
            TemplateInputs { tools, ..inputs },
        )
    }

    /// The probe conversation (`chat_tools::probe`: a system and a user
    /// message, one tool) as this template renders it, when the rendering
    /// names the tool: what a template does with tools tells which format
    /// the model calls them in. None for a template that ignores `tools`
    /// or fails on them. Rendered once.
    pub fn tool_probe(&self) -> Option<&str> {
        self.tool_probe
            .get_or_init(|| {
                let (messages, tools) = chat_tools::probe();
                let inputs = TemplateInputs {
                    tools: Some(&tools),
                    vars: None,
                };
                self.render_raw(&messages, true, inputs)
                    .ok()
                    .filter(|text| text.contains(chat_tools::PROBE_TOOL))
            })
            .as_deref()
    }

    fn render_raw(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        inputs: TemplateInputs<'_>,
    ) -> Result<String, TokenizerError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let mut out = Bounded(Vec::new());
        // The keys before `..` win over the request's.
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            tools => inputs.tools.map_or(Value::from(()), Value::from_serialize),
            documents => Value::from(()),
            ..inputs.vars.map_or(Value::from(()), Value::from_serialize)
        };
        tmpl.render_captured_to(ctx, &mut out).map_err(|e| {
            // minijinja reports a failed write without its reason.
            if e.kind() == ErrorKind::WriteFailure {
                TokenizerError::Template(format!(
                    "the rendered prompt is longer than {MAX_RENDERED_BYTES} bytes"
                ))
            } else {
                template_error(e)
            }
        })?;
        // Templates render str values only, so the bytes are UTF-8.
        String::from_utf8(out.0).map_err(|e| TokenizerError::Template(e.to_string()))
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// In jinja2 (as in Python) a backslash at the end of a line inside a string
/// literal continues the line: both characters vanish. minijinja keeps them, so
/// they are removed here, inside string literals in `{{ }}` / `{% %}` only
/// (Mistral's templates write their long default system prompts this way).
fn python_line_continuations(source: &str) -> String {
    if !source.contains("\\\n") && !source.contains("\\\r\n") {
        return source.to_string();
    }
    let b = source.as_bytes();
    let starts = |i: usize, pat: &str| b[i..].starts_with(pat.as_bytes());
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if starts(i, "{#") {
            // A comment: copied as is.
            let end = source[i + 2..]
                .find("#}")
                .map_or(b.len(), |p| i + 2 + p + 2);
            out.extend_from_slice(&b[i..end]);
            i = end;
        } else if starts(i, "{%") && is_raw_open(&source[i..]) {
            // {% raw %} ... {% endraw %}: copied as is.
            let end = find_endraw(&source[i..]).map_or(b.len(), |p| i + p);
            out.extend_from_slice(&b[i..end]);
            i = end;
        } else if starts(i, "{{") || starts(i, "{%") {
            let close = if b[i + 1] == b'{' { "}}" } else { "%}" };
            out.extend_from_slice(&b[i..i + 2]);
            i += 2;
            let mut quote: Option<u8> = None;
            while i < b.len() {
                let c = b[i];
                match quote {
                    None if starts(i, close) => {
                        out.extend_from_slice(close.as_bytes());
                        i += 2;
                        break;
                    }
                    None => {
                        if c == b'"' || c == b'\'' {
                            quote = Some(c);
                        }
                        out.push(c);
                        i += 1;
                    }
                    Some(_) if c == b'\\' && starts(i + 1, "\n") => i += 2,
                    Some(_) if c == b'\\' && starts(i + 1, "\r\n") => i += 3,
                    Some(_) if c == b'\\' && i + 1 < b.len() => {
                        // Any other escape, kept (and an escaped quote does not end the string).
                        out.extend_from_slice(&b[i..i + 2]);
                        i += 2;
                    }
                    Some(q) => {
                        if c == q {
                            quote = None;
                        }
                        out.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    // Only ASCII bytes were dropped, never part of a multi-byte character.
    String::from_utf8(out).unwrap_or_else(|_| source.to_string())
}

/// Whether `s` starts with a `{% raw %}` tag (with any whitespace control).
fn is_raw_open(s: &str) -> bool {
    let inner = s[2..].trim_start_matches(['-', '+']).trim_start();
    inner.strip_prefix("raw").is_some_and(|rest| {
        rest.trim_start()
            .trim_start_matches(['-', '+'])
            .starts_with("%}")
    })
}

/// Where the `{% endraw %}` closing a raw block at the start of `s` ends.
fn find_endraw(s: &str) -> Option<usize> {
    let mut from = 2;
    while let Some(p) = s[from..].find("{%") {
        let at = from + p;
        let inner = s[at + 2..].trim_start_matches(['-', '+']).trim_start();
        if let Some(rest) = inner.strip_prefix("endraw") {
            let rest = rest.trim_start().trim_start_matches(['-', '+']);
            if rest.starts_with("%}") {
                return Some(s.len() - rest.len() + 2);
            }
        }
        from = at + 2;
    }
    None
}

/// The error with its causes (a wrapped "cannot convert value to list" says
/// why only in its source).
fn template_error(e: Error) -> TokenizerError {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    TokenizerError::Template(text)
}

/// Python's string, dict and list methods (minijinja-contrib's `pycompat`),
/// with the size of the output checked first where it can outgrow the input:
/// `str.replace` and `str.join` square it, `str.split` makes a value per part.
fn python_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let arg_str = |i: usize| args.get(i).and_then(Value::as_str).unwrap_or("");
        match method {
            "replace" => limits::ensure_replaced(s, arg_str(0), arg_str(1))?,
            "join" => {
                if let Some(items) = args.first() {
                    limits::ensure_joined(items, s)?;
                }
            }
            "split" | "splitlines" => limits::ensure_items(s.len())?,
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `raise_exception(msg)`: the template refuses the conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the local time, formatted like Python's `strftime`.
fn strftime_now(fmt: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&fmt).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("bad strftime format {fmt:?}"),
        ));
    }
    Ok(Value::from(
        chrono::Local::now()
            .format_with_items(items.into_iter())
            .to_string(),
    ))
}

/// Prints `none`, `true` and `false` as Python does (`None`, `True`, `False`).
fn python_formatter(
    out: &mut minijinja::Output,
    state: &State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        minijinja::value::ValueKind::None => out.write_str("None").map_err(Error::from),
        minijinja::value::ValueKind::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

#[cfg(test)]
mod limit_tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn render(source: &str) -> Result<String, TokenizerError> {
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        t.render(&[ChatMessage::new("user", "hi")], true)
    }

    /// Issue #15, failure 2: hostile templates end with a clear error,
    /// quickly, instead of keeping a core busy or exhausting memory.
    #[test]
    fn hostile_templates_end_with_an_error() {
        let cases = [
            // An endless loop: nested ranges, about 10^15 steps.
            (
                "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
                 {% endfor %}{% endfor %}{% endfor %}",
                "fuel",
            ),
            // Unbounded recursion.
            ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
            // Output growing past the cap in few instructions.
            (
                "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
                "longer than",
            ),
        ];
        for (source, want) in cases {
            let t = Instant::now();
            let err = render(source).expect_err(source).to_string();
            assert!(err.contains(want), "{source}: {err}");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{source}: {:?}",
                t.elapsed()
            );
        }
    }

    /// Issue #15: templates that build huge values in few instructions (so
    /// fuel does not stop them) end with an error, in bounded time, without
    /// exhausting memory: each of these allocated gigabytes or more before the
    /// render limits.
    #[test]
    fn templates_that_grow_values_end_with_an_error() {
        let cases = [
            // Found by the chat_template fuzzer (see the test below); this one doubles a
            // string 40 times, until libFuzzer's memory limit stopped it.
            "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
            "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}",
            "{% macro d(s, n) %}{% if n > 0 %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('x' * 100000, 40) }}",
            // Lazy sequences, doubled, then materialised or joined in one call.
            "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|join(',') }}",
            "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = ns.x|chain(ns.x) %}{% endfor %}{{ ns.x|list|length }}",
            // Shared items: a list of one big string, repeated.
            "{% set s = 'x' * 10000000 %}{{ ([s] * 100000)|string|length }}",
            // Outputs that are the square of their inputs.
            "{% set s = 'x' * 100000 %}{{ s|replace('x', s)|length }}",
            "{% set s = 'x' * 100000 %}{{ s.replace('', s)|length }}",
            "{% set s = 'x' * 100000 %}{{ s.join([s] * 100000)|length }}",
            "{{ ('a\n' * 1000000)|indent(100000)|length }}",
            "{{ '%1000000000000d'|format(1)|length }}",
            "{{ '{:>1000000000000}'.format(1)|length }}",
            "{{ [1, 2]|batch(1000000000000)|length }}",
            "{{ [1, 2]|slice(1000000000000)|length }}",
            "{{ messages|tojson(indent=1000000000000) }}",
            // Per-character values.
            "{% set s = 'ab' * 50000000 %}{{ s|list|length }}",
            "{% set s = ',' * 100000000 %}{{ s.split(',')|length }}",
            // Captures and loops writing into a variable, not the output.
            "{% set s = 'x' * 10000000 %}{% set y %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endset %}{{ y|length }}",
            // Many cheap-looking scans of a long string: time, not memory.
            "{% set s = 'x' * 90000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
        ];
        for source in cases {
            let t = Instant::now();
            let err = render(source).expect_err(source).to_string();
            eprintln!("{:>8.1?} {source}: {err}", t.elapsed());
            assert!(
                ["memory budget", "time limit", "too large", "longer than"]
                    .iter()
                    .any(|w| err.contains(w)),
                "{source}: {err}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{source}: {:?}",
                t.elapsed()
            );
        }
    }

    /// The chat_template fuzzer's timeout: `'...' * n` up to minijinja's
    /// 100 MB per operation, over and over, rendered for seconds under ASan
    /// (benches/results/code-comment-figures.md). Replayed the way the fuzz
    /// target splits its input.
    #[test]
    fn the_fuzzers_slow_template_ends_in_time() {
        let data = include_bytes!("../../../fuzz/corpus/chat_template/regression-timeout-cca771e7");
        let text = String::from_utf8_lossy(data);
        let (source, rest) = text.split_once('\0').unwrap();
        let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
        let messages: Vec<ChatMessage> = rest
            .split('\0')
            .map(|content| ChatMessage::new("user", content))
            .collect();
        let start = Instant::now();
        let _ = t.render(&messages, true);
        assert!(start.elapsed() < TEMPLATE_TIME + Duration::from_millis(500));
    }

    /// The bounds leave real conversations alone: 256 messages through a
    /// ChatML template.
    #[test]
    fn a_long_real_conversation_renders() {
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                      {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(chatml, "", "").unwrap();
        let msgs: Vec<ChatMessage> = (0..256)
            .map(|i| ChatMessage::new("user", "word ".repeat(25) + &i.to_string()))
            .collect();
        let out = t.render(&msgs, true).unwrap();
        assert!(out.ends_with("<|im_start|>assistant\n") && out.len() > 256 * 125);
    }
}

//! Calls out of a model's output, fed token by token ([`CallParser`]): what
//! each token releases is content that can no longer turn into a call, and
//! the calls completed. Text that may still be the start of a call (a
//! partial `<tool_call>`, an answer that opens with `{`) is held until it is
//! known, so no call markup ever reaches `content`; a call whose JSON does
//! not parse is given back as the content it was. White space next to a
//! call is dropped. A streamed answer and a whole one run the same parser.

use serde_json::Value;

use super::format::ToolFormat;

/// Hermes' markers around each call.
pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";
/// What Llama 3.1 may write before a call.
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// How an answer's calls are read: the model's format, whether more than
/// one call is kept, and the functions' names (an answer of bare JSON is a
/// call only when it names one of them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolReply {
    pub format: ToolFormat,
    pub parallel: bool,
    pub names: Vec<String>,
}

/// One call read from the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// `call_` and 24 random hexadecimal digits.
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// What one step of parsing releases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub content: String,
    pub calls: Vec<ParsedCall>,
    /// The reasoning (`reasoning_content`): never the parser's, which reads
    /// content only; `Release` adds it.
    pub reasoning: String,
}

impl Released {
    pub fn extend(&mut self, other: Released) {
        self.content.push_str(&other.content);
        self.calls.extend(other.calls);
        self.reasoning.push_str(&other.reasoning);
    }
}

#[derive(Clone, Debug)]
enum State {
    /// Only white space so far: held, to see whether the answer is JSON.
    Start,
    /// Text: what is held is white space or a possible start of [`OPEN`].
    Text,
    /// After [`OPEN`]: the call's text so far.
    Call(String),
    /// The answer is JSON (after [`PYTHON_TAG`] maybe): held to the end.
    Json(String),
    /// Llama 3.1 text that is not a call: released as it comes.
    Plain,
}

/// A harmony reply: the header text since the last message body, and the
/// call being read (its function and arguments so far).
#[derive(Clone, Debug, Default)]
struct Harmony {
    header: String,
    in_body: bool,
    call: Option<(String, String)>,
}

/// Reads one answer's calls (see the module's docs).
#[derive(Clone, Debug)]
pub struct CallParser {
    reply: ToolReply,
    state: State,
    held: String,
    harmony: Harmony,
    emitted: usize,
    /// A call has just closed: white space still to come is dropped, in
    /// whichever token it comes.
    after_call: bool,
}

impl CallParser {
    pub fn new(reply: ToolReply) -> Self {
        CallParser {
            reply,
            state: State::Start,
            held: String::new(),
            harmony: Harmony::default(),
            emitted: 0,
            after_call: false,
        }
    }

    /// One generated token's text; `channel` is its harmony channel (none
    /// for structure tokens and headers, and for every token of other
    /// models). Harmony's `analysis` text is left to the caller.
    pub fn push(&mut self, text: &str, channel: Option<&str>) -> Released {
        let mut out = Released::default();
        if self.reply.format == ToolFormat::Harmony {
            self.push_harmony(text, channel, &mut out);
        } else {
            self.held.push_str(text);
            self.advance(&mut out, false);
        }
        out
    }

    /// The end of the answer: everything still held.
    pub fn finish(&mut self) -> Released {
        let mut out = Released::default();
        if self.reply.format == ToolFormat::Harmony {
            self.close_harmony_body(&mut out);
        } else {
            self.advance(&mut out, true);
        }
        out
    }

    fn emit(&mut self, out: &mut Released, name: String, arguments: String) {
        if self.reply.parallel || self.emitted == 0 {
            out.calls.push(ParsedCall {
                id: call_id(),
                name,
                arguments,
            });
        }
        self.emitted += 1;
    }

    fn advance(&mut self, out: &mut Released, end: bool) {
        let llama = self.reply.format == ToolFormat::Llama3Json;
        loop {
            match std::mem::replace(&mut self.state, State::Plain) {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(PYTHON_TAG).filter(|_| llama) {
                        self.state = State::Json(rest.to_string());
                    } else if t.starts_with('{') {
                        self.state = State::Json(t.to_string());
                    } else if !end && (t.is_empty() || llama && PYTHON_TAG.starts_with(t)) {
                        self.state = State::Start;
                        return;
                    } else {
                        self.state = if llama { State::Plain } else { State::Text };
                        continue;
                    }
                    self.held.clear();
                }
                State::Plain => {
                    out.content.push_str(&std::mem::take(&mut self.held));
                    return;
                }
                State::Text => {
                    if self.after_call {
                        self.held = self.held.trim_start().to_string();
                        self.after_call = self.held.is_empty();
                    }
                    if let Some(p) = self.held.find(OPEN) {
                        let body = self.held[p + OPEN.len()..].to_string();
                        out.content.push_str(self.held[..p].trim_end());
                        self.held.clear();
                        self.state = State::Call(body);
                        continue;
                    }
                    self.release_text(out, end);
                    self.state = State::Text;
                    return;
                }
                State::Call(mut body) => {
                    body.push_str(&std::mem::take(&mut self.held));
                    let (inner, rest) = match body.find(CLOSE) {
                        Some(p) => (&body[..p], Some(&body[p + CLOSE.len()..])),
                        None if end => (body.as_str(), None),
                        None => {
                            self.state = State::Call(body);
                            return;
                        }
                    };
                    match call_of_text(inner) {
                        Some((name, args)) => self.emit(out, name, args),
                        None => {
                            let close = if rest.is_some() { CLOSE } else { "" };
                            out.content.push_str(&format!("{OPEN}{inner}{close}"));
                        }
                    }
                    self.held = rest.unwrap_or_default().to_string();
                    self.after_call = true;
                    self.state = State::Text;
                    if rest.is_none() {
                        return;
                    }
                }
                State::Json(mut body) => {
                    body.push_str(&std::mem::take(&mut self.held));
                    if !end {
                        self.state = State::Json(body);
                        return;
                    }
                    match calls_of_json(&body, &self.reply.names) {
                        Some(calls) => {
                            for (name, args) in calls {
                                self.emit(out, name, args);
                            }
                        }
                        None => out.content.push_str(&body),
                    }
                    return;
                }
            }
        }
    }

    /// Releases the held text but a possible start of [`OPEN`] and the
    /// white space before it (all of it at the `end`, where white space
    /// after a call is dropped).
    fn release_text(&mut self, out: &mut Released, end: bool) {
        if end {
            let rest = std::mem::take(&mut self.held);
            if self.emitted == 0 || !rest.trim().is_empty() {
                out.content.push_str(&rest);
            }
            return;
        }
        let keep_from = self.held.len() - partial_suffix(&self.held, OPEN);
        let text_end = self.held[..keep_from].trim_end().len();
        out.content.push_str(&self.held[..text_end]);
        self.held.drain(..text_end);
    }

    fn push_harmony(&mut self, text: &str, channel: Option<&str>, out: &mut Released) {
        let Some(channel) = channel else {
            if self.harmony.in_body {
                self.close_harmony_body(out);
            }
            self.harmony.header.push_str(text);
            return;
        };
        let h = &mut self.harmony;
        if !h.in_body {
            h.in_body = true;
            h.call = recipient(&h.header).map(|name| (name, String::new()));
        }
        match &mut h.call {
            Some((_, args)) => args.push_str(text),
            None if channel != "analysis" => out.content.push_str(text),
            None => {}
        }
    }

    fn close_harmony_body(&mut self, out: &mut Released) {
        self.harmony.in_body = false;
        self.harmony.header.clear();
        if let Some((name, args)) = self.harmony.call.take() {
            let args = normalized(&args).unwrap_or(args);
            self.emit(out, name, args);
        }
    }
}

/// A fresh call id.
fn call_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", &hex[..24])
}

/// The longest end of `text` that is a proper start of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&k| text.ends_with(&marker[..k]))
        .unwrap_or(0)
}

/// Harmony's `to=functions.NAME` in a message header.
fn recipient(header: &str) -> Option<String> {
    let at = header.find("to=functions.")? + "to=functions.".len();
    let name: String = header[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// JSON text in one canonical spelling, when it parses.
fn normalized(text: &str) -> Option<String> {
    serde_json::from_str::<Value>(text)
        .ok()
        .map(|v| v.to_string())
}

/// `{"name": ..., "arguments": ...}` (or `"parameters"`): the name and the
/// arguments as JSON text (`{}` when absent; a string of JSON is read as
/// that JSON).
fn call_of_value(v: &Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => normalized(s).unwrap_or_else(|| s.clone()),
        Some(other) => other.to_string(),
    };
    Some((name.to_string(), args))
}

/// The call inside a Hermes `<tool_call>`.
fn call_of_text(inner: &str) -> Option<(String, String)> {
    call_of_value(&serde_json::from_str(inner.trim()).ok()?)
}

/// An answer of JSON: one call, a list of them, or several separated by
/// `;` or white space; each must name one of `names` and have its
/// arguments given (else the answer is content).
fn calls_of_json(text: &str, names: &[String]) -> Option<Vec<(String, String)>> {
    let mut calls = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if rest.is_empty() {
            break;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        rest = &rest[values.byte_offset()..];
        let items = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for item in items {
            let has_args = item
                .get("arguments")
                .or_else(|| item.get("parameters"))
                .is_some();
            let call = call_of_value(&item).filter(|(n, _)| has_args && names.contains(n))?;
            calls.push(call);
        }
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests;

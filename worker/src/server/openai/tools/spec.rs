//! Tool definitions and `tool_choice`, checked into one [`ToolSpec`] for
//! every front door: the chat route's shapes are read here ([`check`]);
//! `/v1/responses` and `/v1/messages` read theirs with the same pieces
//! ([`function_of`], [`tool_list`], [`ToolSpec::new`]). Every refusal is a
//! [`Refusal`]: the path of the field at fault (`tools[1].function.name`)
//! and why, which each front door words as its API's error (OpenAI's
//! `param`, the start of Anthropic's message).

use serde_json::{json, Map, Value};

use crate::server::openai::error::OpenAiError;

/// Longest function name (OpenAI's rule).
pub const MAX_NAME_CHARS: usize = 64;
/// Most tools in one request.
pub const MAX_TOOLS: usize = 128;

/// A tool field refused: its path and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub path: String,
    pub why: String,
}

impl Refusal {
    pub fn new(path: &str, why: impl std::fmt::Display) -> Self {
        Refusal {
            path: path.to_string(),
            why: why.to_string(),
        }
    }

    /// `path: why`, the message every front door gives.
    pub fn message(&self) -> String {
        format!("{}: {}", self.path, self.why)
    }
}

impl From<Refusal> for OpenAiError {
    fn from(r: Refusal) -> Self {
        OpenAiError::invalid(&r.path, r.message())
    }
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The model may answer or call (the default when there are tools).
    Auto,
    /// Tools are described but no call is parsed: the text is the content.
    None,
    /// At least one call, to any of the tools (Anthropic's `any`).
    Required,
    /// One call to this function.
    Named(String),
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON Schema (`{"type": "object"}` when none was given).
    pub parameters: Value,
}

impl Function {
    /// The definition as the chat template gets it (transformers' shape,
    /// the chat route's): what the other front doors send in their own
    /// shapes is rendered as this.
    pub fn definition(&self) -> Value {
        let mut function = json!({"name": self.name});
        if let Some(d) = &self.description {
            function["description"] = json!(d);
        }
        function["parameters"] = self.parameters.clone();
        json!({"type": "function", "function": function})
    }
}

/// A request's tools, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// The definitions in the chat route's shape, for the chat template.
    pub definitions: Vec<Value>,
    pub functions: Vec<Function>,
    pub choice: Choice,
    /// More than one call in an answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolSpec {
    /// The request's tools once `choice` is checked against the functions;
    /// none when there are no functions and the choice asks for no call.
    pub fn new(
        definitions: Vec<Value>,
        functions: Vec<Function>,
        choice: Choice,
        parallel: bool,
    ) -> Result<Option<ToolSpec>, Refusal> {
        let needs_tools = matches!(choice, Choice::Required | Choice::Named(_));
        if needs_tools && functions.is_empty() {
            return Err(Refusal::new("tool_choice", "needs tools"));
        }
        if let Choice::Named(name) = &choice {
            if !functions.iter().any(|f| &f.name == name) {
                return Err(Refusal::new(
                    "tool_choice",
                    format!("names function {name:?}, which is not in tools"),
                ));
            }
        }
        if functions.is_empty() {
            return Ok(None);
        }
        Ok(Some(ToolSpec {
            definitions,
            functions,
            choice,
            parallel,
        }))
    }

    /// The functions a call may name under the choice.
    pub fn allowed(&self) -> Vec<&Function> {
        match &self.choice {
            Choice::Named(name) => self.functions.iter().filter(|f| &f.name == name).collect(),
            _ => self.functions.iter().collect(),
        }
    }
}

/// Whether `name` is a valid function name: `[A-Za-z0-9_-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Refuses a key of `object` not in `known`.
pub fn known_keys(object: &Map<String, Value>, known: &[&str], path: &str) -> Result<(), Refusal> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(Refusal::new(&format!("{path}.{k}"), "is not a known field")),
        None => Ok(()),
    }
}

/// Where a front door puts a function's fields.
pub struct FunctionShape<'a> {
    /// Every key the object may have.
    pub known: &'a [&'a str],
    /// The key of the arguments' schema (`parameters`, Anthropic's `input_schema`).
    pub schema_key: &'a str,
    /// Whether the schema must be given.
    pub schema_required: bool,
}

/// The chat route's `function` object.
const CHAT_FUNCTION: FunctionShape = FunctionShape {
    known: &["name", "description", "parameters", "strict"],
    schema_key: "parameters",
    schema_required: false,
};

/// One function's fields in `f` (at `path`), in `shape`.
pub fn function_of(
    f: &Map<String, Value>,
    path: &str,
    shape: &FunctionShape,
) -> Result<Function, Refusal> {
    known_keys(f, shape.known, path)?;
    let name = match f.get("name").and_then(Value::as_str) {
        Some(n) if valid_name(n) => n.to_string(),
        _ => {
            return Err(Refusal::new(
                &format!("{path}.name"),
                format!("must be 1 to {MAX_NAME_CHARS} letters, digits, underscores or dashes"),
            ))
        }
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => {
            return Err(Refusal::new(
                &format!("{path}.description"),
                "must be a string",
            ))
        }
    };
    if f.get("strict")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(Refusal::new(
            &format!("{path}.strict"),
            "must be true or false",
        ));
    }
    let key = shape.schema_key;
    let parameters = match f.get(key) {
        None | Some(Value::Null) if !shape.schema_required => json!({"type": "object"}),
        Some(p) if p.is_object() => p.clone(),
        _ => {
            return Err(Refusal::new(
                &format!("{path}.{key}"),
                "must be a JSON Schema object",
            ))
        }
    };
    Ok(Function {
        name,
        description,
        parameters,
    })
}

/// The entries of `tools` (an array; absent or null is none), at most
/// [`MAX_TOOLS`], each read by `read(i, entry)`, the names unique
/// (`name_path(i)` names entry `i`'s name field).
pub fn tool_list(
    tools: Option<&Value>,
    read: impl Fn(usize, &Value) -> Result<Function, Refusal>,
    name_path: impl Fn(usize) -> String,
) -> Result<Vec<Function>, Refusal> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(Refusal::new(
                "tools",
                "must be an array of tool definitions",
            ))
        }
    };
    if list.len() > MAX_TOOLS {
        let n = list.len();
        return Err(Refusal::new(
            "tools",
            format!("at most {MAX_TOOLS} tools (got {n})"),
        ));
    }
    let mut functions: Vec<Function> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let f = read(i, tool)?;
        if functions.iter().any(|g| g.name == f.name) {
            return Err(Refusal::new(
                &name_path(i),
                format!(
                    "{:?} names an earlier tool too; names must be unique",
                    f.name
                ),
            ));
        }
        functions.push(f);
    }
    Ok(functions)
}

/// Entry `i` of `tools` as an object, and its path (`tools[i]`).
pub fn tool_object(i: usize, tool: &Value) -> Result<(String, &Map<String, Value>), Refusal> {
    let path = format!("tools[{i}]");
    match tool.as_object() {
        Some(object) => Ok((path, object)),
        None => Err(Refusal::new(&path, "must be an object")),
    }
}

/// One entry of the chat route's `tools`.
fn chat_function(i: usize, tool: &Value) -> Result<Function, Refusal> {
    let (path, tool) = tool_object(i, tool)?;
    known_keys(tool, &["type", "function"], &path)?;
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(Refusal::new(
                &format!("{path}.type"),
                format!("only \"function\" tools are served (got {other:?})"),
            ))
        }
        None => {
            return Err(Refusal::new(
                &format!("{path}.type"),
                "must be \"function\"",
            ))
        }
    }
    let path = format!("{path}.function");
    let Some(f) = tool.get("function").and_then(Value::as_object) else {
        return Err(Refusal::new(&path, "must be an object"));
    };
    function_of(f, &path, &CHAT_FUNCTION)
}

/// The chat route's `tool_choice`.
fn chat_choice(value: Option<&Value>) -> Result<Choice, Refusal> {
    let named = |v: &Value| -> Option<String> {
        let o = v.as_object()?;
        let f = o.get("function")?.as_object()?;
        let only_name = f.len() == 1;
        let well_formed = o.len() == 2 && o.get("type")?.as_str()? == "function" && only_name;
        well_formed.then(|| f.get("name")?.as_str().map(str::to_string))?
    };
    match value {
        None | Some(Value::Null) => Ok(Choice::Auto),
        Some(Value::String(s)) => mode(s).ok_or_else(chat_choice_refusal),
        Some(v) => named(v).map(Choice::Named).ok_or_else(chat_choice_refusal),
    }
}

fn chat_choice_refusal() -> Refusal {
    Refusal::new(
        "tool_choice",
        "must be \"auto\", \"none\", \"required\" or \
         {\"type\": \"function\", \"function\": {\"name\": ...}}",
    )
}

/// OpenAI's `tool_choice` modes (the chat route's and the Responses API's).
pub fn mode(s: &str) -> Option<Choice> {
    match s {
        "auto" => Some(Choice::Auto),
        "none" => Some(Choice::None),
        "required" => Some(Choice::Required),
        _ => None,
    }
}

/// The chat route's tools, checked; none when it has none (an empty list
/// included) and `tool_choice` asks for no call. The definitions go to the
/// template as given.
pub fn check(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parallel_tool_calls: Option<bool>,
) -> Result<Option<ToolSpec>, OpenAiError> {
    let functions = tool_list(tools, chat_function, |i| {
        format!("tools[{i}].function.name")
    })?;
    let definitions = tools.and_then(Value::as_array).cloned().unwrap_or_default();
    let choice = chat_choice(tool_choice)?;
    let parallel = parallel_tool_calls.unwrap_or(true);
    Ok(ToolSpec::new(definitions, functions, choice, parallel)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}})
    }

    fn refused(tools: Value, choice: Value) -> (String, String) {
        let e = check(Some(&tools), Some(&choice), None).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        let param = e.body.error.param.clone().unwrap();
        assert!(
            e.body.error.message.starts_with(&format!("{param}: ")),
            "{}",
            e.body.error.message
        );
        (param, e.body.error.message)
    }

    #[test]
    fn definitions_and_choices_are_read() {
        let spec = check(Some(&json!([weather()])), None, Some(false))
            .unwrap()
            .unwrap();
        assert_eq!(spec.definitions, vec![weather()]);
        assert_eq!(spec.functions[0].name, "get_weather");
        assert_eq!((spec.choice.clone(), spec.parallel), (Choice::Auto, false));
        let tools = json!([weather(), {"type": "function", "function": {"name": "now"}}]);
        let named = json!({"type": "function", "function": {"name": "now"}});
        let spec = check(Some(&tools), Some(&named), None).unwrap().unwrap();
        assert_eq!(spec.choice, Choice::Named("now".into()));
        assert_eq!(spec.allowed().len(), 1);
        assert_eq!(spec.allowed()[0].parameters, json!({"type": "object"}));
        assert!(spec.parallel);
        for (mode, want) in [("none", Choice::None), ("required", Choice::Required)] {
            let spec = check(Some(&tools), Some(&json!(mode)), None)
                .unwrap()
                .unwrap();
            assert_eq!(spec.choice, want);
        }
        // No tools: nothing to do, unless a call is demanded.
        assert_eq!(
            check(Some(&json!([])), Some(&json!("auto")), None).unwrap(),
            None
        );
        assert_eq!(check(None, Some(&json!("none")), None).unwrap(), None);
        assert_eq!(refused(json!([]), json!("required")).0, "tool_choice");
    }

    #[test]
    fn refusals_name_the_field_at_fault() {
        let dup = json!([weather(), weather()]);
        let cases = [
            (json!({"type": "function"}), json!("auto"), "tools"),
            (
                json!([{"type": "retrieval"}]),
                json!("auto"),
                "tools[0].type",
            ),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                json!("auto"),
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "x".repeat(65)}}]),
                json!("auto"),
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {}}]),
                json!("auto"),
                "tools[0].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                json!("auto"),
                "tools[0].function.parameters",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "extra": 1}}]),
                json!("auto"),
                "tools[0].function.extra",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "strict": "yes"}}]),
                json!("auto"),
                "tools[0].function.strict",
            ),
            (dup, json!("auto"), "tools[1].function.name"),
            (json!([weather()]), json!("sometimes"), "tool_choice"),
            (
                json!([weather()]),
                json!({"type": "function", "function": {"name": "other"}}),
                "tool_choice",
            ),
            (
                json!([weather()]),
                json!({"type": "function", "name": "get_weather"}),
                "tool_choice",
            ),
        ];
        for (tools, choice, want) in cases {
            let (param, message) = refused(tools.clone(), choice);
            assert_eq!(param, want, "{tools}: {message}");
        }
        let (_, message) = refused(
            json!([weather()]),
            json!({"type": "function", "function": {"name": "other"}}),
        );
        assert!(
            message.contains("\"other\", which is not in tools"),
            "{message}"
        );
        let many: Vec<Value> = (0..=MAX_TOOLS)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        assert_eq!(refused(json!(many), json!("auto")).0, "tools");
    }
}

//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request,
//! checked: every refusal is an OpenAI 400 whose `param` is the path of the
//! field at fault (`tools[1].function.name`) and whose message starts with it.

use serde_json::{Map, Value};

use crate::server::openai::error::OpenAiError;

/// Longest function name (OpenAI's rule).
pub const MAX_NAME_CHARS: usize = 64;
/// Most tools in one request.
pub const MAX_TOOLS: usize = 128;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The model may answer or call (the default when there are tools).
    Auto,
    /// Tools are described but no call is parsed: the text is the content.
    None,
    /// At least one call, to any of the tools.
    Required,
    /// One call to this function.
    Named(String),
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    /// The arguments' JSON Schema (`{"type": "object"}` when none was given).
    pub parameters: Value,
}

/// A request's tools, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// The definitions as given, for the chat template.
    pub definitions: Vec<Value>,
    pub functions: Vec<Function>,
    pub choice: Choice,
    /// More than one call in an answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolSpec {
    /// The functions a call may name under the choice.
    pub fn allowed(&self) -> Vec<&Function> {
        match &self.choice {
            Choice::Named(name) => self.functions.iter().filter(|f| &f.name == name).collect(),
            _ => self.functions.iter().collect(),
        }
    }
}

fn invalid(path: &str, why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(path, format!("{path}: {why}"))
}

/// Whether `name` is a valid function name: `[A-Za-z0-9_-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Refuses a key of `object` not in `known`.
fn known_keys(object: &Map<String, Value>, known: &[&str], path: &str) -> Result<(), OpenAiError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(invalid(&format!("{path}.{k}"), "is not a known field")),
        None => Ok(()),
    }
}

/// One entry of `tools`.
fn function(i: usize, tool: &Value) -> Result<Function, OpenAiError> {
    let path = format!("tools[{i}]");
    let Some(tool) = tool.as_object() else {
        return Err(invalid(&path, "must be an object"));
    };
    known_keys(tool, &["type", "function"], &path)?;
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(invalid(
                &format!("{path}.type"),
                format!("only \"function\" tools are served (got {other:?})"),
            ))
        }
        None => return Err(invalid(&format!("{path}.type"), "must be \"function\"")),
    }
    let path = format!("{path}.function");
    let Some(f) = tool.get("function").and_then(Value::as_object) else {
        return Err(invalid(&path, "must be an object"));
    };
    known_keys(f, &["name", "description", "parameters", "strict"], &path)?;
    let name = match f.get("name").and_then(Value::as_str) {
        Some(n) if valid_name(n) => n.to_string(),
        _ => {
            return Err(invalid(
                &format!("{path}.name"),
                format!("must be 1 to {MAX_NAME_CHARS} letters, digits, underscores or dashes"),
            ))
        }
    };
    if f.get("description")
        .is_some_and(|d| !d.is_string() && !d.is_null())
    {
        return Err(invalid(&format!("{path}.description"), "must be a string"));
    }
    if f.get("strict")
        .is_some_and(|s| !s.is_boolean() && !s.is_null())
    {
        return Err(invalid(&format!("{path}.strict"), "must be true or false"));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object"}),
        Some(p) if p.is_object() => p.clone(),
        Some(_) => {
            return Err(invalid(
                &format!("{path}.parameters"),
                "must be a JSON Schema object",
            ))
        }
    };
    Ok(Function { name, parameters })
}

/// `tool_choice`, given the functions' names.
fn choice(value: Option<&Value>, functions: &[Function]) -> Result<Choice, OpenAiError> {
    let named = |v: &Value| -> Option<String> {
        let o = v.as_object()?;
        let f = o.get("function")?.as_object()?;
        let only_name = f.len() == 1;
        let well_formed = o.len() == 2 && o.get("type")?.as_str()? == "function" && only_name;
        well_formed.then(|| f.get("name")?.as_str().map(str::to_string))?
    };
    let choice = match value {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) if s == "auto" => Choice::Auto,
        Some(Value::String(s)) if s == "none" => Choice::None,
        Some(Value::String(s)) if s == "required" => Choice::Required,
        Some(v) => match named(v) {
            Some(name) => Choice::Named(name),
            None => {
                return Err(invalid(
                    "tool_choice",
                    "must be \"auto\", \"none\", \"required\" or \
                     {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    let needs_tools = matches!(choice, Choice::Required | Choice::Named(_));
    if needs_tools && functions.is_empty() {
        return Err(invalid("tool_choice", "needs tools"));
    }
    if let Choice::Named(name) = &choice {
        if !functions.iter().any(|f| &f.name == name) {
            return Err(invalid(
                "tool_choice",
                format!("names function {name:?}, which is not in tools"),
            ));
        }
    }
    Ok(choice)
}

/// The request's tools, checked; none when it has none (an empty list
/// included) and `tool_choice` asks for no call.
pub fn check(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parallel_tool_calls: Option<bool>,
) -> Result<Option<ToolSpec>, OpenAiError> {
    let definitions = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(invalid("tools", "must be an array of tool definitions")),
    };
    if definitions.len() > MAX_TOOLS {
        let n = definitions.len();
        return Err(invalid(
            "tools",
            format!("at most {MAX_TOOLS} tools (got {n})"),
        ));
    }
    let mut functions: Vec<Function> = Vec::with_capacity(definitions.len());
    for (i, tool) in definitions.iter().enumerate() {
        let f = function(i, tool)?;
        if functions.iter().any(|g| g.name == f.name) {
            return Err(invalid(
                &format!("tools[{i}].function.name"),
                format!(
                    "{:?} names an earlier tool too; names must be unique",
                    f.name
                ),
            ));
        }
        functions.push(f);
    }
    let choice = choice(tool_choice, &functions)?;
    if functions.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolSpec {
        definitions,
        functions,
        choice,
        parallel: parallel_tool_calls.unwrap_or(true),
    }))
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

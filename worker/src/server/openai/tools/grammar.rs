//! The grammar that makes `tool_choice` `required` or a named function
//! always parse: a Lark grammar in llguidance's dialect (the `/execute`
//! field `grammar`) admitting exactly the allowed calls in the model's own
//! format, each call's arguments under its `parameters` schema (`%json`).
//! The envelope around the arguments is spelled out (`{"name": "f",
//! "arguments": ...}`, name first, as the templates teach it), not left to a
//! schema, whose properties a JSON compiler may order otherwise; the JSON
//! inside is written with `", "` and `": "` and no other white space, as
//! the templates' `tojson` writes the calls the model has seen.

use serde_json::{json, Value};

use super::format::ToolFormat;
use super::parse::{CLOSE, OPEN};
use super::spec::{Choice, Function, ToolSpec};

/// llguidance's JSON options for the arguments (see the module's docs).
fn json_style() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// A Lark string literal (JSON's escapes are Lark's).
fn lit(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialize")
}

/// `%json` of a function's parameters, in the style above unless the
/// schema sets its own.
fn arguments_rule(f: &Function) -> String {
    let mut schema = f.parameters.clone();
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(json_style);
    }
    format!("%json {schema}")
}

/// The grammar for `spec`'s choice in `format`; none for `auto` and `none`
/// (nothing is enforced). Function names are `[A-Za-z0-9_-]` only
/// (`spec::valid_name`), so they need no escaping.
pub fn for_choice(spec: &ToolSpec, format: ToolFormat) -> Option<String> {
    if !matches!(spec.choice, Choice::Required | Choice::Named(_)) {
        return None;
    }
    let functions = spec.allowed();
    let mut rules = Vec::new();
    let alternatives: Vec<String> = (0..functions.len()).map(|i| format!("fn_{i}")).collect();
    for (i, f) in functions.iter().enumerate() {
        let head = match format {
            ToolFormat::Hermes => format!("{{\"name\": \"{}\", \"arguments\": ", f.name),
            ToolFormat::Llama3Json => format!("{{\"name\": \"{}\", \"parameters\": ", f.name),
            ToolFormat::Harmony => format!("commentary to=functions.{} ", f.name),
        };
        let rule = match format {
            ToolFormat::Harmony => format!(
                "fn_{i}: <|channel|> {} <|constrain|> \"json\" <|message|> args_{i} <|call|>",
                lit(&head)
            ),
            _ => format!("fn_{i}: {} args_{i} \"}}\"", lit(&head)),
        };
        rules.push(rule);
        rules.push(format!("args_{i}: {}", arguments_rule(f)));
    }
    let start = match format {
        ToolFormat::Hermes => {
            rules.push(format!(
                "call: {} fn {}",
                lit(&format!("{OPEN}\n")),
                lit(&format!("\n{CLOSE}"))
            ));
            if spec.parallel {
                format!("start: call ({} call)*", lit("\n"))
            } else {
                "start: call".to_string()
            }
        }
        // Llama 3.1's template renders one call per message; harmony's
        // `<|call|>` ends the answer.
        ToolFormat::Llama3Json => "start: fn".to_string(),
        ToolFormat::Harmony => {
            // The model may reason first, on the analysis channel.
            rules.push(
                "analysis: <|channel|> \"analysis\" <|message|> /(?s:.*)/ <|end|> <|start|> \"assistant\""
                    .to_string(),
            );
            "start: analysis? fn".to_string()
        }
    };
    let fns = format!("fn: {}", alternatives.join(" | "));
    Some(
        [start, fns]
            .into_iter()
            .chain(rules)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

#[cfg(test)]
mod tests;

//! transformers' `tojson` filter for chat templates: Python's `json.dumps`
//! as jinja2 calls it (`", "` and `": "` separators, no HTML escaping), with
//! the output's size checked against the render limits as it grows.

use minijinja::limits;
use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};

/// transformers' `tojson`: Python `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)` (so `", "` and `": "` between items,
/// no HTML escaping, unlike minijinja's built-in filter).
pub(super) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent_arg: Option<Value> = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent_arg {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            if let Some(n) = v.as_i64() {
                let n = n.max(0) as usize;
                // Written once per level on every line.
                limits::ensure(n.saturating_mul(JSON_MAX_DEPTH))?;
                Some(" ".repeat(n))
            } else if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an int or string",
                ));
            }
        }
    };
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    for s in [&item_sep, &key_sep].into_iter().chain(indent.as_ref()) {
        limits::ensure(s.len().saturating_mul(JSON_MAX_DEPTH))?;
    }
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// Deepest nesting `tojson` writes.
const JSON_MAX_DEPTH: usize = 64;

fn write_json(out: &mut String, v: &Value, o: &JsonOpts, depth: usize) -> Result<(), Error> {
    use minijinja::value::ValueKind as K;
    if depth > JSON_MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: value nested more than {JSON_MAX_DEPTH} levels deep"),
        ));
    }
    // Indents and separators repeat per item: the output can outgrow the value.
    limits::ensure(out.len())?;
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        K::Undefined | K::None => out.push_str("null"),
        K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        K::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&python_float(f));
            }
        }
        K::String => write_json_str(out, v.as_str().unwrap_or_default(), o.ensure_ascii),
        K::Bytes => write_json_str(
            out,
            &String::from_utf8_lossy(v.as_bytes().unwrap_or_default()),
            o.ensure_ascii,
        ),
        K::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => write_json_str(out, s, o.ensure_ascii),
                    None => write_json_str(out, &k.to_string(), o.ensure_ascii),
                }
                out.push_str(&o.key_sep);
                write_json(out, &v.get_item(k)?, o, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        K::Seq | K::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, o, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        K::Plain | K::Invalid => write_json_str(out, &v.to_string(), o.ensure_ascii),
        _ => write_json_str(out, &v.to_string(), o.ensure_ascii),
    }
    Ok(())
}

/// Python's `repr` of a float, near enough: always a decimal point or exponent,
/// `e+NN` for large exponents, `NaN` / `Infinity` as `json.dumps` writes them.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let s = format!("{f:?}");
    match s.find('e') {
        Some(p) if !s[p + 1..].starts_with('-') => format!("{}e+{}", &s[..p], &s[p + 1..]),
        _ => s,
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7f) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `value` as the template's `tojson` writes it without arguments: for the
/// text the worker itself writes into a conversation (`chat_tools.rs`), so
/// that it reads like the template's own. A value nested deeper than
/// `tojson` goes is written compactly instead.
pub(super) fn python_json(value: &serde_json::Value) -> String {
    let opts = JsonOpts {
        indent: None,
        item_sep: ", ".into(),
        key_sep: ": ".into(),
        ensure_ascii: false,
        sort_keys: false,
    };
    let mut out = String::new();
    match write_json(&mut out, &Value::from_serialize(value), &opts, 0) {
        Ok(()) => out,
        Err(_) => value.to_string(),
    }
}

//! String formats held to what validators check. llguidance writes `date`,
//! `date-time`, `time`, `hostname` and `email` from regular expressions that
//! take in some strings a validator refuses: February 29th of any year, a
//! leap second at any minute (RFC 3339 allows one only at 23:59:60 UTC),
//! `--` in a host label's third and fourth places (RFC 5891 keeps them for
//! A-labels), a host name over 253 bytes, and an address whose local part is
//! over 64 bytes or whose domain has a label over 63 (RFC 5321). The
//! `jsonschema` validator, which `harness schema-suite` checks outputs
//! with, refuses all of these.
//! Each format is narrowed here by more patterns, added as `allOf` entries and
//! intersected with the format's own (for `email`, one pattern in its place):
//! every string they allow is valid, and only rare valid ones are left out
//! (leap seconds, `xn--` labels, addresses with quoted or very long parts).

use serde_json::{json, Value};

/// A date's start that is a real day: any month but February, February up to
/// the 28th, or the 29th of a leap year (divisible by 4, and by 400 when a
/// century).
const REAL_DAY: &str = concat!(
    r"^(?:[0-9]{4}-(?:0[13-9]|1[0-2])-",
    r"|[0-9]{4}-02-(?:[01][0-9]|2[0-8])",
    r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
);

/// A time (at the start, or after a date's `T`) whose seconds are below 60.
const NO_LEAP_SECOND: &str = r"^(?:[^tT]*[tT])?[0-9]{2}:[0-9]{2}:[0-5]";

/// No `--` anywhere (a subset of "not in a label's third and fourth places").
const NO_DOUBLE_HYPHEN: &str = r"^[^-]*(?:-[^-]+)*$";

/// An address within every limit by construction, in place of llguidance's
/// own pattern (its intersection with length bounds is too costly to
/// compile): a dot-atom local part of at most 30 + 2 × 17 = 64 bytes, and a
/// domain of two to four labels of at most 62 bytes each, without `--`.
const EMAIL: &str = concat!(
    r"^[a-zA-Z0-9_+-]{1,30}(?:\.[a-zA-Z0-9_+-]{1,16}){0,2}",
    r"@[a-zA-Z0-9]{1,20}(?:-[a-zA-Z0-9]{1,20}){0,2}",
    r"(?:\.[a-zA-Z0-9]{1,20}(?:-[a-zA-Z0-9]{1,20}){0,2}){1,3}$"
);

/// How a format is narrowed: schemas added as `allOf` entries, and whether
/// they stand in for the format's own pattern.
struct Narrowing {
    entries: Vec<Value>,
    replaces: bool,
}

fn narrowing(format: &str) -> Option<Narrowing> {
    let pattern = |p: &str| json!({ "pattern": p });
    let (entries, replaces) = match format {
        "date" => (vec![pattern(REAL_DAY)], false),
        "date-time" => (vec![pattern(REAL_DAY), pattern(NO_LEAP_SECOND)], false),
        "time" => (vec![pattern(NO_LEAP_SECOND)], false),
        "hostname" => (
            vec![json!({"pattern": NO_DOUBLE_HYPHEN, "maxLength": 253})],
            false,
        ),
        "email" => (vec![pattern(EMAIL)], true),
        _ => return None,
    };
    Some(Narrowing { entries, replaces })
}

/// Keywords whose values are data, not schemas: a `format` key in them is
/// left as it is.
const DATA_KEYWORDS: [&str; 5] = ["const", "enum", "default", "examples", "example"];

/// Keywords whose values map names (of properties, definitions) to schemas:
/// a property named `const` is a schema all the same.
const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Narrows every format of `schema` that needs it (see the module's docs).
pub(crate) fn narrow(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let narrowed = map
                .get("format")
                .and_then(Value::as_str)
                .and_then(narrowing);
            if let Some(n) = narrowed {
                if n.replaces {
                    map.remove("format");
                }
                let all_of = map.entry("allOf").or_insert_with(|| json!([]));
                if let Some(list) = all_of.as_array_mut() {
                    list.extend(n.entries);
                }
            }
            for (key, child) in map.iter_mut() {
                match (key.as_str(), child) {
                    (k, Value::Object(named)) if SCHEMA_MAPS.contains(&k) => {
                        named.values_mut().for_each(narrow)
                    }
                    (k, _) if DATA_KEYWORDS.contains(&k) => {}
                    (_, child) => narrow(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(narrow),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_in_schemas_are_narrowed_and_formats_in_data_are_not() {
        let mut schema = json!({
            "properties": {
                "default": {"type": "string", "format": "time"},
                "when": {"format": "date", "allOf": [{"maxLength": 10}]}
            },
            "const": {"format": "date"},
            "items": [{"format": "uuid"}]
        });
        narrow(&mut schema);
        let props = &schema["properties"];
        assert_eq!(
            props["default"]["allOf"],
            json!([{"pattern": NO_LEAP_SECOND}])
        );
        assert_eq!(
            props["when"]["allOf"],
            json!([{"maxLength": 10}, {"pattern": REAL_DAY}])
        );
        assert_eq!(schema["const"], json!({"format": "date"}));
        assert_eq!(schema["items"], json!([{"format": "uuid"}]));
    }
}

//! The rules of `presence_penalty`, `frequency_penalty` and `logit_bias`
//! (issue #43; OpenAI's ranges), checked into the engine's [`LogitBias`].

use std::collections::BTreeMap;

use crate::sampling::LogitBias;

/// Largest magnitude of the presence and frequency penalties (OpenAI's).
pub const PENALTY_MAX: f64 = 2.0;
/// Largest magnitude of one `logit_bias` value (OpenAI's).
pub const LOGIT_BIAS_MAX: f64 = 100.0;
/// Most `logit_bias` entries a request may carry (OpenAI takes 300; more
/// than that is a ban list, which a grammar expresses better).
pub const MAX_LOGIT_BIAS: usize = 1024;

/// The bias fields as sent.
pub struct BiasFields {
    pub presence: Option<f64>,
    pub frequency: Option<f64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
}

/// Broken rules: the field and what is wrong.
pub type Broken = Vec<(&'static str, String)>;

/// Checks each field, adding one error per broken rule to `errs`.
pub fn check(errs: &mut Broken, fields: BiasFields, vocab: usize) -> LogitBias {
    LogitBias {
        presence: penalty(errs, "presence_penalty", fields.presence),
        frequency: penalty(errs, "frequency_penalty", fields.frequency),
        fixed: fields
            .logit_bias
            .map(|map| logit_bias(errs, map, vocab))
            .unwrap_or_default(),
    }
}

fn penalty(errs: &mut Broken, field: &'static str, value: Option<f64>) -> f32 {
    match value {
        None => 0.0,
        Some(v) if (-PENALTY_MAX..=PENALTY_MAX).contains(&v) => v as f32,
        Some(v) => {
            errs.push((
                field,
                format!("must be between -{PENALTY_MAX} and {PENALTY_MAX} (got {v})"),
            ));
            0.0
        }
    }
}

/// The map's entries as `(id, delta)`, ids ascending (the map's keys are
/// distinct strings, and no two decimal strings without leading zeros name
/// one id); zero deltas dropped.
fn logit_bias(errs: &mut Broken, map: BTreeMap<String, f64>, vocab: usize) -> Vec<(u32, f32)> {
    const FIELD: &str = "logit_bias";
    if map.len() > MAX_LOGIT_BIAS {
        errs.push((
            FIELD,
            format!("at most {MAX_LOGIT_BIAS} entries (got {})", map.len()),
        ));
        return Vec::new();
    }
    let mut out = Vec::with_capacity(map.len());
    for (key, value) in map {
        let id = match token_id(&key) {
            Some(id) if (id as usize) < vocab => id,
            _ => {
                errs.push((
                    FIELD,
                    format!(
                        "key {key:?} is not a token id of this model (0 to {})",
                        vocab - 1
                    ),
                ));
                continue;
            }
        };
        if !(-LOGIT_BIAS_MAX..=LOGIT_BIAS_MAX).contains(&value) {
            errs.push((FIELD, format!("the bias of token {id} must be between -{LOGIT_BIAS_MAX} and {LOGIT_BIAS_MAX} (got {value})")));
            continue;
        }
        if value != 0.0 {
            out.push((id, value as f32));
        }
    }
    out.sort_unstable_by_key(|&(id, _)| id);
    out
}

/// A token id written as OpenAI writes it: decimal digits, no sign, no
/// leading zero (so that "7" and "007" cannot both name token 7).
fn token_id(key: &str) -> Option<u32> {
    let canonical = key == "0" || (!key.starts_with('0') && !key.is_empty());
    if canonical && key.bytes().all(|b| b.is_ascii_digit()) {
        key.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(fields: BiasFields, vocab: usize) -> Result<LogitBias, Vec<String>> {
        let mut errs = Broken::new();
        let out = check(&mut errs, fields, vocab);
        if errs.is_empty() {
            Ok(out)
        } else {
            Err(errs.into_iter().map(|(f, m)| format!("{f}: {m}")).collect())
        }
    }

    fn fields(presence: f64, frequency: f64, bias: &[(&str, f64)]) -> BiasFields {
        BiasFields {
            presence: Some(presence),
            frequency: Some(frequency),
            logit_bias: Some(bias.iter().map(|&(k, v)| (k.to_string(), v)).collect()),
        }
    }

    #[test]
    fn valid_fields_become_the_engines_bias_with_ids_ascending() {
        let got = run(
            fields(0.5, -1.5, &[("100", 5.0), ("20", -100.0), ("3", 0.0)]),
            1000,
        )
        .unwrap();
        assert_eq!(
            got,
            LogitBias {
                fixed: vec![(20, -100.0), (100, 5.0)],
                presence: 0.5,
                frequency: -1.5,
            }
        );
        let none = BiasFields {
            presence: None,
            frequency: None,
            logit_bias: None,
        };
        assert!(run(none, 10).unwrap().is_neutral());
    }

    #[test]
    fn each_broken_rule_is_named() {
        let errs = run(
            fields(
                2.5,
                -3.0,
                &[
                    ("1000", 1.0),
                    ("007", 1.0),
                    ("-1", 1.0),
                    ("x", 1.0),
                    ("5", 101.0),
                ],
            ),
            1000,
        )
        .unwrap_err();
        assert_eq!(errs.len(), 7, "{errs:?}");
        assert!(errs[0].starts_with("presence_penalty: must be between -2 and 2"));
        assert!(errs[1].starts_with("frequency_penalty: "));
        assert!(errs
            .iter()
            .any(|e| e.contains(r#"key "1000" is not a token id"#)));
        assert!(errs.iter().any(|e| e.contains(r#"key "007""#)));
        assert!(errs
            .iter()
            .any(|e| e.contains("the bias of token 5 must be between -100 and 100")));
    }

    #[test]
    fn too_many_entries_are_refused_whole() {
        let many: Vec<(String, f64)> = (0..=MAX_LOGIT_BIAS).map(|i| (i.to_string(), 1.0)).collect();
        let f = BiasFields {
            presence: None,
            frequency: None,
            logit_bias: Some(many.into_iter().collect()),
        };
        let errs = run(f, 100_000).unwrap_err();
        assert_eq!(
            errs,
            vec![format!(
                "logit_bias: at most {MAX_LOGIT_BIAS} entries (got 1025)"
            )]
        );
    }
}

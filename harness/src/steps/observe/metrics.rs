//! `GET /metrics`: Prometheus text exposition, parsed strictly enough to sum series.

use std::collections::BTreeMap;

use anyhow::anyhow;
use cucumber::{then, when};

use crate::check;
use crate::steps::params::{Names, Selector};
use crate::steps::StepResult;
use crate::world::TestWorld;

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the text format; every non-comment line must be a sample.
pub fn parse(text: &str) -> anyhow::Result<Vec<Sample>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, rest) = match line.find('{') {
            Some(_) => {
                let close = line
                    .rfind('}')
                    .ok_or_else(|| anyhow!("line {}: unclosed labels", n + 1))?;
                (&line[..close + 1], &line[close + 1..])
            }
            None => line.split_at(
                line.find(' ')
                    .ok_or_else(|| anyhow!("line {}: no value", n + 1))?,
            ),
        };
        let (name, labels) = match series.find('{') {
            Some(open) => (
                &series[..open],
                parse_labels(&series[open + 1..series.len() - 1])
                    .map_err(|e| anyhow!("line {}: {e}", n + 1))?,
            ),
            None => (series, BTreeMap::new()),
        };
        let value = rest
            .split_whitespace()
            .next()
            .ok_or_else(|| anyhow!("line {}: no value", n + 1))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .map_err(|_| anyhow!("line {}: bad value {v:?}", n + 1))?,
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(anyhow!("line {}: bad metric name {name:?}", n + 1));
        }
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(out)
}

fn parse_labels(s: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| anyhow!("label without '=' in {s:?}"))?;
        let key = rest[..eq].trim().to_owned();
        let after = rest[eq + 1..].trim_start();
        let body = after
            .strip_prefix('"')
            .ok_or_else(|| anyhow!("unquoted label value in {s:?}"))?;
        let mut value = String::new();
        let mut chars = body.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, e)) = chars.next() {
                        value.push(if e == 'n' { '\n' } else { e });
                    }
                }
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| anyhow!("unterminated label value in {s:?}"))?;
        out.insert(key, value);
        rest = body[end + 1..]
            .trim_start()
            .trim_start_matches(',')
            .trim_start();
    }
    Ok(out)
}

/// Sum of the samples matching `name` or `name{k="v",...}` (given labels must match).
pub fn total(samples: &[Sample], selector: &str) -> anyhow::Result<f64> {
    let (name, want) = match selector.find('{') {
        Some(open) => (
            &selector[..open],
            parse_labels(selector[open + 1..].trim_end_matches('}'))?,
        ),
        None => (selector, BTreeMap::new()),
    };
    let matching: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name && want.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .collect();
    Ok(matching.iter().map(|s| s.value).sum())
}

#[when(expr = "I scrape \\/metrics( again)")]
async fn scrape(w: &mut TestWorld) -> StepResult {
    let text = w.client()?.metrics().await?;
    w.probes.scrapes.push(text);
    Ok(())
}

fn last_two(w: &TestWorld) -> anyhow::Result<(Vec<Sample>, Vec<Sample>)> {
    let (a, b) = w.probes.last_two()?;
    Ok((parse(a)?, parse(b)?))
}

#[then(expr = "both scrapes parse as Prometheus text")]
async fn both_parse(w: &mut TestWorld) -> StepResult {
    last_two(w)?;
    Ok(())
}

#[then(expr = "the scrape has {names}")]
async fn has_names(w: &mut TestWorld, names: Names) -> StepResult {
    let s = parse(w.probes.last_scrape()?)?;
    let missing: Vec<String> = names
        .0
        .into_iter()
        .filter(|n| !s.iter().any(|x| &x.name == n))
        .collect();
    check!(missing.is_empty(), "metrics missing: {missing:?}");
    Ok(())
}

#[then(expr = "some metric carries the label {string}")]
async fn has_label(w: &mut TestWorld, label: String) -> StepResult {
    let s = parse(w.probes.last_scrape()?)?;
    check!(
        s.iter().any(|x| x.labels.contains_key(&label)),
        "no series has a {label} label"
    );
    Ok(())
}

/// `absent`, or the value the one sample of that name must have (gpt-oss's
/// expert gauges).
#[then(expr = "the scrape's {string} is {word}")]
async fn sample_is(w: &mut TestWorld, name: String, want: String) -> StepResult {
    let found = samples_named(w, &name)?;
    if want == "absent" {
        check!(found.is_empty(), "{name} is present: {found:?}");
        return Ok(());
    }
    let want: f64 = want
        .parse()
        .map_err(|_| anyhow!("{want:?} is neither a number nor absent"))?;
    check!(found == [want], "{name} is {found:?}, want [{want}]");
    Ok(())
}

/// The values of every sample of `name` in the last scrape.
fn samples_named(w: &TestWorld, name: &str) -> anyhow::Result<Vec<f64>> {
    let s = parse(w.probes.last_scrape()?)?;
    Ok(s.iter()
        .filter(|x| x.name == name)
        .map(|x| x.value)
        .collect())
}

/// The one sample of `name` in the last scrape.
fn one_sample(w: &TestWorld, name: &str) -> anyhow::Result<f64> {
    let found = samples_named(w, name)?;
    match found[..] {
        [v] => Ok(v),
        _ => Err(anyhow!("{name}: want one sample, found {found:?}")),
    }
}

#[then(expr = "the scrape's {string} is above {int}")]
async fn sample_above(w: &mut TestWorld, name: String, floor: u32) -> StepResult {
    let v = one_sample(w, &name)?;
    check!(
        v > f64::from(floor),
        "{name} is {v}, want more than {floor}"
    );
    Ok(())
}

#[then(expr = "the scrape's {string} equals its {string}")]
async fn samples_equal(w: &mut TestWorld, a: String, b: String) -> StepResult {
    let (x, y) = (one_sample(w, &a)?, one_sample(w, &b)?);
    check!(x == y, "{a} is {x}, {b} is {y}");
    Ok(())
}

fn rose_by(w: &TestWorld, selector: &str, by: f64) -> StepResult {
    let (a, b) = last_two(w)?;
    let (x, y) = (total(&a, selector)?, total(&b, selector)?);
    check!(
        (y - x - by).abs() < 1e-9,
        "{selector} went from {x} to {y}, want a rise of {by}"
    );
    Ok(())
}

#[then(expr = "{selector} rose by {int}")]
async fn rose(w: &mut TestWorld, selector: Selector, by: u32) -> StepResult {
    rose_by(w, &selector.0, f64::from(by))
}

#[then(expr = "{selector} rose by job {string}'s tokens_out")]
async fn rose_by_tokens(w: &mut TestWorld, selector: Selector, id: String) -> StepResult {
    let n = w
        .settle(&id)
        .await?
        .first("end")
        .and_then(|e| e.data.get("tokens_out"))
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| anyhow!("job {id} has no end.tokens_out"))?;
    rose_by(w, &selector.0, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP worker_requests_total Requests.\n# TYPE worker_requests_total counter\nworker_requests_total{outcome=\"ok\",quant_kind=\"Q4_1\"} 3\nworker_requests_total{outcome=\"disconnected\"} 1\nworker_inference_duration_ms_bucket{le=\"+Inf\"} 4\nworker_uptime_seconds 12.5 1700000000\n";

    #[test]
    fn parses_and_sums_by_label() {
        let s = parse(TEXT).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(total(&s, "worker_requests_total").unwrap(), 4.0);
        assert_eq!(
            total(&s, r#"worker_requests_total{outcome="disconnected"}"#).unwrap(),
            1.0
        );
        assert_eq!(s[0].labels["quant_kind"], "Q4_1");
        assert_eq!(total(&s, "worker_uptime_seconds").unwrap(), 12.5);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("worker{a=b} 1").is_err());
        assert!(parse("worker 1x").is_err());
        assert!(parse("bad-name 1").is_err());
    }
}

//! Typed parameters of the step expressions (`{model}`, `{code}`, `{names}`, ...),
//! checked when a feature line is matched, so a typo in a feature fails loudly.
//!
//! Some parameters may match nothing (`{flags}`, `{after}`, `{times}`, ...): they
//! are optional tails of a step (`a worker on the reference model` and `a worker
//! on the reference model with flags "--x 1"` are one step), written right after
//! the text before them, without a space.

use std::str::FromStr;

use anyhow::{anyhow, bail, Error};
use cucumber::Parameter;

/// The text between a pair of double quotes (`"x"` -> `x`).
fn unquote(s: &str) -> anyhow::Result<&str> {
    s.trim()
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| anyhow!("{s:?} is not quoted"))
}

/// Every quoted item of `"a", "b c" and "d"` -> `[a, b c, d]`.
pub fn quoted_list(s: &str) -> Vec<String> {
    s.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

/// A model fixture (see `crate::fixtures`): `reference` or a quoted fixture name.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "model", regex = r#"reference|"[^"]+""#)]
pub struct Model(pub String);

impl FromStr for Model {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let name = unquote(s).unwrap_or(s);
        if crate::fixtures::NAMES.contains(&name)
            || name.starts_with("synthetic-")
            || name == "reference-tokenizer-json"
        {
            Ok(Model(name.to_owned()))
        } else {
            Err(anyhow!("unknown model fixture {name:?}"))
        }
    }
}

/// Optional flags for a start: nothing, ` with flags "..."` or ` without "--flag"`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "flags", regex = r#"(?: with flags "[^"]*"| without "[^"]*")?"#)]
pub enum Flags {
    None,
    With(String),
    Without(String),
}

impl FromStr for Flags {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let s = s.trim();
        Ok(if s.is_empty() {
            Flags::None
        } else if let Some(f) = s.strip_prefix("with flags ") {
            Flags::With(unquote(f)?.to_owned())
        } else if let Some(f) = s.strip_prefix("without ") {
            Flags::Without(unquote(f)?.to_owned())
        } else {
            bail!("bad start flags {s:?}")
        })
    }
}

/// What to watch while a worker starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "watch", regex = "polling /health|sampling its memory")]
pub enum Watch {
    Health,
    Memory,
}

impl FromStr for Watch {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "polling /health" => Ok(Watch::Health),
            "sampling its memory" => Ok(Watch::Memory),
            other => Err(anyhow!("cannot watch {other:?}")),
        }
    }
}

/// How a start ends (M0-W-1212, M0-W-1360): `serves`, `serves with tokenizer "K"`, `fails naming "X"`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(
    name = "outcome",
    regex = r#"serves(?: with tokenizer "[^"]+")?|fails naming "[^"]+""#
)]
pub enum StartOutcome {
    Serves { tokenizer: Option<String> },
    FailsNaming(String),
}

impl FromStr for StartOutcome {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        if let Some(name) = s.strip_prefix("fails naming ") {
            return Ok(StartOutcome::FailsNaming(unquote(name)?.to_owned()));
        }
        match s.strip_prefix("serves") {
            Some("") => Ok(StartOutcome::Serves { tokenizer: None }),
            Some(rest) => Ok(StartOutcome::Serves {
                tokenizer: Some(unquote(rest.trim_start_matches(" with tokenizer "))?.to_owned()),
            }),
            None => Err(anyhow!("unknown start outcome {s:?}")),
        }
    }
}

/// How a scenario stops the worker gracefully.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "stop", regex = "/shutdown|SIGTERM")]
pub enum Stop {
    Shutdown,
    Sigterm,
}

impl FromStr for Stop {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "/shutdown" => Ok(Stop::Shutdown),
            "SIGTERM" => Ok(Stop::Sigterm),
            other => Err(anyhow!("unknown way to stop the worker: {other}")),
        }
    }
}

/// A quoted error code of M0-W-1500.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "code", regex = r#""[A-Z_]+""#)]
pub struct Code(pub String);

impl FromStr for Code {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let s = unquote(s)?;
        if crate::events::ERROR_CODES.contains(&s) {
            Ok(Code(s.to_owned()))
        } else {
            Err(anyhow!("{s} is not an error code of M0-W-1500"))
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A list of quoted names: `"a"`, `"a" and "b"`, `"a", "b" or "c"`, `"a", "b", "c"`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "names", regex = r#""[^"]*"(?:(?:,? and |,? or |, )"[^"]*")*"#)]
pub struct Names(pub Vec<String>);

impl FromStr for Names {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(Names(quoted_list(s)))
    }
}

/// A comma-separated list of numbers: `0, 25, 50`.
#[derive(Debug, Clone, PartialEq, Parameter)]
#[param(name = "numbers", regex = r"\d+(?:\.\d+)?(?:, \d+(?:\.\d+)?)*")]
pub struct Numbers(pub Vec<f64>);

impl FromStr for Numbers {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let v = s
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>();
        Ok(Numbers(v.map_err(|e| anyhow!("bad number list {s}: {e}"))?))
    }
}

/// A quoted text that may itself hold quotes (a metric selector with labels).
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "selector", regex = r#"".+""#)]
pub struct Selector(pub String);

impl FromStr for Selector {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(Selector(unquote(s)?.to_owned()))
    }
}

/// An optional ` with header "Name: value"` of a post.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "header", regex = r#"(?: with header "[^":]+: [^"]+")?"#)]
pub struct Header(pub Option<(String, String)>);

impl FromStr for Header {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let Some(h) = s.trim().strip_prefix("with header ") else {
            return Ok(Header(None));
        };
        let (name, value) = unquote(h)?
            .split_once(": ")
            .ok_or_else(|| anyhow!("bad header {h}"))?;
        Ok(Header(Some((name.to_owned(), value.to_owned()))))
    }
}

/// An optional ` N times` (once when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "times", regex = r"(?: \d+ times)?")]
pub struct Times(pub usize);

impl FromStr for Times {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.trim().strip_suffix(" times") {
            None => Ok(Times(1)),
            Some(n) => Ok(Times(n.parse()?)),
        }
    }
}

/// How many tokens came before an error: any, ` after N tokens` or ` after at least N tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "after", regex = r"(?: after (?:at least )?\d+ tokens)?")]
pub enum After {
    Any,
    Exactly(usize),
    AtLeast(usize),
}

impl FromStr for After {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let Some(n) = s.trim().strip_prefix("after ") else {
            return Ok(After::Any);
        };
        let n = n.trim_end_matches(" tokens");
        Ok(match n.strip_prefix("at least ") {
            Some(m) => After::AtLeast(m.parse()?),
            None => After::Exactly(n.parse()?),
        })
    }
}

/// One or more jobs: `job "a"` or `jobs "a" and "b"`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(
    name = "jobs",
    regex = r#"job "[^"]+"|jobs "[^"]+"(?:(?:, | and )"[^"]+")+"#
)]
pub struct Jobs(pub Vec<String>);

impl FromStr for Jobs {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(Jobs(quoted_list(s)))
    }
}

/// Where an error body comes from: `job "x"'s` (its error event), `the refused job's`, `the reply's`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(
    name = "error_of",
    regex = r#"job "[^"]+"'s|the refused job's|the reply's"#
)]
pub enum ErrorOf {
    Job(String),
    Refused,
    Reply,
}

impl FromStr for ErrorOf {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "the refused job's" => ErrorOf::Refused,
            "the reply's" => ErrorOf::Reply,
            job => ErrorOf::Job(
                unquote(job.trim_start_matches("job ").trim_end_matches("'s"))?.to_owned(),
            ),
        })
    }
}

/// `retriable` or `not retriable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "retriable", regex = "(?:not )?retriable")]
pub struct Retriable(pub bool);

impl FromStr for Retriable {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(Retriable(s == "retriable"))
    }
}

/// An optional `within N s ` before a condition that may take time to become true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "within", regex = r"(?:within \d+ s )?")]
pub struct Within(pub Option<u64>);

impl FromStr for Within {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.trim().strip_prefix("within ") {
            None => Ok(Within(None)),
            Some(n) => Ok(Within(Some(n.trim_end_matches(" s").parse()?))),
        }
    }
}

/// An optional `on cuda ` before a check that only applies to the CUDA backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "on_cuda", regex = "(?:on cuda )?")]
pub struct OnCuda(pub bool);

impl FromStr for OnCuda {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(OnCuda(!s.is_empty()))
    }
}

/// A JSON scalar as a feature writes it: `"text"`, `true`, `false` or a whole number.
#[derive(Debug, Clone, PartialEq, Parameter)]
#[param(name = "json", regex = r#""[^"]*"|true|false|\d+"#)]
pub struct Json(pub serde_json::Value);

impl FromStr for Json {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(Json(serde_json::from_str(s)?))
    }
}

/// The way a job of M0-W-1311 ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(
    name = "ending",
    regex = r#""(?:max_tokens|stop_sequence|eos|cancel|timeout|shutdown)""#
)]
pub enum Ending {
    MaxTokens,
    StopSequence,
    Eos,
    Cancel,
    Timeout,
    Shutdown,
}

impl FromStr for Ending {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match unquote(s)? {
            "max_tokens" => Ending::MaxTokens,
            "stop_sequence" => Ending::StopSequence,
            "eos" => Ending::Eos,
            "cancel" => Ending::Cancel,
            "timeout" => Ending::Timeout,
            "shutdown" => Ending::Shutdown,
            other => bail!("unknown job ending {other}"),
        })
    }
}

impl Ending {
    pub fn name(self) -> &'static str {
        match self {
            Ending::MaxTokens => "max_tokens",
            Ending::StopSequence => "stop_sequence",
            Ending::Eos => "eos",
            Ending::Cancel => "cancel",
            Ending::Timeout => "timeout",
            Ending::Shutdown => "shutdown",
        }
    }
}

/// The two parity logs of `"harness parity A B"`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "parity_cmd", regex = r#""harness parity \S+ \S+""#)]
pub struct ParityCmd(pub String, pub String);

impl FromStr for ParityCmd {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let rest = unquote(s)?.trim_start_matches("harness parity ");
        let (a, b) = rest
            .split_once(' ')
            .ok_or_else(|| anyhow!("want two logs: {s}"))?;
        Ok(ParityCmd(a.to_owned(), b.to_owned()))
    }
}

/// What `harness parity` should report: `no divergence` or `the first divergence at step N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(
    name = "divergence",
    regex = r"no divergence|the first divergence at step \d+"
)]
pub struct Divergence(pub Option<u64>);

impl FromStr for Divergence {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.strip_prefix("the first divergence at step ") {
            None => Ok(Divergence(None)),
            Some(n) => Ok(Divergence(Some(n.parse()?))),
        }
    }
}

/// An optional ` of "FILE"` naming a golden tokenizer file (the reference's when absent).
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(name = "goldens", regex = r#"(?: of "[^"]+")?"#)]
pub struct Goldens(pub Option<String>);

impl FromStr for Goldens {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s.trim().strip_prefix("of ") {
            None => Ok(Goldens(None)),
            Some(f) => Ok(Goldens(Some(unquote(f)?.to_owned()))),
        }
    }
}

/// An optional ` on this backend`: leaves out the tests that need a GPU when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "here", regex = "(?: on this backend)?")]
pub struct ThisBackend(pub bool);

impl FromStr for ThisBackend {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(ThisBackend(!s.is_empty()))
    }
}

/// Optional proof-bundle environment of a nested run:
/// ` and LLORCH_PROOF_DIR "D" and LLORCH_RUN_ID "R"`.
#[derive(Debug, Clone, PartialEq, Eq, Parameter)]
#[param(
    name = "proof_env",
    regex = r#"(?: and LLORCH_PROOF_DIR "[^"]+" and LLORCH_RUN_ID "[^"]+")?"#
)]
pub struct ProofEnv(pub Option<(String, String)>);

impl FromStr for ProofEnv {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match quoted_list(s).as_slice() {
            [] => Ok(ProofEnv(None)),
            [dir, id] => Ok(ProofEnv(Some((dir.clone(), id.clone())))),
            _ => Err(anyhow!("bad proof environment {s}")),
        }
    }
}

/// `zero` or `non-zero`: whether a command should have succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(name = "exit", regex = "zero|non-zero")]
pub struct ExitZero(pub bool);

impl FromStr for ExitZero {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(ExitZero(s == "zero"))
    }
}

/// Which samples a budget step compares, by description.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parameter)]
#[param(
    name = "samples",
    regex = "the maximum load time|the maximum|the client's time to first token|the worker's first_token_ms\
             |the median decode rate|the gaps between token events|the /health latency\
             |the time from /cancel to the terminal event|the benchmark's mean time"
)]
pub enum Samples {
    /// The largest of `startup_s` or `shutdown_ms`, whichever the budget is about.
    Maximum,
    LoadTime,
    ClientFirstToken,
    WorkerFirstToken,
    DecodeRate,
    TokenGaps,
    HealthLatency,
    CancelLatency,
    BenchmarkMean,
}

impl FromStr for Samples {
    type Err = Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "the maximum" => Samples::Maximum,
            "the maximum load time" => Samples::LoadTime,
            "the client's time to first token" => Samples::ClientFirstToken,
            "the worker's first_token_ms" => Samples::WorkerFirstToken,
            "the median decode rate" => Samples::DecodeRate,
            "the gaps between token events" => Samples::TokenGaps,
            "the /health latency" => Samples::HealthLatency,
            "the time from /cancel to the terminal event" => Samples::CancelLatency,
            "the benchmark's mean time" => Samples::BenchmarkMean,
            other => bail!("no samples are called {other:?}"),
        })
    }
}

impl Samples {
    /// The name the measuring steps store these samples under, for `budget`.
    pub fn key(self, budget: &str) -> anyhow::Result<&'static str> {
        Ok(match self {
            Samples::Maximum if budget == "startup_s" => "startup_s",
            Samples::Maximum if budget == "shutdown_ms_max" => "shutdown_ms",
            Samples::Maximum => bail!("no maximum samples for budget {budget}"),
            Samples::LoadTime => "load_s",
            Samples::ClientFirstToken => "first_token_client_ms",
            Samples::WorkerFirstToken => "first_token_worker_ms",
            Samples::DecodeRate => "decode_tok_s",
            Samples::TokenGaps => "inter_token_ms",
            Samples::HealthLatency => "health_ms",
            Samples::CancelLatency => "cancel_ms",
            Samples::BenchmarkMean => "execute_parse_ms",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_lists() {
        assert_eq!(quoted_list(r#""a", "b c" and "d""#), ["a", "b c", "d"]);
        assert!(quoted_list("none").is_empty());
    }

    #[test]
    fn optional_tails_parse_when_absent_and_present() {
        assert_eq!("".parse::<Flags>().unwrap(), Flags::None);
        assert_eq!(
            r#" with flags "--x 1""#.parse::<Flags>().unwrap(),
            Flags::With("--x 1".into())
        );
        assert_eq!(
            r#" without "--backend""#.parse::<Flags>().unwrap(),
            Flags::Without("--backend".into())
        );
        assert_eq!("".parse::<After>().unwrap(), After::Any);
        assert_eq!(
            " after 0 tokens".parse::<After>().unwrap(),
            After::Exactly(0)
        );
        assert_eq!(
            " after at least 5 tokens".parse::<After>().unwrap(),
            After::AtLeast(5)
        );
        assert_eq!("".parse::<Times>().unwrap(), Times(1));
        assert_eq!(" 3 times".parse::<Times>().unwrap(), Times(3));
        assert_eq!("within 3 s ".parse::<Within>().unwrap(), Within(Some(3)));
        assert_eq!(
            r#" with header "X-Deadline: 2030-01-01T00:00:00Z""#
                .parse::<Header>()
                .unwrap(),
            Header(Some(("X-Deadline".into(), "2030-01-01T00:00:00Z".into())))
        );
    }

    #[test]
    fn typed_values_are_checked() {
        assert!(r#""QUEUE_FULL""#.parse::<Code>().is_ok());
        assert!(r#""NO_SUCH_CODE""#.parse::<Code>().is_err());
        assert_eq!(
            "reference".parse::<Model>().unwrap(),
            Model("reference".into())
        );
        assert!(r#""no-such-fixture""#.parse::<Model>().is_err());
        assert_eq!(
            r#"fails naming "mamba""#.parse::<StartOutcome>().unwrap(),
            StartOutcome::FailsNaming("mamba".into())
        );
        assert_eq!(
            r#"serves with tokenizer "gguf-bpe""#.parse::<StartOutcome>().unwrap(),
            StartOutcome::Serves {
                tokenizer: Some("gguf-bpe".into())
            }
        );
        assert_eq!(
            r#"job "w1"'s"#.parse::<ErrorOf>().unwrap(),
            ErrorOf::Job("w1".into())
        );
        assert_eq!(
            "8192".parse::<Json>().unwrap(),
            Json(serde_json::json!(8192))
        );
        assert_eq!(
            r#""harness parity a.jsonl b.jsonl""#.parse::<ParityCmd>().unwrap(),
            ParityCmd("a.jsonl".into(), "b.jsonl".into())
        );
        assert_eq!(
            "0, 25, 50".parse::<Numbers>().unwrap(),
            Numbers(vec![0.0, 25.0, 50.0])
        );
    }
}

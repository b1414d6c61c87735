//! Step definitions, one module per concept, all over the one typed client
//! (`crate::client`) and the worker process (`crate::process`). Steps use
//! regular expressions (cucumber expressions treat `/` as an alternation).

pub mod bench;
pub mod cancel;
pub mod execute;
pub mod golden;
pub mod health;
pub mod lifecycle;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod parity;
pub mod stream;
pub mod tokenize;
pub mod workspace;

use std::fmt;

use cucumber::gherkin::Step;

/// A step failure; shows the whole anyhow chain (cucumber prints it with `{}`).
#[derive(Debug)]
pub struct Fail(anyhow::Error);

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl<E: Into<anyhow::Error>> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.into())
    }
}

pub type StepResult = Result<(), Fail>;

/// Fails the step with a message when `cond` is false.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        let ok: bool = $cond;
        if !ok {
            return Err(anyhow::anyhow!($($msg)+).into());
        }
    };
}

pub fn docstring(step: &Step) -> anyhow::Result<&str> {
    step.docstring
        .as_deref()
        .map(str::trim)
        .ok_or_else(|| anyhow::anyhow!("step needs a docstring"))
}

/// The rows of a step's table as maps from header to cell.
pub fn table_rows(step: &Step) -> anyhow::Result<Vec<std::collections::BTreeMap<String, String>>> {
    let t = step
        .table
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("step needs a table"))?;
    let (head, rows) = t
        .rows
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("empty table"))?;
    Ok(rows
        .iter()
        .map(|r| head.iter().cloned().zip(r.iter().cloned()).collect())
        .collect())
}

/// `"a", "b" and "c"` -> `[a, b, c]`.
pub fn quoted_list(s: &str) -> Vec<String> {
    s.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_lists() {
        assert_eq!(
            super::quoted_list(r#""a", "b c" and "d""#),
            ["a", "b c", "d"]
        );
        assert!(super::quoted_list("none").is_empty());
    }
}

/// How a scenario stops the worker gracefully.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Shutdown,
    Sigterm,
}

impl std::str::FromStr for Stop {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "/shutdown" => Ok(Stop::Shutdown),
            "SIGTERM" => Ok(Stop::Sigterm),
            other => Err(anyhow::anyhow!("unknown way to stop the worker: {other}")),
        }
    }
}

/// An error code of M0-W-1500, checked when the feature is parsed into a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code(pub String);

impl std::str::FromStr for Code {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        if crate::events::ERROR_CODES.contains(&s) {
            Ok(Code(s.to_owned()))
        } else {
            Err(anyhow::anyhow!("{s} is not an error code of M0-W-1500"))
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A model fixture name (see `crate::fixtures`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model(pub String);

impl std::str::FromStr for Model {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        if crate::fixtures::NAMES.contains(&s)
            || s.starts_with("synthetic-")
            || s == "reference-tokenizer-json"
        {
            Ok(Model(s.to_owned()))
        } else {
            Err(anyhow::anyhow!("unknown model fixture {s:?}"))
        }
    }
}

//! Step definitions, grouped by concept, all over the one typed client
//! (`crate::client`) and the World's parts (`crate::world`):
//!
//! - `process`: starting, signalling and stopping workers; their logs; the GPU's view;
//! - `requests`: posting jobs, cancelling, the streams and plain replies they give;
//! - `observe`: `/health` and `/metrics`;
//! - `model`: tokenizer and llama.cpp goldens, the haiku, parity logs, CPU-vs-CUDA;
//! - `openai`: the OpenAI-compatible routes through the `async-openai` client;
//! - `choices`: several choices of one request (`n`, issue 43);
//! - `structured`: output under a JSON Schema, a regex or a grammar (issue 43);
//! - `bias`: `logit_bias` and the presence and frequency penalties (issue 43);
//! - `tools`, `tool_routes`: tool calls on the chat route, and on `/v1/messages`
//!   and `/v1/responses` (issue 43);
//! - `budgets`: measurements against budgets.yaml (`@bench`);
//! - `workspace`: unit tests, source checks, cargo and nested harness runs.
//!
//! Steps are cucumber expressions with typed parameters (`params`): `{int}`,
//! `{float}`, `{string}` and this suite's own (`{model}`, `{code}`, `{names}`, ...).
//! A `/` in an expression is an alternation, so literal slashes are written `\/`.

pub mod anthropic;
pub mod bias;
pub mod budgets;
pub mod choices;
pub mod model;
pub mod observe;
pub mod openai;
pub mod params;
pub mod prefix;
pub mod process;
pub mod requests;
pub mod structured;
pub mod tool_routes;
pub mod tools;
pub mod workspace;

use std::fmt;

use cucumber::gherkin::Step;

use crate::world::TestWorld;

pub use params::quoted_list;

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

/// The step's docstring, expanded, as JSON (a request body).
pub fn json_docstring(w: &mut TestWorld, step: &Step) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let text = w.expand(docstring(step)?)?;
    serde_json::from_str(&text).with_context(|| format!("docstring is not JSON: {text}"))
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

#[cfg(test)]
mod tests {
    use cucumber::codegen::{StepConstructor as _, WorldInventory};
    use cucumber::feature::Ext as _;
    use cucumber::gherkin::{Feature, GherkinEnv, StepType};

    use crate::world::TestWorld;

    /// Every feature step of the given kind, examples expanded.
    fn feature_steps() -> Vec<(StepType, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../features");
        let mut out = Vec::new();
        for file in crate::catalogue::feature_files(&dir).unwrap() {
            let f = Feature::parse_path(&file, GherkinEnv::default())
                .unwrap()
                .expand_examples()
                .unwrap();
            let scenarios = f
                .scenarios
                .iter()
                .chain(f.rules.iter().flat_map(|r| r.scenarios.iter()));
            for sc in scenarios {
                let background = f.background.iter().flat_map(|b| b.steps.iter());
                for st in background.chain(sc.steps.iter()) {
                    out.push((st.ty, st.value.clone()));
                }
            }
        }
        out
    }

    /// Every step definition is used by some feature line of its kind (none is dead code).
    #[test]
    fn every_step_definition_is_used() {
        type G = <TestWorld as WorldInventory>::Given;
        type W = <TestWorld as WorldInventory>::When;
        type T = <TestWorld as WorldInventory>::Then;
        let steps = feature_steps();
        let mut defs = Vec::new();
        for s in cucumber::codegen::inventory::iter::<G> {
            defs.push((StepType::Given, s.inner()));
        }
        for s in cucumber::codegen::inventory::iter::<W> {
            defs.push((StepType::When, s.inner()));
        }
        for s in cucumber::codegen::inventory::iter::<T> {
            defs.push((StepType::Then, s.inner()));
        }
        let unused: Vec<String> = defs
            .iter()
            .filter(|(ty, (_, re, _))| {
                let re = re();
                !steps.iter().any(|(t, v)| t == ty && re.is_match(v))
            })
            .map(|(ty, (loc, re, _))| format!("{ty:?} {} ({}:{})", re(), loc.path, loc.line))
            .collect();
        assert!(
            defs.len() > 50,
            "only {} step definitions found",
            defs.len()
        );
        assert!(
            unused.is_empty(),
            "step definitions no feature uses:\n{}",
            unused.join("\n")
        );
    }
}

//! The requirement matrix (EXT-002): every requirement ID once, with its scenario
//! and a result: passed, failed, skipped (with its reason) or pending (with its
//! capability). An ID passes only when every example of its scenario passed; the
//! worst outcome wins: failed, then pending, then skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::catalogue::{Plan, Requirement, ScenarioInfo, Selection};

/// What running one expansion gave.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Passed,
    Failed(String),
    /// A step had no definition (cucumber's "skipped").
    StepsSkipped,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub file: PathBuf,
    pub line: usize,
    pub name: String,
    pub outcome: Outcome,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Skipped,
    Pending,
    Failed,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExampleRow {
    pub name: String,
    pub line: usize,
    pub status: Status,
    pub reason: Option<String>,
    pub seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub id: String,
    pub title: String,
    pub backend: String,
    pub scenario: Option<String>,
    pub location: Option<String>,
    pub status: Status,
    pub reason: Option<String>,
    pub examples: Vec<ExampleRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Matrix {
    pub rows: Vec<Row>,
    pub counts: BTreeMap<String, usize>,
}

pub fn build(
    reqs: &[Requirement],
    scenarios: &[ScenarioInfo],
    sel: &Selection,
    results: &[RunResult],
    root: &Path,
) -> Matrix {
    let by_loc: BTreeMap<(PathBuf, usize), &RunResult> = results
        .iter()
        .map(|r| ((r.file.clone(), r.line), r))
        .collect();
    let mut rows = Vec::new();
    for req in reqs {
        let Some(sc) = scenarios
            .iter()
            .find(|s| s.ids().contains(&req.id.as_str()))
        else {
            rows.push(Row {
                id: req.id.clone(),
                title: req.title.clone(),
                backend: req.backend.clone(),
                scenario: None,
                location: None,
                status: Status::Failed,
                reason: Some("no scenario".into()),
                examples: vec![],
            });
            continue;
        };
        let examples: Vec<ExampleRow> = sc
            .expansions
            .iter()
            .map(|ex| {
                let ran = by_loc.get(&(sc.file.clone(), ex.line));
                let (status, reason) = match (sel.plan(&ex.tags), ran) {
                    (Plan::Pending(cap), ran) => (
                        Status::Pending,
                        Some(format!(
                            "pending: {cap}{}",
                            ran.map(|r| format!(" (ran: {})", outcome_word(&r.outcome)))
                                .unwrap_or_default()
                        )),
                    ),
                    (_, Some(r)) => match &r.outcome {
                        Outcome::Passed => (Status::Passed, None),
                        Outcome::Failed(m) => (Status::Failed, Some(m.clone())),
                        Outcome::StepsSkipped => (
                            Status::Failed,
                            Some("a step has no definition (skipped steps fail the run)".into()),
                        ),
                    },
                    (Plan::Skip(why), None) => (Status::Skipped, Some(why)),
                    (Plan::Run, None) => (
                        Status::Failed,
                        Some("selected but no result recorded (the run stopped early?)".into()),
                    ),
                };
                ExampleRow {
                    name: ex.name.clone(),
                    line: ex.line,
                    status,
                    reason,
                    seconds: ran.map(|r| r.seconds),
                }
            })
            .collect();
        let status = examples
            .iter()
            .map(|e| e.status)
            .max()
            .unwrap_or(Status::Failed);
        let worst: Vec<&ExampleRow> = examples.iter().filter(|e| e.status == status).collect();
        let mut reasons: Vec<String> = worst.iter().filter_map(|e| e.reason.clone()).collect();
        reasons.dedup();
        let mut reason = (!reasons.is_empty()).then(|| reasons.join("; "));
        if examples.len() > 1 && status != Status::Passed {
            let passed = examples
                .iter()
                .filter(|e| e.status == Status::Passed)
                .count();
            reason = Some(format!(
                "{} ({passed} of {} examples passed)",
                reason.unwrap_or_default(),
                examples.len()
            ));
        }
        let file = sc.file.strip_prefix(root).unwrap_or(&sc.file);
        rows.push(Row {
            id: req.id.clone(),
            title: req.title.clone(),
            backend: req.backend.clone(),
            scenario: Some(sc.name.clone()),
            location: Some(format!("{}:{}", file.display(), sc.line)),
            status,
            reason,
            examples,
        });
    }
    let mut counts = BTreeMap::new();
    for r in &rows {
        *counts
            .entry(format!("{:?}", r.status).to_lowercase())
            .or_insert(0) += 1;
    }
    Matrix { rows, counts }
}

fn outcome_word(o: &Outcome) -> &'static str {
    match o {
        Outcome::Passed => "passed",
        Outcome::Failed(_) => "failed",
        Outcome::StepsSkipped => "skipped steps",
    }
}

impl Matrix {
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| ID | backend | scenario | status | reason |\n| --- | --- | --- | --- | --- |\n",
        );
        for r in &self.rows {
            let cell = |x: &str| x.replace('|', "\\|").replace('\n', " ");
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                r.id,
                r.backend,
                cell(&format!(
                    "{} ({})",
                    r.scenario.as_deref().unwrap_or("-"),
                    r.location.as_deref().unwrap_or("-")
                )),
                format!("{:?}", r.status).to_lowercase(),
                cell(&truncate(r.reason.as_deref().unwrap_or(""), 300))
            ));
        }
        s
    }

    pub fn summary(&self) -> String {
        let get = |k: &str| self.counts.get(k).copied().unwrap_or(0);
        format!(
            "{} passed, {} failed, {} skipped, {} pending (of {} requirements)",
            get("passed"),
            get("failed"),
            get("skipped"),
            get("pending"),
            self.rows.len()
        )
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::Expansion;

    fn req(id: &str, backend: &str) -> Requirement {
        Requirement {
            id: id.into(),
            title: "t".into(),
            backend: backend.into(),
            section: "s".into(),
        }
    }

    fn sc(id: &str, line: usize, rows: &[(&[&str], usize)]) -> ScenarioInfo {
        ScenarioInfo {
            feature: "f".into(),
            file: "/r/features/a.feature".into(),
            name: format!("scenario {id}"),
            line,
            tags: vec![id.into()],
            expansions: rows
                .iter()
                .map(|(t, l)| Expansion {
                    name: "x".into(),
                    line: *l,
                    tags: t.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn res(line: usize, outcome: Outcome) -> RunResult {
        RunResult {
            file: "/r/features/a.feature".into(),
            line,
            name: "x".into(),
            outcome,
            seconds: 1.0,
        }
    }

    #[test]
    fn every_id_once_with_the_worst_outcome() {
        let reqs = [
            req("EXT-901", "any"),
            req("EXT-902", "cuda"),
            req("EXT-903", "any"),
            req("EXT-904", "any"),
            req("EXT-905", "any"),
        ];
        let scs = [
            sc("EXT-901", 1, &[(&["EXT-901", "any"], 1)]),
            sc("EXT-902", 5, &[(&["EXT-902", "cuda"], 5)]),
            sc(
                "EXT-903",
                9,
                &[
                    (&["EXT-903", "any"], 12),
                    (&["EXT-903", "any", "pending:phi3"], 16),
                ],
            ),
            sc("EXT-904", 20, &[(&["EXT-904", "any"], 20)]),
        ];
        let sel = Selection::new(None, false, false).unwrap();
        let m = build(
            &reqs,
            &scs,
            &sel,
            &[
                res(1, Outcome::Passed),
                res(12, Outcome::Passed),
                res(20, Outcome::Failed("boom".into())),
            ],
            Path::new("/r"),
        );
        let st: Vec<Status> = m.rows.iter().map(|r| r.status).collect();
        assert_eq!(
            st,
            [
                Status::Passed,
                Status::Skipped,
                Status::Pending,
                Status::Failed,
                Status::Failed
            ]
        );
        assert_eq!(m.rows[1].reason.as_deref(), Some("no GPU"));
        assert!(
            m.rows[2]
                .reason
                .as_deref()
                .unwrap()
                .starts_with("pending: phi3 (1 of 2"),
            "{:?}",
            m.rows[2].reason
        );
        assert_eq!(m.rows[4].reason.as_deref(), Some("no scenario"));
        assert_eq!(m.rows[0].location.as_deref(), Some("features/a.feature:1"));
        assert_eq!(
            m.summary(),
            "1 passed, 2 failed, 1 skipped, 1 pending (of 5 requirements)"
        );
        assert!(m.markdown().lines().count() == 7);
    }

    #[test]
    fn a_selected_scenario_without_a_result_fails() {
        let reqs = [req("EXT-901", "any")];
        let scs = [sc("EXT-901", 1, &[(&["EXT-901", "any"], 1)])];
        let m = build(
            &reqs,
            &scs,
            &Selection::new(None, true, false).unwrap(),
            &[],
            Path::new("/r"),
        );
        assert_eq!(m.rows[0].status, Status::Failed);
    }
}

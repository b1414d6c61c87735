//! The requirement catalogue (REQUIREMENTS.md) and the scenarios that trace it.
//!
//! Conventions of `features/*.feature`:
//! - every scenario carries exactly one requirement tag (`@M0-W-1300`, `@M0-SYS-6.3.1`,
//!   `@EXT-003`) and the backend tag REQUIREMENTS.md gives it (`@any`, `@cuda`, `@bench`);
//! - `@pending:<capability>` (on a scenario or on one `Examples:` block) marks a check
//!   of a capability a later issue brings; it is reported as pending, never run by default;
//!   `@pending-cuda:<capability>` marks one that the CPU backend passes and the CUDA
//!   backend does not yet: pending only where the backend under test is CUDA;
//! - `@cuda` on an `Examples:` block marks rows that need a GPU inside an `@any` scenario;
//! - `@allow-skip` lets a scenario have unmatched (skipped) steps.
//!
//! `check_coverage` fails when an ID has no scenario or more than one, when a scenario
//! carries an unknown ID or none, or when its backend tag disagrees with the catalogue.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use cucumber::feature::Ext as _;
use cucumber::gherkin::{self, tagexpr::TagOperation, GherkinEnv};
use cucumber::tag::Ext as _;
use regex::Regex;
use serde::Serialize;

/// One requirement of REQUIREMENTS.md.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Requirement {
    pub id: String,
    pub title: String,
    /// `any`, `cuda` or `bench`, from the end of its Check line.
    pub backend: String,
    pub section: String,
}

pub fn parse_requirements(text: &str) -> Result<Vec<Requirement>> {
    let head = Regex::new(r"^### ((?:M0-SYS|M0-W|EXT)-[0-9][0-9.]*) (.+)$").unwrap();
    let check = Regex::new(r"^- Check:.*\[`(any|cuda|bench)`\]\s*$").unwrap();
    let mut out: Vec<Requirement> = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(s) = line.strip_prefix("## ") {
            section = s.trim().to_owned();
        } else if let Some(c) = head.captures(line) {
            out.push(Requirement {
                id: c[1].to_owned(),
                title: c[2].trim().to_owned(),
                backend: String::new(),
                section: section.clone(),
            });
        } else if let Some(c) = check.captures(line) {
            let r = out
                .last_mut()
                .ok_or_else(|| anyhow!("a Check line before any requirement"))?;
            r.backend = c[1].to_owned();
        }
    }
    if let Some(r) = out.iter().find(|r| r.backend.is_empty()) {
        return Err(anyhow!(
            "requirement {} has no backend on its Check line",
            r.id
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(r) = out.iter().find(|r| !seen.insert(r.id.clone())) {
        return Err(anyhow!("requirement {} is listed twice", r.id));
    }
    Ok(out)
}

/// Is this tag a requirement ID?
pub fn is_id_tag(tag: &str) -> bool {
    Regex::new(r"^(M0-SYS|M0-W|EXT)-[0-9]")
        .unwrap()
        .is_match(tag)
}

/// One scenario as written (an outline counts once), with its expansions.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioInfo {
    pub feature: String,
    pub file: PathBuf,
    pub name: String,
    pub line: usize,
    pub tags: Vec<String>,
    pub expansions: Vec<Expansion>,
}

/// One runnable scenario: a plain scenario, or one example row of an outline.
#[derive(Debug, Clone, Serialize)]
pub struct Expansion {
    pub name: String,
    pub line: usize,
    /// Scenario tags plus its Examples block's tags.
    pub tags: Vec<String>,
}

impl ScenarioInfo {
    pub fn ids(&self) -> Vec<&str> {
        self.tags
            .iter()
            .map(String::as_str)
            .filter(|t| is_id_tag(t))
            .collect()
    }
}

pub fn feature_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "feature"))
        .collect();
    files.sort();
    Ok(files)
}

pub fn parse_features(dir: &Path) -> Result<Vec<ScenarioInfo>> {
    let mut out = Vec::new();
    for file in feature_files(dir)? {
        let feature = gherkin::Feature::parse_path(&file, GherkinEnv::default())
            .map_err(|e| anyhow!("{}: {e}", file.display()))?;
        let expanded = feature
            .clone()
            .expand_examples()
            .map_err(|e| anyhow!("{}: {e}", file.display()))?;
        let mut expansions_of: BTreeMap<usize, Vec<Expansion>> = BTreeMap::new();
        let all_expanded = expanded
            .scenarios
            .iter()
            .chain(expanded.rules.iter().flat_map(|r| r.scenarios.iter()));
        let originals: Vec<&gherkin::Scenario> = feature
            .scenarios
            .iter()
            .chain(feature.rules.iter().flat_map(|r| r.scenarios.iter()))
            .collect();
        // An expansion belongs to the nearest scenario written at or above its line.
        for sc in all_expanded {
            let owner = originals
                .iter()
                .filter(|o| o.position.line <= sc.position.line)
                .max_by_key(|o| o.position.line)
                .map(|o| o.position.line)
                .unwrap_or(sc.position.line);
            expansions_of.entry(owner).or_default().push(Expansion {
                name: sc.name.clone(),
                line: sc.position.line,
                tags: sc.tags.clone(),
            });
        }
        for sc in originals {
            out.push(ScenarioInfo {
                feature: feature.name.clone(),
                file: file.clone(),
                name: sc.name.clone(),
                line: sc.position.line,
                tags: sc.tags.clone(),
                expansions: expansions_of.remove(&sc.position.line).unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// The coverage verdict: empty `problems` means every ID has exactly one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    pub requirements: usize,
    pub scenarios: usize,
    pub problems: Vec<String>,
}

pub fn check_coverage(reqs: &[Requirement], scenarios: &[ScenarioInfo]) -> Coverage {
    let mut problems = Vec::new();
    let known: BTreeMap<&str, &Requirement> = reqs.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for sc in scenarios {
        let at = format!("{}:{} ({})", sc.file.display(), sc.line, sc.name);
        let ids = sc.ids();
        if ids.is_empty() {
            problems.push(format!("{at}: carries no requirement ID"));
        }
        if ids.len() > 1 {
            problems.push(format!(
                "{at}: carries {} requirement IDs {:?}; one scenario per ID",
                ids.len(),
                ids
            ));
        }
        for id in ids {
            match known.get(id) {
                None => problems.push(format!("{at}: unknown requirement ID {id}")),
                Some(r) => {
                    *count.entry(id).or_default() += 1;
                    if !sc.tags.contains(&r.backend) {
                        problems.push(format!("{at}: {id} needs the backend tag @{}", r.backend));
                    }
                }
            }
        }
        let backends: Vec<&String> = sc
            .tags
            .iter()
            .filter(|t| ["any", "cuda", "bench"].contains(&t.as_str()))
            .collect();
        if backends.len() != 1 {
            problems.push(format!(
                "{at}: needs exactly one scenario-level backend tag, has {backends:?}"
            ));
        }
    }
    for r in reqs {
        match count.get(r.id.as_str()) {
            None => problems.push(format!("{} ({}) has no scenario", r.id, r.title)),
            Some(n) if *n > 1 => problems.push(format!("{} has {n} scenarios; want one", r.id)),
            _ => {}
        }
    }
    Coverage {
        requirements: reqs.len(),
        scenarios: scenarios.len(),
        problems,
    }
}

/// What the suite does with one expansion.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "plan", content = "reason", rename_all = "snake_case")]
pub enum Plan {
    Run,
    Skip(String),
    Pending(String),
}

/// The run's selection rules, shared by the runner's filter and the matrix.
#[derive(Debug, Clone)]
pub struct Selection {
    pub tags: Option<(String, TagOperation)>,
    /// The backend under test can run `@cuda` scenarios.
    pub gpu: bool,
    pub run_pending: bool,
}

pub const NO_GPU: &str = "no GPU";

impl Selection {
    pub fn new(expr: Option<&str>, gpu: bool, run_pending: bool) -> Result<Self> {
        let tags = match expr {
            Some(e) if !e.trim().is_empty() => Some((
                e.to_owned(),
                e.parse::<TagOperation>()
                    .map_err(|err| anyhow!("bad --tags {e:?}: {err}"))?,
            )),
            _ => None,
        };
        Ok(Self {
            tags,
            gpu,
            run_pending,
        })
    }

    /// Pending wins over everything, then "no GPU", then the tag expression.
    pub fn plan(&self, tags: &[String]) -> Plan {
        let mut all: Vec<&str> = tags.iter().map(String::as_str).collect();
        let caps: Vec<&str> = tags
            .iter()
            .filter_map(|t| {
                t.strip_prefix("pending:")
                    .or_else(|| t.strip_prefix("pending-cuda:").filter(|_| self.gpu))
            })
            .collect();
        if !caps.is_empty() {
            all.push("pending");
        }
        let selected = self.tags.as_ref().is_none_or(|(_, op)| op.eval(all.iter()));
        if !(caps.is_empty() || self.run_pending && selected) {
            return Plan::Pending(caps.join(", "));
        }
        if tags.iter().any(|t| t == "cuda") && !self.gpu {
            return Plan::Skip(NO_GPU.to_owned());
        }
        if !selected {
            let expr = self
                .tags
                .as_ref()
                .map(|(e, _)| e.as_str())
                .unwrap_or_default();
            return Plan::Skip(format!("not selected by --tags '{expr}'"));
        }
        Plan::Run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQS: &str = "# t\n## 1. One\n\n### M0-SYS-6.3.1 Self\n- Requires: x\n- Check: y [`any`]\n\n### M0-W-1010 Ctx\n- Check: z [`cuda`]\n## 16. Ext\n### EXT-003 Queue\n- Check: q [`any`]\n";

    #[test]
    fn requirements_are_read_with_backend_and_section() {
        let r = parse_requirements(REQS).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            (
                r[0].id.as_str(),
                r[0].backend.as_str(),
                r[0].section.as_str()
            ),
            ("M0-SYS-6.3.1", "any", "1. One")
        );
        assert_eq!(r[2].id, "EXT-003");
        assert!(parse_requirements("### M0-W-1 A\n- Check: none\n").is_err());
    }

    #[test]
    fn the_project_requirements_add_new_ids() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        let spec = parse_requirements(&read("REQUIREMENTS.md")).unwrap();
        let project = parse_requirements(&read("REQUIREMENTS-project.md")).unwrap();
        assert!(!project.is_empty());
        for p in &project {
            assert!(
                !spec.iter().any(|s| s.id == p.id),
                "{} is already a requirement of the specification",
                p.id
            );
        }
    }

    #[test]
    fn the_real_catalogue_has_every_area() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/REQUIREMENTS.md");
        let r = parse_requirements(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(r.len() > 90, "{}", r.len());
        assert!(r.iter().any(|x| x.id == "M0-W-1800" && x.backend == "any"));
        assert!(r.iter().any(|x| x.id == "EXT-005" && x.backend == "cuda"));
    }

    fn write_features(dir: &Path, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("a.feature"), text).unwrap();
    }

    #[test]
    fn coverage_finds_missing_unknown_duplicate_and_mistagged() {
        let dir = std::env::temp_dir().join(format!("harness-cov-{}", std::process::id()));
        write_features(
            &dir,
            "Feature: f\n\n  @M0-SYS-6.3.1 @any\n  Scenario: a\n    Given x\n\n  @M0-SYS-6.3.1 @any\n  Scenario: dup\n    Given x\n\n  @M0-W-9999 @any\n  Scenario: unknown\n    Given x\n\n  @EXT-003 @cuda\n  Scenario: wrong backend\n    Given x\n",
        );
        let reqs = parse_requirements(REQS).unwrap();
        let cov = check_coverage(&reqs, &parse_features(&dir).unwrap());
        let p = cov.problems.join("\n");
        assert!(p.contains("M0-W-1010 (Ctx) has no scenario"), "{p}");
        assert!(p.contains("unknown requirement ID M0-W-9999"), "{p}");
        assert!(p.contains("M0-SYS-6.3.1 has 2 scenarios"), "{p}");
        assert!(p.contains("EXT-003 needs the backend tag @any"), "{p}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn outlines_expand_with_their_examples_tags() {
        let dir = std::env::temp_dir().join(format!("harness-outline-{}", std::process::id()));
        write_features(
            &dir,
            "Feature: f\n\n  @M0-W-1010 @any\n  Scenario Outline: o <x>\n    Given <x>\n\n    Examples:\n      | x |\n      | a |\n      | b |\n\n    @pending:phi3\n    Examples:\n      | x |\n      | c |\n",
        );
        let sc = parse_features(&dir).unwrap();
        assert_eq!(sc.len(), 1);
        assert_eq!(sc[0].expansions.len(), 3);
        assert!(sc[0].expansions[2]
            .tags
            .contains(&"pending:phi3".to_owned()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn plans_follow_pending_then_gpu_then_tags() {
        let t = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ci = Selection::new(Some("@any and not @pending"), false, false).unwrap();
        assert_eq!(ci.plan(&t(&["M0-W-1", "any"])), Plan::Run);
        assert_eq!(ci.plan(&t(&["M0-W-1", "cuda"])), Plan::Skip(NO_GPU.into()));
        assert_eq!(
            ci.plan(&t(&["M0-W-1", "any", "pending:gpt-oss"])),
            Plan::Pending("gpt-oss".into())
        );
        assert!(
            matches!(ci.plan(&t(&["M0-W-1", "bench"])), Plan::Skip(r) if r.contains("not selected"))
        );
        // Pending on CUDA only: runs on the CPU.
        let cpu_only = t(&["M0-W-1", "any", "pending-cuda:gpt-oss"]);
        assert_eq!(ci.plan(&cpu_only), Plan::Run);
        let gpu = Selection::new(None, true, false).unwrap();
        assert_eq!(gpu.plan(&cpu_only), Plan::Pending("gpt-oss".into()));
        let all = Selection::new(Some("@pending"), true, true).unwrap();
        assert_eq!(all.plan(&t(&["any", "pending:phi3"])), Plan::Run);
        assert_eq!(
            all.plan(&t(&["any"])),
            Plan::Skip("not selected by --tags '@pending'".into())
        );
    }
}

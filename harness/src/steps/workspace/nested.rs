//! Nested runs of this harness (the proof bundle and matrix it writes, a missed
//! budget's verdict) and the budgets files they are given.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{anyhow, Context};
use cucumber::{given, then, when};
use regex::Regex;

use crate::check;
use crate::steps::params::{ExitZero, Names, ProofEnv};
use crate::steps::StepResult;
use crate::world::{read_json, tail, CommandOutcome, TestWorld};

fn harness_command(
    w: &mut TestWorld,
    args: &str,
    env: &[(&str, String)],
) -> anyhow::Result<CommandOutcome> {
    let exe = std::env::current_exe()?;
    let args = w.expand(args)?;
    let mut cmd = Command::new(&exe);
    cmd.arg("suite")
        .args([
            "--worker",
            &w.cfg.worker_bin.display().to_string(),
            "--backend",
            &w.cfg.backend,
            "--model",
            &w.cfg.model.display().to_string(),
        ])
        .args([
            "--workspace",
            &w.cfg.workspace.display().to_string(),
            "--requirements",
            &w.cfg.requirements.display().to_string(),
        ])
        .args(args.split_whitespace())
        .current_dir(&w.cfg.workspace)
        .env_remove("LLORCH_PROOF_DIR")
        .env_remove("LLORCH_RUN_ID");
    if !args.contains("--budgets") {
        cmd.args(["--budgets", &w.cfg.budgets_path.display().to_string()]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd
        .output()
        .with_context(|| format!("running {} suite", exe.display()))?;
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let proof_dir = Regex::new(r"proof bundle: (\S+)")
        .unwrap()
        .captures_iter(&text)
        .last()
        .map(|c| PathBuf::from(&c[1]));
    let out = CommandOutcome {
        line: format!("harness suite {args}"),
        code: o.status.code(),
        output: text,
        proof_dir,
    };
    w.workspace.command = Some(out.clone());
    Ok(out)
}

#[when(expr = "I run the harness suite with {string}{proof_env}")]
async fn nested(w: &mut TestWorld, args: String, env: ProofEnv) -> StepResult {
    let env = match env.0 {
        None => Vec::new(),
        Some((dir, id)) => vec![("LLORCH_PROOF_DIR", w.expand(&dir)?), ("LLORCH_RUN_ID", id)],
    };
    harness_command(w, &args, &env)?;
    Ok(())
}

#[then(expr = "the harness exited {exit}")]
async fn harness_exit(w: &mut TestWorld, want: ExitZero) -> StepResult {
    let which = if want.0 { "zero" } else { "non-zero" };
    let c = w.workspace.command()?;
    let ok = c.code == Some(0);
    check!(
        ok == want.0,
        "{} exited {:?}, want {which}:\n{}",
        c.line,
        c.code,
        tail(&c.output, 30)
    );
    Ok(())
}

#[then(
    expr = "its proof bundle's timings.json has a missed {string} verdict with p50, p95 and p99"
)]
async fn missed_verdict(w: &mut TestWorld, key: String) -> StepResult {
    let c = w.workspace.command()?;
    let dir = c.proof_dir.clone().ok_or_else(|| {
        anyhow!(
            "the nested run printed no proof bundle path:\n{}",
            tail(&c.output, 20)
        )
    })?;
    let t = read_json(&dir.join("timings.json"))?;
    let missed = t["budgets"].as_array().is_some_and(|a| {
        a.iter()
            .any(|v| v["verdict"]["key"] == key.as_str() && v["verdict"]["met"] == false)
    });
    check!(
        missed,
        "no missed {key} verdict in {}",
        dir.join("timings.json").display()
    );
    let with_pcts = t["measurements"].as_array().is_some_and(|a| {
        a.iter().any(|m| {
            ["p50", "p95", "p99"]
                .iter()
                .all(|p| m["summary"][p].is_number())
        })
    });
    check!(with_pcts, "no measurement with p50/p95/p99 in timings.json");
    Ok(())
}

#[then(expr = "{string} holds {names}")]
async fn dir_holds(w: &mut TestWorld, dir: String, files: Names) -> StepResult {
    let dir = PathBuf::from(w.expand(&dir)?);
    let missing: Vec<String> = files
        .0
        .into_iter()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    check!(missing.is_empty(), "{} lacks {missing:?}", dir.display());
    Ok(())
}

#[then(
    expr = "its matrix.json lists every requirement ID of REQUIREMENTS.md exactly once with a result"
)]
async fn matrix_complete(w: &mut TestWorld) -> StepResult {
    let c = w.workspace.command()?;
    let dir = c
        .proof_dir
        .clone()
        .ok_or_else(|| anyhow!("the nested run printed no proof bundle path"))?;
    let m = read_json(&dir.join("matrix.json"))?;
    let text = crate::suite::catalogue_text(&w.cfg.workspace, &w.cfg.requirements)?;
    let reqs = crate::catalogue::parse_requirements(&text)?;
    let rows = m["rows"]
        .as_array()
        .ok_or_else(|| anyhow!("matrix.json has no rows"))?;
    let mut bad = Vec::new();
    for r in &reqs {
        let n = rows.iter().filter(|row| row["id"] == r.id.as_str()).count();
        if n != 1 {
            bad.push(format!("{} appears {n} times", r.id));
        }
    }
    for row in rows {
        let st = row["status"].as_str().unwrap_or("");
        if !["passed", "failed", "skipped", "pending"].contains(&st) {
            bad.push(format!("{} has no result ({st:?})", row["id"]));
        }
        if st != "passed" && row["reason"].as_str().is_none_or(str::is_empty) {
            bad.push(format!("{} is {st} without a reason", row["id"]));
        }
    }
    check!(
        rows.len() == reqs.len(),
        "{} rows for {} requirements",
        rows.len(),
        reqs.len()
    );
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[given(expr = "a budgets file {string} where every ceiling is {float} and every floor is {float}")]
async fn impossible_budgets(
    w: &mut TestWorld,
    name: String,
    ceiling: f64,
    floor: f64,
) -> StepResult {
    let text = std::fs::read_to_string(&w.cfg.budgets_path)?;
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let backends = doc
        .get_mut("backends")
        .and_then(serde_yaml::Value::as_mapping_mut)
        .ok_or_else(|| anyhow!("no backends"))?;
    for (_, b) in backends.iter_mut() {
        let Some(m) = b.as_mapping_mut() else {
            continue;
        };
        for (k, v) in m.iter_mut() {
            let key = k.as_str().unwrap_or("");
            let value = if key.starts_with("decode_tok_s_min") {
                floor
            } else {
                ceiling
            };
            if let Some(inner) = v.as_mapping_mut() {
                inner
                    .iter_mut()
                    .for_each(|(_, x)| *x = serde_yaml::Value::from(value));
            } else {
                *v = serde_yaml::Value::from(value);
            }
        }
    }
    std::fs::create_dir_all(&w.scratch)?;
    std::fs::write(w.scratch.join(name), serde_yaml::to_string(&doc)?)?;
    Ok(())
}

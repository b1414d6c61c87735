//! The model's place on the GPU as the driver sees it (nvidia-smi).

use std::process::Command;

use anyhow::{anyhow, Context};
use cucumber::then;

use crate::check;
use crate::steps::StepResult;
use crate::world::TestWorld;

/// `(pid, used MiB)` of every compute process nvidia-smi lists.
fn gpu_processes() -> anyhow::Result<Vec<(u32, u64)>> {
    let o = Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .context("running nvidia-smi")?;
    if !o.status.success() {
        return Err(anyhow!(
            "nvidia-smi failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split(',').map(str::trim);
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect())
}

#[then(expr = "nvidia-smi lists the worker's PID with memory in use")]
async fn listed(w: &mut TestWorld) -> StepResult {
    let pid = w.process.worker()?.pid;
    let procs = gpu_processes()?;
    let mine = procs.iter().find(|(p, _)| *p == pid);
    check!(
        mine.is_some_and(|(_, mib)| *mib > 0),
        "nvidia-smi lists {procs:?}, not the worker {pid} with memory"
    );
    Ok(())
}

#[then(expr = "nvidia-smi no longer lists the worker's PID")]
async fn not_listed(w: &mut TestWorld) -> StepResult {
    let pid = w.process.worker()?.pid;
    let procs = gpu_processes()?;
    check!(
        !procs.iter().any(|(p, _)| *p == pid),
        "nvidia-smi still lists the worker {pid}: {procs:?}"
    );
    Ok(())
}

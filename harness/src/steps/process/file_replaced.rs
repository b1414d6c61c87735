//! The model file changed under a running worker, as a deploy that rewrites
//! it in place does (EXT-047.1): the worker runs on a copy in the
//! scenario's scratch folder, which the steps truncate and overwrite.

use std::path::PathBuf;

use anyhow::Context;
use cucumber::{given, then, when};

use crate::check;
use crate::steps::StepResult;
use crate::world::TestWorld;

/// The copy of the model the scenario's worker runs on.
fn model_copy(w: &TestWorld) -> PathBuf {
    w.scratch.join("model-copy.gguf")
}

#[given(expr = "a worker with --backend {word} on a copy of the reference model")]
async fn worker_on_a_copy(w: &mut TestWorld, backend: String) -> StepResult {
    std::fs::create_dir_all(&w.scratch)?;
    let copy = model_copy(w);
    std::fs::copy(&w.cfg.model, &copy)
        .with_context(|| format!("copying {} to {}", w.cfg.model.display(), copy.display()))?;
    let l = w.launch_for(&copy, &backend)?;
    w.start_ready(l).await?;
    Ok(())
}

#[when(expr = "the model file's copy is truncated to 0 bytes")]
async fn truncate_copy(w: &mut TestWorld) -> StepResult {
    std::fs::File::options()
        .write(true)
        .open(model_copy(w))?
        .set_len(0)?;
    Ok(())
}

/// In place: the same inode, so a worker that still mapped the file would
/// read these bytes.
#[when(expr = "the model file's copy is overwritten in place with as many bytes of garbage")]
async fn overwrite_copy(w: &mut TestWorld) -> StepResult {
    let len = std::fs::metadata(&w.cfg.model)?.len() as usize;
    let garbage: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(model_copy(w), garbage)?;
    Ok(())
}

/// Linux names every file a process maps in `/proc/PID/maps`.
#[then(expr = "the worker maps no model file")]
async fn maps_no_model_file(w: &mut TestWorld) -> StepResult {
    let pid = w.process.worker()?.pid;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let mapped: Vec<&str> = maps.lines().filter(|l| l.ends_with(".gguf")).collect();
    check!(mapped.is_empty(), "the worker maps {mapped:?}");
    Ok(())
}

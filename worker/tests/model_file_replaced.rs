//! Issue 47 end to end: the real binary (`--backend cpu`) serves on from a
//! copy of the reference model that is truncated to 0 bytes, then
//! overwritten in place with garbage of the same length, as a deploy that
//! rewrites the file under a running worker does. Before the model was read
//! into memory the first job after the truncation died of SIGBUS, its
//! client left with `started` and no terminal event.

mod common;

use common::*;

/// M0-W-1330 (one terminal event per job) under a model file changed in
/// place: every job ends with `end` and the same greedy tokens as before,
/// and the worker neither maps the file nor dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_complete_alike_after_the_model_file_is_truncated_then_overwritten() {
    let Some(reference) = reference_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("model.gguf");
    std::fs::copy(&reference, &copy).unwrap();
    let w = Worker::start_model(&copy, &[], &[]).await;
    assert!(!maps_file(w.pid(), &copy), "the worker maps the model file");
    let first = complete(&w, "before").await;

    std::fs::File::options()
        .write(true)
        .open(&copy)
        .and_then(|f| f.set_len(0))
        .unwrap();
    assert_eq!(complete(&w, "truncated").await, first);

    let size = std::fs::metadata(&reference).unwrap().len() as usize;
    std::fs::write(&copy, vec![0x5a; size]).unwrap();
    for n in 0..2 {
        assert_eq!(complete(&w, &format!("overwritten-{n}")).await, first);
    }
    assert_eq!(w.health().await["status"], "healthy");
    assert!(
        std::path::Path::new(&format!("/proc/{}", w.pid())).exists(),
        "the worker is gone"
    );
}

/// Runs a greedy job to its end and returns its token ids, after checking
/// the stream's grammar and that its terminal event is `end`.
async fn complete(w: &Worker, id: &str) -> Vec<u64> {
    let frames = w.run(job(id, 12)).await;
    check_grammar(&frames);
    assert_eq!(frames.last().unwrap().event, "end", "{id}: {frames:?}");
    token_ids(&frames)
}

/// Whether process `pid` maps `path` (its /proc maps name each mapped file).
fn maps_file(pid: u32, path: &std::path::Path) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let name = path.canonicalize().unwrap();
    maps.lines().any(|l| l.ends_with(&*name.to_string_lossy()))
}

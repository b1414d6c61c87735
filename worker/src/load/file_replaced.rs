//! Issue 47: a loaded model needs nothing from its file on disk. A deploy
//! that truncates the file, then writes other bytes over it in place, must
//! leave a running worker's answers as they were, on either backend (the
//! GPU case is `backend::cuda::tests::file_replaced`).

use std::path::Path;

use super::*;
use crate::backend::Logits;
use crate::model::synthetic::synthetic_llama;

/// Greedy steps each check runs after the prompt.
const STEPS: usize = 8;

/// Loads `path` with `opts`, then: no map of the file is left in the
/// process; greedy ids and the last logits are the same (bit for bit) with
/// the file as it was, truncated to 0 bytes, and overwritten in place with
/// as many bytes of garbage. `path` is changed: pass a copy.
pub(crate) fn check_model_outlives_its_file(path: &Path, opts: &LoadOptions) {
    let size = std::fs::metadata(path).unwrap().len();
    let mut model = load_model(path, opts, &mut |_| {}).unwrap();
    assert!(
        !maps_file(path),
        "{} is still mapped after the load",
        path.display()
    );
    let backend = model.backend.as_mut();
    let before = greedy(backend);

    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(0))
        .unwrap();
    assert_eq!(greedy(backend), before, "after truncating the file");

    // Same inode, same length, other bytes: what an in-place copy leaves.
    std::fs::write(path, garbage(size as usize)).unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), size);
    assert_eq!(greedy(backend), before, "after overwriting the file");
}

/// Whether this process maps `path` (Linux lists every mapped file, by
/// its path, in /proc/self/maps).
pub(crate) fn maps_file(path: &Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let path = path.canonicalize().unwrap();
    let name = path.to_string_lossy();
    maps.lines().any(|l| l.ends_with(&*name))
}

/// `len` bytes of a fixed pseudo-random pattern (not a GGUF file).
fn garbage(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect()
}

/// A fixed prompt, then [`STEPS`] greedy tokens: their ids and the last
/// step's logits, in a sequence opened and closed for the purpose.
fn greedy(backend: &mut dyn Backend) -> (Vec<u32>, Vec<f32>) {
    let seq = backend.open(64).unwrap();
    let mut logits = Vec::new();
    backend
        .forward(seq, &[1, 2, 3, 4], Logits::Last, &mut logits, None)
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..STEPS {
        let id = argmax(&logits);
        ids.push(id);
        backend
            .forward(seq, &[id], Logits::Last, &mut logits, None)
            .unwrap();
    }
    backend.close(seq);
    (ids, logits)
}

fn argmax(v: &[f32]) -> u32 {
    let best = v
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i);
    best as u32
}

#[test]
fn a_cpu_model_outlives_its_file_truncated_then_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, synthetic_llama("llama", 5, 64)).unwrap();
    // The synthetic file names its 384 tokens but has no tokenizer.
    std::fs::write(
        dir.path().join(HF_TOKENIZER_FILE),
        super::tests::tiny_tokenizer_json(384),
    )
    .unwrap();
    check_model_outlives_its_file(&path, &LoadOptions::default());
}

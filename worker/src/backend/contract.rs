//! The contract every `Backend` keeps (M0-W-1052), one generic check that
//! each backend's tests run on a small synthetic model.

use crate::backend::{Backend, Checkpoints, Logits};

fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs the whole contract on `b`, whose model has `vocab` tokens and a
/// context of at least 8 positions.
pub(crate) fn check_backend_contract(b: &mut dyn Backend, vocab: usize) {
    let mut out = Vec::new();
    assert!(b.forward(&[1], Logits::Last, &mut out, None).is_err(), "forward needs a sequence");

    b.begin_sequence(8).unwrap();
    assert_eq!(b.sequence_len(), 0);
    b.forward(&[1, 2, 3], Logits::All, &mut out, None).unwrap();
    assert_eq!(out.len(), 3 * vocab, "Logits::All gives every position");
    assert_eq!(b.sequence_len(), 3);
    let third = out[2 * vocab..].to_vec();
    b.forward(&[4], Logits::Last, &mut out, None).unwrap();
    assert_eq!(out.len(), vocab, "Logits::Last gives one position");
    assert_eq!(b.sequence_len(), 4);
    let fourth = out.clone();

    // A new sequence starts from an empty cache: the same tokens, the same logits.
    b.begin_sequence(8).unwrap();
    b.forward(&[1, 2, 3], Logits::Last, &mut out, None).unwrap();
    assert!(rel_diff(&out, &third) < 1e-4, "prefix logits changed: {}", rel_diff(&out, &third));
    b.forward(&[4], Logits::Last, &mut out, None).unwrap();
    assert!(rel_diff(&out, &fourth) < 1e-4, "decode logits changed: {}", rel_diff(&out, &fourth));

    // Past the capacity: an error, never a panic.
    assert!(b.forward(&[1, 2, 3, 4, 5], Logits::Last, &mut out, None).is_err(), "capacity is enforced");

    // Checkpoints at the last position, named as llama.cpp names them.
    let mut cp = Checkpoints::default();
    b.begin_sequence(4).unwrap();
    b.forward(&[5, 6], Logits::Last, &mut out, Some(&mut cp)).unwrap();
    let names: Vec<&str> = cp.entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"inp_embd"));
    assert!(names.contains(&"l_out-0"));
    assert_eq!(names.last(), Some(&"result_norm"));

    // A token outside the vocabulary is refused.
    b.begin_sequence(4).unwrap();
    assert!(b.forward(&[vocab as u32], Logits::Last, &mut out, None).is_err(), "out-of-vocabulary id refused");

    b.end_sequence();
    assert_eq!(b.sequence_len(), 0);
    assert_eq!(b.memory_use().kv_cache, 0, "end_sequence frees the KV cache");
}

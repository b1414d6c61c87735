//! The contract every `Backend` keeps (M0-W-1052), one generic check that
//! each backend's tests run on a small synthetic model.

use crate::backend::{Backend, Checkpoints, Logits, SampleRequest};
use crate::sampling::{argmax, draws_away_from_boundaries, select, top_logprobs, SamplingParams};

fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs the whole contract on `b`, whose model has `vocab` tokens and a
/// context of at least 8 positions.
pub(crate) fn check_backend_contract(b: &mut dyn Backend, vocab: usize) {
    let mut out = Vec::new();
    assert!(
        b.forward(&[1], Logits::Last, &mut out, None).is_err(),
        "forward needs a sequence"
    );

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
    assert!(
        rel_diff(&out, &third) < 1e-4,
        "prefix logits changed: {}",
        rel_diff(&out, &third)
    );
    b.forward(&[4], Logits::Last, &mut out, None).unwrap();
    assert!(
        rel_diff(&out, &fourth) < 1e-4,
        "decode logits changed: {}",
        rel_diff(&out, &fourth)
    );

    // Past the capacity: an error, never a panic.
    assert!(
        b.forward(&[1, 2, 3, 4, 5], Logits::Last, &mut out, None)
            .is_err(),
        "capacity is enforced"
    );

    // Checkpoints at the last position, named as llama.cpp names them.
    let mut cp = Checkpoints::default();
    b.begin_sequence(4).unwrap();
    b.forward(&[5, 6], Logits::Last, &mut out, Some(&mut cp))
        .unwrap();
    let names: Vec<&str> = cp.entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"inp_embd"));
    assert!(names.contains(&"l_out-0"));
    assert_eq!(names.last(), Some(&"result_norm"));

    // A token outside the vocabulary is refused.
    b.begin_sequence(4).unwrap();
    assert!(
        b.forward(&[vocab as u32], Logits::Last, &mut out, None)
            .is_err(),
        "out-of-vocabulary id refused"
    );

    check_sampling(b);

    b.end_sequence();
    assert_eq!(b.sequence_len(), 0);
    assert_eq!(
        b.memory_use().kv_cache,
        0,
        "end_sequence frees the KV cache"
    );
}

/// `sample` picks from the latest forward pass's last position, whether or
/// not its logits came to the host, as `sampling::select` and `top_logprobs`
/// do on those logits.
fn check_sampling(b: &mut dyn Backend) {
    let greedy = SamplingParams {
        temperature: 0.0,
        repetition_penalty: 1.3,
        ..SamplingParams::default()
    };
    let drawn = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.01,
        repetition_penalty: 1.2,
        seed: 0,
    };
    let generated = [1u32, 2, 3, 3];
    let req = |params, uniform, logprobs| SampleRequest {
        params,
        generated: &generated,
        uniform,
        logprobs,
    };

    b.begin_sequence(8).unwrap();
    assert!(
        b.sample(&req(&greedy, None, 0)).is_err(),
        "sample needs a forward pass"
    );
    let mut host = Vec::new();
    b.forward(&[1, 2, 3], Logits::Last, &mut host, None)
        .unwrap();
    b.forward(&[4], Logits::Last, &mut host, None).unwrap();
    let from_host = |b: &mut dyn Backend| {
        let g = b.sample(&req(&greedy, None, 5)).unwrap();
        let want = select(&host, &generated, &greedy, None);
        assert_eq!(g.id, want, "greedy with penalty");
        let expected = top_logprobs(&host, 5);
        assert_eq!(
            g.logprobs.iter().map(|t| t.id).collect::<Vec<_>>(),
            expected.iter().map(|t| t.id).collect::<Vec<_>>()
        );
        for (g, c) in g.logprobs.iter().zip(&expected) {
            assert!(
                (g.logprob - c.logprob).abs() < 1e-5,
                "logprob of {}: {} vs {}",
                g.id,
                g.logprob,
                c.logprob
            );
        }
        let grid = (0..40).map(|i| (f64::from(i) + 0.5) / 40.0);
        let draws = draws_away_from_boundaries(&host, &generated, &drawn, grid, 1e-6);
        assert!(draws.len() > 20);
        for u in draws {
            let id = b.sample(&req(&drawn, Some(u), 0)).unwrap().id;
            assert_eq!(id, select(&host, &generated, &drawn, Some(u)), "u = {u}");
        }
    };
    from_host(b);
    let plain = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    assert_eq!(
        b.sample(&req(&plain, None, 0)).unwrap().id,
        argmax(&host),
        "greedy is the argmax"
    );

    // The same steps with the logits left on the device: the same choices.
    b.begin_sequence(8).unwrap();
    let mut none = vec![1.0];
    b.forward(&[1, 2, 3], Logits::None, &mut none, None)
        .unwrap();
    assert!(none.is_empty(), "Logits::None copies nothing");
    b.forward(&[4], Logits::None, &mut none, None).unwrap();
    assert!(none.is_empty());
    from_host(b);
    // Sampling again from the same logits gives the same token.
    let again = b.sample(&req(&drawn, Some(0.37), 3)).unwrap();
    assert_eq!(again, b.sample(&req(&drawn, Some(0.37), 3)).unwrap());
}

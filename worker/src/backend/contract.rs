//! The contract every `Backend` keeps (M0-W-1052), one generic check that
//! each backend's tests run on a small synthetic model.

use crate::backend::{adjust, sample_one, Backend, Checkpoints, Logits, SampleRequest, SeqId};
use crate::sampling::{
    argmax, draws_away_from_boundaries, select, top_logprobs, SamplingParams, TokenLogprob,
};

fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs the whole contract on `b`, whose model has `vocab` tokens and a
/// context of at least 8 positions.
pub(crate) fn check_backend_contract(b: &mut dyn Backend, vocab: usize) {
    let mut out = Vec::new();
    let s = b.open(8).unwrap();
    b.close(s);
    assert!(
        b.forward(s, &[1], Logits::Last, &mut out, None).is_err(),
        "forward needs an open sequence"
    );
    b.close(s); // closing twice does nothing

    let s = b.open(8).unwrap();
    assert!(b.open(8).is_err(), "one sequence at a time by default");
    assert_eq!(b.len(s), 0);
    b.forward(s, &[1, 2, 3], Logits::All, &mut out, None)
        .unwrap();
    assert_eq!(out.len(), 3 * vocab, "Logits::All gives every position");
    assert_eq!(b.len(s), 3);
    let third = out[2 * vocab..].to_vec();
    b.forward(s, &[4], Logits::Last, &mut out, None).unwrap();
    assert_eq!(out.len(), vocab, "Logits::Last gives one position");
    assert_eq!(b.len(s), 4);
    let fourth = out.clone();
    b.close(s);

    // A new sequence starts from an empty cache: the same tokens, the same logits.
    let s = b.open(8).unwrap();
    b.forward(s, &[1, 2, 3], Logits::Last, &mut out, None)
        .unwrap();
    assert!(
        rel_diff(&out, &third) < 1e-4,
        "prefix logits changed: {}",
        rel_diff(&out, &third)
    );
    b.forward(s, &[4], Logits::Last, &mut out, None).unwrap();
    assert!(
        rel_diff(&out, &fourth) < 1e-4,
        "decode logits changed: {}",
        rel_diff(&out, &fourth)
    );

    // Past the capacity: an error, never a panic.
    assert!(
        b.forward(s, &[1, 2, 3, 4, 5], Logits::Last, &mut out, None)
            .is_err(),
        "capacity is enforced"
    );
    b.close(s);

    // Checkpoints at the last position, named as llama.cpp names them.
    let mut cp = Checkpoints::default();
    let s = b.open(4).unwrap();
    b.forward(s, &[5, 6], Logits::Last, &mut out, Some(&mut cp))
        .unwrap();
    let names: Vec<&str> = cp.entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"inp_embd"));
    assert!(names.contains(&"l_out-0"));
    assert_eq!(names.last(), Some(&"result_norm"));

    b.close(s);

    // A token outside the vocabulary is refused.
    let s = b.open(4).unwrap();
    assert!(
        b.forward(s, &[vocab as u32], Logits::Last, &mut out, None)
            .is_err(),
        "out-of-vocabulary id refused"
    );
    b.close(s);

    check_sampling(b);
    check_masked_sampling(b);
    check_biased_sampling(b);

    assert_eq!(b.len(s), 0, "a closed sequence has no positions");
    assert_eq!(b.memory_use().kv_cache, 0, "close frees the KV cache");

    check_slots(b);
}

/// `sample` over the three open sequences, in another order, with greedy,
/// drawn and penalized requests and log-probabilities: each slot's token and
/// log-probabilities are those its own `sample` gives.
fn check_sample_rows(b: &mut dyn Backend, seqs: &[SeqId]) {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let drawn = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.01,
        repetition_penalty: 1.2,
        seed: 0,
    };
    let plain = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let generated = [3u32, 4, 4];
    let req = |params, uniform, logprobs| SampleRequest {
        params,
        generated: &generated,
        uniform,
        logprobs,
        mask: None,
        bias: &[],
    };
    let rows = [
        (seqs[2], req(&drawn, Some(0.37), 3)),
        (seqs[0], req(&greedy, None, 5)),
        (seqs[1], req(&plain, Some(0.81), 0)),
    ];
    let together = b.sample(&rows).unwrap();
    for ((seq, r), got) in rows.iter().zip(&together) {
        assert_eq!(&sample_one(b, *seq, r).unwrap(), got, "{seq:?}");
    }
    assert!(
        b.sample(&[rows[0], rows[0]]).is_err(),
        "a sequence twice in one call"
    );
}

/// What a sequence's next token would be: the greedy id and the top 20
/// log-probabilities, bit for bit (a fingerprint of the logits).
fn fingerprint(b: &mut dyn Backend, seq: SeqId) -> (u32, Vec<(u32, u32)>) {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let req = SampleRequest {
        params: &greedy,
        generated: &[],
        uniform: None,
        logprobs: 20,
        mask: None,
        bias: &[],
    };
    let s = sample_one(b, seq, &req).unwrap();
    let top = s
        .logprobs
        .iter()
        .map(|t| (t.id, t.logprob.to_bits()))
        .collect();
    (s.id, top)
}

/// Several sequences (issue 18): three of different lengths open at once,
/// their prompts and decode steps interleaved and batched in `decode` (in any
/// order, any subset), give bit for bit the logits each gives alone (its
/// steps `decode` of its one row), and within a small tolerance those of
/// one-token `forward` calls.
pub(crate) fn check_slots(b: &mut dyn Backend) {
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[7, 8], &[9, 10, 11, 12, 13]];
    let feeds: [[u32; 3]; 3] = [[4, 5, 6], [3, 2, 1], [14, 15, 16]];
    let none = || Vec::new();
    b.set_max_sequences(3).unwrap();
    assert_eq!(b.max_sequences(), 3);
    // Alone, one after the other.
    let mut alone = Vec::new();
    for (prompt, feed) in prompts.iter().zip(&feeds) {
        let s = b.open(16).unwrap();
        b.forward(s, prompt, Logits::None, &mut none(), None)
            .unwrap();
        let mut prints = vec![fingerprint(b, s)];
        for &t in feed {
            b.decode(&[(s, t)]).unwrap();
            prints.push(fingerprint(b, s));
        }
        b.close(s);
        // The same steps as one-token forward calls: the same choices.
        let s = b.open(16).unwrap();
        b.forward(s, prompt, Logits::None, &mut none(), None)
            .unwrap();
        for (step, &t) in feed.iter().enumerate() {
            b.forward(s, &[t], Logits::None, &mut none(), None).unwrap();
            let (id, top) = fingerprint(b, s);
            let (want_id, want) = &prints[step + 1];
            assert_eq!(id, *want_id, "forward and decode choose alike");
            // Other kernels: on the GPU one row's mat-vecs multiply exact
            // integer weights by x in 8-bit parts, a batch's products weights
            // decoded to f16 by x in f16 parts; the top log-probability moves
            // by a few hundredths on random weights (benches/results).
            let (x, y) = (f32::from_bits(top[0].1), f32::from_bits(want[0].1));
            assert!((x - y).abs() < 5e-2, "top log-probability {x} vs {y}");
        }
        b.close(s);
        alone.push(prints);
    }

    let mut seqs = Vec::new();
    for prompt in &prompts {
        let s = b.open(16).unwrap();
        b.forward(s, prompt, Logits::None, &mut none(), None)
            .unwrap();
        seqs.push(s);
    }
    assert!(b.open(16).is_err(), "no fourth sequence");
    assert!(
        b.set_max_sequences(2).is_err(),
        "the count changes only with none open"
    );
    let check = |b: &mut dyn Backend, i: usize, step: usize| {
        assert_eq!(
            fingerprint(b, seqs[i]),
            alone[i][step],
            "sequence {i} step {step}"
        );
        assert_eq!(b.len(seqs[i]), prompts[i].len() + step);
    };
    for i in 0..3 {
        check(b, i, 0);
    }
    let row = |i: usize, step: usize| (seqs[i], feeds[i][step]);
    // All three together, then two (in another order), then the one left behind alone.
    b.decode(&[row(0, 0), row(1, 0), row(2, 0)]).unwrap();
    for i in 0..3 {
        check(b, i, 1);
    }
    b.decode(&[row(2, 1), row(0, 1)]).unwrap();
    check(b, 0, 2);
    check(b, 2, 2);
    check(b, 1, 1);
    b.decode(&[row(1, 1)]).unwrap();
    check(b, 1, 2);
    b.decode(&[row(1, 2), row(2, 2), row(0, 2)]).unwrap();
    for i in 0..3 {
        check(b, i, 3);
    }
    assert!(
        b.decode(&[row(1, 0), row(1, 1)]).is_err(),
        "a sequence twice in one step"
    );
    check_sample_rows(b, &seqs);
    let stale = seqs[1];
    for s in seqs {
        b.close(s);
    }
    check_masked_rows(b);
    assert!(b.decode(&[(stale, 1)]).is_err(), "a closed sequence");
    match b.kv_blocks() {
        Some(blocks) => assert_eq!(
            blocks.used, 0,
            "every sequence's blocks are back in the pool"
        ),
        None => assert_eq!(
            b.memory_use().kv_cache,
            0,
            "every sequence's cache is freed"
        ),
    }
    b.set_max_sequences(1).unwrap();
    assert_eq!(b.max_sequences(), 1);
    assert_eq!(b.kv_blocks(), None, "one sequence: no pool");
    assert_eq!(
        b.memory_use().kv_cache,
        0,
        "the pool is freed with its sequences"
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
        mask: None,
        bias: &[],
    };

    let s = b.open(8).unwrap();
    assert!(
        sample_one(b, s, &req(&greedy, None, 0)).is_err(),
        "sample needs a forward pass"
    );
    let mut host = Vec::new();
    b.forward(s, &[1, 2, 3], Logits::Last, &mut host, None)
        .unwrap();
    b.forward(s, &[4], Logits::Last, &mut host, None).unwrap();
    let from_host = |b: &mut dyn Backend, s: SeqId| {
        let g = sample_one(b, s, &req(&greedy, None, 5)).unwrap();
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
            let id = sample_one(b, s, &req(&drawn, Some(u), 0)).unwrap().id;
            assert_eq!(id, select(&host, &generated, &drawn, Some(u)), "u = {u}");
        }
    };
    from_host(b, s);
    let plain = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    assert_eq!(
        sample_one(b, s, &req(&plain, None, 0)).unwrap().id,
        argmax(&host),
        "greedy is the argmax"
    );
    b.close(s);

    // The same steps with the logits left on the device: the same choices.
    let s = b.open(8).unwrap();
    let mut none = vec![1.0];
    b.forward(s, &[1, 2, 3], Logits::None, &mut none, None)
        .unwrap();
    assert!(none.is_empty(), "Logits::None copies nothing");
    b.forward(s, &[4], Logits::None, &mut none, None).unwrap();
    assert!(none.is_empty());
    from_host(b, s);
    // Sampling again from the same logits gives the same token.
    let again = sample_one(b, s, &req(&drawn, Some(0.37), 3)).unwrap();
    assert_eq!(
        again,
        sample_one(b, s, &req(&drawn, Some(0.37), 3)).unwrap()
    );
    b.close(s);
}

/// A constraint's mask (issue #43): the choice and the log-probabilities are
/// those of the allowed tokens' logits alone, greedy and drawn, as
/// `sampling::select` and `top_logprobs` give them on the masked logits; a
/// mask of the wrong length is refused.
fn check_masked_sampling(b: &mut dyn Backend) {
    let drawn = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        repetition_penalty: 1.2,
        ..SamplingParams::default()
    };
    let greedy = greedy_params();
    let generated = [1u32, 2];
    let (s, host, ranked) = ranked_logits(b, &[1, 2, 3]);
    // The five least likely tokens and one in the middle: the mask decides.
    let mut bits = vec![0u32; host.len().div_ceil(32)];
    for &id in ranked[..5].iter().chain([&ranked[host.len() / 2]]) {
        bits[id as usize / 32] |= 1 << (id % 32);
    }
    let masked = adjust(&host, &[], Some(&bits)).unwrap();
    let req = |params, uniform, logprobs| SampleRequest {
        params,
        generated: &generated,
        uniform,
        logprobs,
        mask: Some(&bits),
        bias: &[],
    };
    let g = sample_one(b, s, &req(&greedy, None, 4)).unwrap();
    assert_eq!(g.id, ranked[host.len() / 2], "greedy among the allowed");
    assert_logprobs(&g.logprobs, &top_logprobs(&masked, 4));
    let grid = (0..20).map(|i| (f64::from(i) + 0.5) / 20.0);
    for u in draws_away_from_boundaries(&masked, &generated, &drawn, grid, 1e-6) {
        let id = sample_one(b, s, &req(&drawn, Some(u), 0)).unwrap().id;
        assert_eq!(id, select(&masked, &generated, &drawn, Some(u)), "u = {u}");
        assert!(
            bits[id as usize / 32] & (1 << (id % 32)) != 0,
            "{id} not allowed"
        );
    }
    let short = SampleRequest {
        mask: Some(&bits[1..]),
        ..req(&greedy, None, 0)
    };
    assert!(
        sample_one(b, s, &short).is_err(),
        "a mask of the wrong length"
    );
    b.close(s);
}

/// Constrained rows of one step (their masks copied and applied together
/// on the GPU): each row's own mask, one with a bias too, beside an
/// unconstrained row; every choice is the one its adjusted logits give.
/// Needs room for three sequences.
fn check_masked_rows(b: &mut dyn Backend) {
    let (greedy, generated) = (greedy_params(), [7u32]);
    let drawn = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let (s1, host1, ranked1) = ranked_logits(b, &[1, 2, 3]);
    let (s2, host2, ranked2) = ranked_logits(b, &[4, 5]);
    let (s3, host3, _) = ranked_logits(b, &[6]);
    let words = host1.len().div_ceil(32);
    let allow = |ids: &[u32]| {
        let mut bits = vec![0u32; words];
        for &id in ids {
            bits[id as usize / 32] |= 1 << (id % 32);
        }
        bits
    };
    // Row one: the five least likely tokens and one in the middle; row
    // two: its ten most likely, the least of them lifted.
    let bits1 = allow(&[&ranked1[..5], &[ranked1[host1.len() / 2]]].concat());
    let bits2 = allow(&ranked2[host2.len() - 10..]);
    let bias = [(ranked2[host2.len() - 10], 0.5)];
    let adjusted = [
        adjust(&host1, &[], Some(&bits1)).unwrap(),
        adjust(&host2, &bias, Some(&bits2)).unwrap(),
        host3,
    ];
    let u = draws_away_from_boundaries(&adjusted[1], &generated, &drawn, [0.3, 0.6, 0.9], 1e-6)[0];
    let req = |params, uniform, mask, bias| SampleRequest {
        params,
        generated: &generated,
        uniform,
        logprobs: 0,
        mask,
        bias,
    };
    let rows = [
        (s3, req(&greedy, None, None, &[])),
        (s1, req(&greedy, None, Some(&bits1), &[])),
        (s2, req(&drawn, Some(u), Some(&bits2), &bias)),
    ];
    let got: Vec<u32> = b.sample(&rows).unwrap().iter().map(|t| t.id).collect();
    let want = [
        argmax(&adjusted[2]),
        ranked1[host1.len() / 2],
        select(&adjusted[1], &generated, &drawn, Some(u)),
    ];
    assert_eq!(got, want, "each row under its own mask");
    for s in [s1, s2, s3] {
        b.close(s);
    }
}

/// Additive biases (issue #43: `logit_bias`, presence and frequency
/// penalties): the choice and the log-probabilities are those of the logits
/// with each delta added, as `backend::adjust` adds them, greedy and drawn,
/// under a mask too; a list out of order or out of the vocabulary is refused.
fn check_biased_sampling(b: &mut dyn Backend) {
    let drawn = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        ..SamplingParams::default()
    };
    let greedy = greedy_params();
    let generated = [4u32, 9];
    let (s, host, mut ranked) = ranked_logits(b, &[3, 1, 4]);
    ranked.reverse(); // most likely first
    let (top, last) = (ranked[0], ranked[host.len() - 1]);
    let lift = host[top as usize] - host[last as usize] + 1.5;
    // The least likely token lifted above the top one, the top one lowered,
    // and the third made a near tie of the second.
    let mut bias = vec![
        (last, lift),
        (top, -0.75),
        (
            ranked[2],
            host[ranked[1] as usize] - host[ranked[2] as usize],
        ),
    ];
    bias.sort_unstable_by_key(|&(id, _)| id);
    let biased = adjust(&host, &bias, None).unwrap();
    let req = |params, uniform, logprobs, mask| SampleRequest {
        params,
        generated: &generated,
        uniform,
        logprobs,
        mask,
        bias: &bias,
    };
    let g = sample_one(b, s, &req(&greedy, None, 5, None)).unwrap();
    assert_eq!(g.id, last, "the lifted token is the greedy choice");
    assert_logprobs(&g.logprobs, &top_logprobs(&biased, 5));
    let grid = (0..20).map(|i| (f64::from(i) + 0.5) / 20.0);
    for u in draws_away_from_boundaries(&biased, &generated, &drawn, grid, 1e-6) {
        let id = sample_one(b, s, &req(&drawn, Some(u), 0, None)).unwrap().id;
        assert_eq!(id, select(&biased, &generated, &drawn, Some(u)), "u = {u}");
    }
    // Under a mask that excludes the lifted token, the bias still orders the rest.
    let mut bits = vec![u32::MAX; host.len().div_ceil(32)];
    bits[last as usize / 32] &= !(1 << (last % 32));
    let both = adjust(&host, &bias, Some(&bits)).unwrap();
    let m = sample_one(b, s, &req(&greedy, None, 0, Some(&bits))).unwrap();
    assert_eq!(m.id, argmax(&both));
    assert_ne!(m.id, last);
    let mut refused = |bad: &[(u32, f32)]| {
        let r = SampleRequest {
            bias: bad,
            ..req(&greedy, None, 0, None)
        };
        sample_one(b, s, &r).is_err()
    };
    assert!(refused(&[(5, 1.0), (2, 1.0)]), "ids out of order");
    assert!(refused(&[(2, 1.0), (2, 1.0)]), "an id twice");
    assert!(
        refused(&[(host.len() as u32, 1.0)]),
        "an id past the vocabulary"
    );
    b.close(s);
}

fn greedy_params() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    }
}

/// A new sequence fed `tokens`, its last logits, and the token ids from the
/// least likely to the most.
fn ranked_logits(b: &mut dyn Backend, tokens: &[u32]) -> (SeqId, Vec<f32>, Vec<u32>) {
    let s = b.open(8).unwrap();
    let mut host = Vec::new();
    b.forward(s, tokens, Logits::Last, &mut host, None).unwrap();
    let mut ranked: Vec<u32> = (0..host.len() as u32).collect();
    ranked.sort_by(|&x, &y| host[x as usize].total_cmp(&host[y as usize]));
    (s, host, ranked)
}

/// The same ids in the same order, each log-probability within 1e-5.
fn assert_logprobs(got: &[TokenLogprob], want: &[TokenLogprob]) {
    assert_eq!(got.len(), want.len());
    for (g, c) in got.iter().zip(want) {
        assert_eq!(g.id, c.id);
        assert!(
            (g.logprob - c.logprob).abs() < 1e-5,
            "{} vs {}",
            g.logprob,
            c.logprob
        );
    }
}

/// A prompt's greedy continuation as the engine runs it: a sequence opened,
/// the cached prefix attached, the rest prefilled in chunks aligned to
/// `prefill_chunk`, then `n` tokens chosen and decoded. The positions
/// attached, each token, and each step's top log-probabilities as bits.
fn continuation(b: &mut dyn Backend, prompt: &[u32], n: usize) -> (usize, Vec<(u32, Vec<u32>)>) {
    let s = b.open(prompt.len() + n).unwrap();
    let attached = b.attach_prefix(s, prompt).unwrap();
    assert_eq!(b.len(s), attached);
    let chunk = b.prefill_chunk();
    assert!(
        attached.is_multiple_of(chunk) || attached == prompt.len(),
        "whole chunks only, or the whole prompt"
    );
    let mut none = Vec::new();
    for part in prompt[attached..].chunks(chunk) {
        b.forward(s, part, Logits::None, &mut none, None).unwrap();
    }
    let params = greedy_params();
    let mut steps = Vec::new();
    let mut generated = Vec::new();
    for _ in 0..n {
        let req = SampleRequest {
            params: &params,
            generated: &generated,
            uniform: None,
            logprobs: 5,
            mask: None,
            bias: &[],
        };
        let t = sample_one(b, s, &req).unwrap();
        let bits = t.logprobs.iter().map(|l| l.logprob.to_bits()).collect();
        steps.push((t.id, bits));
        generated.push(t.id);
        b.decode(&[(s, t.id)]).unwrap();
    }
    b.close(s);
    (attached, steps)
}

/// Issue 42: with the prefix cache on, a prompt attaches the whole chunks an
/// earlier prompt computed that it starts with, and its tokens and
/// log-probabilities are the same bits as with the cache off, whether the
/// prefix came from the cache whole, partly, or not at all. The model's
/// context must hold three of the backend's prefill chunks.
pub(crate) fn check_prefix_reuse(b: &mut dyn Backend, vocab: usize) {
    let c = b.prefill_chunk();
    let prompt: Vec<u32> = (0..2 * c + 5)
        .map(|i| ((i * 7 + 3) % vocab) as u32)
        .collect();
    let mut other = prompt.clone();
    other[c + 3] = (other[c + 3] + 1) % vocab as u32;
    let n = 6;

    b.set_prefix_cache(None).unwrap();
    let (_, want) = continuation(b, &prompt, n);
    let (_, want_other) = continuation(b, &other, n);
    assert!(b.prefix_stats().is_none(), "no cache when off");

    b.set_prefix_cache(Some(1.0)).unwrap();
    assert_eq!(continuation(b, &prompt, n), (0, want.clone()), "computed");
    let stats = b.prefix_stats().unwrap();
    assert_eq!(stats.entries, 3, "its two whole chunks and its last");
    assert_eq!(
        stats.logits_bytes,
        4 * vocab as u64,
        "one prompt's last logits"
    );
    assert_eq!(
        continuation(b, &prompt, n),
        (prompt.len(), want.clone()),
        "the same prompt: every position and its logits cached"
    );
    assert_eq!(
        continuation(b, &other, n),
        (c, want_other.clone()),
        "partly cached"
    );
    assert_eq!(
        b.prefix_stats().unwrap().entries,
        5,
        "the other's second chunk and its last"
    );
    assert_eq!(
        continuation(b, &other, n),
        (other.len(), want_other),
        "the other again"
    );
    // One chunk exactly: its last token is computed, unless it was this
    // prompt's last chunk before; one past it: that chunk.
    let (_, want_one) = continuation(b, &prompt[..c], n);
    assert_eq!(
        continuation(b, &prompt[..c], n),
        (c, want_one),
        "a whole last chunk keeps its logits too"
    );
    assert_eq!(continuation(b, &prompt[..c + 1], n).0, c);
    let (cached, got) = continuation(b, &prompt[..c + 1], n);
    assert_eq!(cached, c + 1);
    let (_, computed) = {
        b.set_prefix_cache(None).unwrap();
        let r = continuation(b, &prompt[..c + 1], n);
        b.set_prefix_cache(Some(1.0)).unwrap();
        r
    };
    assert_eq!(got, computed, "a partial last chunk attached");

    // A bound below one entry keeps nothing, and everything still agrees.
    b.set_prefix_cache(Some(1e-9)).unwrap();
    assert_eq!(continuation(b, &prompt, n), (0, want.clone()));
    assert_eq!(continuation(b, &prompt, n), (0, want));
    assert_eq!(b.prefix_stats().unwrap().entries, 0);
    b.set_prefix_cache(None).unwrap();
}

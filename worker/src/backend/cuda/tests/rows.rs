//! Rows mode's attention (`ops/rows.rs`): a batched decode step's norms,
//! RoPE, KV store and attention, one launch each a layer for all rows.

use super::*;
use crate::backend::cuda::ops::RowsPass;
use crate::backend::cuda::RowSeq;
use crate::model::ops::{HeadNorms, QkPrep};

/// A rows-mode pass over `lead` and `caches` at these positions (tokens 0,
/// no sampler: what the attention and product tests need).
fn pass(lead: &CudaCache, caches: Vec<CudaCache>, positions: &[usize]) -> RowsPass {
    let seqs = std::iter::once(lead)
        .chain(&caches)
        .zip(positions)
        .map(|(c, &pos)| RowSeq {
            cache: c.planes(0).0,
            logits: 0,
            pos: pos as i32,
            capacity: c.capacity as i32,
        })
        .collect();
    RowsPass {
        seqs,
        tokens: vec![0; positions.len()],
        caches,
        max_splits: None,
    }
}

/// Three sequences at different depths (a few positions, several chunks of
/// `ATS_ROW_CHUNK`, many), decoded in one rows-mode `attend`: three launches
/// for all rows; each row's Q and K after their norms and rotation and its
/// cached K and V are the bits a single-row `attend` gives; its output is
/// within 1e-2 of the CPU's attention, and the same bits when the row runs
/// alone or beside others in another order. Heads of 64 and 128 (tensor
/// cores), 256 with a sliding window, and 80 with a group of 6 (scalar).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rows_attention_matches_cpu_and_is_batch_invariant() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    // (n_head, n_head_kv, head_dim, head norms, style, sliding window)
    let cases = [
        (9, 3, 64, false, RopeStyle::Normal, None),
        (16, 4, 128, false, RopeStyle::Neox, None),
        (4, 1, 256, true, RopeStyle::Neox, Some(200)),
        (6, 1, 80, true, RopeStyle::Normal, None),
    ];
    let depths = [3usize, 300, 700];
    let capacities = [8usize, 310, 760];
    for (n_head, n_kv, hd, with_norms, style, window) in cases {
        let (qd, kvd) = (n_head * hd, n_kv * hd);
        let what = format!("{n_head}/{n_kv}x{hd} {style:?} window {window:?}");
        let norm_w = |rng: &mut ChaCha8Rng| -> Vec<f32> {
            (0..hd)
                .map(|_| 1.0 + rng.random_range(-0.5f32..0.5))
                .collect()
        };
        let (qw, kw) = (norm_w(&mut rng), norm_w(&mut rng));
        let qw = test_weight(&mut ops, GgmlType::F32, 1, hd, &qw);
        let kw = test_weight(&mut ops, GgmlType::F32, 1, hd, &kw);
        let shape = |pos: usize, n: usize| AttentionShape {
            layer: 1,
            start_pos: pos,
            n_tokens: n,
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
            window,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let rope = |n_head, pos| RopeParams {
            n_head,
            head_dim: hd,
            n_rot: hd,
            start_pos: pos,
            freq_base: 10_000.0,
            freq_scale: 1.0,
            style,
            freq_factors: None,
            mscale: 1.0,
        };
        // Each sequence's caches (layer 1 of 2): the CPU's, one for the
        // batched steps, one for single-row steps; its prompt's K and V in all.
        let mut cpu = Vec::new();
        let (mut batched, mut single) = (Vec::new(), Vec::new());
        for (&depth, &capacity) in depths.iter().zip(&capacities) {
            let mut c = CpuCache::new(2, capacity, kvd);
            let mut a = CudaCache::new(&dev(), 2, n_kv, hd, capacity).unwrap();
            let mut b = CudaCache::new(&dev(), 2, n_kv, hd, capacity).unwrap();
            let (qv, kv, vv) = (
                random_vec(&mut rng, depth * qd, 2.0),
                random_vec(&mut rng, depth * kvd, 2.0),
                random_vec(&mut rng, depth * kvd, 2.0),
            );
            let s = shape(0, depth);
            let mut out = cpu_buf(depth, qd, vec![0.0; depth * qd]);
            let (cq, ck, cv) = (
                cpu_buf(depth, qd, qv.clone()),
                cpu_buf(depth, kvd, kv.clone()),
                cpu_buf(depth, kvd, vv.clone()),
            );
            CpuOps
                .attention(&cq, &ck, &cv, &mut c, s, &mut out)
                .unwrap();
            let (q, k, v) = (
                ops.upload(depth, qd, &qv).unwrap(),
                ops.upload(depth, kvd, &kv).unwrap(),
                ops.upload(depth, kvd, &vv).unwrap(),
            );
            let mut g = ops.buf(depth, qd).unwrap();
            for cache in [&mut a, &mut b] {
                ops.attention(&q, &k, &v, cache, s, &mut g).unwrap();
            }
            cpu.push(c);
            batched.push(a);
            single.push(b);
        }
        let (qv, kv, vv) = (
            random_vec(&mut rng, 3 * qd, 2.0),
            random_vec(&mut rng, 3 * kvd, 2.0),
            random_vec(&mut rng, 3 * kvd, 2.0),
        );
        let row = |x: &[f32], width: usize, i: usize| x[i * width..(i + 1) * width].to_vec();
        // The CPU's and a single-row attend for each row.
        let mut want = Vec::new();
        for i in 0..3 {
            let pos = depths[i];
            let prep = QkPrep {
                norms: with_norms.then_some(HeadNorms {
                    q: &qw.cpu,
                    k: &kw.cpu,
                    eps: 1e-6,
                }),
                rope: Some((rope(n_head, pos), rope(n_kv, pos))),
            };
            let (mut cq, mut ck, cv) = (
                cpu_buf(1, qd, row(&qv, qd, i)),
                cpu_buf(1, kvd, row(&kv, kvd, i)),
                cpu_buf(1, kvd, row(&vv, kvd, i)),
            );
            let mut out = cpu_buf(1, qd, vec![0.0; qd]);
            CpuOps
                .attend(
                    &mut cq,
                    &mut ck,
                    &cv,
                    prep,
                    &mut cpu[i],
                    shape(pos, 1),
                    &mut out,
                )
                .unwrap();
            let prep = QkPrep {
                norms: with_norms.then_some(HeadNorms {
                    q: &qw.gpu,
                    k: &kw.gpu,
                    eps: 1e-6,
                }),
                rope: Some((rope(n_head, pos), rope(n_kv, pos))),
            };
            let mut q = ops.upload(1, qd, &row(&qv, qd, i)).unwrap();
            let mut k = ops.upload(1, kvd, &row(&kv, kvd, i)).unwrap();
            let v = ops.upload(1, kvd, &row(&vv, kvd, i)).unwrap();
            let mut g = ops.buf(1, qd).unwrap();
            ops.attend(
                &mut q,
                &mut k,
                &v,
                prep,
                &mut single[i],
                shape(pos, 1),
                &mut g,
            )
            .unwrap();
            want.push((
                out.data,
                bits(&host(&mut ops, &q)),
                bits(&host(&mut ops, &k)),
            ));
        }
        // Rows `order` of the step in one rows-mode attend over the
        // batched caches: each row's output, Q and K, and the launches.
        let step = |ops: &mut CudaOps, batched: &mut Vec<CudaCache>, order: &[usize]| {
            let pick = |x: &[f32], width| -> Vec<f32> {
                order.iter().flat_map(|&i| row(x, width, i)).collect()
            };
            let n = order.len();
            let mut q = ops.upload(n, qd, &pick(&qv, qd)).unwrap();
            let mut k = ops.upload(n, kvd, &pick(&kv, kvd)).unwrap();
            let v = ops.upload(n, kvd, &pick(&vv, kvd)).unwrap();
            let mut out = ops.buf(n, qd).unwrap();
            let mut taken: Vec<Option<CudaCache>> = batched.drain(..).map(Some).collect();
            let mut caches: Vec<CudaCache> =
                order.iter().map(|&i| taken[i].take().unwrap()).collect();
            let mut lead = caches.remove(0);
            let positions: Vec<usize> = order.iter().map(|&i| depths[i]).collect();
            ops.begin_rows(pass(&lead, caches, &positions)).unwrap();
            let prep = QkPrep {
                norms: with_norms.then_some(HeadNorms {
                    q: &qw.gpu,
                    k: &kw.gpu,
                    eps: 1e-6,
                }),
                rope: Some((rope(n_head, positions[0]), rope(n_kv, positions[0]))),
            };
            let before = dev().kernels.writes();
            let result = ops.attend(
                &mut q,
                &mut k,
                &v,
                prep,
                &mut lead,
                shape(positions[0], n),
                &mut out,
            );
            let launches = dev().kernels.writes() - before;
            let rest = ops.end_rows();
            for (&i, c) in order.iter().zip(std::iter::once(lead).chain(rest)) {
                taken[i] = Some(c);
            }
            batched.extend(taken.into_iter().map(Option::unwrap));
            result.unwrap();
            let (o, q, k) = (host(ops, &out), host(ops, &q), host(ops, &k));
            let rows: Vec<_> = (0..n)
                .map(|j| {
                    (
                        row(&o, qd, j),
                        bits(&row(&q, qd, j)),
                        bits(&row(&k, kvd, j)),
                    )
                })
                .collect();
            (rows, launches)
        };
        let (together, launches) = step(&mut ops, &mut batched, &[0, 1, 2]);
        assert_eq!(launches, 3, "{what}: store, split attention, merge");
        for (i, (out, q, k)) in together.iter().enumerate() {
            let (cpu_out, single_q, single_k) = &want[i];
            assert!(q == single_q, "{what}: row {i}'s Q after its rotation");
            assert!(k == single_k, "{what}: row {i}'s K after its rotation");
            let e = rel_err(out, cpu_out);
            assert!(
                e <= 1e-2,
                "{what}: row {i} at {} against the CPU: {e:e}",
                depths[i]
            );
            for h in 0..n_kv {
                let a = batched[i].read_entry(&dev(), 1, h, depths[i]).unwrap();
                let b = single[i].read_entry(&dev(), 1, h, depths[i]).unwrap();
                assert!(a == b, "{what}: row {i}'s cached K and V, head {h}");
            }
        }
        for order in [vec![2, 0], vec![1], vec![0], vec![2, 1, 0]] {
            let (rows, _) = step(&mut ops, &mut batched, &order);
            for (j, &i) in order.iter().enumerate() {
                assert!(
                    bits(&rows[j].0) == bits(&together[i].0),
                    "{what}: row {i} in {order:?} has other bits than beside all"
                );
            }
        }
    }
}

/// Rows mode's products (`gemm_few_*` in groups of 64 rows, or `mv_*`/
/// `mvw_*` groups in formats without it): a row of x gets the same bits
/// whether 1, 9, 20, 37, 64, 65 or 80 rows share the step, and agrees with
/// the CPU's product.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rows_products_give_a_row_the_same_bits_in_any_batch() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    let (rows, cols) = (1000, 1536);
    let xv = random_vec(&mut rng, 80 * cols, 1.0);
    ops.set_widest_input(cols);
    ops.reserve_rows(80).unwrap();
    for ty in [
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q5K,
        GgmlType::F16,
    ] {
        let w = test_weight(
            &mut ops,
            ty,
            rows,
            cols,
            &random_vec(&mut rng, rows * cols, 1.0),
        );
        let mut all: Option<Vec<f32>> = None;
        let lead = CudaCache::new(&dev(), 1, 1, 8, 1).unwrap();
        for n in [80, 1, 9, 20, 37, 64, 65] {
            let caches = (1..n)
                .map(|_| CudaCache::new(&dev(), 1, 1, 8, 1).unwrap())
                .collect();
            ops.begin_rows(pass(&lead, caches, &vec![0; n])).unwrap();
            let x = ops.upload(n, cols, &xv[..n * cols]).unwrap();
            let mut out = ops.buf(n, rows).unwrap();
            let result = ops.matmul(&x, &w.gpu, None, &mut out);
            ops.end_rows();
            result.unwrap();
            let got = host(&mut ops, &out);
            let all = all.get_or_insert_with(|| got.clone());
            let differ = (0..n * rows).filter(|&i| got[i].to_bits() != all[i].to_bits());
            assert_eq!(differ.count(), 0, "{ty}: rows of x differ with {n} of them");
        }
        let all = all.unwrap();
        for t in [0, 7, 8, 63, 64, 79] {
            let mut want = cpu_buf(1, rows, vec![0.0; rows]);
            let x = cpu_buf(1, cols, xv[t * cols..(t + 1) * cols].to_vec());
            CpuOps.matmul(&x, &w.cpu, None, &mut want).unwrap();
            let e = rel_err(&all[t * rows..(t + 1) * rows], &want.data);
            assert!(e <= 1e-2, "{ty}: row {t} against the CPU: {e:e}");
        }
    }
}

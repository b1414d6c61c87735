//! Kernel safety (M0-W-1431): bad sizes are refused on the host, as typed
//! errors, before anything is launched, at both levels that check them:
//! `CudaOps` (every buffer backed by enough device memory for its stated
//! shape) and the `Kernels` launchers (no zero dimension, no null buffer, no
//! value past the kernel's `int` range; `launchers.rs`). And
//! compute-sanitizer's memcheck finds no bad access while the kernel tests
//! run (`memcheck.rs`).

use super::*;

/// Asserts that `r` is a refusal: a typed error, not a panic and not a launch.
pub(super) fn refused(what: &str, r: Result<(), BackendError>) {
    match r {
        Err(BackendError::Shape(_)) => {}
        Err(e) => panic!("{what}: refused, but as {e:?} rather than a shape error"),
        Ok(()) => panic!("{what}: not refused"),
    }
}

/// A matrix that claims `rows` rows of `cols` but holds one row's block.
fn undersized(ops: &mut CudaOps, rows: usize, cols: usize) -> CudaBuf {
    let mut b = ops.buf(1, cols).unwrap();
    b.rows = rows;
    assert!(
        align_up((cols * 4) as u64) < (rows * cols * 4) as u64,
        "the test's buffer must be short"
    );
    b
}

/// An F32 vector weight of `stored` values that claims `len`.
fn short_vector(ops: &mut CudaOps, stored: usize, len: usize) -> CudaWeight {
    let mut w = ops
        .upload_weight(GgmlType::F32, 1, stored, &vec![0u8; stored * 4])
        .unwrap();
    w.cols = len;
    w.row_bytes = len * 4;
    w
}

#[test]
fn m0_w_1431_launch_argument_checks_refuse_zero_null_and_out_of_range() {
    use kernels::{check_args, Norm};
    let k = Norm::Rms;
    assert!(check_args(
        k,
        &[("rows", 1), ("cols", 576)],
        &[("x", 256), ("out", 512)]
    )
    .is_ok());
    assert!(check_args(k, &[("rows", i32::MAX as usize)], &[]).is_ok());
    let expect = |r: Result<(), BackendError>, words: &[&str]| match r {
        Err(BackendError::Shape(msg)) => {
            assert!(
                words.iter().all(|w| msg.contains(w)),
                "{msg:?} should name {words:?}"
            )
        }
        other => panic!("expected a refusal naming {words:?}, got {other:?}"),
    };
    expect(
        check_args(k, &[("rows", 3), ("cols", 0)], &[]),
        &["rms_norm", "cols", "zero"],
    );
    expect(
        check_args(k, &[("rows", i32::MAX as usize + 1)], &[]),
        &["rows", "exceeds"],
    );
    expect(
        check_args(k, &[("rows", 1)], &[("x", 256), ("out", 0)]),
        &["out", "null"],
    );
    for kern in Kernel::all() {
        assert!(
            check_args(kern, &[("n", 0)], &[]).is_err(),
            "{}",
            kern.symbol()
        );
    }
}

/// Every `CudaOps` operation refuses undersized buffers (shapes larger than
/// their device blocks, or than the other operands), zero lengths and
/// overruns of the KV cache, and the context is still healthy afterwards
/// (a launch that had run out of bounds would leave a sticky error).
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1431_cuda_operations_refuse_undersized_buffers_and_zero_lengths() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(31);

    // embed
    let table = test_weight(
        &mut ops,
        GgmlType::Q8_0,
        64,
        256,
        &random_vec(&mut rng, 64 * 256, 1.0),
    )
    .gpu;
    let mut out = ops.buf(2, 256).unwrap();
    ops.embed(&table, &[1, 2], &mut out).expect("a valid embed");
    let mut none = ops.buf(0, 256).unwrap();
    refused("embed of no tokens", ops.embed(&table, &[], &mut none));
    let mut short = undersized(&mut ops, 2, 256);
    refused(
        "embed into a short output",
        ops.embed(&table, &[1, 2], &mut short),
    );
    let mut t = test_weight(
        &mut ops,
        GgmlType::Q8_0,
        64,
        256,
        &random_vec(&mut rng, 64 * 256, 1.0),
    )
    .gpu;
    let mut one = ops.buf(1, 256).unwrap();
    t.rows = 1000;
    refused(
        "embed from a table shorter than its rows",
        ops.embed(&t, &[999], &mut one),
    );
    t.rows = 64;
    t.row_bytes -= 34;
    refused(
        "embed with rows not of the stored size",
        ops.embed(&t, &[1], &mut one),
    );

    // matmul (+ bias)
    let wv = random_vec(&mut rng, 300 * 256, 1.0);
    let mut w = test_weight(&mut ops, GgmlType::Q4_0, 300, 256, &wv).gpu;
    let bias = test_weight(
        &mut ops,
        GgmlType::F32,
        1,
        300,
        &random_vec(&mut rng, 300, 1.0),
    )
    .gpu;
    let x = ops
        .upload(3, 256, &random_vec(&mut rng, 3 * 256, 1.0))
        .unwrap();
    let mut out = ops.buf(3, 300).unwrap();
    ops.matmul(&x, &w, Some(&bias), &mut out)
        .expect("a valid matmul");
    let (zx, mut zout) = (ops.buf(0, 256).unwrap(), ops.buf(0, 300).unwrap());
    refused("matmul of zero rows", ops.matmul(&zx, &w, None, &mut zout));
    let short_x = undersized(&mut ops, 3, 256);
    refused(
        "matmul of a short x",
        ops.matmul(&short_x, &w, None, &mut out),
    );
    let mut short_out = undersized(&mut ops, 3, 300);
    refused(
        "matmul into a short output",
        ops.matmul(&x, &w, None, &mut short_out),
    );
    let mut narrow = ops.buf(3, 299).unwrap();
    refused(
        "matmul into a narrow output",
        ops.matmul(&x, &w, None, &mut narrow),
    );
    let bias_short = test_weight(
        &mut ops,
        GgmlType::F32,
        1,
        299,
        &random_vec(&mut rng, 299, 1.0),
    )
    .gpu;
    refused(
        "matmul with a bias of too few values",
        ops.matmul(&x, &w, Some(&bias_short), &mut out),
    );
    let bias_block = short_vector(&mut ops, 200, 300);
    refused(
        "matmul with a bias shorter than its block",
        ops.matmul(&x, &w, Some(&bias_block), &mut out),
    );
    let mut wide = ops.buf(3, 310).unwrap();
    w.rows = 310;
    refused(
        "matmul with a weight shorter than its rows",
        ops.matmul(&x, &w, None, &mut wide),
    );
    w.rows = 300;

    // rms_norm and layer_norm
    let nw = test_weight(&mut ops, GgmlType::F32, 1, 256, &[1.0; 256]).gpu;
    let nb = test_weight(&mut ops, GgmlType::F32, 1, 256, &[0.5; 256]).gpu;
    let x = ops
        .upload(2, 256, &random_vec(&mut rng, 2 * 256, 1.0))
        .unwrap();
    let mut out = ops.buf(2, 256).unwrap();
    ops.rms_norm(&x, &nw, 1e-5, &mut out)
        .expect("a valid rms_norm");
    ops.layer_norm(&x, &nw, Some(&nb), 1e-5, &mut out)
        .expect("a valid layer_norm");
    let short_w = short_vector(&mut ops, 128, 256);
    let (zero_x, mut zero_out) = (ops.buf(0, 256).unwrap(), ops.buf(0, 256).unwrap());
    let short_x = undersized(&mut ops, 2, 256);
    let mut short_out = undersized(&mut ops, 2, 256);
    refused(
        "rms_norm of zero rows",
        ops.rms_norm(&zero_x, &nw, 1e-5, &mut zero_out),
    );
    refused(
        "rms_norm into a short output",
        ops.rms_norm(&x, &nw, 1e-5, &mut short_out),
    );
    refused(
        "rms_norm of a short x",
        ops.rms_norm(&short_x, &nw, 1e-5, &mut out),
    );
    refused(
        "rms_norm with a weight shorter than its block",
        ops.rms_norm(&x, &short_w, 1e-5, &mut out),
    );
    refused(
        "layer_norm of zero rows",
        ops.layer_norm(&zero_x, &nw, Some(&nb), 1e-5, &mut zero_out),
    );
    refused(
        "layer_norm into a short output",
        ops.layer_norm(&x, &nw, Some(&nb), 1e-5, &mut short_out),
    );
    refused(
        "layer_norm of a short x",
        ops.layer_norm(&short_x, &nw, Some(&nb), 1e-5, &mut out),
    );
    refused(
        "layer_norm with a weight shorter than its block",
        ops.layer_norm(&x, &short_w, Some(&nb), 1e-5, &mut out),
    );
    refused(
        "layer_norm with a bias shorter than its block",
        ops.layer_norm(&x, &nw, Some(&short_w), 1e-5, &mut out),
    );
    let nb_narrow = test_weight(&mut ops, GgmlType::F32, 1, 255, &[0.5; 255]).gpu;
    refused(
        "layer_norm with a bias of too few values",
        ops.layer_norm(&x, &nw, Some(&nb_narrow), 1e-5, &mut out),
    );

    // rope
    let p = RopeParams {
        n_head: 4,
        head_dim: 64,
        n_rot: 64,
        start_pos: 0,
        freq_base: 10000.0,
        freq_scale: 1.0,
        style: RopeStyle::Normal,
        freq_factors: None,
        mscale: 1.0,
    };
    let mut x = ops
        .upload(2, 256, &random_vec(&mut rng, 2 * 256, 1.0))
        .unwrap();
    ops.rope(&mut x, p).expect("a valid rope");
    let mut zero_x = ops.buf(0, 256).unwrap();
    let mut short_x = undersized(&mut ops, 2, 256);
    refused("rope of zero rows", ops.rope(&mut zero_x, p));
    refused("rope of a short x", ops.rope(&mut short_x, p));
    refused(
        "rope of an odd rotation",
        ops.rope(&mut x, RopeParams { n_rot: 63, ..p }),
    );
    refused(
        "rope of more heads than x holds",
        ops.rope(&mut x, RopeParams { n_head: 5, ..p }),
    );

    // attention (and the KV store inside it)
    let (n_head, n_kv, hd, cap) = (4, 2, 64, 16);
    let mut cache = CudaCache::new(&dev(), 1, n_kv, hd, cap).unwrap();
    let s = AttentionShape {
        layer: 0,
        start_pos: 0,
        n_tokens: 2,
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        window: None,
        scale: 0.125,
    };
    let q = ops
        .upload(2, n_head * hd, &random_vec(&mut rng, 2 * n_head * hd, 1.0))
        .unwrap();
    let kv = ops
        .upload(2, n_kv * hd, &random_vec(&mut rng, 2 * n_kv * hd, 1.0))
        .unwrap();
    let mut out = ops.buf(2, n_head * hd).unwrap();
    ops.attention(&q, &kv, &kv, &mut cache, s, &mut out)
        .expect("a valid attention");
    let (zq, zkv) = (
        ops.buf(0, n_head * hd).unwrap(),
        ops.buf(0, n_kv * hd).unwrap(),
    );
    let mut zout = ops.buf(0, n_head * hd).unwrap();
    let zero_s = AttentionShape { n_tokens: 0, ..s };
    refused(
        "attention of zero tokens",
        ops.attention(&zq, &zkv, &zkv, &mut cache, zero_s, &mut zout),
    );
    let (short_q, short_k) = (
        undersized(&mut ops, 2, n_head * hd),
        undersized(&mut ops, 2, n_kv * hd),
    );
    let mut short_out = undersized(&mut ops, 2, n_head * hd);
    refused(
        "attention of a short q",
        ops.attention(&short_q, &kv, &kv, &mut cache, s, &mut out),
    );
    refused(
        "attention of a short k",
        ops.attention(&q, &short_k, &kv, &mut cache, s, &mut out),
    );
    refused(
        "attention into a short output",
        ops.attention(&q, &kv, &kv, &mut cache, s, &mut short_out),
    );
    let past = AttentionShape {
        start_pos: cap - 1,
        ..s
    };
    refused(
        "attention past the cache",
        ops.attention(&q, &kv, &kv, &mut cache, past, &mut out),
    );
    let layer1 = AttentionShape { layer: 1, ..s };
    refused(
        "attention in a layer the cache lacks",
        ops.attention(&q, &kv, &kv, &mut cache, layer1, &mut out),
    );
    cache.capacity = 4 * cap;
    refused(
        "attention in a cache larger than its block",
        ops.attention(&q, &kv, &kv, &mut cache, s, &mut out),
    );
    cache.capacity = cap;

    // swiglu, gelu, add
    let a = ops.upload(3, 100, &random_vec(&mut rng, 300, 2.0)).unwrap();
    let mut out = ops.buf(3, 100).unwrap();
    ops.swiglu(&a, &a, &mut out).expect("a valid swiglu");
    ops.gelu(&a, &mut out).expect("a valid gelu");
    ops.add_assign(&mut out, &a).expect("a valid add");
    let (zero, mut zero_out) = (ops.buf(0, 100).unwrap(), ops.buf(0, 100).unwrap());
    let short_a = undersized(&mut ops, 3, 100);
    let mut short_out = undersized(&mut ops, 3, 100);
    refused("swiglu of nothing", ops.swiglu(&zero, &zero, &mut zero_out));
    refused(
        "swiglu into a short output",
        ops.swiglu(&a, &a, &mut short_out),
    );
    refused("swiglu of a short gate", ops.swiglu(&short_a, &a, &mut out));
    refused("gelu of nothing", ops.gelu(&zero, &mut zero_out));
    refused("gelu into a short output", ops.gelu(&a, &mut short_out));
    refused("gelu of a short x", ops.gelu(&short_a, &mut out));
    refused("add of nothing", ops.add_assign(&mut zero_out, &zero));
    refused("add into a short x", ops.add_assign(&mut short_out, &a));
    refused("add of a short y", ops.add_assign(&mut out, &short_a));

    // copies
    let mut v = Vec::new();
    refused("to_host of a short matrix", ops.to_host(&short_a, &mut v));
    refused("row_to_host past the rows", ops.row_to_host(&a, 3, &mut v));
    assert!(ops.take_row(&a, 3).is_err(), "take_row past the rows");

    // Nothing out of bounds ran: the context has no sticky error.
    dev().synchronize().expect("the context is healthy");
    ops.add_assign(&mut out, &a).expect("still usable");
    assert_eq!(host(&mut ops, &out).len(), 300);
}

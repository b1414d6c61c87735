//! Kernel safety (M0-W-1431): bad sizes are refused on the host, as typed
//! errors, before anything is launched, at both levels that check them:
//! `CudaOps` (every buffer backed by enough device memory for its stated
//! shape) and the `Kernels` launchers (no zero dimension, no null buffer, no
//! value past the kernel's `int` range). And compute-sanitizer's memcheck
//! finds no bad access while the kernel tests run.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use crate::backend::cuda::args::{
    AddAssignArgs, AttentionArgs, CacheWindow, EmbedArgs, GeluArgs, KvStoreArgs, LayerNormArgs,
    MatmulArgs, RmsNormArgs, RopeArgs, RopePairs, Stored, SwigluArgs,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};

/// Asserts that `r` is a refusal: a typed error, not a panic and not a launch.
fn refused(what: &str, r: Result<(), BackendError>) {
    match r {
        Err(BackendError::InferenceFailed(_)) => {}
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
    use launch::check_args;
    let k = Kernel::RmsNorm;
    assert!(check_args(
        k,
        &[("rows", 1), ("cols", 576)],
        &[("x", 256), ("out", 512)]
    )
    .is_ok());
    assert!(check_args(k, &[("rows", i32::MAX as usize)], &[]).is_ok());
    let expect = |r: Result<(), BackendError>, words: &[&str]| match r {
        Err(BackendError::InferenceFailed(msg)) => {
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

/// The `Kernels` launchers themselves refuse zero dimensions, null buffers
/// and cache overruns before launching.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1431_cuda_launchers_refuse_zero_lengths_and_null_buffers() {
    let _gpu = shared_gpu();
    let d = dev();
    d.bind().unwrap();
    let buf = d.alloc(device::Purpose::Scratch, 1 << 20).unwrap();
    let p = buf.ptr();
    let (k, s) = (&d.kernels, &d.stream);
    let f32_ = GgmlType::F32;

    let (tokens, out) = (DevPtr::new(p), DevPtrMut::new(p));
    let table = Stored {
        ty: f32_,
        ptr: DevPtr::new(p),
        row_bytes: 1024,
        rows: 4,
        cols: 256,
    };
    let no_cols = Stored {
        row_bytes: 0,
        cols: 0,
        ..table
    };
    let embed = EmbedArgs {
        table,
        tokens,
        n: 1,
        out,
    };
    refused(
        "embed of no tokens",
        k.launch(s, &EmbedArgs { n: 0, ..embed }),
    );
    refused(
        "embed of zero columns",
        k.launch(
            s,
            &EmbedArgs {
                table: no_cols,
                ..embed
            },
        ),
    );
    let null_table = Stored {
        ptr: DevPtr::new(0),
        ..table
    };
    refused(
        "embed from a null table",
        k.launch(
            s,
            &EmbedArgs {
                table: null_table,
                ..embed
            },
        ),
    );

    let mm = MatmulArgs {
        w: table,
        x: DevPtr::new(p),
        n: 1,
        bias: None,
        out,
    };
    refused(
        "matmul of zero rows of x",
        k.matmul(s, &MatmulArgs { n: 0, ..mm }),
    );
    refused(
        "matmul of zero weight rows",
        k.matmul(
            s,
            &MatmulArgs {
                w: Stored { rows: 0, ..table },
                ..mm
            },
        ),
    );
    refused(
        "matmul of zero columns",
        k.matmul(s, &MatmulArgs { w: no_cols, ..mm }),
    );
    refused(
        "matmul of a null x",
        k.matmul(
            s,
            &MatmulArgs {
                x: DevPtr::new(0),
                ..mm
            },
        ),
    );

    let (x, w) = (DevPtr::new(p), DevPtr::new(p));
    let rms = RmsNormArgs {
        x,
        w,
        rows: 2,
        cols: 256,
        eps: 1e-5,
        out,
    };
    refused(
        "rms_norm of zero rows",
        k.launch(s, &RmsNormArgs { rows: 0, ..rms }),
    );
    refused(
        "rms_norm of zero columns",
        k.launch(s, &RmsNormArgs { cols: 0, ..rms }),
    );
    refused(
        "rms_norm with a null weight",
        k.launch(
            s,
            &RmsNormArgs {
                w: DevPtr::new(0),
                ..rms
            },
        ),
    );
    let ln = LayerNormArgs {
        x,
        w,
        b: Some(DevPtr::new(p)),
        rows: 2,
        cols: 256,
        eps: 1e-5,
        out,
    };
    refused(
        "layer_norm of zero rows",
        k.launch(s, &LayerNormArgs { rows: 0, ..ln }),
    );
    refused(
        "layer_norm of zero columns",
        k.launch(
            s,
            &LayerNormArgs {
                b: None,
                cols: 0,
                ..ln
            },
        ),
    );
    refused(
        "layer_norm into null",
        k.launch(
            s,
            &LayerNormArgs {
                out: DevPtrMut::new(0),
                ..ln
            },
        ),
    );

    let rope = RopeArgs {
        x: DevPtrMut::new(p),
        rows: 2,
        n_head: 4,
        head_dim: 64,
        n_rot: 64,
        start_pos: 0,
        pos_ptr: None,
        inv_freq: None,
        freq_base: 1e4,
        freq_scale: 1.0,
        pairs: RopePairs::Adjacent,
    };
    refused(
        "rope of zero rows",
        k.launch(s, &RopeArgs { rows: 0, ..rope }),
    );
    refused(
        "rope of zero rotated dims",
        k.launch(s, &RopeArgs { n_rot: 0, ..rope }),
    );
    refused(
        "rope of an odd rotation",
        k.launch(s, &RopeArgs { n_rot: 63, ..rope }),
    );
    refused(
        "rope of more rotated dims than a head",
        k.launch(s, &RopeArgs { n_rot: 66, ..rope }),
    );

    let window = CacheWindow {
        start_pos: 0,
        pos_ptr: None,
        capacity: 16,
    };
    let past = CacheWindow {
        start_pos: 15,
        ..window
    };
    let (kv, k_cache, v_cache) = (DevPtr::new(p), DevPtrMut::new(p), DevPtrMut::new(p));
    let store = KvStoreArgs {
        k: kv,
        v: kv,
        n: 2,
        n_head_kv: 2,
        head_dim: 64,
        window,
        k_cache,
        v_cache,
    };
    refused(
        "kv_store of zero tokens",
        k.launch(s, &KvStoreArgs { n: 0, ..store }),
    );
    refused(
        "kv_store past the cache",
        k.launch(
            s,
            &KvStoreArgs {
                window: past,
                ..store
            },
        ),
    );
    refused(
        "kv_store into a null cache",
        k.launch(
            s,
            &KvStoreArgs {
                k_cache: DevPtrMut::new(0),
                ..store
            },
        ),
    );

    let (q, k_cache, v_cache) = (DevPtr::new(p), DevPtr::new(p), DevPtr::new(p));
    let att = AttentionArgs {
        q,
        n: 1,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        window,
        k_cache,
        v_cache,
        scale: 0.125,
        out,
    };
    refused(
        "attention of zero tokens",
        k.launch(s, &AttentionArgs { n: 0, ..att }),
    );
    refused(
        "attention of zero KV heads",
        k.launch(
            s,
            &AttentionArgs {
                n_head_kv: 0,
                ..att
            },
        ),
    );
    refused(
        "attention past the cache",
        k.launch(
            s,
            &AttentionArgs {
                n: 2,
                window: past,
                ..att
            },
        ),
    );
    refused(
        "attention of heads above the maximum",
        k.launch(
            s,
            &AttentionArgs {
                head_dim: 512,
                ..att
            },
        ),
    );
    refused(
        "attention of uneven head groups",
        k.launch(s, &AttentionArgs { n_head: 5, ..att }),
    );

    let (a, b) = (DevPtr::new(p), DevPtr::new(p));
    refused(
        "swiglu of nothing",
        k.launch(
            s,
            &SwigluArgs {
                gate: a,
                up: b,
                len: 0,
                out,
            },
        ),
    );
    refused(
        "swiglu into null",
        k.launch(
            s,
            &SwigluArgs {
                gate: a,
                up: b,
                len: 16,
                out: DevPtrMut::new(0),
            },
        ),
    );
    refused(
        "gelu of nothing",
        k.launch(s, &GeluArgs { x: a, len: 0, out }),
    );
    refused(
        "gelu of null",
        k.launch(
            s,
            &GeluArgs {
                x: DevPtr::new(0),
                len: 16,
                out,
            },
        ),
    );
    refused(
        "add of nothing",
        k.launch(
            s,
            &AddAssignArgs {
                x: out,
                y: a,
                len: 0,
            },
        ),
    );
    refused(
        "add of null",
        k.launch(
            s,
            &AddAssignArgs {
                x: out,
                y: DevPtr::new(0),
                len: 16,
            },
        ),
    );

    d.synchronize().expect("nothing was launched that failed");
}

// -------------------------------------------------------- compute-sanitizer

/// The kernel tests memcheck re-runs: every kernel, every weight format, odd
/// shapes. Full names, run with `--exact`, so that a renamed test fails
/// this one instead of silently dropping out.
const MEMCHECK_TESTS: [&str; 8] = [
    "backend::cuda::tests::matmul::matmul_matches_cpu_for_every_format_and_shape",
    "backend::cuda::tests::matmul::embed_matches_cpu_for_every_format",
    "backend::cuda::tests::norm::rms_norm_matches_cpu",
    "backend::cuda::tests::norm::m0_w_1432_cuda_layer_norm_matches_cpu_at_widths_768_1600_577",
    "backend::cuda::tests::attention::rope_matches_cpu_in_both_styles",
    "backend::cuda::tests::attention::attention_matches_cpu_over_prefill_and_decode",
    "backend::cuda::tests::elementwise::swiglu_and_add_match_cpu",
    "backend::cuda::tests::elementwise::m0_w_1433_cuda_gelu_matches_f64_over_minus_10_to_10",
];

/// Every name memcheck re-runs is a test of this binary, so a test moved or
/// renamed is caught here, without a GPU, rather than on the GPU machine.
#[test]
fn memcheck_test_names_exist_in_this_binary() {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["--list", "--exact"])
        .args(MEMCHECK_TESTS)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    for name in MEMCHECK_TESTS {
        assert!(
            listed.lines().any(|l| l == format!("{name}: test")),
            "{name} is not a test here:\n{listed}"
        );
    }
}

/// How long the memcheck run may take (the quick kernel tests take about a
/// minute under memcheck; far longer means something hangs).
const MEMCHECK_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// `compute-sanitizer` on `PATH`, under `$CUDA_HOME/bin` or `$CUDA_PATH/bin`,
/// or in `/usr/local/cuda/bin`.
fn find_compute_sanitizer() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(PathBuf::from(root).join("bin"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    dirs.into_iter()
        .map(|d| d.join("compute-sanitizer"))
        .find(|p| p.is_file())
}

/// Re-runs this test binary's kernel tests under `compute-sanitizer --tool
/// memcheck` (quick mode: smaller shapes, fewer repeats) and requires a clean
/// report. Without compute-sanitizer this fails: on the GPU machine the
/// check is required, not optional.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn m0_w_1431_compute_sanitizer_memcheck_is_clean() {
    let _gpu = shared_gpu();
    let sanitizer = find_compute_sanitizer().expect(
        "compute-sanitizer (CUDA toolkit) is needed: not on PATH, under $CUDA_HOME/bin or in /usr/local/cuda/bin",
    );
    let exe = std::env::current_exe().expect("the test binary's path");
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("memcheck.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(&sanitizer)
        // Device memory accesses are what is checked here. API calls that
        // return an error are typed errors the worker already handles (and
        // set-up ignores a refused heap limit on purpose), so they are not
        // counted as memcheck errors.
        .args([
            "--tool",
            "memcheck",
            "--error-exitcode",
            "1",
            "--report-api-errors",
            "no",
        ])
        .arg(&exe)
        .args(MEMCHECK_TESTS)
        .args(["--exact", "--include-ignored", "--test-threads", "1"])
        .env(QUICK_ENV, "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", sanitizer.display()));
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > MEMCHECK_TIMEOUT {
            child.kill().ok();
            child.wait().ok();
            panic!(
                "memcheck ran past {MEMCHECK_TIMEOUT:?}; log in {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: String = {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    eprintln!(
        "compute-sanitizer memcheck over {} kernel tests: {:.0} s",
        MEMCHECK_TESTS.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success(),
        "memcheck (or a kernel test under it) failed: {status}\n{tail}"
    );
    assert!(
        text.contains("ERROR SUMMARY: 0 errors"),
        "memcheck did not report 0 errors:\n{tail}"
    );
    let ran = format!("test result: ok. {} passed", MEMCHECK_TESTS.len());
    assert!(
        text.contains(&ran),
        "every kernel test ran and passed under memcheck ({ran:?} expected):\n{tail}"
    );
}

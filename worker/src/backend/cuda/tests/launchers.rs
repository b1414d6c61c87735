//! Kernel safety (M0-W-1431), the launchers' own checks: the `Kernels`
//! launchers refuse zero dimensions, null buffers and cache overruns before
//! anything is queued.

use super::safety::refused;
use super::*;
use crate::backend::cuda::kernels::{
    AddAssignArgs, AttentionArgs, CacheWindow, EmbedArgs, GeluArgs, Glu, GluArgs, KvStoreArgs,
    LayerNormArgs, MatmulArgs, RmsNormArgs, RopeArgs, RopePairs, Stored, X8Bufs,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};

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
        x8: None,
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
        "rms_norm split for mv8 over two rows",
        k.launch(
            s,
            &RmsNormArgs {
                x8: Some(X8Bufs::at(p, 512)),
                ..rms
            },
        ),
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
        x2: None,
        n_head2: 0,
        rows: 2,
        n_head: 4,
        head_dim: 64,
        n_rot: 64,
        start_pos: 0,
        pos_ptr: None,
        inv_freq: None,
        freq_base: 1e4,
        freq_scale: 1.0,
        mscale: 1.0,
        pairs: RopePairs::Adjacent,
    };
    refused(
        "rope of zero rows",
        k.launch(s, &RopeArgs { rows: 0, ..rope }),
    );
    refused(
        "rope with heads of a second matrix but no matrix",
        k.launch(s, &RopeArgs { n_head2: 2, ..rope }),
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
        sliding: 0,
        sinks: None,
        out,
        tensor_cores: false,
        x8: None,
    };
    let x8 = Some(X8Bufs::at(p, 256));
    refused(
        "attention's output of two rows split for a mat-vec",
        k.launch(s, &AttentionArgs { n: 2, x8, ..att }),
    );
    refused(
        "attention's output split for a mat-vec across heads of 80 dims",
        k.launch(
            s,
            &AttentionArgs {
                head_dim: 80,
                x8,
                ..att
            },
        ),
    );
    refused(
        "attention of zero tokens",
        k.launch(s, &AttentionArgs { n: 0, ..att }),
    );
    refused(
        "attention through a window wider than the cache",
        k.launch(
            s,
            &AttentionArgs {
                sliding: window.capacity + 1,
                ..att
            },
        ),
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
    refused(
        "attention on tensor cores of a head size it has no path for",
        k.launch(
            s,
            &AttentionArgs {
                head_dim: 96,
                tensor_cores: true,
                ..att
            },
        ),
    );

    let (a, b) = (DevPtr::new(p), DevPtr::new(p));
    refused(
        "swiglu of nothing",
        k.launch(
            s,
            &GluArgs {
                act: Glu::Silu,
                gate: a,
                up: b,
                len: 0,
                out,
                x8: None,
            },
        ),
    );
    refused(
        "swiglu into null",
        k.launch(
            s,
            &GluArgs {
                act: Glu::Silu,
                gate: a,
                up: b,
                len: 16,
                out: DevPtrMut::new(0),
                x8: None,
            },
        ),
    );
    refused(
        "swiglu split for mv8 in part groups",
        k.launch(
            s,
            &GluArgs {
                act: Glu::Silu,
                gate: a,
                up: b,
                len: 48,
                out,
                x8: Some(X8Bufs::at(p, 64)),
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

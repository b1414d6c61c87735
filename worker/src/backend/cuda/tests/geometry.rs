//! Launch geometry without a GPU: every kernel's grid and block as the
//! launchers have always laid them out. The block size of a reduction fixes
//! its summation order, so a change here would change the GPU's bits.

use super::*;
use crate::backend::cuda::kernels::{
    launch_config, Attention, AttentionSplit, AttentionTc, Elementwise, Embed, Gemm, Matmul,
    Matvec, Norm, Rope, Sample, Work,
};

type Shape = ((u32, u32, u32), (u32, u32, u32));

fn shape(k: Kernel, work: Work) -> Shape {
    let c = launch_config(k, work).unwrap_or_else(|e| panic!("{k:?} over {work:?}: {e}"));
    // Only gemm_tc takes dynamic shared memory (its tiles, split into TF32 parts).
    let dynamic = if let Kernel::Gemm(Gemm::Tc(_)) = k {
        crate::backend::cuda::source::GTC_SMEM_BYTES
    } else {
        0
    };
    assert_eq!(c.shared_mem_bytes, dynamic, "{k:?}: dynamic shared memory");
    (c.grid_dim, c.block_dim)
}

#[test]
fn every_kernel_is_laid_out_as_before() {
    let q = GgmlType::Q4_1;
    let rows = |rows, cols| Work::Rows { rows, cols };
    let matrix = |rows, n| Work::Matrix { rows, n };
    assert_eq!(
        shape(Kernel::Embed(Embed::Embed(q)), rows(3, 576)),
        ((3, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matmul(Matmul::Mv(q)), matrix(576, 8)),
        ((576, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matmul(Matmul::Mvw(q)), matrix(49152, 1)),
        ((12288, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matmul(Matmul::Mvw(q)), matrix(4097, 1)),
        ((1025, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matmul(Matmul::Gemm(q)), matrix(576, 129)),
        ((9, 3, 1), (256, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matmul(Matmul::Gemm(q)), matrix(49152, 64)),
        ((768, 1, 1), (256, 1, 1))
    );
    // mv8: groups of 2 weight rows over as few of the 4 warps as cover a
    // row's 32-value units (wide rows: one group a block; 896 columns: a
    // warp a group, 8 rows a block); mv8n: 4 rows a block.
    let k = GgmlType::Q4K;
    let matvec = |rows, cols| Work::MatVec { rows, cols };
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8(k)), matvec(14336, 4096)),
        ((7168, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8(k)), matvec(4097, 2048)),
        ((1025, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8(k)), matvec(4864, 896)),
        ((608, 1, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8N(k)), matrix(4097, 8)),
        ((1025, 1, 1), (128, 1, 1))
    );
    // Rows of x in groups of 8 along y (a batched decode step's 64).
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8N(k)), matrix(896, 64)),
        ((224, 8, 1), (128, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8N(k)), matrix(896, 9)),
        ((224, 2, 1), (128, 1, 1))
    );
    // mmq: 16 weight rows a block of 8 warps.
    assert_eq!(
        shape(
            Kernel::Matvec(Matvec::Mmq(GgmlType::Q8_0)),
            matrix(4097, 20)
        ),
        ((257, 1, 1), (256, 1, 1))
    );
    // mv1: 8 weight rows a block; gemm_tc: 128 x 64 tiles.
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec1(q)), matrix(4097, 1)),
        ((513, 1, 1), (256, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Gemm(Gemm::Tc(GgmlType::F16)), matrix(4096, 129)),
        ((32, 3, 1), (256, 1, 1))
    );
    for (cols, threads) in [
        (1600, 512),
        (1024, 512),
        (1023, 256),
        (576, 256),
        (256, 256),
        (255, 64),
        (64, 64),
    ] {
        assert_eq!(
            shape(Kernel::Norm(Norm::Rms), rows(7, cols)),
            ((7, 1, 1), (threads, 1, 1)),
            "{cols} columns"
        );
        assert_eq!(
            shape(Kernel::Norm(Norm::Layer), rows(7, cols)),
            ((7, 1, 1), (threads, 1, 1)),
            "{cols} columns"
        );
    }
    for k in [
        Kernel::Rope(Rope::Plain),
        Kernel::Attention(Attention::KvStore),
        Kernel::Elementwise(Elementwise::Swiglu),
        Kernel::Elementwise(Elementwise::Gelu),
        Kernel::Elementwise(Elementwise::AddAssign),
    ] {
        assert_eq!(shape(k, Work::Elements(256)), ((1, 1, 1), (256, 1, 1)));
        assert_eq!(shape(k, Work::Elements(257)), ((2, 1, 1), (256, 1, 1)));
        assert_eq!(
            shape(k, Work::Elements(1536 * 64)),
            ((384, 1, 1), (256, 1, 1))
        );
    }
    assert_eq!(
        shape(
            Kernel::Attention(Attention::Attention),
            Work::Heads { n: 5, n_head: 9 }
        ),
        ((5, 9, 1), (256, 1, 1))
    );
    // Column ranges along z.
    let split = Work::SplitMatrix {
        rows: 4096,
        n: 40,
        splits: 9,
    };
    let tck = launch_config(Kernel::Gemm(Gemm::Tck(GgmlType::Q4K)), split).unwrap();
    assert_eq!((tck.grid_dim, tck.block_dim), ((32, 1, 9), (256, 1, 1)));
    // 64 query rows a block, with its dynamic shared memory.
    let tc = launch_config(
        Kernel::AttentionTc(AttentionTc::AttentionTc),
        Work::Heads { n: 65, n_head: 9 },
    )
    .unwrap();
    assert_eq!((tc.grid_dim, tc.block_dim), ((2, 9, 1), (128, 1, 1)));
    assert_eq!(tc.shared_mem_bytes, (2 * 64 + 2 * 64) * 136 * 2);
    let chunks = Work::Chunks {
        n_head_kv: 8,
        nsplit: 33,
    };
    for k in [
        Kernel::AttentionSplit(AttentionSplit::Scalar(2, 4)),
        Kernel::AttentionSplit(AttentionSplit::Tc(2)),
    ] {
        assert_eq!(shape(k, chunks), ((8, 33, 1), (128, 1, 1)));
    }
    assert_eq!(
        shape(
            Kernel::AttentionSplit(AttentionSplit::Combine),
            rows(32, 128)
        ),
        ((32, 1, 1), (512, 1, 1))
    );
    for k in [
        Kernel::Sample(Sample::Select),
        Kernel::Sample(Sample::Logprobs),
    ] {
        assert_eq!(shape(k, Work::Single), ((1, 1, 1), (1024, 1, 1)));
    }
    // A batched step's sampling: a block per sequence.
    assert_eq!(
        shape(Kernel::Sample(Sample::SelectRows), rows(16, 151_936)),
        ((16, 1, 1), (1024, 1, 1))
    );
    // Greedy sampling: eight logits a thread, at most 256 blocks.
    for (n, blocks) in [(1, 1), (2048, 1), (2049, 2), (262_144, 128), (600_001, 256)] {
        assert_eq!(
            shape(Kernel::Sample(Sample::Argmax), Work::Elements(n)),
            ((blocks, 1, 1), (256, 1, 1)),
            "sample_argmax over {n}"
        );
    }
    // Before attention: a block per (row, head of Q or K), as wide as
    // rms_norm's for a head-wide row.
    let heads = |n, heads, head_dim| Work::HeadRows { n, heads, head_dim };
    assert_eq!(
        shape(Kernel::Rope(Rope::QkRopeStore), heads(1, 12, 64)),
        ((1, 12, 1), (64, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Rope(Rope::QkRopeStore), heads(70, 5, 256)),
        ((70, 5, 1), (256, 1, 1))
    );
    // A mixture of experts (gpt-oss-20b's widths): the router's choice a
    // warp per row, four rows a block; the chosen experts' mat-vec over
    // (weight rows, pairs, gate and up along z), on the integer units two
    // weight rows a block of four warps (2880 columns: 90 units a row, more
    // than two warps cover); the grouped GEMM a block
    // per 128 weight rows and tile of pairs, with gemm_tck's shared memory.
    assert_eq!(
        shape(Kernel::Elementwise(Elementwise::MoeRoute), rows(9, 32)),
        ((3, 1, 1), (128, 1, 1))
    );
    let experts = |matrices| Work::Experts {
        rows: 2880,
        cols: 2880,
        slots: 4,
        matrices,
    };
    let mxfp4 = GgmlType::Mxfp4;
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVecExperts(mxfp4)), experts(2)),
        ((360, 4, 2), (256, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVecExperts(mxfp4)), experts(1)),
        ((360, 4, 1), (256, 1, 1))
    );
    assert_eq!(
        shape(Kernel::Matvec(Matvec::MatVec8Experts(mxfp4)), experts(2)),
        ((1440, 4, 2), (128, 1, 1))
    );
    let tiles = Work::ExpertTiles {
        rows: 2880,
        tiles: 41,
    };
    let g = launch_config(Kernel::Gemm(Gemm::Moe(mxfp4)), tiles).unwrap();
    assert_eq!((g.grid_dim, g.block_dim), ((23, 41, 1), (256, 1, 1)));
    assert_eq!(
        g.shared_mem_bytes,
        crate::backend::cuda::source::GTC_SMEM_BYTES
    );
    assert_eq!(
        shape(
            Kernel::Elementwise(Elementwise::MoeGatherF16),
            Work::Elements(2048 * 2880 / 8)
        ),
        ((2880, 1, 1), (256, 1, 1))
    );
}

#[test]
fn launches_past_the_grid_limits_are_refused() {
    let refused = |k: Kernel, work: Work| match launch_config(k, work) {
        Err(BackendError::Shape(_)) => {}
        other => panic!("{k:?} over {work:?}: expected a refusal, got {other:?}"),
    };
    refused(
        Kernel::Matmul(Matmul::Gemm(GgmlType::F32)),
        Work::Matrix {
            rows: 64,
            n: 65535 * 64 + 1,
        },
    );
    refused(
        Kernel::Attention(Attention::Attention),
        Work::Heads {
            n: 1,
            n_head: 65536,
        },
    );
    refused(
        Kernel::Attention(Attention::Attention),
        Work::Heads {
            n: 65535 * 1024 + 1,
            n_head: 1,
        },
    );
    refused(
        Kernel::AttentionTc(AttentionTc::AttentionTc),
        Work::Heads {
            n: 1,
            n_head: 65536,
        },
    );
    refused(
        Kernel::Matvec(Matvec::MatVecExperts(GgmlType::Mxfp4)),
        Work::Experts {
            rows: 8,
            cols: 64,
            slots: 65536,
            matrices: 1,
        },
    );
    refused(
        Kernel::Matvec(Matvec::MatVecExperts(GgmlType::Mxfp4)),
        Work::Experts {
            rows: 8,
            cols: 64,
            slots: 1,
            matrices: 3,
        },
    );
    refused(
        Kernel::Gemm(Gemm::Moe(GgmlType::Mxfp4)),
        Work::ExpertTiles {
            rows: 128,
            tiles: 65536,
        },
    );
    refused(Kernel::Elementwise(Elementwise::Gelu), Work::Elements(0));
    refused(
        Kernel::Elementwise(Elementwise::Gelu),
        Work::Elements(256 * (u32::MAX as usize + 1)),
    );
    assert!(launch_config(
        Kernel::Matmul(Matmul::Gemm(GgmlType::F32)),
        Work::Matrix {
            rows: 64,
            n: 65535 * 64
        }
    )
    .is_ok());
    // A kernel over a problem it is not laid out for is an internal error, not a launch.
    assert!(matches!(
        launch_config(Kernel::Norm(Norm::Rms), Work::Single),
        Err(BackendError::KernelLaunchFailed(_))
    ));
}

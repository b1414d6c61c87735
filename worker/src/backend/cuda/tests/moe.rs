//! The mixture-of-experts feed-forward (`Ops::moe`) on both backends, in
//! gpt-oss's form (biases, the clamped SwiGLU) and Qwen3-MoE's (no biases,
//! SwiGLU): the router's choice, the chosen experts' products, the
//! activation and the weighted sum, for one row (decode) and many (prefill).

use super::matmul::restore_matmul_choice;
use super::*;
use crate::backend::cuda::kernels::{
    ExpertGemmArgs, ExpertMatVec8Call, ExpertMatVecArgs, KernelCall, MoeGatherF16Args,
    MoeRouteArgs, Stored, X8Bufs,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::MOE_MAX_EXPERTS;
use crate::model::ops::{ExpertAct, MoeWeights};

/// One layer's router, experts and biases on both backends; `act` and
/// whether the biases are passed make the family (gpt-oss or Qwen3-MoE).
struct Experts {
    router: TestWeight,
    router_bias: TestWeight,
    gate: TestWeight,
    gate_bias: TestWeight,
    up: TestWeight,
    up_bias: TestWeight,
    down: TestWeight,
    down_bias: TestWeight,
    act: ExpertAct,
}

impl Experts {
    #[allow(clippy::too_many_arguments)]
    fn random(
        ops: &mut CudaOps,
        rng: &mut ChaCha8Rng,
        router_ty: GgmlType,
        ty: GgmlType,
        act: ExpertAct,
        experts: usize,
        d: usize,
        ff: usize,
    ) -> Experts {
        let mut w = |ty, rows: usize, cols: usize, scale: f32| {
            let v = random_vec(rng, rows * cols, scale);
            test_weight(ops, ty, rows, cols, &v)
        };
        Experts {
            router: w(router_ty, experts, d, 0.2),
            router_bias: w(GgmlType::F32, 1, experts, 0.5),
            // Gate products past the clamp's 7 at some rows, below it at most.
            gate: w(ty, experts * ff, d, 0.3),
            gate_bias: w(GgmlType::F32, experts, ff, 0.5),
            up: w(ty, experts * ff, d, 0.3),
            up_bias: w(GgmlType::F32, experts, ff, 0.5),
            down: w(ty, experts * d, ff, 0.05),
            down_bias: w(GgmlType::F32, experts, d, 0.1),
            act,
        }
    }

    /// The biases where the family has them (gpt-oss's clamped SwiGLU).
    fn biased(&self) -> bool {
        self.act == ExpertAct::SwiGluOai
    }

    fn cpu<'a>(&'a self, experts: usize, used: usize) -> MoeWeights<'a, CpuWeight> {
        let on = self.biased();
        let bias = |b: &'a TestWeight| on.then_some(&b.cpu);
        MoeWeights {
            gate: &self.gate.cpu,
            gate_bias: bias(&self.gate_bias),
            up: &self.up.cpu,
            up_bias: bias(&self.up_bias),
            down: &self.down.cpu,
            down_bias: bias(&self.down_bias),
            experts,
            used,
            act: self.act,
        }
    }

    fn gpu<'a>(&'a self, experts: usize, used: usize) -> MoeWeights<'a, CudaWeight> {
        let on = self.biased();
        let bias = |b: &'a TestWeight| on.then_some(&b.gpu);
        MoeWeights {
            gate: &self.gate.gpu,
            gate_bias: bias(&self.gate_bias),
            up: &self.up.gpu,
            up_bias: bias(&self.up_bias),
            down: &self.down.gpu,
            down_bias: bias(&self.down_bias),
            experts,
            used,
            act: self.act,
        }
    }
}

/// GPU vs CPU `moe` for 1, 3 and 70 rows of x: gpt-oss's small preset's
/// layout (experts in MXFP4, the router in F32), gpt-oss-20b's width with
/// fewer experts, and another expert format; Qwen3-MoE's (no biases,
/// SwiGLU, 8 of 32 experts in Q4_K and Q6_K); the few rows' products on the
/// integer units (`mv8e_*`) and, with them off, on `mv1e_*`; deterministic
/// over runs.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn moe_matches_cpu_for_decode_and_prefill_rows() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let (f32_, mxfp4, q8) = (GgmlType::F32, GgmlType::Mxfp4, GgmlType::Q8_0);
    let (oai, silu) = (ExpertAct::SwiGluOai, ExpertAct::SwiGlu);
    // (router format, expert format, activation, experts, used, n_embd, n_ff)
    let cases = [
        (f32_, mxfp4, oai, 4, 2, 256, 256),
        (f32_, mxfp4, oai, 8, 4, 2880, 512),
        (q8, q8, oai, 6, 3, 128, 96),
        (f32_, GgmlType::Q4K, silu, 32, 8, 512, 256),
        (f32_, GgmlType::Q6K, silu, 32, 8, 256, 256),
    ];
    let mut worst = 0f64;
    for (router_ty, ty, act, experts, used, d, ff) in cases {
        let w = Experts::random(&mut ops, &mut rng, router_ty, ty, act, experts, d, ff);
        let runs = [(1, true), (1, false), (3, true), (3, false), (70, true)];
        for (n, mv8) in runs {
            dev().kernels.set_mv8(mv8);
            let xv = random_vec(&mut rng, n * d, 1.0);
            // The router's logits as the graph makes them, on each backend.
            let cx = cpu_buf(n, d, xv.clone());
            let mut cl = cpu_buf(n, experts, vec![0.0; n * experts]);
            let mut want = cpu_buf(n, d, vec![0.0; n * d]);
            CpuOps
                .matmul(&cx, &w.router.cpu, Some(&w.router_bias.cpu), &mut cl)
                .unwrap();
            CpuOps
                .moe(&cx, &cl, w.cpu(experts, used), &mut want)
                .unwrap();
            let x = ops.upload(n, d, &xv).unwrap();
            let mut logits = ops.buf(n, experts).unwrap();
            let mut out = ops.buf(n, d).unwrap();
            ops.matmul(&x, &w.router.gpu, Some(&w.router_bias.gpu), &mut logits)
                .unwrap();
            ops.moe(&x, &logits, w.gpu(experts, used), &mut out)
                .unwrap();
            let got = host(&mut ops, &out);
            let e = rel_err(&got, &want.data);
            assert!(
                e <= 1e-3,
                "moe {act:?} {used} of {experts} {ty} experts, {d}x{ff}, {n} rows, mv8 {mv8}: relative error {e:e}"
            );
            worst = worst.max(e);
            assert_deterministic("moe", || {
                ops.moe(&x, &logits, w.gpu(experts, used), &mut out)
                    .unwrap();
                host(&mut ops, &out)
            });
        }
        // More experts used than there are is refused before any launch.
        let x = ops.buf(1, d).unwrap();
        let logits = ops.buf(1, experts).unwrap();
        let mut out = ops.buf(1, d).unwrap();
        let too_many = w.gpu(experts, experts + 1);
        assert!(ops.moe(&x, &logits, too_many, &mut out).is_err());
    }
    restore_matmul_choice();
    eprintln!("moe: max relative error {worst:.2e}");
}

fn stored_at(ty: GgmlType, rows: usize, cols: usize) -> Stored {
    Stored {
        ty,
        ptr: DevPtr::new(0x1000),
        row_bytes: ty.bytes_for(cols as u64).unwrap_or(1) as usize,
        rows,
        cols,
    }
}

/// Every launch of the experts' kernels is checked before it is queued
/// (M0-W-1431): shapes that do not split into experts, a second matrix
/// of another shape, pairs over rows of x that do not divide, more
/// experts than the router holds, formats without f16 tiles.
#[test]
fn expert_launches_refuse_shapes_that_do_not_fit() {
    let mxfp4 = GgmlType::Mxfp4;
    let mv = ExpertMatVecArgs {
        w: stored_at(mxfp4, 4 * 64, 256),
        experts: 4,
        ids: DevPtr::new(0x2000),
        slots: 6,
        x: DevPtr::new(0x3000),
        x_div: 2,
        bias: None,
        out: DevPtrMut::new(0x4000),
        second: None,
    };
    assert!(mv.check().is_ok());
    assert_eq!(mv.rows(), 64);
    assert!(ExpertMatVecArgs { experts: 3, ..mv }.check().is_err());
    assert!(ExpertMatVecArgs { x_div: 4, ..mv }.check().is_err());
    assert!(ExpertMatVecArgs { slots: 0, ..mv }.check().is_err());
    let second = |w: Stored| ExpertMatVecArgs {
        second: Some((w, None, DevPtrMut::new(0x5000))),
        ..mv
    };
    assert!(second(stored_at(mxfp4, 4 * 64, 256)).check().is_ok());
    assert!(second(stored_at(mxfp4, 4 * 32, 256)).check().is_err());
    assert!(second(stored_at(GgmlType::Q8_0, 4 * 64, 256))
        .check()
        .is_err());
    // On the integer units: the same checks, and whole 32-value groups
    // of a format with a unit.
    let x8 = X8Bufs::at(0x6000, 6 * 256);
    let mv8 = |args: ExpertMatVecArgs| ExpertMatVec8Call { args, x8 }.check();
    assert!(mv8(mv).is_ok());
    assert!(mv8(ExpertMatVecArgs { x_div: 4, ..mv }).is_err());
    assert!(mv8(second(stored_at(mxfp4, 4 * 32, 256))).is_err());
    for (ty, cols, ok) in [(GgmlType::Q8_0, 256, true), (mxfp4, 240, false)] {
        let w = stored_at(ty, 4 * 64, cols);
        assert_eq!(mv8(ExpertMatVecArgs { w, ..mv }).is_ok(), ok, "{ty} {cols}");
    }
    assert!(mv8(ExpertMatVecArgs {
        w: stored_at(GgmlType::F16, 4 * 64, 256),
        ..mv
    })
    .is_err());

    let route = MoeRouteArgs {
        logits: DevPtr::new(0x1000),
        n: 3,
        experts: 32,
        used: 4,
        ids: DevPtrMut::new(0x2000),
        weights: DevPtrMut::new(0x3000),
    };
    assert!(route.check().is_ok());
    assert!(MoeRouteArgs { used: 33, ..route }.check().is_err());
    let too_many = MOE_MAX_EXPERTS + 1;
    assert!(MoeRouteArgs {
        experts: too_many,
        ..route
    }
    .check()
    .is_err());

    let gemm = ExpertGemmArgs {
        w: stored_at(mxfp4, 4 * 64, 256),
        experts: 4,
        tiles: DevPtr::new(0x2000),
        n_tiles: 5,
        xh: DevPtr::new(0x3000),
        m: 200,
        bias: None,
        out: DevPtrMut::new(0x4000),
    };
    assert!(gemm.check().is_ok());
    assert!(ExpertGemmArgs {
        w: stored_at(mxfp4, 4 * 64, 96),
        ..gemm
    }
    .check()
    .is_ok());
    assert!(ExpertGemmArgs {
        w: stored_at(mxfp4, 4 * 64, 80),
        ..gemm
    }
    .check()
    .is_err());
    assert!(ExpertGemmArgs {
        w: stored_at(GgmlType::F16, 4 * 64, 256),
        ..gemm
    }
    .check()
    .is_err());
    assert!(ExpertGemmArgs {
        xh: DevPtr::new(0x3008),
        ..gemm
    }
    .check()
    .is_err());

    let gather = MoeGatherF16Args {
        x: DevPtr::new(0x1000),
        order: DevPtr::new(0x2000),
        used: 4,
        cols: 256,
        m: 12,
        hi: DevPtrMut::new(0x3000),
        lo: DevPtrMut::new(0x4000),
    };
    assert!(gather.check().is_ok());
    assert!(MoeGatherF16Args { cols: 12, ..gather }.check().is_err());
    assert!(MoeGatherF16Args {
        x: DevPtr::new(0x1010),
        ..gather
    }
    .check()
    .is_err());
}

//! gpt-oss's mixture-of-experts feed-forward (`Ops::moe`) on both backends:
//! the router's choice, the chosen experts' products, the clamped SwiGLU and
//! the weighted sum, for one row (decode) and many (prefill).

use super::matmul::restore_matmul_choice;
use super::*;
use crate::model::ops::MoeWeights;

/// One layer's router, experts and biases on both backends.
struct Experts {
    router: TestWeight,
    router_bias: TestWeight,
    gate: TestWeight,
    gate_bias: TestWeight,
    up: TestWeight,
    up_bias: TestWeight,
    down: TestWeight,
    down_bias: TestWeight,
}

impl Experts {
    #[allow(clippy::too_many_arguments)]
    fn random(
        ops: &mut CudaOps,
        rng: &mut ChaCha8Rng,
        router_ty: GgmlType,
        ty: GgmlType,
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
        }
    }

    fn cpu(&self, experts: usize, used: usize) -> MoeWeights<'_, CpuWeight> {
        MoeWeights {
            gate: &self.gate.cpu,
            gate_bias: &self.gate_bias.cpu,
            up: &self.up.cpu,
            up_bias: &self.up_bias.cpu,
            down: &self.down.cpu,
            down_bias: &self.down_bias.cpu,
            experts,
            used,
        }
    }

    fn gpu(&self, experts: usize, used: usize) -> MoeWeights<'_, CudaWeight> {
        MoeWeights {
            gate: &self.gate.gpu,
            gate_bias: &self.gate_bias.gpu,
            up: &self.up.gpu,
            up_bias: &self.up_bias.gpu,
            down: &self.down.gpu,
            down_bias: &self.down_bias.gpu,
            experts,
            used,
        }
    }
}

/// GPU vs CPU `moe` for 1, 3 and 70 rows of x: gpt-oss's small preset's
/// layout (experts in MXFP4, the router in F32), gpt-oss-20b's width with
/// fewer experts, and another expert format; the few rows' products on the
/// integer units (`mv8e_*`) and, with them off, on `mv1e_*`; deterministic
/// over runs.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn moe_matches_cpu_for_decode_and_prefill_rows() {
    let _gpu = shared_gpu();
    let mut ops = gpu_ops();
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let (f32_, mxfp4, q8) = (GgmlType::F32, GgmlType::Mxfp4, GgmlType::Q8_0);
    // (router format, expert format, experts, used, n_embd, n_ff)
    let cases = [
        (f32_, mxfp4, 4, 2, 256, 256),
        (f32_, mxfp4, 8, 4, 2880, 512),
        (q8, q8, 6, 3, 128, 96),
    ];
    let mut worst = 0f64;
    for (router_ty, ty, experts, used, d, ff) in cases {
        let w = Experts::random(&mut ops, &mut rng, router_ty, ty, experts, d, ff);
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
                "moe {used} of {experts} {ty} experts, {d}x{ff}, {n} rows, mv8 {mv8}: relative error {e:e}"
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

//! Decode steps replayed from a CUDA graph against eager decode.

use super::*;
use crate::model::synthetic::{synthetic_model, SYNTHETIC_ARCHS};

/// Decode steps replayed from the captured graph give the same bits as the
/// same steps launched one by one.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn graph_decode_is_bit_identical_to_eager_decode() {
    let _gpu = shared_gpu();
    for arch in SYNTHETIC_ARCHS {
        let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, 30, 512)).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let mut gpu =
            CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 384) as u32).collect();
        let run = |gpu: &mut CudaBackend, graphs: bool| {
            gpu.set_decode_graphs(graphs);
            gpu.begin_sequence(300).unwrap();
            let mut all = Vec::new();
            let mut out = Vec::new();
            gpu.forward(&tokens[..20], Logits::Last, &mut out, None)
                .unwrap();
            all.extend_from_slice(&out);
            // Long enough for attention to pass its 128-key chunk.
            for i in 0..150 {
                gpu.forward(&[tokens[20 + i % 20]], Logits::Last, &mut out, None)
                    .unwrap();
                all.extend_from_slice(&out);
            }
            assert_eq!(gpu.decoding_with_graph(), graphs);
            gpu.end_sequence();
            all
        };
        let with = run(&mut gpu, true);
        let without = run(&mut gpu, false);
        assert!(
            bits(&with) == bits(&without),
            "{arch}: graph replay differs from eager decode"
        );
        let again = run(&mut gpu, true);
        assert!(
            bits(&with) == bits(&again),
            "{arch}: graph replay is not deterministic"
        );
        // Programmatic dependent launch off: each kernel is scheduled only
        // once the one ahead has ended. The same bits: every kernel waits
        // (`pdl_start`) before it reads what the one ahead wrote.
        let kernels = &gpu.ops.dev.kernels;
        let was = kernels.pdl();
        kernels.set_pdl(false);
        let serial = run(&mut gpu, false);
        gpu.ops.dev.kernels.set_pdl(was);
        assert!(
            bits(&with) == bits(&serial),
            "{arch}: launches that may overlap differ from launches one after another"
        );
        // Attention split over the context from position 80 on: the graph is
        // captured again when the context reaches it, and still matches
        // eager decode, which switches at the same position.
        gpu.ops.dev.kernels.set_split_min_context(80);
        let with = run(&mut gpu, true);
        let without = run(&mut gpu, false);
        gpu.ops
            .dev
            .kernels
            .set_split_min_context(kernels::SPLIT_MIN_CONTEXT);
        assert!(
            bits(&with) == bits(&without),
            "{arch}: graph replay with split attention differs from eager decode"
        );
    }
}

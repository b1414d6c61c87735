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
            let seq = gpu.open(300).unwrap();
            let mut all = Vec::new();
            let mut out = Vec::new();
            gpu.forward(seq, &tokens[..20], Logits::Last, &mut out, None)
                .unwrap();
            all.extend_from_slice(&out);
            // Long enough for attention to pass its 128-key chunk.
            for i in 0..150 {
                let token = tokens[20 + i % 20];
                gpu.forward(seq, &[token], Logits::Last, &mut out, None)
                    .unwrap();
                all.extend_from_slice(&out);
            }
            assert_eq!(gpu.decoding_with_graph(seq), graphs);
            gpu.close(seq);
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

/// Batched decode steps replayed from graphs (`graph::RowsGraphs`, one a
/// padded row count and chunk bound, any sequences) give the logits of the
/// same steps run eagerly, bit for bit: three sequences of different
/// lengths joining and leaving the batch, one of them past several chunks
/// of attention (its own bound), for every synthetic architecture but the
/// mixture of experts (which decodes rows one by one); the graphs go when
/// the last sequence ends.
#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn rows_graphs_are_bit_identical_to_eager_rows() {
    let _gpu = shared_gpu();
    for arch in SYNTHETIC_ARCHS {
        let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, 30, 512)).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let experts = cfg.moe.is_some();
        let mut gpu =
            CudaBackend::load(cfg, &file, &CudaLoadOptions::default(), &mut |_| {}).unwrap();
        gpu.set_max_sequences(3).unwrap();
        let prompts: [Vec<u32>; 3] = [
            (0..5).map(|i| i * 11 % 384).collect(),
            (0..300).map(|i| i * 37 % 384).collect(),
            (0..40).map(|i| i * 7 % 384).collect(),
        ];
        let run = |gpu: &mut CudaBackend, graphs: bool| {
            gpu.set_decode_graphs(graphs);
            let mut seqs = Vec::new();
            for prompt in &prompts {
                let seq = gpu.open(480).unwrap();
                gpu.forward(seq, prompt, Logits::None, &mut Vec::new(), None)
                    .unwrap();
                seqs.push(seq);
            }
            let mut all = Vec::new();
            for step in 0..140u32 {
                // All three, then two, then one, as jobs join and leave.
                let rows: Vec<(SeqId, u32)> = match step % 4 {
                    0 | 1 => vec![(seqs[0], step), (seqs[1], step + 1), (seqs[2], step + 2)],
                    2 => vec![(seqs[2], step), (seqs[0], step + 3)],
                    _ => vec![(seqs[1], step)],
                };
                gpu.decode(&rows).unwrap();
                for &(seq, _) in &rows {
                    all.extend(gpu.sampler(seq).unwrap().download_logits().unwrap());
                }
            }
            let captured = gpu.rows_graphs.captured();
            for seq in seqs {
                gpu.close(seq);
            }
            // No sequence open: the graphs are gone.
            assert_eq!(gpu.rows_graphs.captured(), 0);
            (all, captured)
        };
        let (eager, _) = run(&mut gpu, false);
        let (with, captured) = run(&mut gpu, true);
        assert!(
            bits(&with) == bits(&eager),
            "{arch}: batched steps from graphs differ from eager ones"
        );
        if experts {
            assert_eq!(captured, 0, "{arch}: experts decode rows one by one");
            continue;
        }
        // Three row counts padded to one step of 8; three chunk bounds (the
        // long sequence's 4; the others', 1, then 2 past 128 positions).
        assert_eq!(captured, 3, "{arch}: graphs captured");
        assert!(!gpu.rows_graphs.failed, "{arch}: a capture failed");
        let (again, _) = run(&mut gpu, true);
        assert!(
            bits(&again) == bits(&with),
            "{arch}: replays are not deterministic"
        );
    }
}

//! `harness synth-model`'s files against this worker on the CPU backend: the
//! tiny presets in every format load, their weights dequantize (through this
//! crate's own dequantizer, not the generator's arithmetic) to the intended
//! statistics, a short greedy run gives finite logits with a real spread, and
//! the reference tokenizer padded to Qwen2's 151936 tokens still encodes the
//! golden vectors exactly (testdata/golden/tokenize.json).

mod common;

use std::path::Path;

use harness::synth::{self, Format, Init};
use worker_orcd::backend::Logits;
use worker_orcd::gguf::{file_type_name, GgufFile};
use worker_orcd::load::{load_model, LoadOptions};
use worker_orcd::quant::{dequantize, GgmlType};
use worker_orcd::tokenizer::Tokenizer;

/// Mean and standard deviation.
fn moments(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Every tensor reads back with the statistics `synth` meant for it.
fn check_weights(path: &Path, preset: &synth::Preset, format: Format) {
    let file = GgufFile::open(path).unwrap();
    for spec in synth::tensors(preset, format) {
        let info = file
            .tensor(&spec.name)
            .unwrap_or_else(|| panic!("{} missing", spec.name));
        let ty = GgmlType::from_id(spec.format.ggml_type()).unwrap();
        assert_eq!(info.ggml_type, ty, "{}", spec.name);
        // The first 64 Ki values are plenty for the moments, and keep F32 fast.
        let n = (spec.values() as usize).min(1 << 16);
        let bytes = ty.bytes_for(n as u64).unwrap() as usize;
        let mut v = vec![0f32; n];
        dequantize(ty, &file.tensor_data(info)[..bytes], &mut v).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{}: not finite", spec.name);
        let (mean, std) = moments(&v);
        let what = format!(
            "{} {}: mean {mean:.5} std {std:.5}",
            format.name(),
            spec.name
        );
        match spec.init {
            Init::Matrix { std: want } => {
                let want = want as f64;
                assert!(
                    mean.abs() < 0.05 * want,
                    "{what}, want 0 ± {:.5}",
                    0.05 * want
                );
                assert!(
                    (0.85 * want..1.15 * want).contains(&std),
                    "{what}, want {want:.5}"
                );
            }
            Init::Norm => assert!((mean - 1.0).abs() < 0.01 && std < 0.1, "{what}"),
            Init::Bias => assert!(mean.abs() < 0.01 && std < 0.05, "{what}"),
            Init::Factors(table) => assert_eq!(v, table.values(n), "{what}"),
        }
    }
}

fn golden_vectors_encode(tok: &Tokenizer) {
    let path = common::workspace_root().join("testdata/golden/tokenize.json");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 66);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let parse_special = c["parse_special"].as_bool().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true, parse_special).unwrap();
        assert_eq!(got, want, "{} (parse_special={parse_special})", c["name"]);
        assert_eq!(tok.decode(&got).unwrap(), text, "{}", c["name"]);
    }
}

#[test]
fn tiny_presets_load_and_run_in_every_format() {
    let Some(reference) = common::reference_model() else {
        return;
    };
    let _turn = common::model_turn();
    let dir = tempfile::tempdir().unwrap();
    // SmolLM2's chat prompt for "Hello" (from the goldens' ids), then greedy steps.
    let prompt: Vec<u32> = Tokenizer::from_gguf(&GgufFile::open(&reference).unwrap().metadata)
        .unwrap()
        .encode(
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
            true,
            true,
        )
        .unwrap();
    for name in ["tiny-llama", "tiny-qwen2"] {
        let preset = synth::preset(name).unwrap();
        for (k, format) in Format::ALL.into_iter().enumerate() {
            let path = dir.path().join(format!("{name}-{}.gguf", format.name()));
            let opts = synth::Options {
                preset,
                format,
                seed: 7,
                threads: 2,
            };
            synth::write_file(&opts, &reference, &path).unwrap();
            check_weights(&path, preset, format);

            let mut m = load_model(&path, &LoadOptions::default(), &mut |_| {})
                .unwrap_or_else(|e| panic!("{name} {}: {e}", format.name()));
            assert_eq!(m.info.vocab_size, preset.vocab as usize);
            assert_eq!(m.tokenizer.vocab_size(), preset.vocab as usize);
            assert_eq!(m.info.architecture, preset.arch.name());
            assert_eq!(
                Some(m.info.quant_kind.as_str()),
                file_type_name(format.file_type())
            );
            if k == 0 {
                golden_vectors_encode(&m.tokenizer);
            }

            let vocab = m.info.vocab_size;
            let mut tokens = prompt.clone();
            let mut logits = Vec::new();
            let seq = m.backend.open(tokens.len() + 8).unwrap();
            m.backend
                .forward(seq, &tokens, Logits::Last, &mut logits, None)
                .unwrap();
            let mut spreads = Vec::new();
            for _ in 0..4 {
                assert_eq!(logits.len(), vocab);
                assert!(
                    logits.iter().all(|x| x.is_finite()),
                    "{name} {}: non-finite logits",
                    format.name()
                );
                let (_, std) = moments(&logits);
                spreads.push(std);
                let next = (0..vocab)
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                    .unwrap() as u32;
                tokens.push(next);
                m.backend
                    .forward(seq, &[next], Logits::Last, &mut logits, None)
                    .unwrap();
            }
            m.backend.close(seq);
            eprintln!(
                "{name} {}: logit std per step {spreads:.3?}, greedy {:?}",
                format.name(),
                &tokens[prompt.len()..]
            );
            // Unit-scale weights give logits of about unit spread.
            assert!(
                spreads.iter().all(|&s| (0.2..5.0).contains(&s)),
                "{name} {}: logit std {spreads:?}",
                format.name()
            );
            std::fs::remove_file(&path).unwrap();
        }
    }
}

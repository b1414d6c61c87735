use super::*;

#[test]
fn the_file_is_a_function_of_preset_format_and_seed() {
    for (name, f) in [
        ("tiny-llama", Format::Q4_1),
        ("tiny-llama", Format::Q6K),
        ("tiny-llama", Format::BF16),
        ("tiny-phi3", Format::Q4K),
        ("tiny-gpt2", Format::Q8_0),
    ] {
        let one = written(&options(name, f, 5, 1));
        assert_eq!(
            one,
            written(&options(name, f, 5, 3)),
            "{name} {}: thread count",
            f.name()
        );
        assert_ne!(
            one,
            written(&options(name, f, 6, 3)),
            "{name} {}: seed",
            f.name()
        );
    }
}

#[test]
fn a_written_file_parses_with_its_tensors_in_place() {
    for (name, f) in [
        ("tiny-qwen2", Format::Q5K),
        ("tiny-llama", Format::F16),
        ("tiny-gpt2", Format::Q4K),
        ("tiny-phi3", Format::F16),
        ("tiny-qwen3moe", Format::Q4K),
    ] {
        let o = options(name, f, 1, 2);
        let bytes = written(&o);
        let g = Gguf::parse(bytes.clone()).unwrap();
        let specs = tensors(o.preset, f);
        let sum: u64 = specs.iter().map(TensorSpec::bytes).sum();
        assert_eq!(g.total_tensor_bytes().unwrap(), sum);
        let (offsets, data) = layout(&specs);
        assert_eq!((bytes.len() - g.data_offset) as u64, data, "{name}");
        // Padding only where a tensor's size is not a multiple of the alignment
        // (tiny-gpt2's Q4_K token_embd: 50257 rows of 144 bytes).
        assert_eq!(data == sum, name != "tiny-gpt2", "{name}");
        for (t, &off) in specs.iter().zip(&offsets) {
            assert_eq!(off % ALIGNMENT, 0, "{name}: {}", t.name);
        }
        for ((t, s), off) in g.tensors.iter().zip(&specs).zip(&offsets) {
            assert_eq!(
                (&t.name, &t.dims, t.ttype, t.offset),
                (&s.name, &s.dims, s.format.ggml_type(), *off)
            );
        }
        let arch = o.preset.arch.name();
        assert_eq!(g.string("general.architecture").as_deref(), Some(arch));
        assert_eq!(
            g.u64_value("general.file_type"),
            Some(u64::from(f.file_type()))
        );
        // The converter writes vocab_size for llama, not for phi3 or gpt2.
        let vocab_key = matches!(
            o.preset.arch,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe
        );
        assert_eq!(
            g.u64_value(&format!("{arch}.vocab_size")),
            Some(o.preset.vocab).filter(|_| vocab_key)
        );
        assert_eq!(
            g.u64_value(&format!("{arch}.block_count")),
            Some(o.preset.n_layer)
        );
        assert_eq!(g.array_len("tokenizer.ggml.tokens"), Some(o.preset.vocab));
        assert_eq!(
            g.array_len("tokenizer.ggml.token_type"),
            Some(o.preset.vocab)
        );
        if o.preset.vocab_source == Vocab::Spm {
            assert_eq!(g.string("tokenizer.ggml.model").as_deref(), Some("llama"));
            assert_eq!(g.array_len("tokenizer.ggml.scores"), Some(o.preset.vocab));
            assert_eq!(g.u64_value("tokenizer.ggml.bos_token_id"), Some(2));
        } else {
            assert_eq!(g.array_len("tokenizer.ggml.merges"), Some(1));
            assert_eq!(g.u64_value("tokenizer.ggml.eos_token_id"), Some(0));
        }
        // Norm weights are F32 around 1.
        let norm = g
            .tensors
            .iter()
            .find(|t| t.name == "blk.1.ffn_norm.weight")
            .unwrap();
        let at = g.data_offset + norm.offset as usize;
        let v = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        assert!((0.85..1.15).contains(&v), "{v}");
    }
}

#[test]
fn a_file_is_renamed_into_place_only_when_complete() {
    let dir = std::env::temp_dir().join(format!("harness-synth-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let reference = dir.join("ref.gguf");
    std::fs::write(&reference, fake_reference().write()).unwrap();
    let out = dir.join("m.gguf");
    let o = options("tiny-llama", Format::Q4_0, 0, 2);
    let w = write_file(&o, &reference, &out).unwrap();
    assert_eq!(std::fs::metadata(&out).unwrap().len(), w.bytes);
    assert!(!dir.join("m.gguf.part").exists());
    let head = Gguf::read_header(&out).unwrap();
    assert_eq!(head.data_offset as u64, w.data_offset);
    assert_eq!(head.total_tensor_bytes().unwrap(), w.data_bytes);
    assert!(write_file(&o, &dir.join("missing.gguf"), &dir.join("x.gguf")).is_err());
    assert!(!dir.join("x.gguf.part").exists() && !dir.join("x.gguf").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// testdata/golden-synth's tiny files are what this generator writes: same
/// command, same sha256 (skipped where `.models` lacks a tokenizer source).
#[test]
fn the_golden_synth_files_are_reproduced_byte_for_byte() {
    use sha2::{Digest, Sha256};
    struct Hasher(Sha256);
    impl Write for Hasher {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut checked = 0;
    for name in ["tiny-phi3", "tiny-gpt2"] {
        for f in [Format::Q8_0, Format::Q4K, Format::F16] {
            let golden = root.join(format!("testdata/golden-synth/{name}-{}.json", f.name()));
            let g: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
            assert_eq!(
                g["synth_command"].as_str().unwrap(),
                format!(
                    "harness synth-model --preset {name} --format {} --seed 0 --out synthetic-{name}-{}.gguf",
                    f.name(),
                    f.name()
                )
            );
            let source = root.join(g["tokenizer_source"]["path"].as_str().unwrap());
            let Ok(reference) = Gguf::read_header(&source) else {
                eprintln!("skipped {name} {}: no {}", f.name(), source.display());
                continue;
            };
            let mut h = Hasher(Sha256::new());
            let w = write_to(&options(name, f, 0, 2), &reference, &mut h).unwrap();
            let sha: String = h.0.finalize().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(
                g["file_bytes"].as_u64(),
                Some(w.bytes),
                "{name} {}",
                f.name()
            );
            assert_eq!(
                g["file_sha256"].as_str(),
                Some(&sha[..]),
                "{name} {}",
                f.name()
            );
            checked += 1;
        }
    }
    eprintln!("{checked} of 6 files reproduced");
    // gpt-oss's vocabulary comes from tiktoken-rs: always reproducible.
    let golden = root.join("testdata/golden-synth/gpt-oss-Q8_0.json");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
    let mut h = Hasher(Sha256::new());
    let w = write_to(
        &options("gpt-oss", Format::Q8_0, 0, 2),
        &fake_reference(),
        &mut h,
    )
    .unwrap();
    let sha: String = h.0.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(g["file_bytes"].as_u64(), Some(w.bytes));
    assert_eq!(g["file_sha256"].as_str(), Some(&sha[..]));
}

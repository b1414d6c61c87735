use super::*;

/// A stand-in reference: a few tokens, token types, merges and ids.
pub(crate) fn fake_reference() -> Gguf {
    let mut g = Gguf::parse(crate::gguf::tests::tiny()).unwrap();
    let strings = |v: &[&str]| {
        let mut raw = STRING.to_le_bytes().to_vec();
        raw.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            raw.extend(string_raw(s));
        }
        raw
    };
    let tokens = ["<|endoftext|>", "a", "b", "ab"];
    let mut types = I32.to_le_bytes().to_vec();
    types.extend_from_slice(&4u64.to_le_bytes());
    for t in [3i32, 1, 1, 1] {
        types.extend_from_slice(&t.to_le_bytes());
    }
    g.kvs.extend([
        kv("tokenizer.ggml.model", STRING, string_raw("gpt2")),
        kv("tokenizer.ggml.tokens", ARRAY, strings(&tokens)),
        kv("tokenizer.ggml.token_type", ARRAY, types),
        kv("tokenizer.ggml.merges", ARRAY, strings(&["a b"])),
        kv(
            "tokenizer.ggml.eos_token_id",
            U32,
            0u32.to_le_bytes().to_vec(),
        ),
    ]);
    Gguf::parse(g.write()).unwrap()
}

fn options(name: &str, format: Format, seed: u64, threads: usize) -> Options {
    Options {
        preset: preset(name).unwrap(),
        format,
        seed,
        threads,
    }
}

fn written(o: &Options) -> Vec<u8> {
    let mut out = Vec::new();
    let w = write_to(o, &fake_reference(), &mut out).unwrap();
    assert_eq!(w.bytes, out.len() as u64);
    out
}

#[test]
fn every_preset_has_the_tensors_the_worker_binds() {
    for p in PRESETS {
        let t = tensors(p, p.default_format);
        let find = |n: &str| {
            t.iter()
                .find(|x| x.name == n)
                .unwrap_or_else(|| panic!("{}: no {n}", p.name))
        };
        let hd = p.n_embd / p.n_head;
        let (q, kv) = (p.n_head * hd, p.n_head_kv * hd);
        assert_eq!(find("token_embd.weight").dims, [p.n_embd, p.vocab]);
        assert_eq!(find("output_norm.weight").dims, [p.n_embd]);
        assert_eq!(
            t.iter().any(|x| x.name == "output.weight"),
            !p.tied,
            "{}",
            p.name
        );
        if !p.tied {
            assert_eq!(find("output.weight").dims, [p.n_embd, p.vocab]);
        }
        for i in 0..p.n_layer {
            let dims = |s: &str| find(&format!("blk.{i}.{s}")).dims.clone();
            assert_eq!(dims("attn_norm.weight"), [p.n_embd]);
            assert_eq!(dims("attn_q.weight"), [p.n_embd, q]);
            assert_eq!(dims("attn_k.weight"), [p.n_embd, kv]);
            assert_eq!(dims("attn_v.weight"), [p.n_embd, kv]);
            assert_eq!(dims("attn_output.weight"), [q, p.n_embd]);
            assert_eq!(dims("ffn_norm.weight"), [p.n_embd]);
            assert_eq!(dims("ffn_gate.weight"), [p.n_embd, p.n_ff]);
            assert_eq!(dims("ffn_up.weight"), [p.n_embd, p.n_ff]);
            assert_eq!(dims("ffn_down.weight"), [p.n_ff, p.n_embd]);
            if p.arch == Arch::Qwen2 {
                assert_eq!(dims("attn_q.bias"), [q]);
                assert_eq!(dims("attn_k.bias"), [kv]);
                assert_eq!(dims("attn_v.bias"), [kv]);
            }
        }
        let per_layer = if p.arch == Arch::Qwen2 { 12 } else { 9 };
        assert_eq!(
            t.len() as u64,
            2 + p.n_layer * per_layer + u64::from(!p.tied),
            "{}: nothing else",
            p.name
        );
        for x in &t {
            if x.dims.len() == 1 {
                assert_eq!(x.format, Format::F32, "{}: {} stays F32", p.name, x.name);
            }
            assert_eq!(x.dims[0] % x.format.block().0, 0, "{}: {}", p.name, x.name);
        }
    }
}

#[test]
fn real_shapes_are_the_published_ones() {
    let p = preset("qwen2.5-0.5b").unwrap();
    assert_eq!(
        (p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.vocab),
        (896, 24, 14, 2, 4864, 151_936)
    );
    assert!(p.tied && p.arch == Arch::Qwen2);
    let p = preset("llama-3-8b").unwrap();
    assert_eq!(
        (p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.vocab),
        (4096, 32, 32, 8, 14336, 128_256)
    );
    assert!(!p.tied);
    let p = preset("smollm2").unwrap();
    assert_eq!(
        (p.n_embd, p.n_layer, p.n_head, p.n_head_kv, p.n_ff, p.vocab),
        (576, 30, 9, 3, 1536, 49152)
    );
    // About 2 GB, as M0-W-1221 wants.
    let (_, data) = layout(&tensors(preset("llama-2gb").unwrap(), Format::Q4_1));
    assert!((1_900_000_000..2_300_000_000).contains(&data), "{data}");
    let (_, data) = layout(&tensors(preset("llama-3-8b").unwrap(), Format::Q4_1));
    assert!((4_500_000_000..5_200_000_000).contains(&data), "{data}");
}

#[test]
fn unknown_presets_list_the_known_ones() {
    let e = preset("phi3").unwrap_err().to_string();
    assert!(
        e.contains("unknown preset \"phi3\"") && e.contains("tiny-qwen2, smollm2"),
        "{e}"
    );
}

#[test]
fn blocks_have_ggml_sizes() {
    for f in Format::ALL {
        let (elems, bytes) = f.block();
        assert_eq!(
            crate::gguf::type_block(f.ggml_type()),
            Some((elems, bytes)),
            "{}",
            f.name()
        );
        let mut out = vec![0u8; f.bytes_for(512) as usize];
        blocks::fill(
            f,
            Init::Matrix { std: 0.1 },
            &mut blocks::Rng::for_chunk(0, 0, 0),
            &mut out,
        );
        assert_eq!(out.len() as u64, 512 / elems * bytes);
    }
    assert_eq!(Format::Q4K.bytes_for(256), 144);
    assert_eq!(Format::Q5K.bytes_for(256), 176);
    assert_eq!(Format::Q6K.bytes_for(256), 210);
    assert_eq!(Format::Q5_1.bytes_for(32), 24);
}

#[test]
fn the_file_is_a_function_of_preset_format_and_seed() {
    for f in [Format::Q4_1, Format::Q6K, Format::BF16] {
        let one = written(&options("tiny-llama", f, 5, 1));
        assert_eq!(
            one,
            written(&options("tiny-llama", f, 5, 3)),
            "{}: thread count",
            f.name()
        );
        assert_ne!(
            one,
            written(&options("tiny-llama", f, 6, 3)),
            "{}: seed",
            f.name()
        );
    }
}

#[test]
fn a_written_file_parses_with_its_tensors_in_place() {
    for (name, f) in [("tiny-qwen2", Format::Q5K), ("tiny-llama", Format::F16)] {
        let o = options(name, f, 1, 2);
        let bytes = written(&o);
        let g = Gguf::parse(bytes.clone()).unwrap();
        let specs = tensors(o.preset, f);
        let sum: u64 = specs.iter().map(TensorSpec::bytes).sum();
        // Every tensor's size is a multiple of the alignment here: no padding.
        assert_eq!(g.total_tensor_bytes().unwrap(), sum);
        assert_eq!((bytes.len() - g.data_offset) as u64, sum, "{name}");
        let (offsets, _) = layout(&specs);
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
        assert_eq!(
            g.u64_value(&format!("{arch}.vocab_size")),
            Some(o.preset.vocab)
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
        assert_eq!(g.array_len("tokenizer.ggml.merges"), Some(1));
        assert_eq!(g.u64_value("tokenizer.ggml.eos_token_id"), Some(0));
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
fn padding_tokens_are_unused_and_numbered_by_id() {
    let kvs = tokenizer_kvs(&fake_reference(), 7).unwrap();
    let tokens = kvs
        .iter()
        .find(|k| k.key == "tokenizer.ggml.tokens")
        .unwrap();
    let tail = String::from_utf8_lossy(&tokens.raw);
    assert!(
        tail.contains("[PAD4]") && tail.ends_with("[PAD6]"),
        "{tail:?}"
    );
    let types = kvs
        .iter()
        .find(|k| k.key == "tokenizer.ggml.token_type")
        .unwrap();
    assert_eq!(u64::from_le_bytes(types.raw[4..12].try_into().unwrap()), 7);
    assert_eq!(&types.raw[types.raw.len() - 4..], &5i32.to_le_bytes());
    assert_eq!(types.raw.len(), 12 + 7 * 4);
    // Unpadded when the sizes agree; refused when the reference is larger.
    let same = tokenizer_kvs(&fake_reference(), 4).unwrap();
    assert!(same
        .iter()
        .zip(
            fake_reference()
                .kvs
                .iter()
                .filter(|k| k.key.starts_with("tokenizer."))
        )
        .all(|(a, b)| a.raw == b.raw));
    assert!(tokenizer_kvs(&fake_reference(), 3).is_err());
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

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

/// A stand-in SentencePiece reference: `<pad>`, `<eos>`, `<bos>` (control),
/// `<unk>`, the 256 byte tokens, then `normals` pieces `▁p<i>` of score -i.
pub(crate) fn fake_spm_reference(normals: usize) -> Gguf {
    let mut g = Gguf::parse(crate::gguf::tests::tiny()).unwrap();
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3i32, 3, 3, 2];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for i in 0..normals {
        tokens.push(format!("\u{2581}p{i}"));
        types.push(1);
    }
    let scores: Vec<f32> = (0..tokens.len())
        .map(|id| if types[id] == 1 { -(id as f32) } else { 0.0 })
        .collect();
    let id = |k: &str, v: u32| kv(k, U32, v.to_le_bytes().to_vec());
    g.kvs.extend([
        kv("tokenizer.ggml.model", STRING, string_raw("llama")),
        kv("tokenizer.ggml.pre", STRING, string_raw("default")),
        kv(
            "tokenizer.ggml.tokens",
            ARRAY,
            array_raw(
                STRING,
                tokens
                    .iter()
                    .map(|t| string_raw(t))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        kv(
            "tokenizer.ggml.scores",
            ARRAY,
            array_raw(
                F32,
                scores
                    .iter()
                    .map(|s| s.to_le_bytes().to_vec())
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        kv(
            "tokenizer.ggml.token_type",
            ARRAY,
            array_raw(
                I32,
                types
                    .iter()
                    .map(|t| t.to_le_bytes().to_vec())
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        id("tokenizer.ggml.bos_token_id", 2),
        id("tokenizer.ggml.eos_token_id", 1),
        id("tokenizer.ggml.unknown_token_id", 3),
        id("tokenizer.ggml.padding_token_id", 0),
        kv("tokenizer.ggml.add_space_prefix", BOOL, vec![0]),
    ]);
    Gguf::parse(g.write()).unwrap()
}

/// The stand-in reference a preset takes its tokenizer from.
fn reference_for(p: &Preset) -> Gguf {
    match p.vocab_source {
        Vocab::Reference | Vocab::Harmony => fake_reference(),
        Vocab::Spm => fake_spm_reference(100),
    }
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
    let w = write_to(o, &reference_for(o.preset), &mut out).unwrap();
    assert_eq!(w.bytes, out.len() as u64);
    out
}

/// The tensors llama.cpp's loader creates for `p` (src/models/<arch>.cpp's
/// `load_arch_tensors`, with the optional ones this file has), with their
/// shapes: written out independently of `tensors`.
fn llama_cpp_wants(p: &Preset) -> Vec<(String, Vec<u64>)> {
    let (e, v, ff) = (p.n_embd, p.vocab, p.n_ff);
    // gpt-oss: key_length, 64.
    let hd = if p.arch == Arch::GptOss {
        64
    } else {
        e / p.n_head
    };
    let (q, kv) = (p.n_head * hd, p.n_head_kv * hd);
    let mut w: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![e, v]),
        ("output_norm.weight".into(), vec![e]),
    ];
    if !p.tied {
        w.push(("output.weight".into(), vec![e, v]));
    }
    // llama.cpp's llama.cpp and phi3.cpp: {n_rot / 2}, n_rot the head size here.
    match p.rope_scaling {
        RopeScaling::None | RopeScaling::Yarn { .. } => {}
        RopeScaling::Llama3 => w.push(("rope_freqs.weight".into(), vec![hd / 2])),
        RopeScaling::LongRope { .. } => {
            w.push(("rope_factors_long.weight".into(), vec![hd / 2]));
            w.push(("rope_factors_short.weight".into(), vec![hd / 2]));
        }
    }
    if p.arch == Arch::Gpt2 {
        w.push(("position_embd.weight".into(), vec![e, u64::from(p.context)]));
        w.push(("output_norm.bias".into(), vec![e]));
    }
    for i in 0..p.n_layer {
        let mut t = |s: &str, dims: &[u64]| w.push((format!("blk.{i}.{s}"), dims.to_vec()));
        t("attn_norm.weight", &[e]);
        t("attn_output.weight", &[q, e]);
        if p.arch != Arch::GptOss {
            t("ffn_norm.weight", &[e]);
            t("ffn_down.weight", &[ff, e]);
        }
        match p.arch {
            Arch::Llama | Arch::Qwen2 => {
                t("attn_q.weight", &[e, q]);
                t("attn_k.weight", &[e, kv]);
                t("attn_v.weight", &[e, kv]);
                t("ffn_gate.weight", &[e, ff]);
                t("ffn_up.weight", &[e, ff]);
                if p.arch == Arch::Qwen2 {
                    t("attn_q.bias", &[q]);
                    t("attn_k.bias", &[kv]);
                    t("attn_v.bias", &[kv]);
                }
            }
            // phi3.cpp: create_tensor_qkv (fused), ffn_up {n_embd, 2*n_ff}.
            Arch::Phi3 => {
                t("attn_qkv.weight", &[e, q + 2 * kv]);
                t("ffn_up.weight", &[e, 2 * ff]);
            }
            // gpt2.cpp: every norm and matrix with its bias.
            Arch::Gpt2 => {
                t("attn_qkv.weight", &[e, e + 2 * kv]);
                t("ffn_up.weight", &[e, ff]);
                t("attn_norm.bias", &[e]);
                t("attn_qkv.bias", &[e + 2 * kv]);
                t("attn_output.bias", &[e]);
                t("ffn_norm.bias", &[e]);
                t("ffn_up.bias", &[ff]);
                t("ffn_down.bias", &[e]);
            }
            // openai-moe.cpp: biased Q/K/V and output, sinks, the router
            // and the experts, {cols, rows, n_expert}.
            Arch::GptOss => {
                let m = p.moe.expect("gpt-oss has experts");
                let (x, fx) = (m.experts, m.n_ff);
                t("post_attention_norm.weight", &[e]);
                t("attn_q.weight", &[e, q]);
                t("attn_k.weight", &[e, kv]);
                t("attn_v.weight", &[e, kv]);
                t("attn_q.bias", &[q]);
                t("attn_k.bias", &[kv]);
                t("attn_v.bias", &[kv]);
                t("attn_output.bias", &[e]);
                t("attn_sinks.weight", &[p.n_head]);
                t("ffn_gate_inp.weight", &[e, x]);
                t("ffn_gate_inp.bias", &[x]);
                t("ffn_gate_exps.weight", &[e, fx, x]);
                t("ffn_up_exps.weight", &[e, fx, x]);
                t("ffn_down_exps.weight", &[fx, e, x]);
                t("ffn_gate_exps.bias", &[fx, x]);
                t("ffn_up_exps.bias", &[fx, x]);
                t("ffn_down_exps.bias", &[e, x]);
            }
        }
    }
    w
}

#[test]
fn every_preset_has_exactly_the_tensors_llama_cpp_loads() {
    for p in PRESETS {
        let t = tensors(p, p.default_format);
        let mut got: Vec<(String, Vec<u64>)> =
            t.iter().map(|x| (x.name.clone(), x.dims.clone())).collect();
        let mut want = llama_cpp_wants(p);
        got.sort();
        want.sort();
        assert_eq!(got, want, "{}", p.name);
        for x in &t {
            let biased = x.name.ends_with(".bias");
            // gpt-oss: the router and the experts' (2-D) biases stay F32, the
            // experts are MXFP4 in every format.
            if x.dims.len() == 1
                || x.name == "position_embd.weight"
                || x.name.contains("ffn_gate_inp")
                || biased
            {
                assert_eq!(x.format, Format::F32, "{}: {} stays F32", p.name, x.name);
            } else if x.name.contains("_exps.") {
                assert_eq!(x.format, Format::Mxfp4, "{}: {}", p.name, x.name);
            } else {
                assert_eq!(x.format, p.default_format.for_row(x.dims[0]));
            }
            assert_eq!(x.dims[0] % x.format.block().0, 0, "{}: {}", p.name, x.name);
            let hd = p.head_dim();
            let want = match x.name.as_str() {
                "rope_freqs.weight" => Init::Factors(FactorTable::Llama3 {
                    base: p.rope_base,
                    n_rot: hd as u32,
                }),
                "rope_factors_long.weight" => Init::Factors(FactorTable::LongRopeLong),
                "rope_factors_short.weight" => Init::Factors(FactorTable::LongRopeShort),
                _ if biased || x.name.contains("attn_sinks") => Init::Bias,
                _ if x.name.contains("norm") => Init::Norm,
                _ => Init::Matrix {
                    std: 1.0 / (x.dims[0] as f32).sqrt(),
                },
            };
            assert_eq!(x.init, want, "{}: {}", p.name, x.name);
        }
        // Every K-quant preset of phi3 and gpt2 is K-quant throughout: no fallbacks.
        if matches!(p.arch, Arch::Phi3 | Arch::Gpt2) {
            for f in [Format::Q4K, Format::Q5K, Format::Q6K] {
                assert!(tensors(p, f)
                    .iter()
                    .all(|x| x.format == f || x.format == Format::F32));
            }
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
    // Parameter counts as published: Phi-3-mini 3,821,079,552; GPT-2 124,439,808.
    let params = |name: &str| -> u64 {
        tensors(preset(name).unwrap(), Format::F32)
            .iter()
            .map(TensorSpec::values)
            .sum()
    };
    assert_eq!(params("phi3"), 3_821_079_552);
    assert_eq!(params("gpt2"), 124_439_808);
    let p = preset("phi3").unwrap();
    assert_eq!(
        (
            p.n_embd,
            p.n_layer,
            p.n_head,
            p.n_head_kv,
            p.n_ff,
            p.vocab,
            p.context
        ),
        (3072, 32, 32, 32, 8192, 32064, 4096)
    );
    assert!(!p.tied && p.sliding_window == 2047 && p.vocab_source == Vocab::Spm);
    let p = preset("gpt2").unwrap();
    assert_eq!(
        (p.n_embd, p.n_layer, p.n_head, p.n_ff, p.vocab, p.context),
        (768, 12, 12, 3072, 50257, 1024)
    );
    assert!(p.tied && p.vocab_source == Vocab::Reference);
    let (_, data) = layout(&tensors(preset("phi3").unwrap(), Format::Q4K));
    assert!((2_100_000_000..2_250_000_000).contains(&data), "{data}");
    // About 2 GB, as M0-W-1221 wants.
    let (_, data) = layout(&tensors(preset("llama-2gb").unwrap(), Format::Q4_1));
    assert!((1_900_000_000..2_300_000_000).contains(&data), "{data}");
    let (_, data) = layout(&tensors(preset("llama-3-8b").unwrap(), Format::Q4_1));
    assert!((4_500_000_000..5_200_000_000).contains(&data), "{data}");
}

#[test]
fn unknown_presets_list_the_known_ones() {
    let e = preset("mamba").unwrap_err().to_string();
    assert!(
        e.contains("unknown preset \"mamba\"") && e.contains("tiny-phi3, tiny-gpt2, smollm2"),
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

/// phi3 and gpt2 files carry the hyperparameter keys llama.cpp's
/// convert_hf_to_gguf.py writes for them (Phi3MiniModel, GPT2Model), in its order.
#[test]
fn phi3_and_gpt2_keys_are_the_converters() {
    let keys = |name: &str| -> Vec<String> {
        let o = options(name, Format::Q8_0, 0, 1);
        metadata(&o, &reference_for(o.preset))
            .unwrap()
            .into_iter()
            .map(|k| k.key)
            .filter(|k| !k.starts_with("general.") && !k.starts_with("tokenizer."))
            .collect()
    };
    assert_eq!(
        keys("tiny-phi3"),
        [
            "context_length",
            "rope.scaling.original_context_length",
            "embedding_length",
            "feed_forward_length",
            "block_count",
            "attention.head_count",
            "attention.head_count_kv",
            "attention.layer_norm_rms_epsilon",
            "rope.dimension_count",
            "rope.freq_base",
            "attention.sliding_window",
        ]
        .map(|k| format!("phi3.{k}"))
    );
    assert_eq!(
        keys("gpt2"),
        [
            "block_count",
            "context_length",
            "embedding_length",
            "feed_forward_length",
            "attention.head_count",
            "attention.layer_norm_epsilon",
        ]
        .map(|k| format!("gpt2.{k}"))
    );
    let value = |name: &str, key: &str| -> Vec<u8> {
        let o = options(name, Format::Q4K, 0, 1);
        metadata(&o, &reference_for(o.preset))
            .unwrap()
            .into_iter()
            .find(|k| k.key == key)
            .unwrap_or_else(|| panic!("{name}: no {key}"))
            .raw
    };
    let u32_of =
        |name: &str, key: &str| u32::from_le_bytes(value(name, key)[..].try_into().unwrap());
    assert_eq!(u32_of("phi3", "phi3.rope.dimension_count"), 96);
    assert_eq!(u32_of("phi3", "phi3.attention.sliding_window"), 2047);
    assert_eq!(
        u32_of("phi3", "phi3.rope.scaling.original_context_length"),
        4096
    );
    assert_eq!(u32_of("phi3", "phi3.feed_forward_length"), 8192);
    assert_eq!(u32_of("tiny-phi3", "phi3.rope.dimension_count"), 64);
    assert_eq!(u32_of("gpt2", "gpt2.context_length"), 1024);
    assert_eq!(u32_of("gpt2", "general.file_type"), 14);
    assert_eq!(
        value("gpt2", "gpt2.attention.layer_norm_epsilon"),
        1e-5f32.to_le_bytes()
    );
}

#[test]
fn no_name_trips_llama_cpps_phi3_token_attributes() {
    for p in PRESETS {
        let n = general_name(p).to_lowercase();
        assert!(!n.contains("phi3") && !n.contains("phi-3"), "{n}");
        assert!(n.starts_with("synthetic-"), "{n}");
    }
    assert_eq!(
        general_name(preset("tiny-qwen2").unwrap()),
        "synthetic-tiny-qwen2"
    );
    assert_eq!(
        general_name(preset("tiny-phi3").unwrap()),
        "synthetic-tiny-phi 3"
    );
}

fn ids_of(kvs: &[Kv], key: &str) -> u32 {
    let k = kvs.iter().find(|k| k.key == key).unwrap();
    u32::from_le_bytes(k.raw[..].try_into().unwrap())
}

fn token_list(kvs: &[Kv]) -> Vec<String> {
    let g = Gguf {
        kvs: kvs.to_vec(),
        ..Gguf::parse(crate::gguf::tests::tiny()).unwrap()
    };
    array_elems(&g, "tokenizer.ggml.tokens", STRING)
        .unwrap()
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect()
}

#[test]
fn a_sentencepiece_vocabulary_keeps_specials_and_bytes_and_only_reachable_pieces() {
    // 4 specials, 256 bytes, 100 pieces "▁p<i>" that no single characters
    // build, cut to 300: the 260 non-normal tokens, then padding.
    let kvs = spm_tokenizer_kvs(&fake_spm_reference(100), 300).unwrap();
    let keys: Vec<&str> = kvs.iter().map(|k| k.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.add_eos_token",
        ],
        "no add_space_prefix: llama.cpp's SentencePiece default (true) applies, as for Phi-3"
    );
    let tokens = token_list(&kvs);
    assert_eq!(tokens.len(), 300);
    assert_eq!(tokens[2], "<bos>");
    assert_eq!(tokens[4], "<0x00>");
    assert_eq!(tokens[259], "<0xFF>");
    assert_eq!(
        (&tokens[260][..], &tokens[299][..]),
        ("[PAD260]", "[PAD299]")
    );
    assert_eq!(
        (
            ids_of(&kvs, "tokenizer.ggml.bos_token_id"),
            ids_of(&kvs, "tokenizer.ggml.eos_token_id"),
            ids_of(&kvs, "tokenizer.ggml.unknown_token_id"),
            ids_of(&kvs, "tokenizer.ggml.padding_token_id")
        ),
        (2, 1, 3, 0)
    );
    let add_bos = kvs
        .iter()
        .find(|k| k.key.ends_with("add_bos_token"))
        .unwrap();
    assert_eq!((add_bos.vtype, &add_bos.raw[..]), (BOOL, &[1u8][..]));
    // Padded with unused tokens when the reference is smaller.
    let kvs = spm_tokenizer_kvs(&fake_spm_reference(10), 280).unwrap();
    let tokens = token_list(&kvs);
    assert_eq!(tokens.len(), 280);
    assert_eq!(
        (&tokens[269][..], &tokens[270][..], &tokens[279][..]),
        ("\u{2581}p9", "[PAD270]", "[PAD279]")
    );
    let types = kvs.iter().find(|k| k.key.ends_with("token_type")).unwrap();
    assert_eq!(&types.raw[types.raw.len() - 4..], &5i32.to_le_bytes());
    // Not SentencePiece: refused.
    assert!(spm_tokenizer_kvs(&fake_reference(), 300).is_err());
}

#[test]
fn a_sentencepiece_cut_is_closed_under_its_merges() {
    let tokens: Vec<Vec<u8>> = [
        "<s>",
        "\u{2581}t",
        "h\u{e9}",
        "\u{2581}th\u{e9}",
        "xy",
        "<0x41>",
        "\u{2581}",
        "t",
        "h",
        "\u{e9}",
        "</s>",
        "ab",
        "\u{2581}\u{e9}",
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect();
    // Control, 4 merged pieces, byte, 4 single characters, control, 2 merged pieces.
    let types = [3, 1, 1, 1, 1, 6, 1, 1, 1, 1, 3, 1, 1];
    let scores = [
        0.0, -1.0, -2.0, -3.0, -4.0, 0.0, -10.0, -11.0, -12.0, -13.0, 0.0, -0.5, -3.5,
    ];
    let sel = |specials: &[u64], n| spm_selection(&tokens, &types, &scores, specials, n);
    // Non-normal tokens (0, 5, 10), the singles (6-9), then by score: "ab" (no "a",
    // "b": skipped), "▁t", "hé", "▁thé" (= "▁t" + "hé"), "▁é"; "xy" never.
    assert_eq!(sel(&[0], 11).unwrap(), [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 12]);
    assert_eq!(sel(&[0], 9).unwrap(), [0, 1, 2, 5, 6, 7, 8, 9, 10]);
    // Singles that do not all fit: the highest-scored ones.
    assert_eq!(sel(&[0], 5).unwrap(), [0, 5, 6, 7, 10]);
    // A special id that is a normal piece is kept, and can be built on.
    assert_eq!(sel(&[11], 8).unwrap(), [0, 5, 6, 7, 8, 9, 10, 11]);
    // A vocabulary no larger than the cut is kept whole; fewer slots than
    // non-normal tokens is an error.
    assert_eq!(sel(&[0], 13).unwrap(), (0..13).collect::<Vec<_>>());
    assert!(sel(&[0], 2).is_err());
    assert!(sel(&[4], 3).is_err());
}

#[test]
fn a_written_file_parses_with_its_tensors_in_place() {
    for (name, f) in [
        ("tiny-qwen2", Format::Q5K),
        ("tiny-llama", Format::F16),
        ("tiny-gpt2", Format::Q4K),
        ("tiny-phi3", Format::F16),
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
        let vocab_key = matches!(o.preset.arch, Arch::Llama | Arch::Qwen2);
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

/// The factor tables: Llama 3.1's formula (1 for the fast rotations, 8 for
/// the slow ones, smooth between, never falling) and LongRoPE's made-up
/// shapes; `tiny-phi3-128k` writes its long table with the original
/// context and the magnitude factor the converter derives from them.
#[test]
fn rope_factor_tables_follow_their_formulas() {
    let l3 = FactorTable::Llama3 {
        base: 500_000.0,
        n_rot: 128,
    }
    .values(64);
    assert_eq!((l3[0], l3[63]), (1.0, 8.0));
    assert!(l3.windows(2).all(|w| w[0] <= w[1]), "{l3:?}");
    assert!(
        l3.iter().any(|&f| f > 1.0 && f < 8.0),
        "a smooth band: {l3:?}"
    );
    let (long, short) = (
        FactorTable::LongRopeLong.values(32),
        FactorTable::LongRopeShort.values(32),
    );
    assert_eq!(
        (long[0], long[31], short[0], short[31]),
        (1.0, 40.0, 1.0, 2.5)
    );

    let p = preset("tiny-phi3-128k").unwrap();
    let o = options("tiny-phi3-128k", Format::Q8_0, 0, 1);
    let kvs = metadata(&o, &reference_for(p)).unwrap();
    let word = |key: &str| -> [u8; 4] {
        let kv = kvs
            .iter()
            .find(|kv| kv.key == key)
            .unwrap_or_else(|| panic!("{key}"));
        kv.raw[..4].try_into().unwrap()
    };
    assert_eq!(u32::from_le_bytes(word("phi3.context_length")), 4096);
    let orig = word("phi3.rope.scaling.original_context_length");
    assert_eq!(u32::from_le_bytes(orig), 1024);
    let attn = f32::from_le_bytes(word("phi3.rope.scaling.attn_factor"));
    assert!((attn - 1.2f32.sqrt()).abs() < 1e-6);
}

/// gpt-oss-20b and -120b as published: 20,914,757,184 and 116,829,156,672
/// parameters, and the sizes of llama.cpp's own files with the experts in
/// MXFP4 and the rest in Q8_0 (ggml-org's 12.1 GB and 63.4 GB).
#[test]
fn gpt_oss_presets_are_the_published_shapes() {
    for (name, params, layers, experts) in [
        ("gpt-oss-20b", 20_914_757_184u64, 24, 32),
        ("gpt-oss-120b", 116_829_156_672, 36, 128),
    ] {
        let p = preset(name).unwrap();
        assert_eq!(
            (
                p.n_embd,
                p.n_layer,
                p.n_head,
                p.n_head_kv,
                p.head_dim(),
                p.vocab
            ),
            (2880, layers, 64, 8, 64, 201_088)
        );
        let moe = p.moe.unwrap();
        assert_eq!((moe.experts, moe.used, moe.n_ff), (experts, 4, 2880));
        let t = tensors(p, p.default_format);
        assert_eq!(
            t.iter().map(TensorSpec::values).sum::<u64>(),
            params,
            "{name}"
        );
        let bytes: u64 = t.iter().map(TensorSpec::bytes).sum();
        let want = if layers == 24 { 12.10e9 } else { 63.37e9 };
        assert!(
            (bytes as f64 / want - 1.0).abs() < 0.001,
            "{name}: {bytes} bytes"
        );
    }
}

#[test]
fn gpt_oss_metadata_is_the_converters() {
    let o = options("gpt-oss", Format::Q8_0, 1, 1);
    let kvs = metadata(&o, &fake_reference()).unwrap();
    let keys: Vec<&str> = kvs.iter().map(|k| k.key.as_str()).collect();
    let arch: Vec<&str> = keys
        .iter()
        .filter_map(|k| k.strip_prefix("gpt-oss."))
        .collect();
    assert_eq!(
        arch,
        [
            "block_count",
            "context_length",
            "embedding_length",
            "feed_forward_length",
            "attention.head_count",
            "attention.head_count_kv",
            "rope.scaling.type",
            "rope.scaling.factor",
            "rope.scaling.original_context_length",
            "rope.scaling.yarn_beta_fast",
            "rope.scaling.yarn_beta_slow",
            "rope.freq_base",
            "attention.layer_norm_rms_epsilon",
            "expert_count",
            "expert_used_count",
            "attention.key_length",
            "attention.value_length",
            "attention.sliding_window",
            "expert_feed_forward_length",
        ]
    );
    let u32_of = |k: &str| ids_of(&kvs, k);
    assert_eq!(u32_of("general.file_type"), 38);
    assert_eq!(u32_of("gpt-oss.expert_count"), 4);
    assert_eq!(u32_of("gpt-oss.expert_used_count"), 2);
    assert_eq!(u32_of("gpt-oss.attention.sliding_window"), 128);
    assert_eq!(u32_of("gpt-oss.rope.scaling.original_context_length"), 4096);
    assert_eq!(u32_of("tokenizer.ggml.bos_token_id"), 199_998);
    assert_eq!(u32_of("tokenizer.ggml.eos_token_id"), 200_002);
    assert_eq!(u32_of("tokenizer.ggml.padding_token_id"), 199_999);
    let string_of = |k: &str| {
        let raw = &kvs.iter().find(|x| x.key == k).unwrap().raw;
        String::from_utf8(raw[8..].to_vec()).unwrap()
    };
    assert_eq!(string_of("gpt-oss.rope.scaling.type"), "yarn");
    assert_eq!(string_of("tokenizer.ggml.pre"), "gpt-4o");
    assert!(string_of("tokenizer.chat_template").contains("<|channel|>"));
    // The whole file: experts in MXFP4 (ggml type 39) whatever the format.
    let g = Gguf::parse(written(&options("gpt-oss", Format::F16, 1, 2))).unwrap();
    let exps: Vec<_> = g
        .tensors
        .iter()
        .filter(|t| t.name.ends_with("_exps.weight"))
        .collect();
    assert_eq!(exps.len(), 6);
    assert!(exps.iter().all(|t| t.ttype == 39 && t.dims.len() == 3));
}

/// The o200k_harmony vocabulary: every id defined, the harmony tokens where
/// gpt-oss has them, byte-level token text, and merges with which a plain
/// BPE (lowest merge first) splits words exactly as tiktoken does.
#[test]
fn the_harmony_vocabulary_merges_as_tiktoken_encodes() {
    let kvs = harmony::tokenizer_kvs().unwrap();
    let tokens = token_list(&kvs);
    assert_eq!(tokens.len() as u64, harmony::VOCAB);
    for (id, text) in [
        (0, "!"),
        (199_998, "<|startoftext|>"),
        (200_002, "<|return|>"),
        (200_005, "<|channel|>"),
        (200_006, "<|start|>"),
        (200_007, "<|end|>"),
        (200_008, "<|message|>"),
        (200_012, "<|call|>"),
        (200_013, "<|reserved_200013|>"),
        (201_087, "<|reserved_201087|>"),
    ] {
        assert_eq!(tokens[id], text, "id {id}");
    }
    let bpe = tiktoken_rs::o200k_harmony().unwrap();
    let hello = bpe.encode_ordinary(" hello");
    assert_eq!(hello.len(), 1);
    assert_eq!(tokens[hello[0] as usize], "\u{120}hello");
    let g = Gguf {
        kvs: kvs.clone(),
        ..Gguf::parse(crate::gguf::tests::tiny()).unwrap()
    };
    let merges: Vec<String> = array_elems(&g, "tokenizer.ggml.merges", STRING)
        .unwrap()
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect();
    assert!(merges.len() > 199_998 - 256, "{} merges", merges.len());
    let priority: std::collections::HashMap<(&str, &str), usize> = merges
        .iter()
        .enumerate()
        .map(|(i, m)| (m.split_once(' ').unwrap(), i))
        .collect();
    let id_of: std::collections::HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let chars = harmony::byte_chars();
    // One pre-token each (tiktoken splits text into these first).
    for word in [
        " tokenization",
        " internationalization",
        " Hello",
        "ing",
        " über",
        " 日本語",
        " counterrevolutionaries",
        " pneumonoultramicroscopic",
    ] {
        let mut parts: Vec<String> = word
            .bytes()
            .map(|b| chars[b as usize].to_string())
            .collect();
        while let Some((i, _)) = parts
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| Some((i, *priority.get(&(w[0].as_str(), w[1].as_str()))?)))
            .min_by_key(|&(_, p)| p)
        {
            let right = parts.remove(i + 1);
            parts[i].push_str(&right);
        }
        let ours: Vec<u32> = parts.iter().map(|p| id_of[p.as_str()]).collect();
        assert_eq!(ours, bpe.encode_ordinary(word), "{word:?}");
    }
}

/// llama.cpp, reading a gpt-oss file's vocabulary and merges, tokenizes as
/// tiktoken's o200k_harmony does (`testdata/golden-synth/gpt-oss-tokenize.json`,
/// llama-server's /tokenize on the `gpt-oss` Q8_0 file): the file holds the
/// real vocabulary. Where the two differ, llama.cpp is not tiktoken, and
/// each difference is named: its pre-tokenizer regex takes letters "not
/// a-z" where tiktoken takes letter and mark classes (Devanagari's vowel
/// signs split `hindi` otherwise), and it makes `<|start|>`, `<|message|>`,
/// `<|channel|>` and `<|constrain|>` user-defined tokens, which it cuts out
/// of plain text too (tiktoken's `encode_ordinary` spells them out).
#[test]
fn llama_cpp_tokenizes_the_harmony_file_as_tiktoken() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let path = root.join("testdata/golden-synth/gpt-oss-tokenize.json");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let bpe = tiktoken_rs::o200k_harmony().unwrap();
    let mut differ = Vec::new();
    for c in cases.as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        // gpt-oss adds no BOS.
        let ours = if c["parse_special"].as_bool().unwrap() {
            bpe.encode_with_special_tokens(text)
        } else {
            bpe.encode_ordinary(text)
        };
        if ours != want {
            let how = if c["parse_special"].as_bool().unwrap() {
                "special"
            } else {
                "plain"
            };
            differ.push(format!("{} {how}", c["name"].as_str().unwrap()));
        }
    }
    differ.dedup();
    assert_eq!(
        differ,
        [
            "hindi special",
            "hindi plain",
            "hindi special",
            "harmony_user_turn plain",
            "harmony_channels plain",
            "harmony_call plain",
        ]
    );
}

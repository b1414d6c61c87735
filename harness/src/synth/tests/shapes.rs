use super::*;

/// The tensors llama.cpp's loader creates for `p` (src/models/<arch>.cpp's
/// `load_arch_tensors`, with the optional ones this file has), with their
/// shapes: written out independently of `tensors`.
fn llama_cpp_wants(p: &Preset) -> Vec<(String, Vec<u64>)> {
    let (e, v, ff) = (p.n_embd, p.vocab, p.n_ff);
    // gpt-oss: key_length, 64; qwen3: key_length, 128.
    let hd = match p.arch {
        Arch::GptOss => 64,
        Arch::Qwen3 | Arch::Qwen3Moe => 128,
        // Mistral Nemo's shape: llama with an explicit head size.
        Arch::Llama if p.name.contains("mistral") => 128,
        _ => e / p.n_head,
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
        }
        if !matches!(p.arch, Arch::GptOss | Arch::Qwen3Moe) {
            t("ffn_down.weight", &[ff, e]);
        }
        match p.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {
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
                // qwen3.cpp: attn_q_norm and attn_k_norm {n_embd_head_k}.
                if p.arch == Arch::Qwen3 {
                    t("attn_q_norm.weight", &[hd]);
                    t("attn_k_norm.weight", &[hd]);
                }
            }
            // qwen3moe.cpp: qwen3's attention, the router and the experts,
            // {cols, rows, n_expert}, no biases.
            Arch::Qwen3Moe => {
                let m = p.moe.expect("qwen3moe has experts");
                let (x, fx) = (m.experts, m.n_ff);
                t("attn_q.weight", &[e, q]);
                t("attn_k.weight", &[e, kv]);
                t("attn_v.weight", &[e, kv]);
                t("attn_q_norm.weight", &[hd]);
                t("attn_k_norm.weight", &[hd]);
                t("ffn_gate_inp.weight", &[e, x]);
                t("ffn_gate_exps.weight", &[e, fx, x]);
                t("ffn_up_exps.weight", &[e, fx, x]);
                t("ffn_down_exps.weight", &[fx, e, x]);
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
            // experts are MXFP4 in every format; qwen3moe's router stays F32,
            // its experts take the format.
            if x.dims.len() == 1
                || x.name == "position_embd.weight"
                || x.name.contains("ffn_gate_inp")
                || biased
            {
                assert_eq!(x.format, Format::F32, "{}: {} stays F32", p.name, x.name);
            } else if x.name.contains("_exps.") && p.arch == Arch::GptOss {
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

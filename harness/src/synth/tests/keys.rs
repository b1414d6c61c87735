use super::*;

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

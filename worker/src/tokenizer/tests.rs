//! Tokenizer tests: small hand-built vocabularies here; llama.cpp's golden vectors
//! for SmolLM2 (`testdata/golden/`) against the real model file in `golden`.

use super::*;

/// A byte-level vocabulary: ids 0..=255 are the single bytes (GPT-2 alphabet, in
/// byte order), then a few merged tokens and special tokens.
pub(super) fn tiny_spec() -> VocabSpec {
    let table = bpe::byte_to_unicode();
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    let mut types = vec![token_type::NORMAL; 256];
    for (t, ty) in [
        ("he", token_type::NORMAL),             // 256
        ("ll", token_type::NORMAL),             // 257
        ("hell", token_type::NORMAL),           // 258
        ("hello", token_type::NORMAL),          // 259
        ("Ġhello", token_type::NORMAL),         // 260
        ("<|im_start|>", token_type::CONTROL),  // 261
        ("<|im_end|>", token_type::CONTROL),    // 262
        ("<user>", token_type::USER_DEFINED),   // 263
        ("<|endoftext|>", token_type::CONTROL), // 264
    ] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens,
        token_types: types,
        merges: vec!["h e".into(), "l l".into(), "he ll".into(), "hell o".into(), "Ġ hello".into()],
        scores: None,
        bos_id: Some(261),
        eos_id: Some(262),
        eot_id: None,
        eom_id: None,
        unk_id: None,
        pad_id: None,
        add_bos: false,
        add_eos: false,
        add_space_prefix: false,
        chat_template: Some("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into()),
    }
}

fn tiny() -> Tokenizer {
    Tokenizer::from_spec(tiny_spec()).expect("tiny vocabulary builds")
}

/// The id of the single-byte token for `b` in the tiny vocabulary.
fn byte_id(b: u8) -> u32 {
    b as u32
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<StreamDecoder>();
}

#[test]
fn kind_names() {
    assert_eq!(TokenizerKind::GgufBpe.as_str(), "gguf-bpe");
    assert_eq!(TokenizerKind::GgufSpm.as_str(), "gguf-spm");
    assert_eq!(TokenizerKind::HfJson.as_str(), "hf-json");
    assert_eq!(tiny().kind(), TokenizerKind::GgufBpe);
}

#[test]
fn tiny_encode_merges_and_specials() {
    let t = tiny();
    assert_eq!(t.vocab_size(), 265);
    assert_eq!(t.encode("hello", false, false).unwrap(), vec![259]);
    assert_eq!(t.encode(" hello", false, false).unwrap(), vec![260]);
    // "hel": he + l
    assert_eq!(
        t.encode("hel", false, false).unwrap(),
        vec![256, byte_id(b'l')]
    );
    // parse_special: control tokens are single tokens...
    assert_eq!(
        t.encode("<|im_start|>hello<|im_end|>", false, true)
            .unwrap(),
        vec![261, 259, 262]
    );
    // ...and plain text otherwise.
    let plain = t.encode("<|im_end|>", false, false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&262), "{plain:?}");
    assert_eq!(t.decode(&plain).unwrap(), "<|im_end|>");
    // User-defined tokens always match.
    assert_eq!(
        t.encode("<user>hello", false, false).unwrap(),
        vec![263, 259]
    );
    assert_eq!(
        t.encode("<user>hello", false, true).unwrap(),
        vec![263, 259]
    );
    // Digits one by one (smollm).
    assert_eq!(
        t.encode("42", false, false).unwrap(),
        vec![byte_id(b'4'), byte_id(b'2')]
    );
    assert_eq!(t.encode("", true, true).unwrap(), Vec::<u32>::new());
}

#[test]
fn bytes_missing_from_the_vocabulary_block_merges_like_llama_cpp() {
    // SmolLM2 has no token for some bytes (e.g. 0x04). llama.cpp keeps such a byte
    // as a symbol that never merges and drops it at the end, so its neighbours
    // stay apart.
    let mut spec = tiny_spec();
    spec.tokens[4] = "[no byte 4]".into();
    spec.tokens.push("!!".into()); // 265
    spec.token_types.push(token_type::NORMAL);
    spec.merges.push("! !".into());
    let t = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(t.encode("!!", false, false).unwrap(), vec![265]);
    assert_eq!(
        t.encode("!\u{4}!", false, false).unwrap(),
        vec![byte_id(b'!'), byte_id(b'!')]
    );
    assert_eq!(
        t.encode("he\u{4}llo", false, false).unwrap(),
        vec![256, 257, byte_id(b'o')]
    );
}

#[test]
fn add_special_adds_bos_and_eos_when_asked() {
    let mut spec = tiny_spec();
    spec.add_bos = true;
    spec.add_eos = true;
    let t = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(t.encode("hello", true, false).unwrap(), vec![261, 259, 262]);
    assert_eq!(t.encode("hello", false, false).unwrap(), vec![259]);
    assert_eq!(t.encode("", true, false).unwrap(), vec![261, 262]);
}

#[test]
fn eog_set() {
    let t = tiny();
    // eos (<|im_end|>) and <|endoftext|> by its text; not BOS.
    assert_eq!(t.eog_ids(), &[262, 264]);
    assert!(t.is_eog(262) && t.is_eog(264) && !t.is_eog(261) && !t.is_eog(259));
    assert!(!t.is_eog(100_000));
}

#[test]
fn token_bytes_and_decode() {
    let t = tiny();
    assert_eq!(t.token_bytes(260), Some(&b" hello"[..]));
    assert_eq!(t.token_bytes(byte_id(b'\n')), Some(&b"\n"[..]));
    assert_eq!(t.token_bytes(0xF0), Some(&[0xF0u8][..]));
    assert_eq!(t.token_bytes(261), Some(&b"<|im_start|>"[..]));
    assert_eq!(t.token_bytes(265), None);
    assert_eq!(t.token_text(260), Some("Ġhello"));
    assert_eq!(
        t.decode(&[261, 259, 260, 262]).unwrap(),
        "<|im_start|>hello hello<|im_end|>"
    );
    // A lone continuation byte is lossy.
    assert_eq!(t.decode(&[0x80, 259]).unwrap(), "\u{FFFD}hello");
    assert!(matches!(
        t.decode(&[999]),
        Err(TokenizerError::TokenOutOfRange(999))
    ));
    // Round trip through bytes for arbitrary text.
    let text = "Grüße, 世界! 🦙\n\ttabs";
    assert_eq!(
        t.decode(&t.encode(text, false, false).unwrap()).unwrap(),
        text
    );
}

#[test]
fn stream_decoder_holds_back_split_emoji() {
    let t = tiny();
    let emoji = "🦙";
    let ids: Vec<u32> = emoji.bytes().map(byte_id).collect();
    assert_eq!(ids.len(), 4);
    let mut s = StreamDecoder::new();
    let out: Vec<String> = ids.iter().map(|&id| s.push(&t, id)).collect();
    assert_eq!(out, vec!["", "", "", emoji]);
    assert_eq!(s.finish(), "");
}

#[test]
fn stream_decoder_chinese_three_byte_chars() {
    let t = tiny();
    let text = "你好，世界";
    let mut s = StreamDecoder::new();
    let mut outs = Vec::new();
    for b in text.bytes() {
        outs.push(s.push(&t, byte_id(b)));
    }
    // Every third byte completes a character.
    for (i, o) in outs.iter().enumerate() {
        if i % 3 == 2 {
            assert_eq!(o.chars().count(), 1, "byte {i}: {o:?}");
        } else {
            assert_eq!(o, "", "byte {i}");
        }
    }
    assert_eq!(outs.concat(), text);
    // Mixed with multi-byte tokens and specials.
    let mut s = StreamDecoder::new();
    let mut got = String::new();
    for id in [259, 0xE4, 0xBD, 0xA0, 262] {
        got.push_str(&s.push(&t, id));
    }
    got.push_str(&s.finish());
    assert_eq!(got, "hello你<|im_end|>");
}

#[test]
fn stream_decoder_finish_flushes_incomplete_lossily() {
    let t = tiny();
    let mut s = StreamDecoder::new();
    assert_eq!(s.push(&t, 0xF0), "");
    assert_eq!(s.push(&t, 0x9F), "");
    assert_eq!(s.pending_len(), 2);
    assert_eq!(s.finish(), "\u{FFFD}");
    assert_eq!(s.pending_len(), 0);
    assert_eq!(s.finish(), "");
    // An impossible sequence is replaced at once, not held back.
    assert_eq!(s.push(&t, 0xFF), "\u{FFFD}");
    // A broken sequence followed by ASCII: the ASCII comes through.
    assert_eq!(s.push(&t, 0xE4), "");
    assert_eq!(s.push(&t, byte_id(b'a')), "\u{FFFD}a");
    // Same as a lossy decode of the whole.
    let ids = [0xE4, 0xBD, byte_id(b'x'), 0xF0, 0x9F, 0xA6, 0x99, 0xC3];
    let mut s = StreamDecoder::new();
    let mut got: String = ids.iter().map(|&id| s.push(&t, id)).collect();
    got.push_str(&s.finish());
    assert_eq!(got, t.decode(&ids).unwrap());
}

#[test]
fn unknown_pre_tokenizer_is_an_error() {
    let mut spec = tiny_spec();
    spec.pre = Some("klingon".into());
    match Tokenizer::from_spec(spec) {
        Err(TokenizerError::UnknownPreTokenizer(p)) => assert_eq!(p, "klingon"),
        other => panic!("expected UnknownPreTokenizer, got {other:?}"),
    }
}

/// A hand-built SentencePiece vocabulary: pieces merge by the score of the
/// piece they make (not by position), spaces become `▁`, a space goes before
/// text that opens the input or follows a special token when the file says
/// `add_space_prefix`, characters outside the vocabulary fall back to bytes.
#[test]
fn sentencepiece_merges_by_score_with_byte_fallback() {
    let mut tokens: Vec<String> = [
        "<unk>",
        "<s>",
        "</s>",
        "\u{2581}",
        "a",
        "b",
        "c",
        "ab",
        "bc",
        "\u{2581}a",
        "abc",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut types = vec![
        token_type::UNKNOWN,
        token_type::CONTROL,
        token_type::CONTROL,
    ];
    types.extend([token_type::NORMAL; 8]);
    let mut scores = vec![
        0.0f32, 0.0, 0.0, -1.0, -2.0, -2.0, -2.0, -5.0, -3.0, -4.0, -6.0,
    ];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(token_type::BYTE);
        scores.push(0.0);
    }
    let spec = VocabSpec {
        model: "llama".into(),
        tokens,
        token_types: types,
        scores: Some(scores),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_bos: true,
        add_space_prefix: true,
        ..Default::default()
    };
    let t = Tokenizer::from_spec(spec).unwrap();
    assert_eq!(t.kind(), TokenizerKind::GgufSpm);
    // " abc": "▁a" (-4) beats "ab" (-5), but "bc" (-3) goes first: ▁, a, bc -> ▁a, bc.
    assert_eq!(t.encode("abc", false, true).unwrap(), vec![9, 8]);
    // BOS, and the prefix space again after a special token.
    assert_eq!(
        t.encode("ab</s>ab", true, true).unwrap(),
        vec![1, 9, 5, 2, 9, 5]
    );
    // "é" is not a piece: its two UTF-8 bytes.
    let e = t.encode("é", false, true).unwrap();
    assert_eq!(e, vec![3, 11 + 0xC3, 11 + 0xA9]);
    assert_eq!(t.decode(&e).unwrap(), " é");
}

#[test]
fn unsupported_models_are_errors() {
    let mut spec = tiny_spec();
    spec.model = "llama".into();
    match Tokenizer::from_spec(spec) {
        Err(TokenizerError::MissingKey(k)) => assert_eq!(k, "tokenizer.ggml.scores"),
        other => panic!("a SentencePiece vocabulary without scores: {other:?}"),
    }
    let mut spec = tiny_spec();
    spec.model = "t5".into();
    match Tokenizer::from_spec(spec) {
        Err(TokenizerError::UnsupportedModel(msg)) => assert!(msg.contains("gguf-spm"), "{msg}"),
        other => panic!("expected UnsupportedModel, got {other:?}"),
    }
    let mut spec = tiny_spec();
    spec.model = "t5".into();
    assert!(matches!(
        Tokenizer::from_spec(spec),
        Err(TokenizerError::UnsupportedModel(_))
    ));
}

#[test]
fn bad_specs_are_errors() {
    let mut spec = tiny_spec();
    spec.eos_id = Some(5000);
    assert!(matches!(
        Tokenizer::from_spec(spec),
        Err(TokenizerError::TokenOutOfRange(5000))
    ));
    let mut spec = tiny_spec();
    spec.tokens[260] = "he".into(); // duplicate of id 256
    assert!(matches!(
        Tokenizer::from_spec(spec),
        Err(TokenizerError::Build(_))
    ));
    let mut spec = tiny_spec();
    spec.bos_id = None;
    spec.add_bos = true;
    assert!(matches!(
        Tokenizer::from_spec(spec),
        Err(TokenizerError::Build(_))
    ));
}

#[test]
fn chat_template_from_spec() {
    let t = tiny();
    let tmpl = t.chat_template().expect("template compiles");
    let out = tmpl
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(tmpl.bos_token(), "<|im_start|>");
    assert_eq!(tmpl.eos_token(), "<|im_end|>");

    let mut spec = tiny_spec();
    spec.chat_template = Some("{% if %}".into());
    let t = Tokenizer::from_spec(spec).unwrap();
    assert!(t.chat_template().is_none());
    assert!(t.chat_template_error().is_some());
}

/// gpt-oss's harmony template writes `reasoning_effort` into its system
/// message, `medium` where none is given.
#[test]
fn reasoning_effort_reaches_the_harmony_template() {
    let src = include_str!("../../../harness/src/synth/gpt-oss.jinja");
    let t = ChatTemplate::new(src, "<|startoftext|>", "<|return|>").unwrap();
    let msgs = [ChatMessage::new("user", "hi")];
    let vars = serde_json::json!({"reasoning_effort": "high"});
    let inputs = TemplateInputs {
        tools: None,
        vars: vars.as_object(),
    };
    let high = t.render_with(&msgs, true, inputs).unwrap();
    assert!(high.contains("Reasoning: high"), "{high}");
    assert!(high.ends_with("<|start|>assistant"), "{high}");
    let default = t.render(&msgs, true).unwrap();
    assert!(default.contains("Reasoning: medium"), "{default}");
}

#[test]
fn chat_template_trim_and_lstrip_blocks() {
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% else %}\nA:{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::new("user", "hi"),
                ChatMessage::new("assistant", "yo"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(out, "U:hi\nA:yo\n");
    // No trailing newline kept at the end of the template.
    let t = ChatTemplate::new("{{ bos_token }}x{{ eos_token }}\n", "<s>", "</s>").unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "<s>x</s>");
}

#[test]
fn chat_template_raise_exception() {
    let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
        "ok"
    );
    match t.render(&[ChatMessage::new("system", "x")], false) {
        Err(TokenizerError::Template(msg)) => {
            assert!(
                msg.contains("Conversation must start with a user message"),
                "{msg}"
            )
        }
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn chat_template_syntax_error() {
    match ChatTemplate::new("{% for m in messages %}", "", "") {
        Err(TokenizerError::Template(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn chat_template_python_string_methods() {
    let src = "{% for m in messages %}{% if m.content.startswith('/') %}cmd:{{ m.content[1:].strip() }}{% else %}{{ m.content.strip().upper() }}{% endif %};{% endfor %}{{ 'a,b'.split(',') | join('+') }}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::new("user", "  hello  "),
                ChatMessage::new("user", "/ run "),
            ],
            false,
        )
        .unwrap();
    assert_eq!(out, "HELLO;cmd:run;a+b");
}

#[test]
fn chat_template_python_values_and_tojson() {
    let src = "{{ tools }}|{{ add_generation_prompt }}|{{ messages[0] | tojson }}|{{ {'a': '<é>', 'b': [1, 2.5, none, true]} | tojson(indent=2) }}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let out = t
        .render(&[ChatMessage::new("user", "say \"hi\"\n")], true)
        .unwrap();
    assert_eq!(
        out,
        "None|True|{\"role\": \"user\", \"content\": \"say \\\"hi\\\"\\n\"}|{\n  \"a\": \"<é>\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
    );
}

#[test]
fn chat_template_render_messages_as_dicts() {
    // Templates index messages both ways, and loop over them with loop.* helpers.
    // (trim_blocks eats the newline right after `{% if not loop.last %}`, as jinja2 does.)
    let src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}SYS\n{% endif %}{{ message['role'] + ':' + message.content }}{% if not loop.last %}\n{% endif %}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let out = t
        .render(
            &[
                ChatMessage::new("user", "a"),
                ChatMessage::new("assistant", "b"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(out, "SYS\nuser:aassistant:b");
}

#[test]
fn chat_template_backslash_newline_in_strings_continues_the_line() {
    // jinja2 drops a backslash-newline inside a string literal (Python's line
    // continuation); text outside tags, raw blocks and comments keep theirs.
    let src = "{% set s = \"a\\\nb\" %}{{ s }}|{{ 'c\\\r\nd' }}|x\\\ny|{% raw %}{{ \"e\\\nf\" }}{% endraw %}|{# \"g\\\nh\" #}|{{ \"i\\\"j\\\\\" }}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(
        t.render(&[], false).unwrap(),
        "ab|cd|x\\\ny|{{ \"e\\\nf\" }}||i\"j\\"
    );
}

#[test]
fn chat_message_serde() {
    let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
    assert_eq!(m, ChatMessage::new("user", "hi"));
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"role":"user","content":"hi"}"#
    );
}

mod chat_tools;
mod golden;
mod golden_gemma3;
mod golden_gpt_oss;
mod hf_json;
mod qwen3;

mod metadata {
    use super::*;
    use crate::gguf::{MetaValue, Metadata};

    fn strings(v: &[String]) -> MetaValue {
        MetaValue::Array(v.iter().map(|s| MetaValue::String(s.clone())).collect())
    }

    /// The tiny vocabulary as GGUF metadata.
    fn tiny_metadata() -> Metadata {
        let spec = tiny_spec();
        let mut md = Metadata::new();
        md.insert("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
            .unwrap();
        md.insert("tokenizer.ggml.pre", MetaValue::String("smollm".into()))
            .unwrap();
        md.insert("tokenizer.ggml.tokens", strings(&spec.tokens))
            .unwrap();
        md.insert(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                spec.token_types
                    .iter()
                    .map(|&t| MetaValue::I32(t))
                    .collect(),
            ),
        )
        .unwrap();
        md.insert("tokenizer.ggml.merges", strings(&spec.merges))
            .unwrap();
        md.insert("tokenizer.ggml.bos_token_id", MetaValue::U32(261))
            .unwrap();
        md.insert("tokenizer.ggml.eos_token_id", MetaValue::U32(262))
            .unwrap();
        md.insert("tokenizer.ggml.padding_token_id", MetaValue::U32(99_999))
            .unwrap();
        md.insert(
            "tokenizer.chat_template",
            MetaValue::String(spec.chat_template.clone().unwrap()),
        )
        .unwrap();
        md
    }

    #[test]
    fn from_metadata_reads_the_tokenizer_keys() {
        let md = tiny_metadata();
        let spec = VocabSpec::from_metadata(&md).unwrap();
        let want = tiny_spec();
        assert_eq!(spec.tokens, want.tokens);
        assert_eq!(spec.token_types, want.token_types);
        assert_eq!(spec.merges, want.merges);
        assert_eq!(spec.pre.as_deref(), Some("smollm"));
        assert_eq!((spec.bos_id, spec.eos_id), (Some(261), Some(262)));
        // Out-of-range ids are dropped, as llama.cpp ignores them.
        assert_eq!(spec.pad_id, None);
        assert!(!spec.add_bos && !spec.add_eos);
        let t = Tokenizer::from_gguf(&md).unwrap();
        assert_eq!(t.encode(" hello", true, true).unwrap(), vec![260]);
    }

    #[test]
    fn from_metadata_defaults_add_bos_per_pre_tokenizer() {
        let mut md = Metadata::new();
        let spec = tiny_spec();
        md.insert("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
            .unwrap();
        md.insert("tokenizer.ggml.pre", MetaValue::String("llama-bpe".into()))
            .unwrap();
        md.insert("tokenizer.ggml.tokens", strings(&spec.tokens))
            .unwrap();
        md.insert("tokenizer.ggml.merges", strings(&spec.merges))
            .unwrap();
        md.insert("tokenizer.ggml.bos_token_id", MetaValue::U32(261))
            .unwrap();
        let s = VocabSpec::from_metadata(&md).unwrap();
        assert!(s.add_bos, "llama3 pre-tokenizers add BOS by default");
        assert!(s.token_types.is_empty());
        let t = Tokenizer::from_spec(s).unwrap();
        assert_eq!(t.encode("hello", true, false).unwrap(), vec![261, 259]);
        md.insert("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
            .unwrap();
        assert!(!VocabSpec::from_metadata(&md).unwrap().add_bos);
    }

    #[test]
    fn from_metadata_errors() {
        let md = Metadata::new();
        assert!(matches!(
            VocabSpec::from_metadata(&md),
            Err(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.model"
        ));
        let mut md = Metadata::new();
        md.insert("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
            .unwrap();
        md.insert("tokenizer.ggml.tokens", strings(&["a".to_string()]))
            .unwrap();
        assert!(matches!(
            VocabSpec::from_metadata(&md),
            Err(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.merges"
        ));
        let mut md = Metadata::new();
        md.insert("tokenizer.ggml.model", MetaValue::U32(3))
            .unwrap();
        assert!(matches!(
            VocabSpec::from_metadata(&md),
            Err(TokenizerError::Build(_))
        ));
        let mut md = Metadata::new();
        md.insert("tokenizer.ggml.model", MetaValue::String("llama".into()))
            .unwrap();
        md.insert("tokenizer.ggml.tokens", strings(&["a".to_string()]))
            .unwrap();
        // SentencePiece adds BOS by default, and this vocabulary names none.
        match Tokenizer::from_gguf(&md) {
            Err(TokenizerError::Build(msg)) => assert!(msg.contains("no BOS"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}

use super::*;

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

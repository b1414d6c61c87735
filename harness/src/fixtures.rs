//! Model files the scenarios start the worker on, by name. Bad and hostile files
//! are made from the reference model (see `gguf`). `synthetic-<preset>` names are
//! random-weight models of other architectures and real shapes, written as
//! `harness synth-model --preset PRESET --out FILE --reference REF` does (see
//! `synth`), with the reference model's tokenizer, or for the phi3 presets
//! Gemma 3's SentencePiece vocabulary from `synth::SPM_REFERENCE_FILE` beside
//! the reference model (`ci/fetch-model gemma3`); the gpt-oss presets' vocabulary
//! comes from tiktoken-rs (`synth::harmony`). An unknown preset fails with the
//! list of known ones.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use crate::gguf::{patched, Gguf};
use crate::synth;

/// The Gemma 3 270M file's name in the models folder.
pub const GEMMA3_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Every fixture name a feature file may use.
pub const NAMES: &[&str] = &[
    "reference",
    "gemma3",
    "bad-magic",
    "gguf-v1",
    "gguf-v2",
    "10001-tensors",
    "tensor-past-eof",
    "cut-mid-tensor",
    "arch-mamba",
    "arch-qwen2",
    "missing-block-count",
    "tokenizer-rwkv",
    "absurd-kv-count",
    "huge-string",
    "tensor-overlap",
    "dim-overflow",
    "unknown-type",
    "misaligned-offset",
];

/// Builds (once per directory) the named fixture and returns its absolute path.
/// `synthetic-<preset>` names are written as `harness synth-model` writes them,
/// into `$HARNESS_MODEL_CACHE` when set (kept between runs) instead of `dir`;
/// `reference-tokenizer-json` is the reference model with `golden_dir/tokenizer.json` beside it.
pub fn materialize(name: &str, reference: &Path, golden_dir: &Path, dir: &Path) -> Result<PathBuf> {
    if name == "reference" {
        return Ok(reference.to_path_buf());
    }
    if name == "gemma3" {
        // The real Gemma 3 270M file, which `ci/fetch-model gemma3` puts
        // beside the reference model.
        let path = reference.with_file_name(GEMMA3_FILE);
        if !path.exists() {
            bail!("{} is absent: run ci/fetch-model gemma3", path.display());
        }
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    if name == "reference-tokenizer-json" {
        let folder = dir.join(name);
        std::fs::create_dir_all(&folder)?;
        let tok = golden_dir.join("tokenizer.json");
        std::fs::copy(&tok, folder.join("tokenizer.json")).with_context(|| {
            format!(
                "no {} to put beside the model (hf-json goldens)",
                tok.display()
            )
        })?;
        let model = folder.join("model.gguf");
        if !model.exists() {
            std::os::unix::fs::symlink(reference, &model)?;
        }
        return Ok(model);
    }
    if name == "synthetic-gpt-oss-tokenizer-json" {
        // The synthetic gpt-oss file with the Hugging Face `tokenizer.json`
        // of the same vocabulary beside it (M0-W-1821 through hf-json).
        let model = materialize("synthetic-gpt-oss", reference, golden_dir, dir)?;
        let folder = dir.join(name);
        std::fs::create_dir_all(&folder)?;
        let tok = folder.join("tokenizer.json");
        if !tok.exists() {
            let json = crate::synth::harmony::tokenizer_json()?;
            let part = folder.join("tokenizer.json.part");
            std::fs::write(&part, serde_json::to_vec(&json)?)?;
            std::fs::rename(&part, &tok)?;
        }
        let link = folder.join("model.gguf");
        if !link.exists() {
            std::os::unix::fs::symlink(&model, &link)?;
        }
        return Ok(link);
    }
    if let Some(preset) = name.strip_prefix("synthetic-") {
        // Large synthetic models may be kept between runs (the GPU machine
        // writes Llama-3-8B's 5 GB once per session).
        let dir = std::env::var_os("HARNESS_MODEL_CACHE").map_or(dir.to_path_buf(), PathBuf::from);
        std::fs::create_dir_all(&dir)?;
        let out = dir.join(format!("{name}.gguf"));
        if !out.exists() {
            synthesize(preset, reference, &out)?;
        }
        return Ok(out);
    }
    let out = dir.join(format!("{name}.gguf"));
    if out.exists() {
        return Ok(out);
    }
    let g = Gguf::read(reference)?;
    let b = &g.bytes;
    let first_kv = g
        .kvs
        .first()
        .ok_or_else(|| anyhow!("reference has no metadata"))?;
    let (t0, t1) = (&g.tensors[0], &g.tensors[1]);
    let last = g
        .tensors
        .iter()
        .max_by_key(|t| t.offset)
        .ok_or_else(|| anyhow!("no tensors"))?;
    let file_len = b.len() as u64;
    let bytes: Vec<u8> = match name {
        "bad-magic" => patched(b, 0, b"GGUX"),
        "gguf-v1" => patched(b, 4, &1u32.to_le_bytes()),
        "gguf-v2" => patched(b, 4, &2u32.to_le_bytes()),
        "10001-tensors" => patched(b, 8, &10_001u64.to_le_bytes()),
        "absurd-kv-count" => patched(b, 16, &(u64::MAX / 3).to_le_bytes()),
        "huge-string" => patched(b, first_kv.at, &(1u64 << 62).to_le_bytes()),
        "tensor-past-eof" => patched(b, last.offset_at, &(file_len * 2).to_le_bytes()),
        "tensor-overlap" => patched(b, t1.offset_at, &t0.offset.to_le_bytes()),
        "dim-overflow" => patched(b, t0.dims_at, &(1u64 << 62).to_le_bytes()),
        "unknown-type" => patched(b, t0.type_at, &99u32.to_le_bytes()),
        "misaligned-offset" => patched(b, t1.offset_at, &(t1.offset + 1).to_le_bytes()),
        "cut-mid-tensor" => {
            let size = Gguf::tensor_bytes(last).ok_or_else(|| anyhow!("unknown type"))?;
            b[..g.data_offset + (last.offset + size / 2) as usize].to_vec()
        }
        "arch-mamba" => edited(&g, |e| e.set_string("general.architecture", "mamba"))?,
        // qwen2 carries Q/K/V biases (as llama.cpp requires); zero ones keep llama's weights.
        "arch-qwen2" => edited(&g, |e| {
            e.set_string("general.architecture", "qwen2")?;
            e.rename_prefix("llama.", "qwen2.");
            let blocks = e
                .u64_value("qwen2.block_count")
                .ok_or_else(|| anyhow!("no block_count"))?;
            for b in 0..blocks {
                for m in ["q", "k", "v"] {
                    let weight = format!("blk.{b}.attn_{m}.weight");
                    let rows = e
                        .tensors
                        .iter()
                        .find(|t| t.name == weight)
                        .and_then(|t| t.dims.last().copied())
                        .ok_or_else(|| anyhow!("no {weight}"))?;
                    e.add_f32_tensor(&format!("blk.{b}.attn_{m}.bias"), &vec![0.0; rows as usize]);
                }
            }
            Ok(())
        })?,
        "missing-block-count" => edited(&g, |e| e.remove_key("llama.block_count"))?,
        "tokenizer-rwkv" => edited(&g, |e| e.set_string("tokenizer.ggml.model", "rwkv"))?,
        other => bail!("unknown model fixture {other:?}; known: {NAMES:?} and synthetic-<preset>"),
    };
    let tmp = out.with_extension("part");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

fn edited(g: &Gguf, f: impl FnOnce(&mut Gguf) -> Result<()>) -> Result<Vec<u8>> {
    let mut e = g.clone();
    f(&mut e)?;
    Ok(e.write())
}

/// Writes the preset's model in its default format, seed 0: what `harness
/// synth-model --preset PRESET --out FILE --reference REF` writes (with
/// `--spm-reference` the Gemma 3 file beside REF, for the phi3 presets).
fn synthesize(name: &str, reference: &Path, out: &Path) -> Result<()> {
    let preset =
        synth::preset(name).with_context(|| format!("synthetic model {name:?} unavailable"))?;
    let spm = reference.with_file_name(synth::SPM_REFERENCE_FILE);
    let reference = synth::tokenizer_source(preset, reference, &spm);
    if preset.vocab_source == synth::Vocab::Spm && !spm.is_file() {
        bail!(
            "synthetic model {name:?} takes its SentencePiece vocabulary from {}, which is \
             missing: run `ci/fetch-model gemma3`",
            spm.display()
        );
    }
    let opts = synth::Options {
        preset,
        format: preset.default_format,
        seed: 0,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    synth::write_file(&opts, reference, out)
        .with_context(|| format!("writing synthetic model {name:?}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Kv;

    #[test]
    fn every_named_fixture_is_broken_as_named() {
        let dir =
            std::env::temp_dir().join(format!("harness-fixtures-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut g = Gguf::parse(crate::gguf::tests::tiny()).unwrap();
        let mut raw = (4u64).to_le_bytes().to_vec();
        raw.extend_from_slice(b"gpt2");
        g.kvs.push(Kv {
            key: "tokenizer.ggml.model".into(),
            vtype: 8,
            raw,
            at: 0,
        });
        // One block with Q/K/V weights, so the qwen2 relabelling has something to bias.
        g.kvs
            .iter_mut()
            .find(|k| k.key == "llama.block_count")
            .unwrap()
            .raw = 1u32.to_le_bytes().to_vec();
        g.tensors[0].name = "blk.0.attn_q.weight".into();
        g.tensors[1].name = "blk.0.attn_k.weight".into();
        g.add_f32_tensor("blk.0.attn_v.weight", &[0.5; 4]);
        let reference = dir.join("ref.gguf");
        std::fs::write(&reference, g.write()).unwrap();
        let g = Gguf::read(&reference).unwrap();
        // The real Gemma file is found beside the reference model, or named as missing.
        let err = materialize("gemma3", &reference, &dir, &dir.join("out")).unwrap_err();
        assert!(err.to_string().contains("ci/fetch-model gemma3"), "{err}");
        std::fs::write(dir.join(GEMMA3_FILE), b"GGUF").unwrap();
        let made = |n: &str| materialize(n, &reference, &dir, &dir.join("out")).unwrap();
        for name in NAMES {
            assert!(made(name).is_file(), "{name}");
        }
        let bytes = |n: &str| std::fs::read(made(n)).unwrap();
        assert_eq!(&bytes("bad-magic")[..4], b"GGUX");
        assert_eq!(Gguf::parse(bytes("gguf-v2")).unwrap().version, 2);
        assert_eq!(
            Gguf::parse(bytes("arch-mamba"))
                .unwrap()
                .string("general.architecture")
                .as_deref(),
            Some("mamba")
        );
        let q = Gguf::parse(bytes("arch-qwen2")).unwrap();
        assert_eq!(q.u64_value("qwen2.block_count"), Some(1));
        for m in ["q", "k", "v"] {
            let b = q
                .tensors
                .iter()
                .find(|t| t.name == format!("blk.0.attn_{m}.bias"))
                .expect("bias");
            assert_eq!(b.dims, [4]);
        }
        assert!(Gguf::parse(bytes("missing-block-count"))
            .unwrap()
            .kv("llama.block_count")
            .is_none());
        assert_eq!(
            Gguf::parse(bytes("tokenizer-rwkv"))
                .unwrap()
                .string("tokenizer.ggml.model")
                .as_deref(),
            Some("rwkv")
        );
        assert!(bytes("cut-mid-tensor").len() < g.bytes.len());
        let eof = Gguf::parse(bytes("tensor-past-eof")).unwrap();
        assert!(eof
            .tensors
            .iter()
            .any(|t| t.offset > eof.bytes.len() as u64));
        let ov = Gguf::parse(bytes("tensor-overlap")).unwrap();
        assert_eq!(ov.tensors[0].offset, ov.tensors[1].offset);
        assert_eq!(
            Gguf::parse(bytes("unknown-type")).unwrap().tensors[0].ttype,
            99
        );
        assert_eq!(
            u64::from_le_bytes(bytes("10001-tensors")[8..16].try_into().unwrap()),
            10_001
        );
        assert!(materialize("no-such", &reference, &dir, &dir.join("out")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn synthetic_names_are_written_by_synth_model() {
        let dir =
            std::env::temp_dir().join(format!("harness-fixtures-synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let reference = dir.join("ref.gguf");
        std::fs::write(&reference, crate::synth::tests::fake_reference().write()).unwrap();
        let made = materialize("synthetic-tiny-qwen2", &reference, &dir, &dir.join("out")).unwrap();
        assert_eq!(made, dir.join("out/synthetic-tiny-qwen2.gguf"));
        let g = Gguf::read_header(&made).unwrap();
        assert_eq!(g.string("general.architecture").as_deref(), Some("qwen2"));
        assert_eq!(g.array_len("tokenizer.ggml.tokens"), Some(151_936));
        let e = materialize("synthetic-mamba", &reference, &dir, &dir.join("out")).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("known: tiny-llama"), "{e}");
        // The phi3 presets want the SentencePiece file beside the reference.
        let e = materialize("synthetic-tiny-phi3", &reference, &dir, &dir.join("out")).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("ci/fetch-model gemma3") && e.contains(crate::synth::SPM_REFERENCE_FILE),
            "{e}"
        );
        std::fs::write(
            dir.join(crate::synth::SPM_REFERENCE_FILE),
            crate::synth::tests::fake_spm_reference(40).write(),
        )
        .unwrap();
        let made = materialize("synthetic-tiny-phi3", &reference, &dir, &dir.join("out")).unwrap();
        let g = Gguf::read_header(&made).unwrap();
        assert_eq!(g.string("general.architecture").as_deref(), Some("phi3"));
        assert_eq!(g.string("tokenizer.ggml.model").as_deref(), Some("llama"));
        assert_eq!(g.array_len("tokenizer.ggml.tokens"), Some(32064));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

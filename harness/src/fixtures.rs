//! Model files the scenarios start the worker on, by name. Bad and hostile files
//! are made from the reference model (see `gguf`); synthetic random-weight models
//! of other architectures and real shapes come from `harness synth-model
//! --preset NAME --out FILE` (owned by the CUDA backend's issue: until it exists,
//! scenarios that need one fail, or are tagged pending).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

use crate::gguf::{patched, Gguf};

/// Every fixture name a feature file may use.
pub const NAMES: &[&str] = &[
    "reference",
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
/// `synthetic-<preset>` names are delegated to `harness synth-model`.
pub fn materialize(name: &str, reference: &Path, dir: &Path) -> Result<PathBuf> {
    if name == "reference" {
        return Ok(reference.to_path_buf());
    }
    std::fs::create_dir_all(dir)?;
    let out = dir.join(format!("{name}.gguf"));
    if out.exists() {
        return Ok(out);
    }
    if let Some(preset) = name.strip_prefix("synthetic-") {
        synthesize(preset, &out)?;
        return Ok(out);
    }
    let g = Gguf::read(reference)?;
    let b = &g.bytes;
    let first_kv = g.kvs.first().ok_or_else(|| anyhow!("reference has no metadata"))?;
    let (t0, t1) = (&g.tensors[0], &g.tensors[1]);
    let last = g.tensors.iter().max_by_key(|t| t.offset).ok_or_else(|| anyhow!("no tensors"))?;
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
        "arch-qwen2" => edited(&g, |e| {
            e.set_string("general.architecture", "qwen2")?;
            e.rename_prefix("llama.", "qwen2.");
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

/// Runs `harness synth-model --preset PRESET --out FILE` (this same binary).
fn synthesize(preset: &str, out: &Path) -> Result<()> {
    let exe = std::env::current_exe()?;
    let o = Command::new(&exe)
        .args(["synth-model", "--preset", preset, "--out"])
        .arg(out)
        .output()
        .with_context(|| format!("running {} synth-model", exe.display()))?;
    if !o.status.success() {
        bail!(
            "synthetic model {preset:?} unavailable: `harness synth-model` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).lines().take(5).collect::<Vec<_>>().join(" / ")
        );
    }
    if !out.exists() {
        bail!("harness synth-model wrote no {}", out.display());
    }
    Ok(())
}

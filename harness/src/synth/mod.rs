//! `harness synth-model`: random-weight GGUF files of named, real model shapes,
//! for scenarios that need an architecture or a size the reference model does
//! not have (qwen2, phi3, gpt2, Llama-3-8B, a 2 GB file, every weight format).
//!
//! A file is the preset's hyperparameters (for phi3 and gpt2 exactly the keys
//! llama.cpp's `convert_hf_to_gguf.py` writes for them), a vocabulary, and
//! llama.cpp-named tensors (the converter's names, shapes and fusions) whose
//! bytes come from `blocks`. The vocabulary is the reference model's
//! `tokenizer.*` metadata (SmolLM2's byte-level BPE) padded to the preset's
//! size with unused `[PAD<id>]` tokens, as llama.cpp's converter pads Qwen2's;
//! or, for the phi3 presets, a SentencePiece vocabulary cut from another file
//! (`--spm-reference`: Gemma 3's 262,144 pieces, the first 32,064 of which hold
//! the 256 byte-fallback tokens, the special ones and the best-scored pieces),
//! with a Phi-3 file's tokenizer keys; or, for the gpt-oss presets, o200k_harmony from tiktoken-rs
//! (`harmony`), their experts written straight in MXFP4 and the rest in the format asked for
//! (Q8_0 by default, as llama.cpp's own gpt-oss files). The bytes are a function of (preset, format, seed) alone: each
//! 8192-value chunk of each tensor has its own random stream, so any number of
//! threads writes the same file.
//!
//! Writing streams: the header is computed first (every size is known), then
//! each tensor is generated window by window in parallel and handed to a
//! writer thread, so memory stays at a few windows whatever the file size.
//! The file appears under its name only when complete (`FILE.part`, renamed).
//!
//! Default formats: the tiny presets are Q8_0 (close to the float model, fast
//! on the CPU); the real shapes are Q4_1, the reference model's type, so the
//! large files stay small on disk (Llama-3-8B about 5 GB) and run the same
//! kernels as the goldens; phi3 and gpt2 are Q4_K, the format of their
//! llama.cpp goldens (testdata/golden-synth, which has the tiny ones in Q8_0,
//! Q4_K and F16). Norm weights and biases are F32 in every format, as in
//! llama.cpp's files (and gpt2's `position_embd`, which llama.cpp never quantizes).
//!
//! Like `gguf`, this deliberately does not use the worker's writer or quantizer.
//!
//! Parts: `presets` (the shapes), `tensors` (names, shapes, layout), `vocab`
//! and `harmony` (the vocabularies), `metadata` (every key), `blocks` (the
//! bytes); here, the streaming writer.

pub mod blocks;
pub mod harmony;
pub mod metadata;
mod preset_table;
pub mod presets;
pub mod tensors;
pub mod vocab;

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

pub use blocks::{FactorTable, Format, Init};
pub use metadata::{general_name, metadata};
pub use preset_table::{preset, PRESETS};
pub use presets::{Arch, Moe, Options, Preset, RopeScaling, Vocab, SPM_REFERENCE_FILE};
pub use tensors::{layout, tensors, TensorSpec, ALIGNMENT};
pub use vocab::{spm_selection, spm_tokenizer_kvs, tokenizer_kvs, tokenizer_source};

use crate::gguf::{write_header, Gguf, Kv, TensorEntry};

/// Values per independent random stream: a multiple of every block size.
const CHUNK_VALUES: u64 = 8192;
/// Bytes generated per window (split among the threads, then written).
const WINDOW_BYTES: u64 = 32 << 20;

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    pub bytes: u64,
    pub tensors: usize,
    pub data_offset: u64,
    pub data_bytes: u64,
    pub seconds: f64,
}

/// The header (up to the data section, padded) with the offsets of `layout`.
pub fn header(kvs: &[Kv], tensors: &[TensorSpec], offsets: &[u64]) -> Vec<u8> {
    let entries = tensors.iter().zip(offsets).map(|(t, &offset)| TensorEntry {
        name: &t.name,
        dims: &t.dims,
        ttype: t.format.ggml_type(),
        offset,
    });
    write_header(3, kvs, entries, ALIGNMENT)
}

/// Generates chunks `chunks` of tensor `index` into `out` (their bytes, in order).
fn fill_window(
    t: &TensorSpec,
    index: u64,
    seed: u64,
    chunks: std::ops::Range<u64>,
    out: &mut [u8],
    threads: usize,
) {
    let chunk_bytes = t.format.bytes_for(CHUNK_VALUES) as usize;
    let fill_range = |first: u64, out: &mut [u8]| {
        for (k, part) in out.chunks_mut(chunk_bytes).enumerate() {
            let mut rng = blocks::Rng::for_chunk(seed, index, first + k as u64);
            blocks::fill(t.format, t.init, &mut rng, part);
        }
    };
    let n = (chunks.end - chunks.start) as usize;
    if threads <= 1 || n < 2 * threads {
        fill_range(chunks.start, out);
        return;
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        for (k, part) in out.chunks_mut(per * chunk_bytes).enumerate() {
            let fill_range = &fill_range;
            s.spawn(move || fill_range(chunks.start + (k * per) as u64, part));
        }
    });
}

/// Writes the whole file to `w`: header, then each tensor aligned.
pub fn write_to(o: &Options, reference: &Gguf, w: &mut (impl Write + Send)) -> Result<Written> {
    let start = Instant::now();
    let specs = tensors(o.preset, o.format);
    let (offsets, data_bytes) = layout(&specs);
    let head = header(&metadata(o, reference)?, &specs, &offsets);
    let data_offset = head.len() as u64;

    std::thread::scope(|s| -> Result<()> {
        // Two buffers circulate: one being generated, one being written.
        let (full_tx, full_rx) = mpsc::sync_channel::<Vec<u8>>(1);
        let (empty_tx, empty_rx) = mpsc::channel::<Vec<u8>>();
        empty_tx.send(Vec::new())?;
        empty_tx.send(Vec::new())?;
        let writer = s.spawn(move || -> std::io::Result<()> {
            for buf in full_rx {
                w.write_all(&buf)?;
                // The generator may have stopped; then the buffer is not wanted.
                let _ = empty_tx.send(buf);
            }
            w.flush()
        });
        let send = |fill: &mut dyn FnMut(&mut Vec<u8>)| -> Result<()> {
            let mut buf = empty_rx
                .recv()
                .map_err(|_| anyhow!("the writer thread stopped"))?;
            fill(&mut buf);
            full_tx
                .send(buf)
                .map_err(|_| anyhow!("the writer thread stopped"))
        };
        let produced = || -> Result<()> {
            send(&mut |b| {
                b.clear();
                b.extend_from_slice(&head);
            })?;
            let mut at = 0u64;
            for (i, (t, &off)) in specs.iter().zip(&offsets).enumerate() {
                if off > at {
                    send(&mut |b| {
                        b.clear();
                        b.resize((off - at) as usize, 0);
                    })?;
                }
                let values = t.values();
                let n_chunks = values.div_ceil(CHUNK_VALUES);
                let per_window = (WINDOW_BYTES / t.format.bytes_for(CHUNK_VALUES)).max(1);
                let mut c = 0;
                while c < n_chunks {
                    let end = (c + per_window).min(n_chunks);
                    let len = t
                        .format
                        .bytes_for((end * CHUNK_VALUES).min(values) - c * CHUNK_VALUES);
                    send(&mut |b| {
                        b.clear();
                        b.resize(len as usize, 0);
                        fill_window(t, i as u64, o.seed, c..end, b, o.threads);
                    })?;
                    c = end;
                }
                at = off + t.bytes();
            }
            Ok(())
        };
        let made = produced();
        drop(full_tx);
        let wrote = writer
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))?;
        made?;
        Ok(wrote?)
    })?;
    Ok(Written {
        bytes: data_offset + data_bytes,
        tensors: specs.len(),
        data_offset,
        data_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Writes the file at `out` (through `out.part`, renamed when complete), with
/// the tokenizer of `reference`: the BPE reference model, or for a preset of
/// `Vocab::Spm` the SentencePiece one (`tokenizer_source` picks).
pub fn write_file(o: &Options, reference: &Path, out: &Path) -> Result<Written> {
    let reference = Gguf::read_header(reference).with_context(|| {
        format!(
            "reading the {} tokenizer from {}",
            match o.preset.vocab_source {
                Vocab::Reference | Vocab::Harmony => "reference's",
                Vocab::Spm => "SentencePiece reference's",
            },
            reference.display()
        )
    })?;
    let mut part = out.as_os_str().to_owned();
    part.push(".part");
    let part = std::path::PathBuf::from(part);
    let file =
        std::fs::File::create(&part).with_context(|| format!("creating {}", part.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = match write_to(o, &reference, &mut w) {
        Ok(x) => x,
        Err(e) => {
            drop(w);
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    let file = w.into_inner().map_err(|e| e.into_error())?;
    let len = file.metadata()?.len();
    if len != written.bytes {
        bail!(
            "wrote {len} bytes to {}, expected {}",
            part.display(),
            written.bytes
        );
    }
    drop(file);
    std::fs::rename(&part, out)
        .with_context(|| format!("renaming {} to {}", part.display(), out.display()))?;
    Ok(written)
}

#[cfg(test)]
pub(crate) mod tests;

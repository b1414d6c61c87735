//! Loading, the one place that knows both the model and the backends: read
//! or map → parse → validate → configure (which picks the architecture) →
//! tokenizer (from the GGUF metadata, or `tokenizer.json` beside the file:
//! M0-W-1360) → construct the chosen backend, which binds the weights
//! (M0-W-1410), with progress reported by bytes.
//!
//! A loaded model needs nothing from the file on disk any more, so a deploy
//! that truncates or overwrites it in place cannot reach a running worker
//! (issue 47): see [`open_for`].
//!
//! It sits above `model` and `backend` (which know nothing of each other's
//! construction) and below `engine` and `cli`; the stable API code of a load
//! failure is decided above, by `engine::load_error_code`.

use std::path::Path;
use std::sync::Arc;

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, CudaLoadOptions};
use crate::backend::{Backend, BackendError, BackendKind, KvType};
use crate::gguf::{file_type_name, GgufError, GgufFile};
use crate::model::config::{ConfigError, ModelConfig};
use crate::model::ModelInfo;
use crate::tokenizer::{Tokenizer, TokenizerError, TokenizerKind, HF_TOKENIZER_FILE};

/// Where the tokenizer comes from (`--tokenizer`, M0-W-1360).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TokenizerChoice {
    /// The GGUF file's metadata (`gguf-bpe`, `gguf-spm`); `hf-json` when the
    /// file has no tokenizer and a `tokenizer.json` is beside it.
    #[default]
    Gguf,
    /// `tokenizer.json` in the model file's folder (`hf-json`).
    HfJson,
}

impl TokenizerChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenizerChoice::Gguf => "gguf",
            TokenizerChoice::HfJson => "hf-json",
        }
    }
}

impl std::fmt::Display for TokenizerChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TokenizerChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gguf" => Ok(TokenizerChoice::Gguf),
            "hf-json" => Ok(TokenizerChoice::HfJson),
            other => Err(format!(
                "unknown tokenizer {other:?} (expected gguf or hf-json)"
            )),
        }
    }
}

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: BackendKind,
    pub gpu_device: usize,
    /// Upper bound on one sequence's KV cache; `None`: computed from the context.
    pub kv_cache_size_mb: Option<u64>,
    /// The KV cache's type (`--kv-type`).
    pub kv_type: KvType,
    /// Host-to-device copy chunk (M0-W-1222).
    pub upload_chunk_bytes: usize,
    /// Caps the model's context length (`--max-tokens-in` plus output).
    pub max_context: Option<usize>,
    /// A chat template replacing the file's (`--chat-template[-file]`).
    pub chat_template: Option<String>,
    /// `--tokenizer`.
    pub tokenizer: TokenizerChoice,
    /// Sequences the backend holds at once (`--parallel`).
    pub parallel: usize,
    /// The prefix cache's share of the KV memory (`--prefix-cache`); `None`: off.
    pub prefix_cache: Option<f64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            backend: BackendKind::Cpu,
            gpu_device: 0,
            kv_cache_size_mb: None,
            kv_type: KvType::F16,
            upload_chunk_bytes: 1 << 20,
            max_context: None,
            chat_template: None,
            tokenizer: TokenizerChoice::Gguf,
            parallel: 1,
            prefix_cache: None,
        }
    }
}

/// Load progress, reported exactly once at each of 0, 25, 50, 75 and 100 percent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    pub percent: u8,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// A model ready to serve.
pub struct LoadedModel {
    pub backend: Box<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    pub info: ModelInfo,
    pub config: ModelConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Gguf(#[from] GgufError),
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("{0}")]
    Backend(#[from] BackendError),
}

impl LoadError {
    /// Bytes needed and bytes free, when the failure is a lack of device memory.
    pub fn vram(&self) -> Option<(u64, u64)> {
        match self {
            LoadError::Backend(BackendError::OutOfMemory { needed, available }) => {
                Some((*needed, *available))
            }
            _ => None,
        }
    }
}

/// Calls the progress callback at each quarter of the bytes, once each.
struct ProgressMarks<'a> {
    total: u64,
    done: u64,
    next_mark: u8,
    report: &'a mut dyn FnMut(LoadProgress),
}

impl<'a> ProgressMarks<'a> {
    fn new(total: u64, report: &'a mut dyn FnMut(LoadProgress)) -> Self {
        let mut marks = ProgressMarks {
            total,
            done: 0,
            next_mark: 0,
            report,
        };
        marks.advance(0);
        marks
    }

    fn advance(&mut self, bytes: u64) {
        self.done = (self.done + bytes).min(self.total);
        let percent = (self.done * 100).checked_div(self.total).unwrap_or(100) as u8;
        while self.next_mark <= 100 && percent >= self.next_mark {
            (self.report)(LoadProgress {
                percent: self.next_mark,
                bytes_done: self.done,
                bytes_total: self.total,
            });
            self.next_mark += 25;
        }
    }

    fn finish(&mut self) {
        let rest = self.total - self.done;
        self.advance(rest);
    }
}

/// Reads the model file and makes it ready on the chosen backend.
pub fn load_model(
    path: &Path,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<LoadedModel, LoadError> {
    load_from(
        Arc::new(open_for(opts.backend, path)?),
        path.parent(),
        opts,
        progress,
    )
}

/// The file as the chosen backend needs it for as long as it serves. The
/// CPU backend computes from the stored weights on every step, so they are
/// read into memory: the file's size in RSS instead of the page cache (one
/// copy, read in one go), and no map left for a truncation to turn into
/// SIGBUS (a private map would not help: it copies pages only on write).
/// The CUDA backend copies every weight to the GPU while it loads and only
/// borrows the file (`CudaBackend::load` takes `&GgufFile`), so the map is
/// dropped when [`load_from`] returns: no host copy of gigabytes.
fn open_for(backend: BackendKind, path: &Path) -> Result<GgufFile, GgufError> {
    match backend {
        BackendKind::Cpu => GgufFile::read(path),
        BackendKind::Cuda => GgufFile::open(path),
    }
}

/// [`load_model`] for a file already parsed (from memory, in tests and the
/// hostile-file corpus): everything after the GGUF reader's own checks. It
/// has no folder, so no `tokenizer.json`.
pub fn load_file(
    file: Arc<GgufFile>,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<LoadedModel, LoadError> {
    load_from(file, None, opts, progress)
}

/// `folder`: the model file's, where a `tokenizer.json` may be.
fn load_from(
    file: Arc<GgufFile>,
    folder: Option<&Path>,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<LoadedModel, LoadError> {
    let mut config = ModelConfig::try_from(&file.metadata)?;
    if let Some(cap) = opts.max_context {
        config.context_length = config.context_length.min(cap);
    }
    let mut tokenizer = build_tokenizer(&file.metadata, folder, opts.tokenizer)?;
    check_fits_model(&tokenizer, &config)?;
    if let Some(source) = &opts.chat_template {
        tokenizer.set_chat_template(source)?;
    }
    let tokenizer = Arc::new(tokenizer);
    let info = model_info(&file, &config);

    let mut marks = ProgressMarks::new(file.tensor_bytes_total(), progress);
    let mut backend = construct_backend(&config, &file, opts, &mut |b| marks.advance(b))?;
    backend.set_max_sequences(opts.parallel)?;
    backend.set_prefix_cache(opts.prefix_cache)?;
    marks.finish();
    Ok(LoadedModel {
        backend,
        tokenizer,
        info,
        config,
    })
}

/// The tokenizer `choice` asks for (M0-W-1360), reading `tokenizer.json`
/// from `folder` for hf-json.
fn build_tokenizer(
    md: &crate::gguf::Metadata,
    folder: Option<&Path>,
    choice: TokenizerChoice,
) -> Result<Tokenizer, TokenizerError> {
    let json = folder.map(|dir| dir.join(HF_TOKENIZER_FILE));
    match (choice, json) {
        (TokenizerChoice::HfJson, Some(path)) => Tokenizer::from_hf_json(&path, md),
        (TokenizerChoice::HfJson, None) => Err(TokenizerError::Build(
            "--tokenizer hf-json reads tokenizer.json beside the model file, and this model \
             was not loaded from a file"
                .into(),
        )),
        (TokenizerChoice::Gguf, Some(path))
            if md.get("tokenizer.ggml.model").is_none() && path.is_file() =>
        {
            Tokenizer::from_hf_json(&path, md)
        }
        (TokenizerChoice::Gguf, _) => Tokenizer::from_gguf(md),
    }
}

/// A `tokenizer.json` comes from elsewhere than the weights: every id it can
/// produce must have a row in the model (the GGUF kinds are the model's own
/// vocabulary).
fn check_fits_model(tokenizer: &Tokenizer, config: &ModelConfig) -> Result<(), TokenizerError> {
    if tokenizer.kind() == TokenizerKind::HfJson && tokenizer.vocab_size() > config.vocab_size {
        return Err(TokenizerError::Build(format!(
            "tokenizer.json has {} tokens, more than the model's vocabulary of {}",
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    Ok(())
}

/// The chosen backend with the model's weights bound on it; `bound` hears
/// each byte count as it is bound.
fn construct_backend(
    config: &ModelConfig,
    file: &Arc<GgufFile>,
    opts: &LoadOptions,
    bound: &mut dyn FnMut(u64),
) -> Result<Box<dyn Backend>, BackendError> {
    Ok(match opts.backend {
        BackendKind::Cpu => Box::new(
            CpuBackend::load(config.clone(), file.clone(), bound)?.with_kv_type(opts.kv_type)?,
        ),
        BackendKind::Cuda => {
            let cuda_opts = CudaLoadOptions {
                gpu_device: opts.gpu_device,
                kv_cache_size_mb: opts.kv_cache_size_mb,
                upload_chunk_bytes: opts.upload_chunk_bytes,
                kv_type: opts.kv_type,
                ..Default::default()
            };
            Box::new(CudaBackend::load(config.clone(), file, &cuda_opts, bound)?)
        }
    })
}

fn model_info(file: &GgufFile, cfg: &ModelConfig) -> ModelInfo {
    ModelInfo {
        name: cfg.name.clone(),
        architecture: cfg.architecture.name().to_string(),
        quant_kind: quant_kind(file),
        vocab_size: cfg.vocab_size,
        context_length: cfg.context_length,
        tensor_bytes: file.tensor_bytes_total(),
    }
}

/// The file type's short name from `general.file_type`, or, when absent,
/// the most common type among the matrices.
fn quant_kind(file: &GgufFile) -> String {
    if let Ok(Some(ft)) = file.metadata.opt_u64("general.file_type") {
        if let Some(name) = file_type_name(ft as u32) {
            return name.to_string();
        }
    }
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for t in file.tensors.iter().filter(|t| t.dims.len() >= 2) {
        *counts.entry(t.ggml_type.name()).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(name, _)| name.to_string())
        .unwrap_or_else(|| "F32".into())
}

#[cfg(test)]
pub(crate) mod file_replaced;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufError;
    use crate::model::synthetic::synthetic_llama;

    /// M0-W-1410: a file cut in the middle of a tensor fails validation while
    /// the file is parsed, before a single weight is bound (no progress event).
    #[test]
    fn m0_w_1410_a_file_cut_mid_tensor_fails_before_any_weight_is_bound() {
        let bytes = synthetic_llama("llama", 5, 32);
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        let last = file.tensors.iter().max_by_key(|t| t.offset).unwrap();
        let cut = (file.data_offset + last.offset + last.n_bytes / 2) as usize;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.gguf");
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let mut progress = Vec::new();
        let err = load_model(&path, &LoadOptions::default(), &mut |p| {
            progress.push(p.percent)
        })
        .err()
        .expect("cut file");
        assert!(
            matches!(err, LoadError::Gguf(GgufError::CutShort { .. })),
            "{err}"
        );
        assert_eq!(
            crate::engine::load_error_code(&err, BackendKind::Cpu).as_str(),
            "MODEL_LOAD_FAILED"
        );
        assert!(progress.is_empty(), "no weight was bound: {progress:?}");
    }

    /// M0-W-1201: `quant_kind` is the short name of `general.file_type`; a
    /// file without one (or with a number llama.cpp does not name) reports
    /// its most common matrix type.
    #[test]
    fn m0_w_1201_quant_kind_is_the_file_type_short_name() {
        use crate::gguf::{GgufWriter, MetaValue};
        use crate::quant::{quantize, GgmlType};
        let file = |file_type: Option<u32>| {
            let mut w = GgufWriter::new();
            w.metadata("general.architecture", MetaValue::String("llama".into()));
            if let Some(ft) = file_type {
                w.metadata("general.file_type", MetaValue::U32(ft));
            }
            let m = |ty: GgmlType| quantize(ty, &[0.25; 64 * 32]).unwrap();
            for (i, ty) in [
                GgmlType::Q4_1,
                GgmlType::Q4_1,
                GgmlType::Q8_0,
                GgmlType::Q4_1,
                GgmlType::F16,
            ]
            .into_iter()
            .enumerate()
            {
                w.tensor(&format!("m{i}"), &[64, 32], ty, m(ty));
            }
            // Vectors do not count: more F32 vectors than Q4_1 matrices.
            for i in 0..5 {
                w.tensor(
                    &format!("v{i}"),
                    &[64],
                    GgmlType::F32,
                    quantize(GgmlType::F32, &[1.0; 64]).unwrap(),
                );
            }
            GgufFile::from_bytes(w.to_bytes()).unwrap()
        };
        assert_eq!(quant_kind(&file(Some(3))), "Q4_1");
        assert_eq!(quant_kind(&file(Some(15))), "Q4_K_M");
        assert_eq!(quant_kind(&file(Some(38))), "MXFP4");
        assert_eq!(quant_kind(&file(Some(7))), "Q8_0");
        assert_eq!(quant_kind(&file(None)), "Q4_1");
        assert_eq!(
            quant_kind(&file(Some(4))),
            "Q4_1",
            "an unnamed file type falls back to the matrices"
        );

        // The reference model, when present, is Q4_1.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../.models/smollm2-135m-instruct-q4_1.gguf");
        if path.exists() {
            let file = GgufFile::open(&path).unwrap();
            assert_eq!(quant_kind(&file), "Q4_1");
            let cfg = ModelConfig::try_from(&file.metadata).unwrap();
            assert_eq!(model_info(&file, &cfg).quant_kind, "Q4_1");
        }
    }

    /// M0-W-1360: a file without a tokenizer of its own takes the
    /// `tokenizer.json` beside it; `--tokenizer hf-json` insists on one,
    /// naming the path it looked at; a `tokenizer.json` with more tokens than
    /// the model has rows is refused.
    #[test]
    fn m0_w_1360_hf_json_beside_a_file_without_a_tokenizer() {
        // synthetic_llama names 384 tokens but no tokenizer.ggml.model.
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, synthetic_llama("llama", 5, 32)).unwrap();
        let json = dir.path().join(HF_TOKENIZER_FILE);
        let load = |choice| {
            let opts = LoadOptions {
                tokenizer: choice,
                ..LoadOptions::default()
            };
            load_model(&model, &opts, &mut |_| {})
        };
        let err = load(TokenizerChoice::HfJson)
            .err()
            .expect("no tokenizer.json");
        assert!(
            matches!(&err, LoadError::Tokenizer(TokenizerError::Read { path, .. }) if *path == json),
            "{err}"
        );
        assert!(
            err.to_string().contains(&json.display().to_string()),
            "{err}"
        );
        let err = load(TokenizerChoice::Gguf)
            .err()
            .expect("no tokenizer at all");
        assert!(
            matches!(&err, LoadError::Tokenizer(TokenizerError::MissingKey(k)) if k == "tokenizer.ggml.model"),
            "{err}"
        );

        std::fs::write(&json, tiny_tokenizer_json(384)).unwrap();
        for choice in [TokenizerChoice::Gguf, TokenizerChoice::HfJson] {
            let loaded = load(choice).unwrap_or_else(|e| panic!("{choice}: {e}"));
            assert_eq!(loaded.tokenizer.kind(), TokenizerKind::HfJson);
            assert_eq!(loaded.tokenizer.vocab_size(), 384);
        }
        std::fs::write(&json, tiny_tokenizer_json(385)).unwrap();
        let err = load(TokenizerChoice::HfJson)
            .err()
            .expect("one token too many");
        assert!(
            err.to_string()
                .contains("385 tokens, more than the model's vocabulary of 384"),
            "{err}"
        );
    }

    /// A `tokenizer.json` of `n` tokens, `t0` up, as the synthetic file names them.
    pub(super) fn tiny_tokenizer_json(n: usize) -> String {
        let vocab: serde_json::Map<String, serde_json::Value> =
            (0..n).map(|i| (format!("t{i}"), i.into())).collect();
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []}
        })
        .to_string()
    }

    #[test]
    fn tokenizer_choice_names() {
        for c in [TokenizerChoice::Gguf, TokenizerChoice::HfJson] {
            assert_eq!(c.as_str().parse::<TokenizerChoice>(), Ok(c));
        }
        assert!("sentencepiece".parse::<TokenizerChoice>().is_err());
        assert_eq!(TokenizerChoice::default(), TokenizerChoice::Gguf);
    }

    #[test]
    fn progress_marks_fire_once_each_in_order() {
        let mut seen = Vec::new();
        {
            let mut report = |p: LoadProgress| seen.push(p.percent);
            let mut marks = ProgressMarks::new(1000, &mut report);
            for _ in 0..10 {
                marks.advance(30);
            }
            marks.advance(700);
            marks.finish();
        }
        assert_eq!(seen, vec![0, 25, 50, 75, 100]);
    }
}

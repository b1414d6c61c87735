//! Loading: map → parse → validate → configure → tokenizer → bind weights on
//! the chosen backend (M0-W-1410), with progress reported by bytes.

use std::path::Path;
use std::sync::Arc;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BackendError, BackendKind};
use crate::engine::{backend_error_code, ErrorCode, Phase};
use crate::gguf::{file_type_name, GgufError, GgufFile};
use crate::model::config::{ConfigError, ModelConfig};
use crate::model::ModelInfo;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub backend: BackendKind,
    pub gpu_device: usize,
    /// Upper bound on one sequence's KV cache; `None`: computed from the context.
    pub kv_cache_size_mb: Option<u64>,
    /// Host-to-device copy chunk (M0-W-1222).
    pub upload_chunk_bytes: usize,
    /// Caps the model's context length (`--max-tokens-in` plus output).
    pub max_context: Option<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            backend: BackendKind::Cpu,
            gpu_device: 0,
            kv_cache_size_mb: None,
            upload_chunk_bytes: 1 << 20,
            max_context: None,
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
    /// The stable API code for this failure (M0-W-1500): backend errors
    /// through the engine's one mapping (M0-W-1501), everything else is the
    /// file's fault.
    pub fn code(&self, backend: BackendKind) -> &'static str {
        match self {
            LoadError::Backend(err) => backend_error_code(err, backend, Phase::Load).as_str(),
            _ => ErrorCode::ModelLoadFailed.as_str(),
        }
    }

    /// Bytes needed and bytes free, when the failure is a lack of device memory.
    pub fn vram(&self) -> Option<(u64, u64)> {
        match self {
            LoadError::Backend(BackendError::OutOfMemory { needed, available }) => Some((*needed, *available)),
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
        let mut marks = ProgressMarks { total, done: 0, next_mark: 0, report };
        marks.advance(0);
        marks
    }

    fn advance(&mut self, bytes: u64) {
        self.done = (self.done + bytes).min(self.total);
        let percent = (self.done * 100).checked_div(self.total).unwrap_or(100) as u8;
        while self.next_mark <= 100 && percent >= self.next_mark {
            (self.report)(LoadProgress { percent: self.next_mark, bytes_done: self.done, bytes_total: self.total });
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
    let file = Arc::new(GgufFile::open(path)?);
    let mut config = ModelConfig::try_from(&file.metadata)?;
    if let Some(cap) = opts.max_context {
        config.context_length = config.context_length.min(cap);
    }
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file.metadata)?);
    let info = model_info(&file, &config);

    let mut marks = ProgressMarks::new(file.tensor_bytes_total(), progress);
    let backend: Box<dyn Backend> = match opts.backend {
        BackendKind::Cpu => Box::new(CpuBackend::load(config.clone(), file.clone(), &mut |b| marks.advance(b))?),
        BackendKind::Cuda => {
            let cuda_opts = crate::backend::cuda::CudaLoadOptions {
                gpu_device: opts.gpu_device,
                kv_cache_size_mb: opts.kv_cache_size_mb,
                upload_chunk_bytes: opts.upload_chunk_bytes,
                ..Default::default()
            };
            Box::new(crate::backend::cuda::CudaBackend::load(config.clone(), &file, &cuda_opts, &mut |b| marks.advance(b))?)
        }
    };
    marks.finish();
    Ok(LoadedModel { backend, tokenizer, info, config })
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
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(name, _)| name.to_string()).unwrap_or_else(|| "F32".into())
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! The plain-Rust f32 reference backend: the numerical oracle that the CUDA
//! backend and the golden data are compared with. It runs only when asked
//! for (`--backend cpu`). Weights are read through the GGUF memory map in
//! their stored format; activations and the KV cache are f32.

mod ops;

use std::sync::Arc;

pub use ops::{dot_f32, CpuBuf, CpuCache, CpuOps, CpuWeight};

use crate::backend::{
    check_set_slots, check_slot, sample_on_host, Backend, BackendError, BackendKind, Checkpoints,
    DeviceInfo, Logits, MemoryUse, SampleRequest, SampledToken,
};
use crate::gguf::GgufFile;
use crate::model::ModelConfig;
use crate::model::{self, Weights};
use crate::sampling::Selector;

pub struct CpuBackend {
    cfg: ModelConfig,
    weights: Weights<CpuWeight>,
    /// One sequence per slot ([`Backend::set_slots`]); `current` is the one
    /// the single-sequence calls act on.
    slots: Vec<CpuSlot>,
    current: usize,
    device: DeviceInfo,
    selector: Selector,
}

/// One sequence: its KV cache, position and last logits.
#[derive(Default)]
struct CpuSlot {
    cache: Option<CpuCache>,
    len: usize,
    /// The latest forward pass's last-position logits (empty before one).
    last_logits: Vec<f32>,
}

impl CpuBackend {
    /// Binds the model's tensors. `on_bytes` is told the size of each tensor
    /// as it is bound, for load progress.
    pub fn load(
        cfg: ModelConfig,
        file: Arc<GgufFile>,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<Self, BackendError> {
        let weights = Weights::load(&cfg, &file, &mut |spec| {
            on_bytes(spec.info.n_bytes);
            if spec.rows == 1 {
                CpuWeight::dense(&file, spec.info, spec.cols)
            } else {
                CpuWeight::stored(file.clone(), spec.info, spec.rows, spec.cols)
            }
        })?;
        let device = DeviceInfo {
            backend: BackendKind::Cpu,
            name: format!("cpu ({} threads)", rayon::current_num_threads()),
            gpu_device: None,
            sm: None,
            cuda_runtime_version: None,
            total_memory_bytes: None,
        };
        Ok(CpuBackend {
            cfg,
            weights,
            slots: vec![CpuSlot::default()],
            current: 0,
            device,
            selector: Selector::default(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn slot(&mut self) -> &mut CpuSlot {
        &mut self.slots[self.current]
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> &DeviceInfo {
        &self.device
    }

    fn begin_sequence(&mut self, capacity: usize) -> Result<(), BackendError> {
        if capacity == 0 || capacity > self.cfg.context_length {
            return Err(BackendError::InferenceFailed(format!(
                "a sequence of {capacity} positions does not fit the context of {}",
                self.cfg.context_length
            )));
        }
        let cache = CpuCache::new(self.cfg.n_layer, capacity, self.cfg.kv_dim());
        *self.slot() = CpuSlot {
            cache: Some(cache),
            ..CpuSlot::default()
        };
        Ok(())
    }

    fn sequence_len(&self) -> usize {
        self.slots[self.current].len
    }

    fn forward(
        &mut self,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError> {
        if logits == Logits::Rows {
            return Err(BackendError::InferenceFailed(
                "the CPU backend decodes several sequences one by one".into(),
            ));
        }
        let slot = &mut self.slots[self.current];
        let cache = slot
            .cache
            .as_mut()
            .ok_or_else(|| BackendError::InferenceFailed("forward without a sequence".into()))?;
        slot.last_logits.clear();
        let (ops, cfg, w, start) = (&mut CpuOps, &self.cfg, &self.weights, slot.len);
        if logits == Logits::None {
            // Host memory either way: the last row goes straight to the sampler's copy.
            model::forward(
                ops,
                cfg,
                w,
                cache,
                tokens,
                start,
                Logits::Last,
                &mut slot.last_logits,
                checkpoints,
            )?;
            out.clear();
        } else {
            model::forward(ops, cfg, w, cache, tokens, start, logits, out, checkpoints)?;
            slot.last_logits
                .extend_from_slice(&out[out.len() - cfg.vocab_size..]);
        }
        slot.len += tokens.len();
        Ok(())
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<SampledToken, BackendError> {
        let logits = &self.slots[self.current].last_logits;
        sample_on_host(&mut self.selector, logits, req)
    }

    fn end_sequence(&mut self) {
        *self.slot() = CpuSlot::default();
    }

    fn slots(&self) -> usize {
        self.slots.len()
    }

    fn set_slots(&mut self, n: usize) -> Result<(), BackendError> {
        check_set_slots(n, self.slots.iter().any(|s| s.cache.is_some()))?;
        self.slots.resize_with(n, CpuSlot::default);
        self.current = 0;
        Ok(())
    }

    fn select_slot(&mut self, slot: usize) -> Result<(), BackendError> {
        check_slot(slot, self.slots.len())?;
        self.current = slot;
        Ok(())
    }

    /// Host memory is not device memory: the CPU backend reports zero (M0-W-1011).
    fn memory_use(&self) -> MemoryUse {
        MemoryUse::default()
    }

    fn check_residency(&self) -> Result<bool, BackendError> {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::synthetic::{synthetic_model, SYNTHETIC_ARCHS};

    fn synthetic_backend(arch: &str) -> (CpuBackend, usize) {
        let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, 7, 64)).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let vocab = cfg.vocab_size;
        (CpuBackend::load(cfg, file, &mut |_| {}).unwrap(), vocab)
    }

    #[test]
    fn m0_w_1052_backend_contract_cpu() {
        for arch in SYNTHETIC_ARCHS {
            let (mut b, vocab) = synthetic_backend(arch);
            crate::backend::contract::check_backend_contract(&mut b, vocab);
        }
    }
}

#[cfg(test)]
mod gpt2_tests {
    use super::*;
    use crate::model::ops::Ops;
    use crate::model::synthetic::synthetic_model;
    use crate::quant;

    /// M0-W-1434: GPT-2's input at position p is the token's embedding plus
    /// row p of `position_embd`, checked at positions 0, 1 and n_ctx - 1; a
    /// position past the table is refused.
    #[test]
    fn m0_w_1434_learned_positions_are_added_at_0_1_and_the_last() {
        let n_ctx = 64;
        let file =
            Arc::new(GgufFile::from_bytes(synthetic_model("gpt2", 9, n_ctx as u32)).unwrap());
        let cfg = ModelConfig::try_from(&file.metadata).unwrap();
        let table = file.tensor("position_embd.weight").unwrap().clone();
        let mut rows = vec![0f32; n_ctx * cfg.n_embd];
        quant::dequantize(table.ggml_type, file.tensor_data(&table), &mut rows).unwrap();
        let mut b = CpuBackend::load(cfg.clone(), file, &mut |_| {}).unwrap();
        b.begin_sequence(n_ctx).unwrap();
        let mut out = Vec::new();
        let mut pos = 0;
        for target in [0, 1, n_ctx - 1] {
            if target > pos {
                let filler: Vec<u32> = (pos..target).map(|p| (p % 300) as u32).collect();
                b.forward(&filler, Logits::Last, &mut out, None).unwrap();
                pos = target;
            }
            let mut cp = Checkpoints::default();
            b.forward(&[7], Logits::Last, &mut out, Some(&mut cp))
                .unwrap();
            let get = |name: &str| &cp.entries.iter().find(|(n, _)| n == name).unwrap().1;
            let (tok, input) = (get("inp_embd"), get("inpL"));
            let want = &rows[target * cfg.n_embd..(target + 1) * cfg.n_embd];
            for c in 0..cfg.n_embd {
                assert_eq!(input[c], tok[c] + want[c], "position {target}, column {c}");
            }
            pos += 1;
        }
        // The table has n_ctx rows: position n_ctx cannot be embedded.
        let mut ops = CpuOps;
        let Weights::Gpt2(w) = &b.weights else {
            panic!("a gpt2 file binds gpt2 weights")
        };
        let mut x = ops.buf(1, cfg.n_embd).unwrap();
        let err = ops
            .embed_positions(&w.position_embd, n_ctx, &mut x)
            .unwrap_err();
        assert!(
            err.to_string().contains("past the 64 learned positions"),
            "{err}"
        );
    }
}

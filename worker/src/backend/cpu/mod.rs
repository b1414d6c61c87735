//! The plain-Rust f32 reference backend: the numerical oracle that the CUDA
//! backend and the golden data are compared with. It runs only when asked
//! for (`--backend cpu`). Weights stay in their stored format in the
//! `GgufFile`'s bytes, which the load path reads into memory (so the file on
//! disk may be replaced under a running worker); activations and the KV
//! cache are f32.

mod ops;

use std::sync::Arc;

pub use ops::{dot_f32, CpuBuf, CpuCache, CpuOps, CpuWeight};

use crate::backend::prefix::{PrefixCache, Trail};
use crate::backend::{
    check_capacity, check_prefix_share, sample_rows_on_host, Backend, BackendError, BackendKind,
    Checkpoints, DeviceInfo, KvLayout, KvType, Logits, MemoryUse, PrefixStats, SampleRequest,
    SampledToken, SeqId, Slots,
};
use crate::gguf::GgufFile;
use crate::model::ModelConfig;
use crate::model::{self, Weights};
use crate::sampling::Selector;

pub struct CpuBackend {
    cfg: ModelConfig,
    weights: Weights<CpuWeight>,
    /// The open sequences ([`Backend::set_max_sequences`] of them at most).
    seqs: Slots<CpuSeq>,
    device: DeviceInfo,
    selector: Selector,
    /// Prompts' whole chunks, each a cache of its own (`backend::prefix`).
    prefix: Option<PrefixCache<CpuCache>>,
    /// Its share of `max_sequences` full contexts' KV.
    prefix_share: Option<f64>,
    /// The values the KV cache stores (`--kv-type`), widened to f32.
    kv_type: KvType,
}

/// One sequence: its KV cache, position and last logits.
#[derive(Default)]
struct CpuSeq {
    cache: Option<CpuCache>,
    len: usize,
    /// The latest forward pass's last-position logits (empty before one).
    last_logits: Vec<f32>,
    /// Where it stands with the prefix cache.
    trail: Trail,
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
            seqs: Slots::new(vec![CpuSeq::default()]),
            device,
            selector: Selector::default(),
            prefix: None,
            prefix_share: None,
            kv_type: KvType::F16,
        })
    }

    /// Caches of `kv_type` from now on (at load, before any sequence opens):
    /// the values it stores, kept widened to f32.
    pub fn with_kv_type(mut self, kv_type: KvType) -> Result<Self, BackendError> {
        kv_type.check_head_dim(self.cfg.head_dim)?;
        self.kv_type = kv_type;
        Ok(self)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Bytes of a KV cache of `capacity` positions.
    fn kv_bytes(&self, capacity: usize) -> u64 {
        (self.cfg.n_layer * 2 * capacity * self.cfg.kv_dim() * 4) as u64
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> &DeviceInfo {
        &self.device
    }

    fn max_sequences(&self) -> usize {
        self.seqs.capacity()
    }

    /// A prefix cache's bound follows the number of sequences.
    fn set_max_sequences(&mut self, n: usize) -> Result<(), BackendError> {
        self.seqs.resize(n, || Ok(CpuSeq::default()))?;
        self.set_prefix_cache(self.prefix_share)
    }

    fn open(&mut self, capacity: usize) -> Result<SeqId, BackendError> {
        check_capacity(capacity, self.cfg.context_length)?;
        let cache = CpuCache::of_type(self.kv_type, self.cfg.n_layer, capacity, self.cfg.kv_dim());
        let (id, seq) = self.seqs.open()?;
        *seq = CpuSeq {
            cache: Some(cache),
            ..CpuSeq::default()
        };
        Ok(id)
    }

    fn close(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.close(seq) {
            *s = CpuSeq::default();
        }
    }

    fn len(&self, seq: SeqId) -> usize {
        self.seqs.get(seq).map_or(0, |s| s.len)
    }

    fn forward(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError> {
        if logits == Logits::Rows {
            return Err(BackendError::CallerBug(
                "Logits::Rows belongs to decode".into(),
            ));
        }
        let s = self.seqs.get_mut(seq)?;
        let cache = s.cache.as_mut().expect("an open sequence has a cache");
        s.last_logits.clear();
        let (ops, cfg, w, start) = (&mut CpuOps, &self.cfg, &self.weights, s.len);
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
                &mut s.last_logits,
                checkpoints,
            )?;
            out.clear();
        } else {
            model::forward(ops, cfg, w, cache, tokens, start, logits, out, checkpoints)?;
            s.last_logits
                .extend_from_slice(&out[out.len() - cfg.vocab_size..]);
        }
        if let Some(prefix) = self.prefix.as_mut() {
            prefix.publish(
                &mut s.trail,
                start,
                tokens,
                |_evicted| Ok::<_, BackendError>(Some(cache.span(start, tokens.len()))),
                || Ok(s.last_logits.clone()),
            )?;
        }
        s.len += tokens.len();
        Ok(())
    }

    fn set_prefix_cache(&mut self, max_share: Option<f64>) -> Result<(), BackendError> {
        if self.seqs.any_open() {
            return Err(BackendError::CallerBug(
                "the prefix cache is set up only while no sequence is open".into(),
            ));
        }
        self.prefix = match max_share {
            None => None,
            Some(share) => {
                check_prefix_share(share)?;
                let pool = self.seqs.capacity() as u64 * self.kv_bytes(self.cfg.context_length);
                let max_bytes = (pool as f64 * share) as u64;
                let chunk = self.prefill_chunk();
                Some(PrefixCache::new(
                    chunk,
                    self.kv_bytes(chunk),
                    self.cfg.vocab_size,
                    max_bytes,
                ))
            }
        };
        self.prefix_share = max_share;
        Ok(())
    }

    fn attach_prefix(&mut self, seq: SeqId, prompt: &[u32]) -> Result<usize, BackendError> {
        let s = self.seqs.get_mut(seq)?;
        let Some(prefix) = self.prefix.as_mut() else {
            return Ok(0);
        };
        let cache = s.cache.as_mut().expect("an open sequence has a cache");
        let a = prefix.attach(s.len, prompt, |at, part, _| {
            cache.put(at, part);
            Ok(())
        })?;
        (s.trail, s.len) = (a.trail, a.len);
        if let Some(logits) = a.logits {
            s.last_logits = logits.into_vec();
        }
        Ok(a.len)
    }

    fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.stats())
    }

    fn sample(
        &mut self,
        rows: &[(SeqId, SampleRequest<'_>)],
    ) -> Result<Vec<SampledToken>, BackendError> {
        sample_rows_on_host(&mut self.seqs, &mut self.selector, rows, |s| &s.last_logits)
    }

    /// Host memory is not device memory: the CPU backend reports zero (M0-W-1011).
    fn memory_use(&self) -> MemoryUse {
        MemoryUse::default()
    }

    /// The values of the type, held as f32.
    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            kv_type: self.kv_type,
            bytes_per_token: self.kv_bytes(1),
        }
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

    /// Issue 42: the prefix cache changes no token (`contract::check_prefix_reuse`).
    #[test]
    fn a_cached_prefix_gives_the_same_tokens_as_a_computed_one() {
        for arch in SYNTHETIC_ARCHS {
            let file = Arc::new(GgufFile::from_bytes(synthetic_model(arch, 7, 1024)).unwrap());
            let cfg = ModelConfig::try_from(&file.metadata).unwrap();
            let vocab = cfg.vocab_size;
            let mut b = CpuBackend::load(cfg, file, &mut |_| {}).unwrap();
            // The cache's bound is a share of the slots' contexts: room
            // for every entry the check makes (a 1,024-token context holds
            // four chunks, the check keeps seven and their logits).
            b.set_max_sequences(4).unwrap();
            crate::backend::contract::check_prefix_reuse(&mut b, vocab);
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
        let seq = b.open(n_ctx).unwrap();
        let mut out = Vec::new();
        let mut pos = 0;
        for target in [0, 1, n_ctx - 1] {
            if target > pos {
                let filler: Vec<u32> = (pos..target).map(|p| (p % 300) as u32).collect();
                b.forward(seq, &filler, Logits::Last, &mut out, None)
                    .unwrap();
                pos = target;
            }
            let mut cp = Checkpoints::default();
            b.forward(seq, &[7], Logits::Last, &mut out, Some(&mut cp))
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

//! The KV cache's share of device memory: what a context and the open
//! sequences take, the `--kv-cache-size-mb` budget, the start-up check that
//! one full context fits, and the paged pool sized from all of it.

use super::{kv_pool, CudaBackend, CudaCache};
use crate::backend::BackendError;

impl CudaBackend {
    /// Whether a cache of `capacity` positions fits `--kv-cache-size-mb`
    /// beside the open sequences' caches (the limit holds for all together).
    pub(super) fn kv_budget(&self, capacity: usize) -> Result<(), BackendError> {
        let bytes = self.kv_bytes(capacity);
        let Some(limit) = self.kv_limit_bytes else {
            return Ok(());
        };
        let open = self.kv_bytes_open();
        if open + bytes > limit {
            return Err(BackendError::OutOfMemory {
                needed: bytes,
                available: limit.saturating_sub(open),
            });
        }
        Ok(())
    }

    /// Issue 45: a context that one sequence's KV cache cannot fill in the
    /// memory left beside the weights is refused at start (before `ready`,
    /// as `INSUFFICIENT_VRAM` naming the bytes), not at the first long
    /// prompt. A `--kv-cache-size-mb` budget is the operator's own bound.
    pub(super) fn check_context_fits(&self) -> Result<(), BackendError> {
        if self.kv_limit_bytes.is_some() {
            return Ok(());
        }
        let ctx = self.cfg.context_length;
        let needed = self.kv_bytes(ctx);
        let room = kv_pool::KvPool::room(&self.dev)?;
        if needed > room {
            tracing::error!(
                context = ctx,
                kv_bytes = needed,
                free_bytes = room,
                "the context's KV cache does not fit the GPU beside the weights; lower --ctx-size"
            );
            return Err(BackendError::OutOfMemory {
                needed,
                available: room,
            });
        }
        Ok(())
    }

    /// The paged pool for `slots` sequences, taken last at start-up: the
    /// `--kv-cache-size-mb` budget, or else a full context for every slot
    /// (whole blocks each); either way no more than the device has free
    /// beside some headroom.
    pub(super) fn make_kv_pool(
        &self,
        slots: usize,
        extra: u64,
    ) -> Result<kv_pool::KvPool, BackendError> {
        let full = self.kv_bytes(self.cfg.context_length);
        let rough = self.kv_limit_bytes.unwrap_or(slots as u64 * full + extra);
        let block = kv_pool::KvPool::block_bytes(&self.dev, rough)?;
        let want = match self.kv_limit_bytes {
            Some(limit) => limit.div_ceil(block) * block,
            None => (slots as u64 * full.div_ceil(block) + extra.div_ceil(block)) * block,
        };
        let room = kv_pool::KvPool::room(&self.dev)?;
        let bytes = want.min(room / block * block);
        if bytes == 0 {
            return Err(BackendError::OutOfMemory {
                needed: block,
                available: room,
            });
        }
        let started = std::time::Instant::now();
        let pool = kv_pool::KvPool::new(&self.dev, bytes, block)?;
        let blocks = pool.blocks();
        tracing::info!(
            slots,
            blocks = blocks.total,
            block_bytes = blocks.block_bytes,
            pool_bytes = bytes,
            wanted_bytes = want,
            ms = started.elapsed().as_millis() as u64,
            "paged KV pool ready"
        );
        Ok(pool)
    }

    /// Bytes a KV cache of `capacity` positions takes for this model.
    pub(super) fn kv_bytes(&self, capacity: usize) -> u64 {
        let cfg = &self.cfg;
        let kv_type = self.dev.kernels.kv_type();
        CudaCache::bytes_of(kv_type, cfg.n_layer, cfg.n_head_kv, cfg.head_dim, capacity)
    }

    /// KV cache bytes of the open sequences.
    fn kv_bytes_open(&self) -> u64 {
        self.seqs
            .open_states()
            .filter_map(|s| s.cache.as_ref())
            .map(|c| self.kv_bytes(c.capacity))
            .sum()
    }
}

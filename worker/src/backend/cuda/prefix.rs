//! The prefix cache on the GPU (`backend::prefix`): each entry a
//! [`CudaCache`] of one prefill chunk on blocks of the paged KV pool, so the
//! cache takes no device memory beyond the pool, and sequences take its
//! blocks back when they need them.

use super::{kv_pool, CudaBackend, CudaCache, PREFILL_CHUNK_GPU};
use crate::backend::prefix::PrefixCache;
use crate::backend::{BackendError, SeqId};

impl CudaBackend {
    /// Makes the cache for `share` of the pool. With one sequence there is
    /// no pool yet: one is made for it, holding a whole context (a job must
    /// not find less room than it would without the cache) and the cache's
    /// share of one more. Without room for that, the worker serves without
    /// the cache (a warning).
    pub(super) fn make_prefix_cache(&mut self, share: f64) {
        if self.kv_pool.is_none() {
            let full = self.kv_bytes(self.cfg.context_length);
            let extra = (full as f64 * share) as u64;
            let want = self.kv_limit_bytes.unwrap_or(full + extra);
            let pool = kv_pool::KvPool::room(&self.dev).and_then(|room| match room >= want {
                true => self.make_kv_pool(1, extra),
                false => Err(BackendError::OutOfMemory {
                    needed: want,
                    available: room,
                }),
            });
            match pool {
                Ok(pool) => self.kv_pool = Some(pool),
                Err(e) => {
                    tracing::warn!(error = %e, "no room for a KV pool of a whole context: serving without the prefix cache");
                    return;
                }
            }
        }
        let pool = self.kv_pool.as_ref().expect("made above");
        let blocks = pool.blocks();
        let max_bytes = (blocks.total as u64 * blocks.block_bytes) as f64 * share;
        let entry = pool.blocks_for(self.kv_bytes(PREFILL_CHUNK_GPU)) as u64 * blocks.block_bytes;
        self.prefix = Some(PrefixCache::new(
            PREFILL_CHUNK_GPU,
            entry,
            self.cfg.vocab_size,
            max_bytes as u64,
        ));
    }

    /// Evicts prefix cache entries until the pool has room for `bytes` of
    /// cache (or the cache is empty): sequences come first.
    pub(super) fn evict_for(&mut self, bytes: u64) {
        let (Some(pool), Some(prefix)) = (self.kv_pool.as_ref(), self.prefix.as_mut()) else {
            return;
        };
        while !pool.has_room(bytes) {
            // Dropping an entry waits for the work queued on it, then frees its blocks.
            if prefix.evict_one(None).is_none() {
                break;
            }
        }
    }

    /// The pool's blocks the prefix cache holds (its entries are whole blocks).
    pub(super) fn prefix_blocks(&self) -> usize {
        match (self.kv_pool.as_ref(), self.prefix.as_ref()) {
            (Some(pool), Some(prefix)) => {
                (prefix.stats().bytes / pool.blocks().block_bytes) as usize
            }
            _ => 0,
        }
    }

    /// After a forward of `tokens` at `start` on `seq`: a chunk the cache
    /// may keep is copied into blocks of the pool of its own (room for a
    /// whole chunk, also for a prompt's partial last one, so that every
    /// entry takes the same blocks), when the pool has them free (a
    /// sequence's blocks are never taken for it); a prompt's last logits are
    /// copied to the host.
    pub(super) fn publish(
        &mut self,
        seq: SeqId,
        start: usize,
        tokens: &[u32],
    ) -> Result<(), BackendError> {
        let (Some(prefix), Some(pool)) = (self.prefix.as_mut(), self.kv_pool.as_ref()) else {
            return Ok(());
        };
        let slot = self.seqs.get_mut(seq)?;
        let cache = slot.cache.as_ref().expect("an open sequence has a cache");
        let (cfg, dev) = (&self.cfg, &self.dev);
        let sampler = &slot.sampler;
        prefix.publish(
            &mut slot.trail,
            start,
            tokens,
            |evicted| {
                drop(evicted);
                let (l, h, d) = (cfg.n_layer, cfg.n_head_kv, cfg.head_dim);
                let (c, t) = (PREFILL_CHUNK_GPU, cache.kv_type);
                if !pool.has_room(CudaCache::bytes_of(t, l, h, d, c)) {
                    return Ok(None);
                }
                let mut part = CudaCache::new_in(dev, Some(pool), t, l, h, d, c)?;
                part.copy_positions(dev, cache, start, 0, tokens.len())?;
                Ok(Some(part))
            },
            || sampler.download_logits(),
        )
    }
}

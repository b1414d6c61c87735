//! Decode steps: one sequence's through its captured graph, several
//! sequences' as one batched pass (rows mode), replayed from a graph per row
//! count or run eagerly.

use super::*;

impl CudaBackend {
    /// One forward pass over every row (`ops::RowsPass`); see `decode`.
    pub(super) fn decode_batched(&mut self, rows: &[(SeqId, u32)]) -> Result<(), BackendError> {
        let ids: Vec<SeqId> = rows.iter().map(|&(id, _)| id).collect();
        self.seqs.get_many_mut(&ids)?;
        for &(seq, token) in rows {
            self.check_decode(seq, token)?;
        }
        self.dev.bind()?;
        let tokens: Vec<u32> = rows.iter().map(|&(_, t)| t).collect();
        let mut seqs = Vec::with_capacity(rows.len());
        let mut caches = Vec::with_capacity(rows.len());
        for slot in self.seqs.get_many_mut(&ids)? {
            let cache = slot.cache.take().expect("checked above");
            seqs.push(RowSeq {
                cache: cache.planes(0).0,
                logits: slot.sampler.logits_ptr(),
                pos: slot.len as i32,
                capacity: cache.capacity as i32,
            });
            slot.has_logits = false;
            caches.push(cache);
        }
        let mut lead = caches.remove(0);
        let start = seqs[0].pos as usize;
        let mut pass = RowsPass {
            seqs,
            tokens,
            caches,
            max_splits: None,
        };
        let mut result = Ok(false);
        if self.use_graphs && !self.rows_graphs.failed {
            result = self.rows_graphs.run(
                &mut self.ops,
                &self.cfg,
                &self.weights,
                &mut lead,
                &mut pass,
            );
        }
        let result = match result {
            Ok(false) => self.decode_rows_eagerly(&mut lead, &mut pass, start),
            other => other.map(|_| ()),
        };
        self.ops.end_step();
        // Every cache goes back to its sequence, whatever the pass did.
        let caches = std::iter::once(lead).chain(std::mem::take(&mut pass.caches));
        let slots = self.seqs.get_many_mut(&ids)?;
        for (slot, cache) in slots.into_iter().zip(caches) {
            slot.cache = Some(cache);
            if result.is_ok() {
                slot.len += 1;
                slot.has_logits = true;
            }
        }
        result
    }

    /// A batched step's pass run eagerly (see `decode`); the caches of
    /// rows 1 and on are taken from `pass` and given back in it.
    pub(super) fn decode_rows_eagerly(
        &mut self,
        lead: &mut CudaCache,
        pass: &mut RowsPass,
        start: usize,
    ) -> Result<(), BackendError> {
        let tokens = pass.tokens.clone();
        let began = self.ops.begin_rows(RowsPass {
            seqs: pass.seqs.clone(),
            tokens: pass.tokens.clone(),
            caches: std::mem::take(&mut pass.caches),
            max_splits: None,
        });
        let result = began.and_then(|()| {
            model::forward(
                &mut self.ops,
                &self.cfg,
                &self.weights,
                lead,
                &tokens,
                start,
                Logits::Rows,
                &mut Vec::new(),
                None,
            )
        });
        // The caches come back whatever happened (begin_rows holds the pass
        // even when it fails).
        pass.caches = self.ops.end_rows();
        result
    }

    /// One decode step of `seq` through its graph, capturing it first if
    /// needed; the logits go to `out` when given. `Ok(false)` when the graph
    /// cannot be used (then run eagerly).
    pub(super) fn decode_with_graph(
        &mut self,
        seq: SeqId,
        token: u32,
        out: Option<&mut Vec<f32>>,
    ) -> Result<bool, BackendError> {
        self.check_decode(seq, token)?;
        let slot = self.seqs.get_mut(seq)?;
        let cache = slot.cache.as_mut().expect("checked above");
        // A long context splits attention over the context; the graph holds
        // one choice, so it is captured again (once) when the context grows
        // past the threshold.
        let split = self.ops.dev.kernels.splits_attention_at(slot.len + 1);
        if slot
            .decode_graph
            .as_ref()
            .is_some_and(|g| g.split_attention != split)
        {
            slot.decode_graph = None;
        }
        if slot.decode_graph.is_none() {
            match graph::DecodeGraph::capture(&mut self.ops, &self.cfg, &self.weights, cache, split)
            {
                Ok(g) => slot.decode_graph = Some(g),
                Err(e) => {
                    tracing::warn!(error = %e, "capturing the decode graph failed; decoding without it");
                    slot.graph_failed = true;
                    return Ok(false);
                }
            }
        }
        let g = slot.decode_graph.as_ref().expect("captured above");
        g.replay(
            &self.graph_host,
            token,
            slot.len,
            slot.sampler.logits_ptr(),
            out,
        )?;
        Ok(true)
    }
}

//! Rows mode: one forward pass over a batched decode step, each row of x the
//! next token of a sequence of its own (`CudaBackend::decode_rows`).
//!
//! The graph runs unchanged; what depends on a row's sequence looks here
//! instead of at the pass's single cache and start position: every product
//! runs over all rows at once, reading each weight once for the step, on a
//! kernel whose per-row sums do not depend on how many rows there are
//! (`mv8n_*`, else `mv_*`, for one row as for many), so a row's logits are
//! the same bits whichever rows share its step; Q's and K's norms and RoPE,
//! the KV store and attention run for all rows in one launch each a layer,
//! each row at its own position over its own cache, read from a device table
//! of the step's sequences (`RowSeq`); attention cuts each row's context
//! into chunks of a fixed length (`ATS_ROW_CHUNK`), so its sums do not
//! depend on the others either. Shapes those kernels do not take run row by
//! row, as alone. The LM head's rows go to each sequence's sampler (one
//! `keep_rows` launch).
//!
//! Nothing of a pass but the table depends on which sequences it decodes:
//! the table holds each row's cache, sampler buffer, position and token, so
//! a pass captured into a CUDA graph replays for any rows of the same count
//! (`graph::RowsGraphs`) once the host has rewritten the table. Row-by-row
//! work (host positions) refuses to be captured.

use super::attend::{check_attention, head_norms};
use super::buffers::{
    check_bufs, check_weights, shape_check, BufMem, CudaBuf, CudaCache, CudaWeight,
};
use super::products::matmul_args;
use super::state::{RowsPass, RowsTable};
use super::CudaOps;
use crate::backend::cuda::device::{driver_error, Purpose};
use crate::backend::cuda::kernels::Mv8Plan;
use crate::backend::cuda::kernels::{
    most_splits, AttentionCombineRowsArgs, AttentionSplitRowsArgs, QkRopeStoreRowsArgs, RowSeq,
};
use crate::backend::cuda::kernels::{EmbedArgs, KeepRowsArgs};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{ATS_MAX_GROUP, GF_MAX_TOKENS};
use crate::backend::BackendError;
use crate::model::ops::{AttentionShape, HeadNorms, QkPrep, RopeParams};
use half::f16;

/// Row `i` of `x` as a matrix of its own, in `x`'s memory.
fn row_view(x: &CudaBuf, i: usize) -> CudaBuf {
    CudaBuf::new(BufMem::Arena(x.row_ptr(i)), 1, x.cols)
}

/// `x` whole, as a matrix of its own in the same memory.
fn view(x: &CudaBuf) -> CudaBuf {
    CudaBuf::new(BufMem::Arena(x.ptr()), x.rows, x.cols)
}

/// `p` at position `pos`.
fn rope_at(p: RopeParams<'_>, pos: usize) -> RopeParams<'_> {
    RopeParams {
        start_pos: pos,
        ..p
    }
}

/// `prep` for the row at position `pos`.
fn prep_at<'a>(prep: &QkPrep<'a, CudaWeight>, pos: usize) -> QkPrep<'a, CudaWeight> {
    QkPrep {
        norms: prep.norms.as_ref().map(|n| HeadNorms {
            q: n.q,
            k: n.k,
            eps: n.eps,
        }),
        rope: prep.rope.map(|(q, k)| (rope_at(q, pos), rope_at(k, pos))),
    }
}

/// `s` for the one row at position `pos`.
fn shape_at(s: AttentionShape, pos: usize) -> AttentionShape {
    AttentionShape {
        start_pos: pos,
        n_tokens: 1,
        ..s
    }
}

impl CudaOps {
    /// Sets the widest row of x any product of the model takes (for
    /// [`CudaOps::reserve_rows`]).
    pub fn set_widest_input(&mut self, cols: usize) {
        self.widest_input = Some(cols);
    }

    /// Makes the device table room for `rows` rows, `mv8_*`'s block room
    /// for that many rows of x, and the rows' f16 block room for a group of
    /// `gemm_few_*` (at load or when the slots change, so that no captured
    /// pass needs to allocate).
    pub fn reserve_rows(&mut self, rows: usize) -> Result<(), BackendError> {
        if let Some(cols) = self.x8_cols {
            self.reserve_x8_values(cols * rows)?;
        }
        if let Some(cols) = self.widest_input {
            let bytes = (4 * cols * rows.min(GF_MAX_TOKENS)) as u64;
            if self.rows_x16.as_ref().is_none_or(|b| b.bytes() < bytes) {
                self.dev.bind()?;
                self.rows_x16 = Some(self.dev.alloc(Purpose::Scratch, bytes)?);
            }
        }
        if self.rows_table.as_ref().is_some_and(|t| t.rows >= rows) {
            return Ok(());
        }
        self.dev.bind()?;
        let mem = self
            .dev
            .alloc(Purpose::Scratch, (rows * RowsTable::ROW_BYTES) as u64)?;
        self.rows_table = Some(RowsTable { mem, rows });
        Ok(())
    }

    /// Writes the rows' sequences and tokens to the device table, in stream
    /// order (before a pass, or a captured pass's replay, reads them).
    pub fn write_rows_table(
        &mut self,
        seqs: &[RowSeq],
        tokens: &[u32],
    ) -> Result<(), BackendError> {
        let n = seqs.len();
        shape_check(tokens.len() != n || n == 0, || {
            format!("{n} rows with {} tokens", tokens.len())
        })?;
        if self.rows_table.as_ref().is_none_or(|t| t.rows < n) {
            self.reserve_rows(n)?;
        }
        let table = self.rows_table.as_ref().expect("reserved above");
        let mut bytes = vec![0u8; table.rows * RowsTable::ROW_BYTES];
        let seq_bytes = std::mem::size_of::<RowSeq>();
        for (i, q) in seqs.iter().enumerate() {
            // SAFETY: RowSeq is a plain repr(C) struct of integers.
            let raw =
                unsafe { std::slice::from_raw_parts(q as *const RowSeq as *const u8, seq_bytes) };
            bytes[i * seq_bytes..][..seq_bytes].copy_from_slice(raw);
        }
        let (tok_at, pos_at) = (table.rows * seq_bytes, table.rows * (seq_bytes + 4));
        for (i, (&t, q)) in tokens.iter().zip(seqs).enumerate() {
            bytes[tok_at + 4 * i..][..4].copy_from_slice(&t.to_le_bytes());
            bytes[pos_at + 4 * i..][..4].copy_from_slice(&(q.pos as u32).to_le_bytes());
        }
        self.dev.bind()?;
        // SAFETY: the table's own bytes; pageable memory is staged before
        // the call returns, and the copy is ordered after the passes that
        // read the table before.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                table.mem.ptr(),
                &bytes[..],
                self.dev.cu_stream(),
            )
        }
        .map_err(|e| driver_error("copying the rows' sequences", e))
    }

    /// Starts a rows-mode pass (see the module doc): a sequence and a token
    /// per row, a cache for each row after the first. Outside a capture the
    /// table is written now; inside one, the replays write it. The pass is
    /// held even when this fails: [`CudaOps::end_rows`] gives its caches back.
    pub fn begin_rows(&mut self, rows: RowsPass) -> Result<(), BackendError> {
        let n = rows.seqs.len();
        let padded = self.capture.is_some() && rows.caches.len() < n;
        let shape_ok = n > 0 && rows.tokens.len() == n && (rows.caches.len() + 1 == n || padded);
        let bound_ok = self.capture.is_some() == rows.max_splits.is_some();
        let tokens = rows.tokens.len();
        let caches = rows.caches.len();
        self.rows = Some(rows);
        shape_check(!shape_ok, || {
            format!("a rows-mode pass of {n} sequences, {tokens} tokens and {caches} caches")
        })?;
        shape_check(!bound_ok, || {
            "a captured pass's chunk bound, and only its".into()
        })?;
        if self.capture.is_some() {
            if self.rows_table.as_ref().is_none_or(|t| t.rows < n) {
                return Err(BackendError::InferenceFailed(format!(
                    "no table room for {n} rows reserved before a capture"
                )));
            }
            return Ok(());
        }
        let rows = self.rows.take().expect("set above");
        let written = self.write_rows_table(&rows.seqs, &rows.tokens);
        self.rows = Some(rows);
        written
    }

    /// Ends a rows-mode pass, giving back the caches of rows 1 and on.
    pub fn end_rows(&mut self) -> Vec<CudaCache> {
        self.rows.take().map(|r| r.caches).unwrap_or_default()
    }

    /// Whether a rows-mode pass is running.
    pub(super) fn in_rows(&self) -> bool {
        self.rows.is_some()
    }

    /// Runs `f` for every row with its position and cache (row 0's is
    /// `lead`; a captured pass's padding rows have none and are skipped);
    /// inside `f` the ops are out of rows mode, so single-row operations
    /// run as they do alone.
    pub(super) fn each_row(
        &mut self,
        lead: &mut CudaCache,
        mut f: impl FnMut(&mut CudaOps, usize, usize, &mut CudaCache) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let mut rows = self.rows.take().expect("in rows mode");
        let result = (0..rows.caches.len() + 1).try_for_each(|i| {
            let pos = rows.position(i);
            let cache = match i {
                0 => &mut *lead,
                _ => &mut rows.caches[i - 1],
            };
            f(self, i, pos, cache)
        });
        self.rows = Some(rows);
        result
    }

    /// Refuses row-by-row work inside a capture: it would run at the
    /// captured positions at every replay.
    fn no_capture(&self, what: &str) -> Result<(), BackendError> {
        if self.capture.is_some() {
            return Err(BackendError::InferenceFailed(format!(
                "{what} runs row by row, which a graph cannot replay"
            )));
        }
        Ok(())
    }

    /// Runs `f` for every row with its position (operations that touch no
    /// cache, row by row; never inside a capture).
    fn each_position(
        &mut self,
        mut f: impl FnMut(&mut CudaOps, usize, usize) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.no_capture("rope")?;
        let rows = self.rows.take().expect("in rows mode");
        let result = (0..rows.seqs.len()).try_for_each(|i| f(self, i, rows.position(i)));
        self.rows = Some(rows);
        result
    }

    /// Checks that a rows-mode operation's buffers hold one row per sequence.
    fn check_rows(&self, what: &str, bufs: &[&CudaBuf]) -> Result<(), BackendError> {
        let n = self.rows.as_ref().map_or(0, |r| r.seqs.len());
        shape_check(bufs.iter().any(|b| b.rows != n), || {
            format!("{what}: rows mode over {n} sequences")
        })?;
        check_bufs(what, bufs)
    }

    /// A product of a batched decode step (see the module doc): on
    /// `gemm_few_*` where the format has it, else `mv8n_*`, else `mv_*`.
    pub(super) fn matmul_rows(
        &mut self,
        x: &CudaBuf,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let args = matmul_args(x, w, bias, out)?;
        self.dev.bind()?;
        if let Some(plan) = self.dev.kernels.rows_few_plan(&args) {
            // Groups of up to GF_MAX_TOKENS rows, each x split into f16
            // parts in the rows' block, its column ranges summed.
            for t0 in (0..args.n).step_by(GF_MAX_TOKENS) {
                let m = args.rows_of_x(t0, GF_MAX_TOKENS.min(args.n - t0));
                let block = self
                    .rows_x16
                    .as_ref()
                    .filter(|b| b.bytes() >= (4 * m.n * m.w.cols) as u64);
                let Some(block) = block else {
                    return Err(BackendError::InferenceFailed(format!(
                        "no room reserved for {} rows of {} values in f16 parts",
                        m.n, m.w.cols
                    )));
                };
                let hi = DevPtrMut::<f16>::new(block.ptr());
                self.launch_to_f16(&m, hi)?;
                let mut part = self.temp_buf(plan.splits * m.n, m.w.rows)?;
                let st = &self.dev.stream;
                self.dev
                    .kernels
                    .gemm_split(st, &m, hi.as_const(), plan, part.output())?;
            }
            return Ok(());
        }
        if self.dev.kernels.mv8_applies(&args)
            && self.matmul_x8_plan(x, &args, Mv8Plan::Rows, out)?
        {
            return Ok(());
        }
        self.dev.kernels.matmul_rows(&self.dev.stream, &args)
    }

    /// The device table's sequences, and the most chunks any row's
    /// attention takes with a window of `sliding` positions (0: none): a
    /// capture's bound, which every row's count must stay within.
    fn rows_seqs(&self, sliding: usize) -> Result<(DevPtr<RowSeq>, usize), BackendError> {
        let rows = self.rows.as_ref().expect("in rows mode");
        let table = self.rows_table.as_ref().expect("written by begin_rows");
        if let Some(q) = rows.seqs.iter().find(|q| q.pos < 0 || q.pos >= q.capacity) {
            return Err(BackendError::Shape(format!(
                "KV cache holds {} positions, {} needed",
                q.capacity,
                q.pos + 1
            )));
        }
        let most = most_splits(&rows.seqs, sliding);
        match rows.max_splits {
            Some(bound) if most > bound => Err(BackendError::InferenceFailed(format!(
                "a row's attention takes {most} chunks, a captured pass {bound}"
            ))),
            Some(bound) => Ok((table.seqs(), bound)),
            None => Ok((table.seqs(), most)),
        }
    }

    /// Checks every row's attention call as alone (buffers, cache, position).
    fn check_rows_attention(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        self.check_rows("attention", &[q, k, v, out])?;
        let kv_type = self.dev.kernels.kv_type();
        self.each_row(cache, |_, i, pos, c| {
            let (qi, ki, vi, oi) = (
                row_view(q, i),
                row_view(k, i),
                row_view(v, i),
                row_view(out, i),
            );
            check_attention(&qi, &ki, &vi, c, &shape_at(s, pos), &oi, kv_type)
        })
    }

    /// The `qk_rope_store_rows` launch of an `attend` call, or `None` where
    /// Q and K do not turn alike (then each row runs alone).
    #[allow(clippy::too_many_arguments)]
    fn qk_rope_store_rows_args(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        prep: &QkPrep<'_, CudaWeight>,
        s: &AttentionShape,
    ) -> Result<Option<QkRopeStoreRowsArgs>, BackendError> {
        let norms = head_norms(prep, s.head_dim)?;
        // The rotation's frequencies and pairing (its positions are the table's).
        let pos0 = self.rows.as_ref().expect("in rows mode").position(0);
        let rope = match prep.rope {
            Some((pq, pk)) => {
                let a = self.rope_args(&mut row_view(q, 0), rope_at(pq, pos0))?;
                let b = self.rope_args(&mut row_view(k, 0), rope_at(pk, pos0))?;
                match (a, b) {
                    (Some(a), Some(b)) if a.rotates_like(&b) => Some(a),
                    (None, None) => None,
                    _ => return Ok(None),
                }
            }
            None => None,
        };
        let (seqs, _) = self.rows_seqs(0)?;
        Ok(Some(QkRopeStoreRowsArgs {
            q: view(q).output(),
            k: view(k).output(),
            v: v.input(),
            rows: q.rows,
            n_head: s.n_head,
            n_head_kv: s.n_head_kv,
            head_dim: s.head_dim,
            norms,
            rope,
            seqs,
            layer: s.layer,
        }))
    }

    /// `Ops::attend` in rows mode: every row's norms, rotation and store in
    /// one launch, then attention (row by row where Q and K do not turn
    /// alike, as alone).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_rows(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        prep: &QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        self.check_rows_attention(q, k, v, cache, s, out)?;
        if let Some(args) = self.qk_rope_store_rows_args(q, k, v, prep, &s)? {
            self.dev.kernels.launch(&self.dev.stream, &args)?;
            return self.attend_rows_cached(q, cache, s, None, out);
        }
        self.no_capture("attend")?;
        self.each_row(cache, |ops, i, pos, c| {
            let (mut qi, mut ki, vi, mut oi) = (
                row_view(q, i),
                row_view(k, i),
                row_view(v, i),
                row_view(out, i),
            );
            let prep = prep_at(prep, pos);
            crate::model::ops::Ops::attend(
                ops,
                &mut qi,
                &mut ki,
                &vi,
                prep,
                c,
                shape_at(s, pos),
                &mut oi,
            )
        })
    }

    /// `Ops::attention` (with sinks where given, checked by the caller) in
    /// rows mode: every row's store in one launch, then attention.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_rows(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: Option<&CudaWeight>,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        self.check_rows_attention(q, k, v, cache, s, out)?;
        let nothing = QkPrep {
            norms: None,
            rope: None,
        };
        let store = self
            .qk_rope_store_rows_args(q, k, v, &nothing, &s)?
            .expect("nothing to turn: one launch");
        self.dev.bind()?;
        self.dev.kernels.launch(&self.dev.stream, &store)?;
        self.attend_rows_cached(q, cache, s, sinks.map(CudaWeight::vector), out)
    }

    /// Every row's attention over its own cache (its K and V already
    /// stored): one split launch and one merge for all rows, each row's
    /// context in chunks of its own (`rows_nsplit`); row by row, as alone,
    /// for groups or heads the split kernels do not take.
    fn attend_rows_cached(
        &mut self,
        q: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: Option<DevPtr<f32>>,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        let (n_head, n_head_kv, hd) = (s.n_head, s.n_head_kv, s.head_dim);
        if n_head / n_head_kv > ATS_MAX_GROUP || !hd.is_multiple_of(8) {
            self.no_capture("attention")?;
            return self.each_row(cache, |ops, i, pos, c| {
                ops.attend_cached(
                    &row_view(q, i),
                    c,
                    shape_at(s, pos),
                    sinks,
                    &mut row_view(out, i),
                )
            });
        }
        // A window at least as wide as a row's context hides nothing of it.
        let sliding = s.window.unwrap_or(0);
        let (seqs, max_splits) = self.rows_seqs(sliding)?;
        let rows = q.rows;
        // Inside a capture, one arena block for every layer's chunks.
        let mut part = self.split_part(rows * n_head * max_splits, hd + 2)?;
        let split = AttentionSplitRowsArgs {
            q: q.input(),
            rows,
            n_head,
            n_head_kv,
            head_dim: hd,
            seqs,
            layer: s.layer,
            scale: s.scale,
            sliding,
            max_splits,
            part: part.output(),
        };
        let combine = AttentionCombineRowsArgs {
            part: part.input(),
            rows,
            n_head,
            head_dim: hd,
            seqs,
            sliding,
            max_splits,
            sinks,
            out: view(out).output(),
        };
        self.dev.bind()?;
        self.dev.kernels.launch(&self.dev.stream, &split)?;
        self.dev.kernels.launch(&self.dev.stream, &combine)
    }

    /// `Ops::rope_qk` in rows mode: each row turned by its own position.
    pub(super) fn rope_qk_rows(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        pq: RopeParams<'_>,
        pk: RopeParams<'_>,
    ) -> Result<(), BackendError> {
        self.check_rows("rope", &[q, k])?;
        self.each_position(|ops, i, pos| {
            let (mut qi, mut ki) = (row_view(q, i), row_view(k, i));
            crate::model::ops::Ops::rope_qk(
                ops,
                &mut qi,
                &mut ki,
                rope_at(pq, pos),
                rope_at(pk, pos),
            )
        })
    }

    /// `Ops::rope` in rows mode.
    pub(super) fn rope_rows(&mut self, x: &CudaBuf, p: RopeParams<'_>) -> Result<(), BackendError> {
        self.check_rows("rope", &[x])?;
        self.each_position(|ops, i, pos| {
            crate::model::ops::Ops::rope(ops, &mut row_view(x, i), rope_at(p, pos))
        })
    }

    /// `embed` in rows mode: each row's token, from the table.
    pub(super) fn embed_rows(
        &mut self,
        table: &CudaWeight,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let tokens = self
            .rows_table
            .as_ref()
            .expect("written by begin_rows")
            .tokens();
        self.embed_from(table, tokens, out)
    }

    /// `embed_positions` in rows mode: each row's learned position (GPT-2),
    /// from the table.
    pub(super) fn embed_positions_rows(
        &mut self,
        table: &CudaWeight,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let rows = self.rows.as_ref().expect("in rows mode");
        if let Some(q) = rows.seqs.iter().find(|q| q.pos as usize >= table.rows) {
            return Err(BackendError::InferenceFailed(format!(
                "position {} is past the {} learned positions",
                q.pos, table.rows
            )));
        }
        let positions = self
            .rows_table
            .as_ref()
            .expect("written by begin_rows")
            .positions();
        self.embed_from(table, positions, out)
    }

    /// `embed` of the rows' ids at `ids` (device) into `out`.
    fn embed_from(
        &mut self,
        table: &CudaWeight,
        ids: DevPtr<u32>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.check_rows("embed", &[out])?;
        shape_check(out.cols != table.cols, || {
            format!(
                "embed: table {}x{}, out {}x{}",
                table.rows, table.cols, out.rows, out.cols
            )
        })?;
        check_weights("embed", &[table])?;
        self.dev.bind()?;
        let args = EmbedArgs {
            table: table.stored(),
            tokens: ids,
            n: out.rows,
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    /// `keep_last_row` in rows mode: row `i` of the logits to sequence `i`'s
    /// sampler, one launch for all.
    pub(super) fn keep_rows(&mut self, x: &CudaBuf, len: usize) -> Result<(), BackendError> {
        self.check_rows("keep_last_row", &[x])?;
        shape_check(x.cols != len, || {
            format!("keep_last_row: {}x{} for {len} logits", x.rows, x.cols)
        })?;
        let seqs = self
            .rows_table
            .as_ref()
            .expect("written by begin_rows")
            .seqs();
        self.dev.bind()?;
        let args = KeepRowsArgs {
            x: x.input(),
            rows: x.rows,
            cols: len,
            seqs,
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }
}

//! `CudaOps`'s implementation of `model::ops::Ops`: each operation checks
//! its operands and launches its kernel, or hands over to the file that
//! does more (`attend.rs`, `moe.rs`, `norm.rs`, `products.rs`, `rows.rs`).

use cudarc::driver::result as drv;

use crate::backend::cuda::device::{driver_error, Purpose};
use crate::backend::cuda::kernels::{
    AddAssignArgs, CopyColsArgs, EmbedArgs, GeluArgs, Glu, LayerNormArgs, RmsNormArgs, RopeArgs,
    ScaleArgs,
};
use crate::backend::cuda::ptr::DevPtr;
use crate::backend::BackendError;
use crate::model::ops::{
    attend_in_steps, project_attend_in_steps, AttentionShape, MoeWeights, Ops, Product, QkPrep,
    RopeParams,
};

use crate::backend::cuda::ops::buffers::{
    check_bufs, check_weights, is_f32_vector, shape_check, CudaBuf, CudaCache, CudaWeight,
};
use crate::backend::cuda::ops::CudaOps;

/// `embed` of `n` token ids at `tokens` from `table` into `out`.
fn embed_args(table: &CudaWeight, tokens: DevPtr<u32>, n: usize, out: &mut CudaBuf) -> EmbedArgs {
    EmbedArgs {
        table: table.stored(),
        tokens,
        n,
        out: out.output(),
    }
}

impl Ops for CudaOps {
    type Weight = CudaWeight;
    type Buf = CudaBuf;
    type Cache = CudaCache;
    type Error = BackendError;

    /// Zeroed, except inside a decode-step capture: there a memset node
    /// per buffer would run at every replay (and hold up the next kernel's
    /// early launch), while every architecture writes each buffer before it
    /// reads it. The graph test checks replays against eager steps, whose
    /// buffers are zeroed, bit for bit.
    fn buf(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        let b = self.alloc_buf(rows, cols)?;
        if self.capture.is_none() {
            self.zero(&b)?;
        }
        Ok(b)
    }

    fn dims(&self, x: &CudaBuf) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn embed(
        &mut self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        shape_check(
            tokens.is_empty()
                || out.rows != tokens.len()
                || out.cols != table.cols
                || table.cols == 0,
            || {
                format!(
                    "embed: {} tokens, table {}x{}, out {}x{}",
                    tokens.len(),
                    table.rows,
                    table.cols,
                    out.rows,
                    out.cols
                )
            },
        )?;
        check_weights("embed", &[table])?;
        check_bufs("embed", &[out])?;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= table.rows) {
            return Err(BackendError::InferenceFailed(format!(
                "token id {id} is outside the vocabulary ({})",
                table.rows
            )));
        }
        if self.in_rows() {
            return self.embed_rows(table, out);
        }
        self.dev.bind()?;
        if let Some(c) = &self.capture {
            // The token id is written to the step's device slot before each replay.
            if tokens.len() != 1 {
                return Err(BackendError::InferenceFailed(
                    "a decode graph takes one token".into(),
                ));
            }
            let args = embed_args(table, DevPtr::new(c.step), 1, out);
            return self.dev.kernels.launch(&self.dev.stream, &args);
        }
        let ids = self
            .dev
            .alloc_async(Purpose::Scratch, (tokens.len() * 4) as u64)?;
        // SAFETY: `ids` holds `tokens.len()` u32 values; pageable memory is
        // staged before the call returns.
        unsafe { drv::memcpy_htod_async(ids.ptr(), tokens, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying token ids", e))?;
        let args = embed_args(table, DevPtr::new(ids.ptr()), tokens.len(), out);
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn embed_positions(
        &mut self,
        table: &CudaWeight,
        start_pos: usize,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.embed_positions_rows(table, out);
        }
        let end = start_pos + out.rows;
        if end > table.rows {
            return Err(BackendError::InferenceFailed(format!(
                "position {} is past the {} learned positions",
                end - 1,
                table.rows
            )));
        }
        let Some(c) = &self.capture else {
            let positions: Vec<u32> = (start_pos..end).map(|p| p as u32).collect();
            return self.embed(table, &positions, out);
        };
        // A decode graph reads its position from the step's slot, the word
        // after the token (the model's context, checked at load, is within
        // the table).
        shape_check(out.rows != 1 || out.cols != table.cols, || {
            format!(
                "embed_positions: a decode graph takes one row of {}, not {}x{}",
                table.cols, out.rows, out.cols
            )
        })?;
        check_weights("embed_positions", &[table])?;
        check_bufs("embed_positions", &[out])?;
        self.dev.bind()?;
        let args = embed_args(table, DevPtr::new(c.step + 4), 1, out);
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn copy_cols(
        &mut self,
        x: &CudaBuf,
        start: usize,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        shape_check(
            out.rows != x.rows || start + out.cols > x.cols || out.is_empty(),
            || {
                format!(
                    "copy_cols: x {}x{} from {start}, out {}x{}",
                    x.rows, x.cols, out.rows, out.cols
                )
            },
        )?;
        check_bufs("copy_cols", &[x, out])?;
        self.dev.bind()?;
        let args = CopyColsArgs {
            x: x.input(),
            rows: x.rows,
            x_cols: x.cols,
            start,
            cols: out.cols,
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn rms_norm(
        &mut self,
        x: &CudaBuf,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let width = weight.cols;
        shape_check(
            !is_f32_vector(weight, width)
                || width == 0
                || !x.cols.is_multiple_of(width)
                || out.rows != x.rows
                || out.cols != x.cols
                || x.is_empty(),
            || {
                format!(
                    "rms_norm: x {}x{}, w {}, out {}x{}",
                    x.rows, x.cols, weight.cols, out.rows, out.cols
                )
            },
        )?;
        check_weights("rms_norm", &[weight])?;
        check_bufs("rms_norm", &[x, out])?;
        self.dev.bind()?;
        // A narrower weight normalises each group of a row: the kernel sees
        // the groups as rows of their own (the buffer is contiguous).
        let groups = x.cols / width;
        let (w, rows, cols) = (weight.vector(), x.rows * groups, width);
        let x8 = if groups == 1 { self.x8_for(out) } else { None };
        let args = RmsNormArgs {
            x: x.input(),
            w,
            rows,
            cols,
            eps,
            out: out.output(),
            x8,
        };
        self.launch_splitting(&args, out)
    }

    fn matmul(
        &mut self,
        x: &CudaBuf,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.product(x, w, bias, out)
    }

    /// Products of one row of x in one format with `mv8_*` run as one
    /// `mv8m_*` launch per format (Q and K apart from a V in another
    /// format); every other product as `matmul` runs it.
    fn matmuls(
        &mut self,
        x: &CudaBuf,
        products: &mut [Product<'_, CudaWeight, CudaBuf>],
    ) -> Result<(), BackendError> {
        self.products(x, products)
    }

    fn rope(&mut self, x: &mut CudaBuf, p: RopeParams<'_>) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.rope_rows(x, p);
        }
        match self.rope_args(x, p)? {
            Some(args) => self.dev.kernels.launch(&self.dev.stream, &args),
            None => Ok(()),
        }
    }

    /// Q and K in one `rope` launch where they turn alike (every layer of
    /// the models here: the same positions, frequencies and style).
    fn rope_qk(
        &mut self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        pq: RopeParams<'_>,
        pk: RopeParams<'_>,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.rope_qk_rows(q, k, pq, pk);
        }
        let (a, b) = (self.rope_args(q, pq)?, self.rope_args(k, pk)?);
        match (a, b) {
            (Some(a), Some(b)) if a.rotates_like(&b) => {
                let both = RopeArgs {
                    x2: Some(b.x),
                    n_head2: b.n_head,
                    ..a
                };
                self.dev.kernels.launch(&self.dev.stream, &both)
            }
            (a, b) => {
                for args in [a, b].into_iter().flatten() {
                    self.dev.kernels.launch(&self.dev.stream, &args)?;
                }
                Ok(())
            }
        }
    }

    fn attention(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.attention_rows(q, k, v, cache, s, None, out);
        }
        self.store_attend(q, k, v, cache, s, None, out)
    }

    /// The sinks in the softmax's denominator: a term of the attention
    /// kernels' final normalisation (`sinks` argument).
    fn attention_sinks(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: &CudaWeight,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        shape_check(!is_f32_vector(sinks, s.n_head), || {
            format!(
                "attention sinks: {} values for {} heads",
                sinks.cols, s.n_head
            )
        })?;
        check_weights("attention sinks", &[sinks])?;
        if self.in_rows() {
            return self.attention_rows(q, k, v, cache, s, Some(sinks), out);
        }
        self.store_attend(q, k, v, cache, s, Some(sinks.vector()), out)
    }

    fn moe(
        &mut self,
        x: &CudaBuf,
        logits: &CudaBuf,
        w: MoeWeights<'_, CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.experts(x, logits, &w, out)
    }

    /// Q's and K's norms and rotations and the KV store in one
    /// `qk_rope_store` launch where Q and K turn alike, then attention.
    fn attend(
        &mut self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        prep: QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.attend_rows(q, k, v, &prep, cache, s, out);
        }
        let Some(args) = self.qk_rope_store_args(q, k, v, &prep, cache, &s, out)? else {
            return attend_in_steps(self, q, k, v, prep, cache, s, out);
        };
        self.dev.kernels.launch(&self.dev.stream, &args)?;
        self.attend_cached(q, cache, s, None, out)
    }

    /// One row of x: Q, K and V, Q's and K's rotations and the KV store in
    /// one `mv8q_*` launch where they can, then attention.
    fn project_attend(
        &mut self,
        x: &CudaBuf,
        mut qkv: [Product<'_, CudaWeight, CudaBuf>; 3],
        prep: QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            // Q, K and V of every row at once, then each row alone.
            self.matmuls(x, &mut qkv)?;
            let [q, k, v] = qkv;
            return self.attend_rows(q.out, k.out, v.out, &prep, cache, s, out);
        }
        if let Some(call) = self.qkv_rope_call(x, &mut qkv, &prep, cache, &s, out)? {
            self.dev.kernels.launch(&self.dev.stream, &call)?;
            let [q, k, v] = qkv;
            self.x8_still_holds(x, &[&*q.out, &*k.out, &*v.out]);
            return self.attend_cached(q.out, cache, s, None, out);
        }
        project_attend_in_steps(self, x, qkv, prep, cache, s, out)
    }

    fn swiglu(
        &mut self,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.glu(Glu::Silu, gate, up, out)
    }

    fn geglu(
        &mut self,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.glu(Glu::Gelu, gate, up, out)
    }

    fn scale(&mut self, x: &mut CudaBuf, factor: f32) -> Result<(), BackendError> {
        shape_check(x.is_empty(), || "scale: an empty buffer".into())?;
        check_bufs("scale", &[x])?;
        self.dev.bind()?;
        let args = ScaleArgs {
            x: x.output(),
            len: x.len(),
            factor,
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn layer_norm(
        &mut self,
        x: &CudaBuf,
        weight: &CudaWeight,
        bias: Option<&CudaWeight>,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        shape_check(
            !is_f32_vector(weight, x.cols)
                || bias.is_some_and(|b| !is_f32_vector(b, x.cols))
                || out.rows != x.rows
                || out.cols != x.cols
                || x.is_empty(),
            || {
                format!(
                    "layer_norm: x {}x{}, w {}, bias {:?}, out {}x{}",
                    x.rows,
                    x.cols,
                    weight.cols,
                    bias.map(|b| b.cols),
                    out.rows,
                    out.cols
                )
            },
        )?;
        check_weights("layer_norm", &[weight])?;
        if let Some(b) = bias {
            check_weights("layer_norm bias", &[b])?;
        }
        check_bufs("layer_norm", &[x, out])?;
        self.dev.bind()?;
        let (w, b) = (weight.vector(), bias.map(CudaWeight::vector));
        let args = LayerNormArgs {
            x: x.input(),
            w,
            b,
            rows: x.rows,
            cols: x.cols,
            eps,
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn gelu(&mut self, x: &CudaBuf, out: &mut CudaBuf) -> Result<(), BackendError> {
        shape_check(out.len() != x.len() || x.is_empty(), || {
            format!(
                "gelu: x {}x{}, out {}x{}",
                x.rows, x.cols, out.rows, out.cols
            )
        })?;
        check_bufs("gelu", &[x, out])?;
        self.dev.bind()?;
        let args = GeluArgs {
            x: x.input(),
            len: x.len(),
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn add_assign(&mut self, x: &mut CudaBuf, y: &CudaBuf) -> Result<(), BackendError> {
        shape_check(x.len() != y.len() || x.is_empty(), || "add".into())?;
        check_bufs("add", &[x, y])?;
        self.dev.bind()?;
        let args = AddAssignArgs {
            len: x.len(),
            x: x.output(),
            y: y.input(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn add_rms_norm(
        &mut self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.add_rms_norm_launch(x, y, None, weight, eps, out)
    }

    /// One `add_rms_norm` launch with `y`'s own norm.
    fn norm_add_rms_norm(
        &mut self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        y_weight: &CudaWeight,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.add_rms_norm_launch(x, y, Some(y_weight), weight, eps, out)
    }

    fn take_row(&mut self, x: &CudaBuf, row: usize) -> Result<CudaBuf, BackendError> {
        shape_check(row >= x.rows, || "take_row".into())?;
        check_bufs("take_row", &[x])?;
        let out = self.alloc_buf(1, x.cols)?;
        // SAFETY: both ranges are `cols` f32 values inside their blocks.
        unsafe {
            drv::memcpy_dtod_async(out.ptr(), x.row_ptr(row), x.cols * 4, self.dev.cu_stream())
        }
        .map_err(|e| driver_error("copying a row", e))?;
        self.dev.kernels.note_write();
        Ok(out)
    }

    fn to_host(&mut self, x: &CudaBuf, out: &mut Vec<f32>) -> Result<(), BackendError> {
        check_bufs("to_host", &[x])?;
        out.clear();
        out.resize(x.len(), 0.0);
        self.dev.bind()?;
        if self.capture.is_some() {
            return Err(BackendError::InferenceFailed(
                "a decode graph keeps its logits on the device".into(),
            ));
        }
        // SAFETY: `out` holds exactly the block's `len` values.
        unsafe { drv::memcpy_dtoh_async(out.as_mut_slice(), x.ptr(), self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying to the host", e))?;
        self.dev.synchronize()
    }

    /// An asynchronous device-to-device copy (captured into a decode graph
    /// like any other step); without a buffer set by `keep_logits_in`, nothing.
    fn keep_last_row(&mut self, x: &CudaBuf) -> Result<(), BackendError> {
        let Some((dst, len)) = self.kept_logits else {
            return Ok(());
        };
        if self.in_rows() {
            return self.keep_rows(x, len);
        }
        shape_check(x.rows == 0 || x.cols != len, || {
            format!("keep_last_row: {}x{} for {len} logits", x.rows, x.cols)
        })?;
        self.dev.bind()?;
        self.dev.kernels.note_write();
        // SAFETY: one row of `len` f32 inside the block, into a buffer of `len` f32.
        unsafe { drv::memcpy_dtod_async(dst, x.row_ptr(x.rows - 1), len * 4, self.dev.cu_stream()) }
            .map_err(|e| driver_error("keeping the logits on the device", e))
    }

    fn row_to_host(
        &mut self,
        x: &CudaBuf,
        row: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        shape_check(row >= x.rows, || "row_to_host".into())?;
        check_bufs("row_to_host", &[x])?;
        if self.capture.is_some() {
            return Err(BackendError::InferenceFailed(
                "checkpoints are not recorded in a decode graph".into(),
            ));
        }
        out.clear();
        out.resize(x.cols, 0.0);
        self.dev.bind()?;
        // SAFETY: one row of `cols` f32 values inside the block.
        unsafe { drv::memcpy_dtoh_async(out.as_mut_slice(), x.row_ptr(row), self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying to the host", e))?;
        self.dev.synchronize()
    }
}

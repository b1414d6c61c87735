//! The launches that may split their output for the next mat-vec (norms,
//! gated activations) and RoPE's frequency tables on the device.

use cudarc::driver::result as drv;

use super::buffers::{check_bufs, check_weights, is_f32_vector, shape_check, CudaBuf, CudaWeight};
use super::state::RopeTable;
use super::CudaOps;
use crate::backend::cuda::device::{driver_error, Purpose};
use crate::backend::cuda::kernels::{norm_cluster_blocks, Kernel};
use crate::backend::cuda::kernels::{
    AddRmsNormArgs, AddRmsNormClusterArgs, Glu, GluArgs, RopeArgs, RopePairs, SplitsOutput,
};
use crate::backend::cuda::ptr::DevPtr;
use crate::backend::BackendError;
use crate::model::config::RopeStyle;
use crate::model::ops::{rope_inv_freqs, RopeParams};

impl CudaOps {
    /// `out = act(gate) * up`.
    pub(super) fn glu(
        &mut self,
        act: Glu,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        shape_check(
            gate.len() != up.len() || out.len() != up.len() || up.is_empty(),
            || format!("glu: {} {} {}", gate.len(), up.len(), out.len()),
        )?;
        check_bufs("glu", &[gate, up, out])?;
        self.dev.bind()?;
        let x8 = self.x8_for(out);
        let args = GluArgs {
            act,
            gate: gate.input(),
            up: up.input(),
            len: up.len(),
            out: out.output(),
            x8,
        };
        self.launch_splitting(&args, out)
    }

    /// Launches a kernel that writes `out` and, when `args.x8()` says so,
    /// splits it into the block; the block then holds `out` as it is now
    /// (until the next launch or copy).
    pub(super) fn launch_splitting<C: SplitsOutput>(
        &mut self,
        args: &C,
        out: &CudaBuf,
    ) -> Result<(), BackendError>
    where
        C::Kernel: Into<Kernel>,
    {
        self.dev.kernels.launch(&self.dev.stream, args)?;
        if args.x8().is_some() {
            self.x8_now_holds(out);
        }
        Ok(())
    }

    /// `x += y` (or `rms_norm(y) * y_weight`), then `out = rms_norm(x) * weight`.
    pub(super) fn add_rms_norm_launch(
        &mut self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        y_weight: Option<&CudaWeight>,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let same = |b: &CudaBuf| b.rows == x.rows && b.cols == x.cols;
        let yw_ok = y_weight.is_none_or(|w| is_f32_vector(w, x.cols));
        shape_check(
            !is_f32_vector(weight, x.cols) || !yw_ok || !same(y) || !same(out) || x.is_empty(),
            || {
                format!(
                    "add_rms_norm: x {}x{}, y {}x{}, w {}, y's w {:?}, out {}x{}",
                    x.rows,
                    x.cols,
                    y.rows,
                    y.cols,
                    weight.cols,
                    y_weight.map(|w| w.cols),
                    out.rows,
                    out.cols
                )
            },
        )?;
        check_weights("add_rms_norm", &[weight])?;
        if let Some(w) = y_weight {
            check_weights("add_rms_norm", &[w])?;
        }
        check_bufs("add_rms_norm", &[x, y, out])?;
        self.dev.bind()?;
        let x8 = self.x8_for(out);
        if let Some(x8) = x8.filter(|_| {
            y_weight.is_none()
                && self.dev.kernels.clusters()
                && norm_cluster_blocks(x.cols).is_some()
        }) {
            let args = AddRmsNormClusterArgs {
                x: x.output(),
                y: y.input(),
                w: weight.vector(),
                cols: x.cols,
                eps,
                out: out.output(),
                x8,
            };
            return self.launch_splitting(&args, out);
        }
        let args = AddRmsNormArgs {
            x: x.output(),
            y: y.input(),
            yw: y_weight.map(CudaWeight::vector),
            w: weight.vector(),
            rows: x.rows,
            cols: x.cols,
            eps,
            out: out.output(),
            x8,
        };
        self.launch_splitting(&args, out)
    }

    /// The checked launch of `rope` on x (`None`: nothing to rotate).
    pub(super) fn rope_args(
        &mut self,
        x: &mut CudaBuf,
        p: RopeParams<'_>,
    ) -> Result<Option<RopeArgs>, BackendError> {
        shape_check(
            x.cols != p.n_head * p.head_dim
                || p.n_rot > p.head_dim
                || !p.n_rot.is_multiple_of(2)
                || !p.factors_fit()
                || x.is_empty(),
            || {
                format!(
                    "rope: x {}x{}, {} heads of {}, {:?} frequency factors",
                    x.rows,
                    x.cols,
                    p.n_head,
                    p.head_dim,
                    p.freq_factors.map(<[f32]>::len)
                )
            },
        )?;
        check_bufs("rope", &[x])?;
        if p.n_rot == 0 {
            return Ok(None);
        }
        let pairs = match p.style {
            RopeStyle::Normal => RopePairs::Adjacent,
            RopeStyle::Neox => RopePairs::Halves,
        };
        // Frequency factors live only in the table: made here on first use
        // (never inside a graph capture, which may not allocate; the prefill
        // before it has made it).
        if p.freq_factors.is_some() && self.capture.is_none() {
            self.prepare_rope(p.freq_base, p.n_rot, p.freq_factors)?;
        }
        let inv_freq = self
            .rope_tables
            .iter()
            .find(|t| t.is_for(p.freq_base, p.n_rot, p.freq_factors))
            .map(|t| DevPtr::new(t.mem.ptr()));
        if inv_freq.is_none() && p.freq_factors.is_some() {
            return Err(BackendError::InferenceFailed(
                "rope: no table for these frequency factors inside a graph capture".into(),
            ));
        }
        self.dev.bind()?;
        Ok(Some(RopeArgs {
            x: x.output(),
            x2: None,
            n_head2: 0,
            rows: x.rows,
            n_head: p.n_head,
            head_dim: p.head_dim,
            n_rot: p.n_rot,
            start_pos: p.start_pos,
            pos_ptr: self.pos_ptr(),
            inv_freq,
            freq_base: p.freq_base,
            freq_scale: p.freq_scale,
            mscale: p.mscale,
            pairs,
        }))
    }

    /// Uploads the RoPE frequencies for (`freq_base`, `n_rot`), computed as
    /// the CPU reference computes them, so that `rope` need not compute them
    /// per thread. Without a table the kernel computes them itself.
    pub fn prepare_rope(
        &mut self,
        freq_base: f32,
        n_rot: usize,
        factors: Option<&[f32]>,
    ) -> Result<(), BackendError> {
        if n_rot < 2
            || factors.is_some_and(|f| f.len() != n_rot / 2)
            || self
                .rope_tables
                .iter()
                .any(|t| t.is_for(freq_base, n_rot, factors))
        {
            return Ok(());
        }
        let table = rope_inv_freqs(freq_base, n_rot, factors);
        self.dev.bind()?;
        let mem = self.dev.alloc(Purpose::Weights, (table.len() * 8) as u64)?;
        // SAFETY: the block holds the table.
        unsafe { drv::memcpy_htod_async(mem.ptr(), &table, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying the RoPE table", e))?;
        self.dev.synchronize()?;
        self.rope_tables
            .push(RopeTable::new(freq_base, n_rot, factors, mem));
        Ok(())
    }

    /// The device position slot while capturing, else none.
    pub(super) fn pos_ptr(&self) -> Option<DevPtr<i32>> {
        self.capture.as_ref().map(|c| DevPtr::new(c.step + 4))
    }
}

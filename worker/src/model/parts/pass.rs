//! The ends of every forward pass: the token embeddings, the checkpoints
//! recorded on the way, and the LM head.

use crate::model::config::ModelConfig;
use crate::model::ops::{Checkpoints, Logits, Ops};
use crate::model::parts::{OutputNorm, Trunk};

/// Records the last row of named intermediate values when checkpoints are
/// asked for (parity logging), and does nothing otherwise.
pub struct Recorder<'c> {
    checkpoints: Option<&'c mut Checkpoints>,
    last: usize,
    row: Vec<f32>,
}

impl<'c> Recorder<'c> {
    pub fn new(checkpoints: Option<&'c mut Checkpoints>, n_tokens: usize) -> Self {
        Recorder {
            checkpoints,
            last: n_tokens.saturating_sub(1),
            row: Vec::new(),
        }
    }

    pub fn record<O: Ops>(&mut self, ops: &mut O, name: &str, x: &O::Buf) -> Result<(), O::Error> {
        self.record_row(ops, name, x, self.last)
    }

    /// The residual stream after layer `il` (`l_out-<il>`, llama.cpp's name).
    pub fn layer_out<O: Ops>(
        &mut self,
        ops: &mut O,
        il: usize,
        x: &O::Buf,
    ) -> Result<(), O::Error> {
        self.record(ops, &format!("l_out-{il}"), x)
    }

    fn record_row<O: Ops>(
        &mut self,
        ops: &mut O,
        name: &str,
        x: &O::Buf,
        row: usize,
    ) -> Result<(), O::Error> {
        if let Some(cp) = self.checkpoints.as_deref_mut() {
            ops.row_to_host(x, row, &mut self.row)?;
            cp.record(name, &self.row);
        }
        Ok(())
    }
}

/// One forward pass as every architecture's graph takes it: `tokens` at
/// positions `start_pos..` (never empty: `model::forward` refuses that), the
/// logits wanted and where they go, and the checkpoint recorder.
pub struct Pass<'p> {
    pub tokens: &'p [u32],
    pub start_pos: usize,
    pub logits: Logits,
    pub out: &'p mut Vec<f32>,
    pub rec: Recorder<'p>,
}

/// The pass's token embeddings from `table`, `[n_tokens, n_embd]`,
/// recorded as `inp_embd`.
pub fn embed<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    table: &O::Weight,
    pass: &mut Pass<'_>,
) -> Result<O::Buf, O::Error> {
    let mut x = ops.buf(pass.tokens.len(), cfg.n_embd)?;
    ops.embed(table, pass.tokens, &mut x)?;
    pass.rec.record(ops, "inp_embd", &x)?;
    Ok(x)
}

/// The end of every forward pass: the rows whose logits are wanted go
/// through the trunk's final norm and LM head; the last row is kept for the
/// backend's sampler and the requested logits copied to `pass.out` (left
/// empty for `Logits::None`).
pub fn lm_head<O: Ops, L>(
    ops: &mut O,
    cfg: &ModelConfig,
    x: O::Buf,
    trunk: &Trunk<O::Weight, L>,
    pass: Pass<'_>,
) -> Result<(), O::Error> {
    let Pass {
        logits,
        out,
        rec: mut recorder,
        ..
    } = pass;
    let n = recorder.last + 1;
    let x = match logits {
        Logits::All | Logits::Rows => x,
        Logits::Last | Logits::None if n == 1 => x,
        Logits::Last | Logits::None => ops.take_row(&x, recorder.last)?,
    };
    let rows = match logits {
        Logits::All | Logits::Rows => n,
        Logits::Last | Logits::None => 1,
    };
    let mut normed = ops.buf(rows, cfg.n_embd)?;
    match &trunk.output_norm {
        OutputNorm::Rms(w) => ops.rms_norm(&x, w, cfg.norm_eps, &mut normed)?,
        OutputNorm::Layer(a) => {
            ops.layer_norm(&x, &a.weight, Some(&a.bias), cfg.norm_eps, &mut normed)?
        }
    }
    recorder.record_row(ops, "result_norm", &normed, rows - 1)?;
    let mut result = ops.buf(rows, cfg.vocab_size)?;
    ops.matmul(&normed, trunk.head(), None, &mut result)?;
    ops.keep_last_row(&result)?;
    if matches!(logits, Logits::None | Logits::Rows) {
        out.clear();
        return Ok(());
    }
    ops.to_host(&result, out)
}

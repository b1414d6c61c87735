//! Test doubles for the engine and the HTTP layer (M0-W-1811): a scripted
//! backend whose logits make a fixed token sequence win, and a tiny
//! byte-level tokenizer. Compiled for the crate's own tests only
//! (`#[cfg(test)]` in `engine/mod.rs`): nothing of it ships in the library.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{
    sample_rows_on_host, Backend, BackendError, BackendKind, Checkpoints, DeviceInfo, KvLayout,
    KvType, Logits, MemoryUse, SampleRequest, SampledToken, SeqId, Slots, DEFAULT_PREFILL_CHUNK,
};
use crate::sampling::Selector;
use crate::tokenizer::{Tokenizer, VocabSpec};

/// Ids of the byte tokenizer's special tokens (byte `b` is id `b`).
pub const EOS_ID: u32 = 256;
pub const IM_START_ID: u32 = 257;
pub const IM_END_ID: u32 = 258;
pub const BYTE_VOCAB_SIZE: usize = 259;

/// A ChatML template, as SmolLM2 ships.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-unicode map: the token text of byte `b`.
fn byte_char(b: u8) -> char {
    let printable =
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return b as char;
    }
    // Unprintable bytes map, in order, to U+0100 and up.
    let mut n = 0u32;
    for x in 0..b {
        let p =
            (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x);
        if !p {
            n += 1;
        }
    }
    char::from_u32(0x100 + n).expect("valid char")
}

/// The vocabulary of [`byte_tokenizer`]: 256 byte tokens (id = byte value,
/// no merges), then `<|endoftext|>` (EOS), `<|im_start|>`, `<|im_end|>`.
pub fn byte_vocab_spec(chat_template: Option<&str>) -> VocabSpec {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut token_types = vec![1; 256];
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_string());
        token_types.push(3);
    }
    VocabSpec {
        model: "gpt2".into(),
        pre: Some("default".into()),
        tokens,
        token_types,
        merges: Vec::new(),
        scores: None,
        bos_id: None,
        eos_id: Some(EOS_ID),
        eot_id: Some(IM_END_ID),
        eom_id: None,
        unk_id: None,
        pad_id: None,
        add_bos: false,
        add_eos: false,
        add_space_prefix: false,
        chat_template: chat_template.map(str::to_string),
    }
}

/// Ids of the harmony structure tokens of [`harmony_byte_tokenizer`], in
/// the order of `harmony::STRUCTURE`.
pub const HARMONY_IDS: [u32; 6] = [259, 260, 261, 262, 263, 264];

/// [`byte_tokenizer`] with gpt-oss's harmony structure tokens after its own.
pub fn harmony_byte_tokenizer() -> Arc<Tokenizer> {
    let mut spec = byte_vocab_spec(Some(CHATML_TEMPLATE));
    for t in crate::tokenizer::harmony::STRUCTURE {
        spec.tokens.push(t.to_string());
        spec.token_types.push(3);
    }
    Arc::new(Tokenizer::from_spec(spec).expect("byte vocabulary is valid"))
}

/// Ids of `<think>` and `</think>` in [`think_byte_tokenizer`].
pub const THINK_OPEN_ID: u32 = 259;
pub const THINK_CLOSE_ID: u32 = 260;

/// Qwen3's chat template, as its models ship it.
pub const QWEN3_TEMPLATE: &str = include_str!("../tokenizer/testdata/qwen3.jinja");

/// [`byte_tokenizer`] with Qwen3's chat template and its `<think>` and
/// `</think>` after its own tokens, user-defined tokens as in Qwen3's GGUF
/// files.
pub fn think_byte_tokenizer() -> Arc<Tokenizer> {
    let mut spec = byte_vocab_spec(Some(QWEN3_TEMPLATE));
    for t in [
        crate::tokenizer::think::OPEN,
        crate::tokenizer::think::CLOSE,
    ] {
        spec.tokens.push(t.to_string());
        spec.token_types
            .push(crate::tokenizer::token_type::USER_DEFINED);
    }
    Arc::new(Tokenizer::from_spec(spec).expect("byte vocabulary is valid"))
}

/// A token of a think model's answer as the engine sends it: its id, its
/// released text, and whether the engine put it in a think block.
pub fn think_token(
    index: usize,
    id: u32,
    text: &str,
    inside: bool,
) -> crate::engine::job::TokenOut {
    crate::engine::job::TokenOut {
        index,
        id,
        text: text.into(),
        logprobs: None,
        channel: inside.then(|| crate::tokenizer::think::CHANNEL.into()),
    }
}

/// A byte-level tokenizer with a ChatML template: every byte is one token.
pub fn byte_tokenizer() -> Arc<Tokenizer> {
    Arc::new(
        Tokenizer::from_spec(byte_vocab_spec(Some(CHATML_TEMPLATE)))
            .expect("byte vocabulary is valid"),
    )
}

/// What a test can observe of a [`ScriptedBackend`] after handing it over.
#[derive(Debug, Default)]
pub struct ScriptProbe {
    pub sequences_begun: AtomicUsize,
    pub sequences_ended: AtomicUsize,
    pub forward_calls: AtomicUsize,
    /// Tokens of each forward call, in order.
    pub forward_sizes: Mutex<Vec<usize>>,
    /// Prompt tokens of each sequence, in order.
    pub prompts: Mutex<Vec<Vec<u32>>>,
    /// What `check_residency` answers on a scripted `cuda` device.
    pub resident: AtomicBool,
    pub residency_checks: AtomicUsize,
    /// The most sequences open at once.
    pub most_open: AtomicUsize,
    /// Rows of each `decode` call, in order.
    pub decode_rows: Mutex<Vec<usize>>,
}

/// A fake backend: after a sequence's prompt, the `n`-th forward call's
/// logits make `script[n]` the clear winner (then EOS once the script runs
/// out). Each forward call, and each `decode` step once, sleeps
/// `step_delay`. It samples on the host, as the CPU backend does. With
/// [`ScriptedBackend::with_slots`] it holds that many sequences, each
/// following the script.
pub struct ScriptedBackend {
    script: Vec<u32>,
    vocab_size: usize,
    step_delay: Duration,
    /// Forward call (0-based within a sequence) that fails, and how; fires once.
    fail_at: Option<(usize, fn() -> BackendError)>,
    /// Forward call that panics; fires once.
    panic_at: Option<usize>,
    memory: MemoryUse,
    device: DeviceInfo,
    /// What `prefill_chunk` answers (the trait's default when unset).
    prefill_chunk: Option<usize>,
    /// Whether `queues_decode` says yes once each row's sequence has
    /// decoded a step (as a GPU's captured decode graph does).
    queues: bool,
    seqs: Slots<ScriptSeq>,
    /// Open sequences `has_room` allows (none: any).
    room: Option<usize>,
    probe: Arc<ScriptProbe>,
    selector: Selector,
}

/// One sequence.
#[derive(Clone, Default)]
struct ScriptSeq {
    step: usize,
    len: usize,
    /// The latest forward call's logits.
    last_logits: Vec<f32>,
}

impl ScriptedBackend {
    pub fn new(script: Vec<u32>, vocab_size: usize) -> Self {
        ScriptedBackend {
            script,
            vocab_size,
            step_delay: Duration::ZERO,
            fail_at: None,
            panic_at: None,
            memory: MemoryUse::default(),
            prefill_chunk: None,
            queues: false,
            device: DeviceInfo {
                backend: BackendKind::Cpu,
                name: "scripted".into(),
                gpu_device: None,
                sm: None,
                cuda_runtime_version: None,
                total_memory_bytes: None,
            },
            seqs: Slots::new(vec![ScriptSeq::default()]),
            room: None,
            probe: Arc::new(ScriptProbe::default()),
            selector: Selector::default(),
        }
    }

    /// A script that spells `text` byte by byte (for [`byte_tokenizer`]).
    pub fn spelling(text: &str) -> Self {
        ScriptedBackend::new(text.bytes().map(u32::from).collect(), BYTE_VOCAB_SIZE)
    }

    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.step_delay = delay;
        self
    }

    pub fn failing_at(mut self, step: usize, err: fn() -> BackendError) -> Self {
        self.fail_at = Some((step, err));
        self
    }

    pub fn panicking_at(mut self, step: usize) -> Self {
        self.panic_at = Some(step);
        self
    }

    /// Poses as a `cuda` device whose weights are resident until the probe says otherwise.
    pub fn on_cuda(mut self) -> Self {
        self.device.backend = BackendKind::Cuda;
        self.device.gpu_device = Some(0);
        self.device.sm = Some("9.0".into());
        self.device.cuda_runtime_version = Some("13.0".into());
        self.probe.resident.store(true, Ordering::SeqCst);
        self
    }

    /// Queues decode steps (see the field `queues`).
    pub fn queuing(mut self, queues: bool) -> Self {
        self.queues = queues;
        self
    }

    pub fn with_prefill_chunk(mut self, tokens: usize) -> Self {
        self.prefill_chunk = Some(tokens);
        self
    }

    /// Has room for at most `n` open sequences (`has_room`).
    pub fn with_room(mut self, n: usize) -> Self {
        self.room = Some(n);
        self
    }

    /// Holds `n` sequences at once (what `set_max_sequences(n)` does).
    pub fn with_slots(mut self, n: usize) -> Self {
        self.seqs = Slots::new(vec![ScriptSeq::default(); n]);
        self
    }

    pub fn with_memory(mut self, memory: MemoryUse) -> Self {
        self.memory = memory;
        self
    }

    pub fn probe(&self) -> Arc<ScriptProbe> {
        self.probe.clone()
    }
}

impl ScriptedBackend {
    /// One forward call of `seq`, without the delay.
    fn step(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError> {
        let seq = self.seqs.get_mut(seq)?;
        self.probe.forward_calls.fetch_add(1, Ordering::SeqCst);
        self.probe.forward_sizes.lock().unwrap().push(tokens.len());
        if seq.step == 0 {
            self.probe.prompts.lock().unwrap().push(tokens.to_vec());
        }
        if let Some((at, err)) = self.fail_at {
            if at == seq.step {
                self.fail_at = None;
                return Err(err());
            }
        }
        if self.panic_at == Some(seq.step) {
            self.panic_at = None;
            panic!("scripted panic at step {}", seq.step);
        }
        let winner = self.script.get(seq.step).copied().unwrap_or(EOS_ID) as usize;
        seq.last_logits.clear();
        seq.last_logits.resize(self.vocab_size, 0.0);
        if winner < self.vocab_size {
            seq.last_logits[winner] = 20.0;
        }
        out.clear();
        if logits != Logits::None {
            out.extend_from_slice(&seq.last_logits);
        }
        if let Some(cp) = checkpoints {
            cp.record("inp_embd", &[seq.step as f32; 8]);
            cp.record("result_norm", &[1.0; 8]);
        }
        seq.len += tokens.len();
        seq.step += 1;
        Ok(())
    }
}

impl Backend for ScriptedBackend {
    fn device(&self) -> &DeviceInfo {
        &self.device
    }

    fn max_sequences(&self) -> usize {
        self.seqs.capacity()
    }

    fn open(&mut self, capacity: usize) -> Result<SeqId, BackendError> {
        if capacity == 0 {
            return Err(BackendError::CallerBug("empty sequence".into()));
        }
        let (id, seq) = self.seqs.open()?;
        *seq = ScriptSeq::default();
        let open = self.seqs.open_count();
        self.probe.most_open.fetch_max(open, Ordering::SeqCst);
        self.probe.sequences_begun.fetch_add(1, Ordering::SeqCst);
        Ok(id)
    }

    fn close(&mut self, seq: SeqId) {
        if self.seqs.close(seq).is_some() {
            self.probe.sequences_ended.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn len(&self, seq: SeqId) -> usize {
        self.seqs.get(seq).map_or(0, |s| s.len)
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk.unwrap_or(DEFAULT_PREFILL_CHUNK)
    }

    /// Queued once every row's sequence has decoded a step before (a GPU
    /// captures its decode graph at the first).
    fn queues_decode(&self, rows: &[(SeqId, u32)]) -> bool {
        self.queues
            && rows
                .iter()
                .all(|(id, _)| self.seqs.get(*id).is_ok_and(|s| s.step > 1))
    }

    fn forward(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError> {
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        self.step(seq, tokens, logits, out, checkpoints)
    }

    fn sample(
        &mut self,
        rows: &[(SeqId, SampleRequest<'_>)],
    ) -> Result<Vec<SampledToken>, BackendError> {
        sample_rows_on_host(&mut self.seqs, &mut self.selector, rows, |s| &s.last_logits)
    }

    fn has_room(&self, _capacity: usize) -> bool {
        self.room.is_none_or(|n| self.seqs.open_count() < n)
    }

    /// One sleep for the whole step, as a device that batches them.
    fn decode(&mut self, rows: &[(SeqId, u32)]) -> Result<(), BackendError> {
        self.probe.decode_rows.lock().unwrap().push(rows.len());
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        for &(seq, token) in rows {
            self.step(seq, &[token], Logits::None, &mut Vec::new(), None)?;
        }
        Ok(())
    }

    fn memory_use(&self) -> MemoryUse {
        self.memory
    }

    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            kv_type: KvType::F16,
            bytes_per_token: 0,
        }
    }

    fn check_residency(&self) -> Result<bool, BackendError> {
        self.probe.residency_checks.fetch_add(1, Ordering::SeqCst);
        Ok(self.device.backend == BackendKind::Cuda && self.probe.resident.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_distinct() {
        let set: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(set.len(), 256);
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'\n'), '\u{10A}');
    }
}

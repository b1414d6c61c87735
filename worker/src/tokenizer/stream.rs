//! Incremental detokenization for streaming: bytes of tokens go in, only whole
//! UTF-8 characters come out.

use super::Tokenizer;

/// Turns a job's generated token ids into text piece by piece. A character whose
/// bytes are spread over several tokens (emoji, CJK under byte-level BPE) is held
/// back until its last byte arrives; bytes that can never form a character come
/// out as U+FFFD, as a lossy decode of the whole text would give.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text completed by it (possibly "").
    /// An id outside the vocabulary adds nothing.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if let Some(bytes) = tok.token_bytes(id) {
            self.pending.extend_from_slice(bytes);
        }
        self.take_complete()
    }

    /// Flushes whatever is left (an unfinished character) lossily, as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: from_utf8 vouched for these bytes.
                    out.push_str(std::str::from_utf8(&self.pending[start..start + valid]).unwrap());
                    start += valid;
                    match e.error_len() {
                        // Broken sequence: it can never complete.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += bad;
                        }
                        // Unfinished character at the end: wait for more.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

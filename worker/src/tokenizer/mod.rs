//! Tokenizer and chat templates.
//!
//! A [`Tokenizer`] is chosen at load (M0-W-1360): built from a GGUF file's
//! `tokenizer.*` metadata (through a [`VocabSpec`]), or from a Hugging Face
//! `tokenizer.json` beside the model file. The GGUF kinds must give exactly the
//! token ids llama.cpp gives for the same file; `testdata/golden/` holds
//! llama.cpp's own output to prove it. All three kinds run on the `tokenizers`
//! crate, built without native code (M0-W-1365).
//!
//! * `gguf-bpe` (`tokenizer.ggml.model = "gpt2"`): GPT-2 style byte-level BPE. The
//!   merging runs in the `tokenizers` crate; around it this module follows
//!   llama.cpp's `llama-vocab.cpp`: the pre-tokenizer regexes picked by
//!   `tokenizer.ggml.pre` (`llm_tokenizer_bpe`), special tokens cut out of the text
//!   first (`tokenizer_st_partition`: control tokens only with `parse_special`,
//!   user-defined tokens always), BOS/EOS added per `add_bos`/`add_eos`, the
//!   end-of-generation set built from the EOS/EOT/EOM ids plus well-known
//!   end-of-turn token texts, and pieces rendered as `token_to_piece` does
//!   (byte-level tokens decoded to their bytes, special tokens as their text;
//!   no `clean_spaces` post-processing). A byte with no token of its own stops
//!   merging across it and is dropped, as in llama.cpp.
//!
//!   Proof: `tests/golden.rs` checks the 66 `testdata/golden/tokenize.json` vectors,
//!   the four chat prompts of `greedy.json` (rendering and ids), and ~950 more
//!   llama.cpp vectors (`testdata/llama_cpp_vectors.json` here) covering seven
//!   `tokenizer.ggml.pre` values.
//! * `gguf-spm` (`"llama"`, SentencePiece: `spm.rs`): merges derived from the
//!   pieces' scores, `▁` spaces, `<0xNN>` byte fallback; Gemma 3's 117 llama.cpp
//!   vectors in `tests/golden_gemma3.rs`.
//! * `hf-json` (`--tokenizer hf-json`, or a GGUF without a tokenizer: `hf.rs`):
//!   the file's own pipeline, with the same special-token partition, BOS/EOS
//!   from the GGUF when it names them (checked against the file), and pieces
//!   rendered through the file's decoder one token at a time. Proof:
//!   `tests/hf_json.rs` runs transformers' export of the reference model
//!   (`testdata/golden/tokenizer.json`) through the 66 golden vectors.
//!
//! [`StreamDecoder`] turns generated ids into text without ever splitting a UTF-8
//! character; [`ChatTemplate`] renders `tokenizer.chat_template` as Hugging Face
//! transformers does. Which generated tokens are reasoning: [`harmony`]
//! (gpt-oss's channels) and [`think`] (Qwen3's `<think>` blocks).
//!
//! The [`Tokenizer`] type itself is in `codec.rs`; the vocabulary's keys and
//! token attributes in `vocab.rs`.

mod bpe;
mod builtin_templates;
mod chat;
mod chat_json;
mod chat_message;
mod chat_tools;
mod codec;
mod error;
mod fragments;
pub mod harmony;
mod hf;
mod spm;
mod stream;
pub mod think;
mod vocab;

#[cfg(test)]
mod tests;

pub use builtin_templates::{builtin_template, builtin_template_names, BUILTIN_TEMPLATES};
pub use chat::{is_reserved_variable, ChatTemplate, TemplateInputs};
pub use chat_message::{ChatMessage, FunctionCall, ToolCall};
pub use chat_tools::{hermes_call, hermes_preamble, PROBE_TOOL};
pub use codec::{Tokenizer, TokenizerKind};
pub use error::TokenizerError;
pub use hf::FILE_NAME as HF_TOKENIZER_FILE;
pub use stream::StreamDecoder;
pub use vocab::{token_type, VocabSpec};

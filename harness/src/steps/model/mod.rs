//! The model's numbers against references: tokenizer goldens (`tokenize`),
//! llama.cpp's greedy goldens and CPU-vs-CUDA comparisons (`golden`), the
//! anti-cheat haiku (`haiku`) and parity logs (`parity`).

pub mod golden;
pub mod haiku;
pub mod parity;
pub mod tokenize;

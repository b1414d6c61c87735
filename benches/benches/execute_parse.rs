//! M0-W-1603: the cost of parsing and validating the largest valid `/execute`
//! body (a 32,768-character prompt, four stop strings, every optional field):
//!
//! - `execute_parse`: JSON parsing plus every field rule, the stop strings'
//!   token counts included (`validation::check_fields`), the budget's subject;
//! - `prompt_tokenize`: the rest of `validate`, tokenizing the prompt to check
//!   its length, reported beside it (it is the model's input processing and
//!   grows with the prompt).
//!
//! Run: `cargo bench -p worker-benches --bench execute_parse`
//! (`-- --output-format bencher` for the suite's step).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use worker_orcd::gguf::GgufFile;
use worker_orcd::server::validation::{
    check_fields, validate, ExecuteRequest, Limits, DEFAULT_MAX_PROMPT_CHARS,
};
use worker_orcd::tokenizer::Tokenizer;

fn largest_valid_body() -> Vec<u8> {
    // Plain prose, cut to exactly the character limit.
    let prose = "The quick brown fox jumps over the lazy dog while the engineers measure everything twice. ";
    let prompt: String = prose
        .chars()
        .cycle()
        .take(DEFAULT_MAX_PROMPT_CHARS)
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "job_id": "bench-execute-parse-0001",
        "prompt": prompt,
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 40,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "stop": ["\n\nUser:", "<|im_end|>", "The end.", "###"],
        "seed": 42,
        "logprobs": 5,
    }))
    .unwrap()
}

fn bench_execute_parse(c: &mut Criterion) {
    let file = GgufFile::open(&worker_benches::reference_model()).expect("reference model opens");
    let tokenizer = Tokenizer::from_gguf(&file.metadata).expect("tokenizer builds");
    let limits = Limits::new(8192, tokenizer.vocab_size(), 8192);
    let body = largest_valid_body();
    // The body must be valid, or the benchmark would time the refusal path.
    let req: ExecuteRequest = serde_json::from_slice(&body).unwrap();
    let valid = validate(req, &limits, &tokenizer, || 0).expect("the benchmark body is valid");
    eprintln!(
        "prompt: {} characters, {} tokens",
        valid.prompt_chars,
        valid.prompt_tokens.len()
    );

    let mut group = c.benchmark_group("server");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("execute_parse", |b| {
        b.iter(|| {
            let req: ExecuteRequest = serde_json::from_slice(std::hint::black_box(&body)).unwrap();
            check_fields(req, &limits, &tokenizer).unwrap()
        })
    });
    let checked =
        check_fields(serde_json::from_slice(&body).unwrap(), &limits, &tokenizer).unwrap();
    group.bench_function("prompt_tokenize", |b| {
        b.iter(|| checked.clone().tokenize(&limits, &tokenizer, || 0).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench_execute_parse);
criterion_main!(benches);

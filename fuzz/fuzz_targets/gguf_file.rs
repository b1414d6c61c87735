//! Any bytes as a GGUF file: the reader, then what loading reads from the
//! metadata before it sizes anything (the model's configuration and the
//! tokenizer). Each may refuse the file; none may panic, abort or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_orcd::gguf::GgufFile;
use worker_orcd::model::ModelConfig;
use worker_orcd::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for info in &file.tensors {
        // Every tensor's bytes are inside the file once the reader accepted it.
        let _ = file.tensor_data(info);
    }
    let _ = ModelConfig::try_from(&file.metadata);
    let _ = Tokenizer::from_gguf(&file.metadata);
});

//! The reference model's tokenizer, read once per fuzzing process: from
//! `WORKER_ORCD_REFERENCE_MODEL`, else the file `ci/fetch-model` fetches.

use std::path::PathBuf;
use std::sync::OnceLock;

use worker_orcd::gguf::GgufFile;
use worker_orcd::tokenizer::Tokenizer;

pub fn reference_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = std::env::var_os("WORKER_ORCD_REFERENCE_MODEL")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../.models/smollm2-135m-instruct-q4_1.gguf")
            });
        let file = GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run ci/fetch-model)", path.display()));
        Tokenizer::from_gguf(&file.metadata).expect("the reference tokenizer loads")
    })
}

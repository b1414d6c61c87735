//! The reference model, when present.

use super::*;

#[test]
fn reference_model_smollm2() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.models/smollm2-135m-instruct-q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "skipping: {} not present (CI fetches it first)",
            path.display()
        );
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    let m = &f.metadata;
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_u64("llama.context_length").unwrap(), 8192);
    assert_eq!(m.get_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(m.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    let file_type = m.get_u64("general.file_type").unwrap();
    assert_eq!(file_type, 3);
    assert_eq!(file_type_name(file_type as u32), Some("Q4_1"));

    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(f.tensor_data(embd).len() as u64, 576 * 49152 / 32 * 34);

    let count = |ty| f.tensors.iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(count(GgmlType::F32), 61);
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::Q8_0), 1);
    assert!(f.data_offset + f.tensor_bytes_total() <= f.file_size());
}

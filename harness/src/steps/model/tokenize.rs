//! `/tokenize` and `/detokenize` against the golden vectors (M0-W-1363, EXT-006).

use std::path::PathBuf;

use cucumber::then;
use serde::Deserialize;

use crate::check;
use crate::steps::params::{Code, Goldens};
use crate::steps::StepResult;
use crate::world::{read_json, TestWorld};

/// One entry of a golden `tokenize.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Vector {
    pub name: String,
    pub text: String,
    pub ids: Vec<i64>,
    pub parse_special: bool,
    /// Whether the ids were made with the vocabulary's BOS/EOS added
    /// (llama.cpp's `add_special`); the reference model's set never does.
    #[serde(default)]
    pub add_bos: bool,
}

pub fn vectors(path: &std::path::Path) -> anyhow::Result<Vec<Vector>> {
    Ok(serde_json::from_value(read_json(path)?)?)
}

fn golden_path(w: &TestWorld, rel: Option<&str>) -> PathBuf {
    match rel {
        Some(r) => w.cfg.workspace.join(r),
        None => w.cfg.golden_dir.join("tokenize.json"),
    }
}

async fn encode_all(w: &mut TestWorld, rel: Option<&str>) -> StepResult {
    let vs = vectors(&golden_path(w, rel))?;
    check!(!vs.is_empty(), "no golden vectors");
    let client = w.client()?;
    let mut bad = Vec::new();
    for v in &vs {
        match client.tokenize(&v.text, v.add_bos, v.parse_special).await {
            Ok(ids) if ids == v.ids => {}
            Ok(ids) => bad.push(format!(
                "{} (parse_special {}): got {ids:?}, want {:?}",
                v.name, v.parse_special, v.ids
            )),
            Err(e) => bad.push(format!(
                "{} (parse_special {}): {e:#}",
                v.name, v.parse_special
            )),
        }
    }
    check!(
        bad.is_empty(),
        "{} of {} vectors differ:\n{}",
        bad.len(),
        vs.len(),
        bad.join("\n")
    );
    Ok(())
}

async fn decode_all(w: &mut TestWorld, rel: Option<&str>) -> StepResult {
    let vs = vectors(&golden_path(w, rel))?;
    let client = w.client()?;
    let mut bad = Vec::new();
    for v in &vs {
        match client.detokenize(&v.ids).await {
            Ok(text) if text == v.text => {}
            Ok(text) => bad.push(format!("{}: got {text:?}, want {:?}", v.name, v.text)),
            Err(e) => bad.push(format!("{}: {e:#}", v.name)),
        }
    }
    check!(
        bad.is_empty(),
        "{} of {} vectors do not round-trip:\n{}",
        bad.len(),
        vs.len(),
        bad.join("\n")
    );
    Ok(())
}

#[then(expr = "every golden tokenizer vector{goldens} encodes to its ids through \\/tokenize")]
async fn encode(w: &mut TestWorld, goldens: Goldens) -> StepResult {
    encode_all(w, goldens.0.as_deref()).await
}

#[then(
    expr = "every golden tokenizer vector{goldens} decodes back to its text through \\/detokenize"
)]
async fn decode(w: &mut TestWorld, goldens: Goldens) -> StepResult {
    decode_all(w, goldens.0.as_deref()).await
}

#[then(expr = "job {string}'s joined text equals \\/detokenize of its token ids")]
async fn joined_equals_decode(w: &mut TestWorld, id: String) -> StepResult {
    let t = w.settle(&id).await?;
    let (ids, text) = (t.token_ids(), t.text());
    check!(!ids.is_empty(), "job {id} streamed no tokens");
    let whole = w.client()?.detokenize(&ids).await?;
    check!(
        whole == text,
        "streamed text {text:?} != one-shot decode {whole:?}"
    );
    Ok(())
}

#[then(expr = "\\/tokenize with an empty body is refused with 400 {code}")]
async fn tokenize_invalid(w: &mut TestWorld, code: Code) -> StepResult {
    let r = w
        .client()?
        .raw(
            reqwest::Method::POST,
            "/tokenize",
            Some("application/json"),
            b"{}".to_vec(),
            &[],
        )
        .await?;
    check!(
        r.status == 400,
        "/tokenize {{}} answered {} {}",
        r.status,
        r.body
    );
    let v = r.json()?;
    check!(
        v.get("code").and_then(serde_json::Value::as_str) == Some(code.0.as_str()),
        "body {}",
        r.body
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reference_goldens_have_66_vectors() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/golden/tokenize.json");
        let v = super::vectors(&p).unwrap();
        assert_eq!(v.len(), 66);
        assert_eq!(v.iter().filter(|x| x.parse_special).count(), 33);
    }
}

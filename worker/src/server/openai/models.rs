//! `GET /v1/models`: the one served model. Its id is the model file's name
//! without `.gguf`; requests may name it by that id, by the file as given at
//! start (`--model`) or by the GGUF's `general.name`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::Json;

use super::types::{Model, ModelList};
use crate::server::AppState;

/// `owned_by` of the served model.
pub const OWNED_BY: &str = "worker-orcd";

/// The served model's id: the file name without its `.gguf` extension.
pub fn model_id(model_ref: &str) -> String {
    let name = model_ref.rsplit(['/', '\\']).next().unwrap_or(model_ref);
    name.strip_suffix(".gguf").unwrap_or(name).to_string()
}

/// Every name a request's `model` may use; the id first.
pub fn served_names(state: &AppState) -> Vec<String> {
    let model = &state.model;
    vec![
        model_id(&model.model_ref),
        model.model_ref.clone(),
        model.info.name.clone(),
    ]
}

/// Seconds since the Unix epoch, `ago` before now.
pub fn unix_seconds(ago: Duration) -> u64 {
    SystemTime::now()
        .checked_sub(ago)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Lists the served model.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    responses((status = 200, description = "The served model", body = ModelList))
)]
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![Model {
            id: model_id(&state.model.model_ref),
            object: "model".into(),
            created: unix_seconds(state.started.elapsed()),
            owned_by: OWNED_BY.into(),
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_the_file_name_without_gguf() {
        assert_eq!(
            model_id("/m/.models/smollm2-135m-instruct-q4_1.gguf"),
            "smollm2-135m-instruct-q4_1"
        );
        assert_eq!(model_id("llama.bin"), "llama.bin");
        assert_eq!(model_id(r"C:\m\x.gguf"), "x");
    }
}

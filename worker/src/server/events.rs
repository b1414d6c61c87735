//! The wire format of a job's stream (M0-W-1310, M0-W-1312): each engine
//! event becomes one SSE `event:` name and one line of JSON `data:`.
//!
//! | event | data |
//! |---|---|
//! | `started` | [`StartedEvent`] |
//! | `token` | [`TokenEvent`] |
//! | `end` | [`EndEvent`] |
//! | `error` | [`ErrorBody`], the same JSON as a non-stream error answer |

use serde::Serialize;

use crate::engine::generate::{GenerationSummary, StopReason};
use crate::engine::job::{JobEvent, JobStarted, TokenAlternative, TokenOut};
use crate::engine::JobError;

/// `started`: sent when the job is accepted, before it is queued.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StartedEvent {
    pub job_id: String,
    pub model: String,
    /// RFC 3339 acceptance time, in milliseconds.
    pub started_at: String,
    pub seed: u64,
}

impl From<&JobStarted> for StartedEvent {
    fn from(s: &JobStarted) -> Self {
        StartedEvent {
            job_id: s.job_id.clone(),
            model: s.model.clone(),
            started_at: s
                .started_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            seed: s.seed,
        }
    }
}

/// One entry of a token's `logprobs` list.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LogprobEntry {
    pub id: u32,
    pub t: String,
    pub logprob: f32,
}

impl From<&TokenAlternative> for LogprobEntry {
    fn from(a: &TokenAlternative) -> Self {
        LogprobEntry {
            id: a.id,
            t: a.text.clone(),
            logprob: a.logprob,
        }
    }
}

/// `token`: one generated token and the text released with it.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct TokenEvent {
    pub t: String,
    pub i: usize,
    pub id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<LogprobEntry>>,
    /// gpt-oss (harmony): the channel of the message the token is text of,
    /// `analysis` (reasoning), `final` (the answer) or `commentary` (tool
    /// calls); absent for structure tokens. Qwen3 and other models that
    /// reason between `<think>` and `</think>` tokens: `analysis` for the
    /// tokens of a think block, absent for the markers and the answer.
    /// Absent for every other model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

impl From<&TokenOut> for TokenEvent {
    fn from(t: &TokenOut) -> Self {
        TokenEvent {
            t: t.text.clone(),
            i: t.index,
            id: t.id,
            logprobs: t
                .logprobs
                .as_ref()
                .map(|list| list.iter().map(LogprobEntry::from).collect()),
            channel: t.channel.as_deref().map(str::to_string),
        }
    }
}

/// `end`: the job finished normally.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EndEvent {
    pub tokens_out: usize,
    /// Prompt tokens whose KV came from the prefix cache (issue 42).
    pub tokens_cached: usize,
    pub decode_time_ms: u64,
    pub first_token_ms: u64,
    pub stop_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
}

impl From<&GenerationSummary> for EndEvent {
    fn from(s: &GenerationSummary) -> Self {
        EndEvent {
            tokens_out: s.tokens_out,
            tokens_cached: s.tokens_cached,
            decode_time_ms: s.decode_time_ms,
            first_token_ms: s.first_token_ms,
            stop_reason: s.stop_reason.as_str(),
            stop_sequence: match &s.stop_reason {
                StopReason::StopSequence(stop) => Some(stop.clone()),
                _ => None,
            },
        }
    }
}

/// `{code, message, retriable}`: the body of every error answer and the
/// data of the SSE `error` event.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ErrorBody<'a> {
    pub code: &'static str,
    pub message: &'a str,
    pub retriable: bool,
}

impl<'a> From<&'a JobError> for ErrorBody<'a> {
    fn from(e: &'a JobError) -> Self {
        ErrorBody {
            code: e.code.as_str(),
            message: &e.message,
            retriable: e.retriable,
        }
    }
}

/// The SSE `event:` name.
pub fn event_name(event: &JobEvent) -> &'static str {
    match event {
        JobEvent::Started(_) => "started",
        JobEvent::Token(_) => "token",
        JobEvent::End(_) => "end",
        JobEvent::Error(_) => "error",
    }
}

/// The SSE `data:` line: one line of JSON.
pub fn event_data(event: &JobEvent) -> String {
    let json = match event {
        JobEvent::Started(e) => serde_json::to_string(&StartedEvent::from(e)),
        JobEvent::Token(e) => serde_json::to_string(&TokenEvent::from(e)),
        JobEvent::End(e) => serde_json::to_string(&EndEvent::from(e)),
        JobEvent::Error(e) => serde_json::to_string(&ErrorBody::from(e)),
    };
    json.expect("event payloads serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_event_json_has_short_keys_and_omits_absent_logprobs() {
        let mut t = TokenOut {
            text: "hi".into(),
            index: 0,
            id: 7,
            logprobs: None,
            channel: None,
        };
        let e = JobEvent::Token(t.clone());
        assert_eq!(event_name(&e), "token");
        assert_eq!(event_data(&e), r#"{"t":"hi","i":0,"id":7}"#);
        // gpt-oss: the harmony channel, after the token's own fields.
        t.channel = Some("final".into());
        assert_eq!(
            event_data(&JobEvent::Token(t)),
            r#"{"t":"hi","i":0,"id":7,"channel":"final"}"#
        );
    }

    #[test]
    fn end_event_carries_stop_sequence_only_when_matched() {
        let mut s = GenerationSummary {
            tokens_in: 3,
            tokens_cached: 0,
            tokens_out: 2,
            first_token_ms: 5,
            decode_time_ms: 9,
            stop_reason: StopReason::MaxTokens,
        };
        let e = JobEvent::End(s.clone());
        assert_eq!(
            event_data(&e),
            r#"{"tokens_out":2,"tokens_cached":0,"decode_time_ms":9,"first_token_ms":5,"stop_reason":"max_tokens"}"#
        );
        s.stop_reason = StopReason::StopSequence("\n\n".into());
        let v: serde_json::Value = serde_json::from_str(&event_data(&JobEvent::End(s))).unwrap();
        assert_eq!(v["stop_reason"], "stop_sequence");
        assert_eq!(v["stop_sequence"], "\n\n");
    }

    #[test]
    fn error_json_has_three_fields() {
        let e = JobEvent::Error(JobError::queue_full(8));
        let v: serde_json::Value = serde_json::from_str(&event_data(&e)).unwrap();
        assert_eq!(v["code"], "QUEUE_FULL");
        assert_eq!(v["retriable"], true);
        assert!(v["message"].as_str().unwrap().contains("full"));
        assert_eq!(v.as_object().unwrap().len(), 3);
    }

    #[test]
    fn started_and_logprobs_keep_their_shapes() {
        let started = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678901Z").unwrap();
        let started = started.with_timezone(&chrono::Utc);
        let e = JobEvent::Started(JobStarted {
            job_id: "j".into(),
            model: "m".into(),
            started_at: started,
            seed: 9,
        });
        assert_eq!(event_name(&e), "started");
        assert_eq!(
            event_data(&e),
            r#"{"job_id":"j","model":"m","started_at":"2026-01-02T03:04:05.678Z","seed":9}"#
        );
        let alt = TokenAlternative {
            id: 3,
            text: "a".into(),
            logprob: -0.5,
        };
        let e = JobEvent::Token(TokenOut {
            text: "a".into(),
            index: 1,
            id: 3,
            logprobs: Some(vec![alt]),
            channel: None,
        });
        assert_eq!(
            event_data(&e),
            r#"{"t":"a","i":1,"id":3,"logprobs":[{"id":3,"t":"a","logprob":-0.5}]}"#
        );
    }
}

//! The one typed HTTP/SSE client for worker-orcd's API (REQUIREMENTS.md sections 7 and 16).
//!
//! Every SSE event is recorded with its arrival time, measured from the moment the
//! request was sent, together with the raw bytes of the stream so framing can be
//! checked frame by frame (M0-W-1310). The conformance steps and the benches use it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Context, Result};
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::Value;

/// How long a plain call ([`Client::raw`], [`Client::post_json`]) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One SSE event as received.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// The `event:` field (`started`, `token`, `metrics`, `end`, `error`).
    pub kind: String,
    /// The `data:` line parsed as JSON; `Value::Null` when it did not parse.
    pub data: Value,
    /// The `data:` line as sent.
    pub raw_data: String,
    /// Arrival time since the request was sent.
    #[serde(serialize_with = "ser_ms")]
    pub at: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// A plain (non-stream) HTTP reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub elapsed: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("reply {} is not JSON: {:?}", self.status, self.body))
    }
}

/// A finished (or abandoned) job's stream: every event with its arrival time.
#[derive(Debug, Clone, Serialize)]
pub struct Transcript {
    pub job_id: String,
    pub status: u16,
    pub content_type: String,
    /// Wall-clock time the request was sent (RFC 3339).
    pub sent_at: String,
    /// Monotonic time the request was sent; `Event::at` counts from it.
    #[serde(skip)]
    pub sent: Instant,
    pub events: Vec<Event>,
    /// The raw bytes of the stream, lossily decoded (for framing checks).
    #[serde(skip)]
    pub raw: Vec<u8>,
    /// True when the server closed the stream (as opposed to us dropping it or a timeout).
    pub closed: bool,
    /// A transport or parse error that ended the stream early.
    pub transport_error: Option<String>,
}

impl Transcript {
    pub fn tokens(&self) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(|e| e.kind == "token")
    }

    pub fn token_ids(&self) -> Vec<i64> {
        self.tokens()
            .filter_map(|e| e.data.get("id").and_then(Value::as_i64))
            .collect()
    }

    pub fn text(&self) -> String {
        self.tokens()
            .filter_map(|e| e.data.get("t").and_then(Value::as_str))
            .collect()
    }

    /// The monotonic instant an event arrived (comparable across jobs).
    pub fn arrival(&self, e: &Event) -> Instant {
        self.sent + e.at
    }

    pub fn first(&self, kind: &str) -> Option<&Event> {
        self.events.iter().find(|e| e.kind == kind)
    }

    /// The terminal event (`end` or `error`), if the stream carried one.
    pub fn terminal(&self) -> Option<&Event> {
        self.events
            .iter()
            .find(|e| e.kind == "end" || e.kind == "error")
    }

    pub fn error_code(&self) -> Option<&str> {
        self.first("error")
            .and_then(|e| e.data.get("code"))
            .and_then(Value::as_str)
    }
}

/// A job whose stream is read in a background task; its events can be watched live.
pub struct LiveJob {
    pub job_id: String,
    events: Arc<Mutex<Vec<Event>>>,
    handle: tokio::task::JoinHandle<Result<Transcript>>,
    sent: Instant,
}

impl std::fmt::Debug for LiveJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveJob")
            .field("job_id", &self.job_id)
            .finish()
    }
}

impl LiveJob {
    /// A snapshot of the events received so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    pub fn sent_at(&self) -> Instant {
        self.sent
    }

    /// Waits until `pred` holds for the events so far; errors after `timeout`.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&[Event]) -> bool,
    ) -> Result<Vec<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let ev = self.events.lock().unwrap();
                if pred(&ev) {
                    return Ok(ev.clone());
                }
            }
            if self.handle.is_finished() {
                let ev = self.events();
                return if pred(&ev) {
                    Ok(ev)
                } else {
                    Err(anyhow!(
                        "job {} ended before the awaited condition; events: {}",
                        self.job_id,
                        kinds(&ev)
                    ))
                };
            }
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "job {}: condition not met within {:?}; events: {}",
                    self.job_id,
                    timeout,
                    kinds(&self.events())
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    pub async fn wait_tokens(&self, n: usize, timeout: Duration) -> Result<Vec<Event>> {
        self.wait_until(timeout, |ev| {
            ev.iter().filter(|e| e.kind == "token").count() >= n
        })
        .await
    }

    /// Waits for the stream to end by itself.
    pub async fn finish(self, timeout: Duration) -> Result<Transcript> {
        let id = self.job_id.clone();
        match tokio::time::timeout(timeout, self.handle).await {
            Ok(joined) => joined.map_err(|e| anyhow!("reader task of {id} failed: {e}"))?,
            Err(_) => Err(anyhow!("job {id} did not end within {timeout:?}")),
        }
    }

    /// Drops the connection (a client disconnect) and returns what had arrived.
    pub fn disconnect(self) -> Vec<Event> {
        self.handle.abort();
        self.events()
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

fn kinds(ev: &[Event]) -> String {
    let names: Vec<&str> = ev.iter().map(|e| e.kind.as_str()).collect();
    format!("[{}]", names.join(","))
}

/// The outcome of `POST /execute`: a stream, or a plain reply (a refusal).
#[derive(Debug)]
pub enum Execute {
    Stream(LiveJob),
    Refused(Reply),
}

impl Execute {
    pub fn into_stream(self) -> Result<LiveJob> {
        match self {
            Execute::Stream(j) => Ok(j),
            Execute::Refused(r) => Err(anyhow!("/execute refused: {} {}", r.status, r.body)),
        }
    }
}

type ByteStream = std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Typed client of one worker.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    pub fn new(host: &str, port: u16) -> Self {
        Self::with_base(format!("http://{host}:{port}"))
    }

    pub fn with_base(base: String) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("reqwest client");
        Self { base, http }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Any request with a raw body; used for the endpoints' JSON calls and for hostile bodies.
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<Reply> {
        let req = self.http.request(method, format!("{}{}", self.base, path));
        self.send(req, content_type, body, headers, REQUEST_TIMEOUT)
            .await
            .with_context(|| format!("request to {path}"))
    }

    /// A JSON POST given up after `timeout` (a whole generation, where
    /// [`Client::post_json`] allows a short call's [`REQUEST_TIMEOUT`]).
    pub async fn post_json_within(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Reply> {
        let req = self.http.post(format!("{}{}", self.base, path));
        let body = serde_json::to_vec(body)?;
        self.send(req, Some("application/json"), body, &[], timeout)
            .await
            .with_context(|| format!("request to {path}"))
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        content_type: Option<&str>,
        body: Vec<u8>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Reply> {
        let sent = Instant::now();
        let mut req = req.timeout(timeout);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.body(body).send().await?;
        let status = resp.status().as_u16();
        let headers = header_pairs(resp.headers());
        let body = resp.text().await.unwrap_or_default();
        Ok(Reply {
            status,
            headers,
            body,
            elapsed: sent.elapsed(),
        })
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Reply> {
        self.raw(
            reqwest::Method::POST,
            path,
            Some("application/json"),
            serde_json::to_vec(body)?,
            &[],
        )
        .await
    }

    pub async fn get(&self, path: &str) -> Result<Reply> {
        self.raw(reqwest::Method::GET, path, None, Vec::new(), &[])
            .await
    }

    pub async fn health(&self) -> Result<Value> {
        let r = self.get("/health").await?;
        if r.status != 200 {
            return Err(anyhow!("/health answered {}: {}", r.status, r.body));
        }
        r.json()
    }

    pub async fn cancel(&self, job_id: &str) -> Result<Reply> {
        self.post_json("/cancel", &serde_json::json!({ "job_id": job_id }))
            .await
    }

    pub async fn shutdown(&self) -> Result<Reply> {
        self.post_json("/shutdown", &serde_json::json!({})).await
    }

    pub async fn metrics(&self) -> Result<String> {
        let r = self.get("/metrics").await?;
        if r.status != 200 {
            return Err(anyhow!("/metrics answered {}", r.status));
        }
        Ok(r.body)
    }

    /// The id `GET /v1/models` lists first: the model OpenAI requests must name.
    pub async fn served_model(&self) -> Result<String> {
        let models = self.get("/v1/models").await?.json()?;
        models["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("GET /v1/models lists no model: {models}"))
    }

    pub async fn tokenize(
        &self,
        content: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<i64>> {
        let body = serde_json::json!({ "content": content, "add_special": add_special, "parse_special": parse_special });
        let r = self.post_json("/tokenize", &body).await?;
        let v = r.json()?;
        v.get("tokens")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .ok_or_else(|| anyhow!("/tokenize answered {} without tokens: {}", r.status, r.body))
    }

    pub async fn detokenize(&self, tokens: &[i64]) -> Result<String> {
        let r = self
            .post_json("/detokenize", &serde_json::json!({ "tokens": tokens }))
            .await?;
        let v = r.json()?;
        v.get("content")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                anyhow!(
                    "/detokenize answered {} without content: {}",
                    r.status,
                    r.body
                )
            })
    }

    /// `POST /execute`; a 200 event stream is read in a background task.
    pub async fn execute(&self, body: &Value) -> Result<Execute> {
        self.execute_with_headers(body, &[]).await
    }

    pub async fn execute_with_headers(
        &self,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Result<Execute> {
        let job_id = body
            .get("job_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let sent = Instant::now();
        let sent_at = chrono::DateTime::<chrono::Utc>::from(SystemTime::now()).to_rfc3339();
        let mut req = self.http.post(format!("{}/execute", self.base)).json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.context("POST /execute")?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if status != 200 || !content_type.starts_with("text/event-stream") {
            let headers = header_pairs(resp.headers());
            let body = resp.text().await.unwrap_or_default();
            return Ok(Execute::Refused(Reply {
                status,
                headers,
                body,
                elapsed: sent.elapsed(),
            }));
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        let raw = Arc::new(Mutex::new(Vec::new()));
        let raw_tap = raw.clone();
        let bytes: ByteStream = Box::pin(resp.bytes_stream().inspect(move |chunk| {
            if let Ok(b) = chunk {
                raw_tap.lock().unwrap().extend_from_slice(b);
            }
        }));
        let sink = events.clone();
        let id = job_id.clone();
        let handle = tokio::spawn(async move {
            let mut stream = bytes.eventsource();
            let mut closed = true;
            let mut transport_error = None;
            while let Some(item) = stream.next().await {
                match item {
                    Ok(ev) => {
                        let at = sent.elapsed();
                        let data = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
                        sink.lock().unwrap().push(Event {
                            kind: ev.event,
                            data,
                            raw_data: ev.data,
                            at,
                        });
                    }
                    Err(e) => {
                        closed = false;
                        transport_error = Some(e.to_string());
                        break;
                    }
                }
            }
            let events = sink.lock().unwrap().clone();
            let raw = raw.lock().unwrap().clone();
            Ok(Transcript {
                job_id: id,
                status,
                content_type,
                sent_at,
                sent,
                events,
                raw,
                closed,
                transport_error,
            })
        });
        Ok(Execute::Stream(LiveJob {
            job_id,
            events,
            handle,
            sent,
        }))
    }

    /// Runs one job to its end.
    pub async fn run(&self, body: &Value, timeout: Duration) -> Result<Transcript> {
        self.execute(body)
            .await?
            .into_stream()?
            .finish(timeout)
            .await
    }
}

fn header_pairs(h: &reqwest::header::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect()
}

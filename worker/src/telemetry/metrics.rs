//! The worker's Prometheus metrics (M0-W-1350), exposed by `GET /metrics` in
//! OpenMetrics text format.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `worker_info{model,quant_kind,backend,architecture,tokenizer_kind}` | gauge | always 1; carries the labels |
//! | `worker_requests_total{outcome}` | counter | `/execute` requests by how they ended: completed, cancelled, disconnected, timeout, error, invalid, rejected |
//! | `worker_jobs_accepted_total` | counter | jobs accepted into the queue (their stream opened with `started`) |
//! | `worker_jobs_ended_total` | counter | accepted jobs that got their terminal event; equals accepted once idle |
//! | `worker_tokens_generated_total` | counter | tokens streamed |
//! | `worker_inference_duration_ms` | histogram | run time of jobs that ran (queue wait excluded) |
//! | `worker_first_token_ms` | histogram | job start to first token |
//! | `worker_inter_token_ms` | histogram | gap between consecutive tokens |
//! | `worker_vram_bytes` | gauge | device bytes held (0 on cpu) |
//! | `worker_uptime_seconds` | gauge | seconds since start |
//! | `worker_queue_depth` | gauge | jobs waiting |
//! | `worker_busy` | gauge | 1 while a job runs |
//! | `worker_slots` | gauge | jobs that may run at once (`--parallel`) |
//! | `worker_running_jobs` | gauge | jobs running now (at most `worker_slots`) |
//! | `worker_batch_rows` | histogram | jobs decoded together in one step (`--parallel` > 1) |
//! | `worker_kv_cache_bytes` | gauge | device bytes of the open sequences' KV caches (0 on cpu) |
//! | `worker_kv_blocks_total` | gauge | blocks of the paged KV pool (`--parallel` > 1 on the GPU; 0 without a pool) |
//! | `worker_kv_blocks_used` | gauge | blocks of the pool held by open sequences |
//! | `worker_kv_blocks_free` | gauge | blocks of the pool free for new jobs |
//! | `worker_prefix_cache_hit_tokens_total` | counter | prompt tokens whose KV came from the prefix cache |
//! | `worker_prefix_cache_miss_tokens_total` | counter | prompt tokens computed (not found in the prefix cache, or the cache off) |
//! | `worker_prefix_cache_entries` | gauge | entries (whole prompt chunks) the prefix cache holds |
//! | `worker_prefix_cache_bytes` | gauge | bytes they take: KV (on the GPU, blocks of the paged KV pool) and prompts' last logits (host) |
//! | `worker_prefix_cache_evictions_total` | counter | entries evicted from the prefix cache |
//! | `worker_parity_records_dropped_total` | counter | parity records dropped because the writer was behind |
//! | `worker_active_expert_count` | gauge | mixture-of-experts models (gpt-oss) only: experts each token is routed to in every layer (`expert_used_count`) |
//! | `worker_expert_count` | gauge | mixture-of-experts models only: experts in every layer (`expert_count`) |

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The content type of the `/metrics` answer.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InfoLabels {
    pub model: String,
    pub quant_kind: String,
    pub backend: String,
    pub architecture: String,
    pub tokenizer_kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// A mixture-of-experts model's experts per layer and per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    pub active: usize,
}

/// Values read at scrape time from cached state.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub vram_bytes: u64,
    pub queue_depth: usize,
    pub busy: bool,
    /// Jobs running now.
    pub running: usize,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<OutcomeLabels, Counter>,
    jobs_accepted: Counter,
    jobs_ended: Counter,
    tokens: Counter,
    inference_ms: Histogram,
    first_token_ms: Histogram,
    inter_token_ms: Histogram,
    vram_bytes: Gauge,
    uptime_s: Gauge<f64, AtomicU64>,
    queue_depth: Gauge,
    busy: Gauge,
    slots: Gauge,
    running_jobs: Gauge,
    batch_rows: Histogram,
    kv_cache_bytes: Gauge,
    kv_blocks_total: Gauge,
    kv_blocks_used: Gauge,
    kv_blocks_free: Gauge,
    parity_dropped: Counter,
    prefix: PrefixMetrics,
    started: Instant,
}

/// The prefix cache's series (issue 42).
#[derive(Default)]
struct PrefixMetrics {
    hit_tokens: Counter,
    miss_tokens: Counter,
    entries: Gauge,
    bytes: Gauge,
    evictions: Counter,
}

impl PrefixMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "worker_prefix_cache_hit_tokens",
            "Prompt tokens whose KV came from the prefix cache",
            self.hit_tokens.clone(),
        );
        registry.register(
            "worker_prefix_cache_miss_tokens",
            "Prompt tokens computed (not in the prefix cache)",
            self.miss_tokens.clone(),
        );
        registry.register(
            "worker_prefix_cache_entries",
            "Entries (whole prompt chunks) in the prefix cache",
            self.entries.clone(),
        );
        registry.register(
            "worker_prefix_cache_bytes",
            "Bytes the prefix cache's entries take",
            self.bytes.clone(),
        );
        registry.register(
            "worker_prefix_cache_evictions",
            "Entries evicted from the prefix cache",
            self.evictions.clone(),
        );
    }
}

impl Metrics {
    /// The registry for a model described by `info`, with the expert gauges
    /// where it has `experts`.
    pub fn new(info: InfoLabels, experts: Option<Experts>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<OutcomeLabels, Counter>::default();
        let jobs_accepted = Counter::default();
        let jobs_ended = Counter::default();
        let tokens = Counter::default();
        let inference_ms = Histogram::new(exponential_buckets(10.0, 2.0, 16));
        let first_token_ms = Histogram::new(exponential_buckets(1.0, 2.0, 15));
        let inter_token_ms = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        let vram_bytes = Gauge::default();
        let uptime_s = Gauge::<f64, AtomicU64>::default();
        let queue_depth = Gauge::default();
        let busy = Gauge::default();
        let slots = Gauge::default();
        slots.set(1);
        let running_jobs = Gauge::default();
        let batch_rows = Histogram::new(exponential_buckets(1.0, 2.0, 9));
        let kv_cache_bytes = Gauge::default();
        let kv_blocks_total = Gauge::default();
        let kv_blocks_used = Gauge::default();
        let kv_blocks_free = Gauge::default();
        let parity_dropped = Counter::default();
        let prefix = PrefixMetrics::default();
        prefix.register(&mut registry);
        let info_family = Family::<InfoLabels, Gauge>::default();
        info_family.get_or_create(&info).set(1);

        registry.register(
            "worker_info",
            "The served model and backend (always 1)",
            info_family,
        );
        registry.register(
            "worker_requests",
            "Execute requests by outcome",
            requests.clone(),
        );
        // Accepted and ended jobs, apart from refusals: a load test checks
        // that every accepted job ended (accepted == ended once idle).
        registry.register(
            "worker_jobs_accepted",
            "Jobs accepted into the queue",
            jobs_accepted.clone(),
        );
        registry.register(
            "worker_jobs_ended",
            "Accepted jobs that got their terminal event",
            jobs_ended.clone(),
        );
        registry.register(
            "worker_tokens_generated",
            "Tokens streamed to clients",
            tokens.clone(),
        );
        registry.register(
            "worker_inference_duration_ms",
            "Run time of each job that ran, in milliseconds",
            inference_ms.clone(),
        );
        registry.register(
            "worker_first_token_ms",
            "Job start to first token, in milliseconds",
            first_token_ms.clone(),
        );
        registry.register(
            "worker_inter_token_ms",
            "Gap between consecutive tokens, in milliseconds",
            inter_token_ms.clone(),
        );
        registry.register(
            "worker_vram_bytes",
            "Device memory held, in bytes (0 on cpu)",
            vram_bytes.clone(),
        );
        registry.register(
            "worker_uptime_seconds",
            "Seconds since the worker started",
            uptime_s.clone(),
        );
        registry.register(
            "worker_queue_depth",
            "Jobs waiting in the queue",
            queue_depth.clone(),
        );
        registry.register("worker_busy", "1 while a job runs", busy.clone());
        registry.register(
            "worker_slots",
            "Jobs that may run at once (--parallel)",
            slots.clone(),
        );
        registry.register(
            "worker_running_jobs",
            "Jobs running now",
            running_jobs.clone(),
        );
        registry.register(
            "worker_batch_rows",
            "Jobs decoded together in one step",
            batch_rows.clone(),
        );
        registry.register(
            "worker_kv_cache_bytes",
            "Device bytes of the open sequences' KV caches",
            kv_cache_bytes.clone(),
        );
        registry.register(
            "worker_kv_blocks_total",
            "Blocks of the paged KV pool (0 without one)",
            kv_blocks_total.clone(),
        );
        registry.register(
            "worker_kv_blocks_used",
            "Blocks of the paged KV pool held by open sequences",
            kv_blocks_used.clone(),
        );
        registry.register(
            "worker_kv_blocks_free",
            "Blocks of the paged KV pool free for new jobs",
            kv_blocks_free.clone(),
        );
        registry.register(
            "worker_parity_records_dropped",
            "Parity log records dropped because the writer was behind",
            parity_dropped.clone(),
        );
        if let Some(e) = experts {
            let gauge = |v: usize| {
                let g = Gauge::<i64>::default();
                g.set(i64::try_from(v).unwrap_or(i64::MAX));
                g
            };
            registry.register(
                "worker_active_expert_count",
                "Experts each token is routed to in every layer (mixture of experts)",
                gauge(e.active),
            );
            registry.register(
                "worker_expert_count",
                "Experts in every layer (mixture of experts)",
                gauge(e.count),
            );
        }
        Metrics {
            registry,
            requests,
            jobs_accepted,
            jobs_ended,
            tokens,
            inference_ms,
            first_token_ms,
            inter_token_ms,
            vram_bytes,
            uptime_s,
            queue_depth,
            busy,
            slots,
            running_jobs,
            batch_rows,
            kv_cache_bytes,
            kv_blocks_total,
            kv_blocks_used,
            kv_blocks_free,
            parity_dropped,
            prefix,
            started: Instant::now(),
        }
    }

    /// Metrics with empty info labels, for tests.
    pub fn new_for_tests() -> Self {
        Metrics::new(InfoLabels::default(), None)
    }

    /// Creates the series of each outcome label at 0, so that every one
    /// shows from the first scrape. The engine's ledger names them.
    pub fn declare_request_outcomes(&self, outcomes: &[&str]) {
        for outcome in outcomes {
            let _ = self.request_counter(outcome);
        }
    }

    /// A request ended with `outcome` (a label of the engine's `Outcome`;
    /// its ledger is the only caller).
    pub fn request_finished(&self, outcome: &str) {
        self.request_counter(outcome).inc();
    }

    /// Requests counted with `outcome` so far.
    pub fn requests(&self, outcome: &str) -> u64 {
        self.request_counter(outcome).get()
    }

    fn request_counter(&self, outcome: &str) -> Counter {
        self.requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .clone()
    }

    /// A job was accepted into the queue.
    pub fn job_accepted(&self) {
        self.jobs_accepted.inc();
    }

    /// An accepted job got its terminal event.
    pub fn job_ended(&self) {
        self.jobs_ended.inc();
    }

    /// `(accepted, ended)` jobs so far.
    pub fn jobs(&self) -> (u64, u64) {
        (self.jobs_accepted.get(), self.jobs_ended.get())
    }

    pub fn token_generated(&self) {
        self.tokens.inc();
    }

    pub fn tokens_generated(&self) -> u64 {
        self.tokens.get()
    }

    pub fn observe_inference_ms(&self, ms: f64) {
        self.inference_ms.observe(ms);
    }

    pub fn observe_first_token_ms(&self, ms: f64) {
        self.first_token_ms.observe(ms);
    }

    pub fn observe_inter_token_ms(&self, ms: f64) {
        self.inter_token_ms.observe(ms);
    }

    /// The counter the parity writer's sender increments.
    /// Jobs that may run at once, set once the engine starts.
    pub fn set_slots(&self, n: usize) {
        self.slots.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One batched decode step of `rows` jobs.
    pub fn observe_batch_rows(&self, rows: usize) {
        self.batch_rows.observe(rows as f64);
    }

    pub fn set_kv_cache_bytes(&self, bytes: u64) {
        self.kv_cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The paged KV pool's blocks: all, held, free.
    pub fn set_kv_blocks(&self, total: usize, used: usize) {
        let g = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.kv_blocks_total.set(g(total));
        self.kv_blocks_used.set(g(used));
        self.kv_blocks_free.set(g(total.saturating_sub(used)));
    }

    /// A job's prompt began with `cached` tokens from the prefix cache and
    /// `computed` to prefill.
    pub fn prompt_tokens(&self, cached: usize, computed: usize) {
        self.prefix.hit_tokens.inc_by(cached as u64);
        self.prefix.miss_tokens.inc_by(computed as u64);
    }

    /// The prefix cache's entries, bytes and evictions since start.
    pub fn set_prefix_cache(&self, entries: usize, bytes: u64, evictions: u64) {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.prefix.entries.set(g(entries as u64));
        self.prefix.bytes.set(g(bytes));
        let seen = self.prefix.evictions.get();
        self.prefix.evictions.inc_by(evictions.saturating_sub(seen));
    }

    /// `(hit, missed)` prompt tokens so far.
    pub fn prefix_tokens(&self) -> (u64, u64) {
        (self.prefix.hit_tokens.get(), self.prefix.miss_tokens.get())
    }

    pub fn parity_dropped_counter(&self) -> Counter {
        self.parity_dropped.clone()
    }

    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The OpenMetrics text, with gauges refreshed from `snap`.
    pub fn render(&self, snap: Snapshot) -> String {
        self.vram_bytes.set(snap.vram_bytes as i64);
        self.queue_depth.set(snap.queue_depth as i64);
        self.busy.set(snap.busy as i64);
        self.running_jobs
            .set(i64::try_from(snap.running).unwrap_or(i64::MAX));
        self.uptime_s.set(self.uptime_seconds());
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_every_required_metric() {
        let m = Metrics::new(
            InfoLabels {
                model: "m".into(),
                quant_kind: "Q4_1".into(),
                backend: "cpu".into(),
                architecture: "llama".into(),
                tokenizer_kind: "gguf-bpe".into(),
            },
            None,
        );
        m.declare_request_outcomes(&["completed", "disconnected"]);
        m.request_finished("completed");
        m.job_accepted();
        m.job_accepted();
        m.job_ended();
        m.token_generated();
        m.observe_inference_ms(12.0);
        let text = m.render(Snapshot {
            vram_bytes: 42,
            queue_depth: 3,
            busy: true,
            running: 1,
        });
        for needle in [
            "worker_vram_bytes 42",
            "worker_requests_total{outcome=\"completed\"} 1",
            "worker_requests_total{outcome=\"disconnected\"} 0",
            "worker_tokens_generated_total 1",
            "worker_jobs_accepted_total 2",
            "worker_jobs_ended_total 1",
            "worker_inference_duration_ms_bucket",
            "worker_inference_duration_ms_count 1",
            "worker_first_token_ms_bucket",
            "worker_inter_token_ms_bucket",
            "worker_uptime_seconds ",
            "worker_queue_depth 3",
            "worker_busy 1",
            "quant_kind=\"Q4_1\"",
            "worker_parity_records_dropped_total 0",
            "# EOF",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(
            !text.contains("expert"),
            "a dense model has no expert gauges:\n{text}"
        );
    }

    /// A mixture-of-experts model (gpt-oss) shows its experts per token and per layer.
    #[test]
    fn experts_show_for_a_mixture_of_experts_model() {
        let experts = Experts {
            count: 32,
            active: 4,
        };
        let text = Metrics::new(InfoLabels::default(), Some(experts)).render(Snapshot::default());
        for needle in ["worker_active_expert_count 4", "worker_expert_count 32"] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}

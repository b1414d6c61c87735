//! What the worker reports about itself: `GET /health` (`health`) and
//! `GET /metrics` (`metrics`).

pub mod health;
pub mod metrics;

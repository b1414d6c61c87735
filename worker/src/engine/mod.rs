//! The engine: one thread that owns the backend (`runner.rs`) and runs up to
//! `--parallel N` jobs at once, one by default (`scheduler.rs`), every job's
//! steps in one loop of rounds (`round.rs`), fed by a bounded FIFO queue
//! (EXT-003).
//!
//! Built as an actor (after mistral.rs `engine/` and TGI's `queue.rs`): the
//! HTTP side holds an [`EngineHandle`] and submits [`Job`]s; each job carries
//! its own event channel, through which the engine streams `token` events and
//! exactly one terminal event. The engine never waits on the HTTP side, and
//! the HTTP side never waits on the engine except to hand over a job.

mod channels;
pub mod error;
pub mod generate;
pub mod job;
pub mod ledger;
pub mod parity;
pub mod queue;
pub mod round;
pub mod runner;
mod scheduler;
pub mod status;
pub mod stop;
#[cfg(test)]
pub mod testing;

pub use error::{backend_error_code, load_error_code, ErrorCode, JobError, Phase};
pub use generate::{Generation, GenerationError};
pub use job::{Job, JobEvent, JobSink};
pub use ledger::{Ledger, Outcome};
pub use round::generate;
pub use runner::{Engine, EngineConfig, EngineHandle, SubmitError};
pub use status::EngineStatus;

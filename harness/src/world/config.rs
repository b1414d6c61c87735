//! What the whole suite run was started with, shared by every scenario.

use std::path::PathBuf;
use std::time::Duration;

use crate::budgets::BudgetFile;

/// What the whole run was started with.
#[derive(Debug)]
pub struct SuiteConfig {
    pub workspace: PathBuf,
    pub worker_bin: PathBuf,
    pub backend: String,
    /// The reference model (absolute).
    pub model: PathBuf,
    /// A GPU is present and the backend under test is `cuda`.
    pub gpu: bool,
    pub gpu_count: u32,
    pub budgets: BudgetFile,
    pub budgets_path: PathBuf,
    pub fixtures_dir: PathBuf,
    pub golden_dir: PathBuf,
    pub requirements: PathBuf,
    pub start_timeout: Duration,
}

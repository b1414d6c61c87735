//! The worker as a process: starting it (`start`), signals, exits and what it
//! printed while it started (`exit`), its JSON log (`logs`), the GPU driver's
//! view of it (`gpu`), and the worker as a person starts and reads it
//! (`by_hand`: `serve`, its text log, `GET /`), and its model file changed
//! under it (`file_replaced`), a GPU fault mid-job (`gpu_fault`).

pub mod by_hand;
pub mod exit;
pub mod file_replaced;
pub mod gpu;
pub mod gpu_fault;
pub mod logs;
pub mod start;

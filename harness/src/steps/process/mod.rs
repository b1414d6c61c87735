//! The worker as a process: starting it (`start`), signals, exits and what it
//! printed while it started (`exit`), its JSON log (`logs`), and the GPU driver's
//! view of it (`gpu`).

pub mod exit;
pub mod gpu;
pub mod logs;
pub mod start;

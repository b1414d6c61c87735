//! Requests and the streams they open: posting jobs (`post`), the job kinds of
//! M0-W-1311 and hostile input (`kinds`), `/cancel` (`cancel`), checks of finished
//! streams (`stream`) and of plain replies (`reply`), jobs alone and alongside
//! others (`parallel`).

pub mod cancel;
pub mod kinds;
pub mod parallel;
pub mod post;
pub mod reply;
pub mod stream;

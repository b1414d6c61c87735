//! How large a request body may be, and how much of one too large is still
//! read before the 413 goes out.

/// Largest request body accepted, in bytes (413 above).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// An oversized body is read and discarded up to this many bytes before the
/// 413 goes out, so the client is not cut off mid-send and can read the
/// answer; beyond it the connection is closed.
pub const MAX_DRAINED_BYTES: u64 = 64 << 20;

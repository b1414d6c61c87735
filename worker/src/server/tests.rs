//! In-process handler tests.

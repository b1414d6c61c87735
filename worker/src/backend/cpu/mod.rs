//! The plain-Rust f32 reference backend.

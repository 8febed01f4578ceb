//! The store: the on-disk state of one database node (DESIGN.md section 2).
//!
//! - [`format`]: WAL, snapshot and position encodings.
//! - [`engine`]: the reference engine, a key-value map that writes exactly this format.

pub mod engine;
pub mod format;

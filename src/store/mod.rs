//! The store: the on-disk state of one database node (DESIGN.md section 2).
//!
//! - [`format`](mod@format): WAL, snapshot and position encodings.
//! - [`dir`]: [`dir::StoreDir`], the store directory opened once (inside its allowed root) and
//!   every file in it opened without following links, regular files only, small ones capped.
//! - [`disk`]: [`disk::DiskState`], one look at a store directory, and the file names.
//! - [`watch`]: [`watch::DirWatch`], which says without looking that a directory has not
//!   changed, so that idle stores cost almost nothing.
//! - [`engine`]: the reference engine, a key-value map that writes exactly this format:
//!   [`engine::codec`] (commit and snapshot payloads), [`engine::recover`] (recovery as a
//!   read-only reading: `read_store`, `digest`), the position handle, and the deterministic
//!   `store write` workload.

pub mod dir;
pub mod disk;
pub mod engine;
/// The formats, from the `mushroom-format` crate (shared with engines and the node client).
pub use mushroom_format::store as format;
pub mod watch;

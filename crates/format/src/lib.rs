//! `mushroom-format`: what the bytes of mushroom-backup mean, with no I/O runtime (no tokio,
//! no network): the formats a database node and the service share, so that an engine, the
//! node client and the service read and write them with one piece of code.
//!
//! - [`store`]: the store's on-disk formats (DESIGN.md section 2): WAL files and frames,
//!   snapshot files, the `wal.position` record ([`store::WalPosition`], what a node reports),
//!   `snapshot.intent` and `backup.parent`. Decoders take hostile input.
//! - [`manifest`]: restore points in the bucket (DESIGN.md section 4): the manifest format,
//!   the object keys under a prefix, LATEST and the GENERATION claim.
//! - [`branch`]: branches: where a branch manifest was cut from, the prefixes it may name,
//!   the pins and releases that keep its objects from retention.
//! - [`units`]: saturating conversions between integer widths, durations as the wire carries
//!   them, and [`units::error_chain`], how every error reads in a message.
//!
//! Floors: `units` depends on nothing; `store` on `units`; `manifest` on neither. The crate
//! depends on no other crate of the workspace; the library (`mushroom-backup`) re-exports
//! these as `store::format`, `manifest` and `units`.

pub mod branch;
pub mod manifest;
pub mod store;
pub mod units;

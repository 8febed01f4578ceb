//! mushroom-backup: continuous, crash-safe backup of database stores to an object store, with
//! restore points that are proven restorable. See `DESIGN.md` in the project's shared folder
//! and the module docs below, floor by floor from the bottom: a module uses only the floors
//! below it (`tests/architecture.rs` checks it). The floors an engine shares with the service
//! are crates of their own under `crates/` (docs/layout.md), re-exported here under the paths
//! they always had: [`units`] and [`manifest`] (`mushroom-format`, with [`store::format`]),
//! [`backoff`] (`mushroom-backoff`), [`node_client`] (`mushroom-node-client`) and the messages
//! and client of [`service::proto`] (`mushroom-proto`).
//!
//! - [`units`], [`pacing`], [`backoff`]: saturating conversions, the process's tick grid, the
//!   one retry delay. [`telemetry`]: logs, traces, metric names, the Prometheus endpoint.
//!   [`manifest`]: restore points, object keys, LATEST. [`instance_lock`]: the data
//!   directory's lock, and what a free one proves about the process that held it.
//!   [`nofollow`]: opening below a directory descriptor without following a link (the store
//!   directory's and the local-directory bucket's one walk).
//! - [`bucket`]: the object-store trait and its backends (local directory, S3, faults, retry);
//!   [`store`]: the store's on-disk format, [`store::disk::DiskState`], the reference engine;
//!   [`cost`]: the price table and a store's monthly estimate from its bucket usage;
//!   [`crypto`]: envelope encryption (sealed objects, data keys, their wrappers, rekey).
//!   [`at_rest`]: how an object's stored bytes are made from its plain bytes (zstd behind a
//!   sample, the seam of encryption) and back.
//! - [`lease`]: the bucket lease: who may write to a prefix, and what that does not guarantee;
//!   in the service, one instance lease per lease root fences every store lease ([`lease::instance`]);
//!   [`wal_source`]: where the worker learns how much WAL is durable.
//! - [`events`]: the event bus (typed events of stores, fanned out to `WatchEvents` watchers
//!   and webhooks, never blocking a publisher).
//! - [`health`]: what a runner records, and the health judged from it.
//! - [`worker`]: the backup worker (one step, its ledger, generations, segments, restore
//!   points, lineage, retention, the runner under the lease); [`restore`]: restore, `--at`,
//!   adopt; [`drill`]: restore drills (the real restore into scratch, checked against the
//!   manifest); [`verify`]: verify and `ls`; [`listing`]: restore points a page at a time, at
//!   the cost of a page; [`registry`]: stores, tokens and instance claims.
//! - [`service`]: the gRPC control plane; [`node_client`]: the position reporter a node embeds.

// A cast that wraps or truncates turned `keep_for` of 2^63 ms into a negative age once; every
// conversion goes through `units` (or a checked `try_from`) instead.
#![deny(
    clippy::cast_possible_wrap,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

pub mod at_rest;
pub mod branch;
pub mod bucket;
pub mod cost;
pub mod crypto;
pub mod drill;
pub mod events;
pub mod health;
pub mod instance_id;
pub mod instance_lock;
pub mod latest;
pub mod lease;
pub mod listing;
pub mod nofollow;
pub mod pacing;
pub mod pins;
pub mod registry;
pub mod restore;
pub mod service;
pub mod standby;
pub mod store;
pub mod telemetry;
pub mod verify;
pub mod wal_source;
pub mod worker;

// The floors that live in their own crates (crates/, docs/layout.md), under the paths the
// library has always used.
pub use mushroom_backoff as backoff;
pub use mushroom_format::{manifest, units};
pub use mushroom_node_client as node_client;

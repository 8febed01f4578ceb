//! `mushroom-proto`: the `mushroom.backup.v1` protocol (`proto/mushroom/backup/v1/backup.proto`
//! at the repository's root), generated: every message, and the `BackupControl` client over a
//! tonic channel with tonic's standard prost codec.
//!
//! No server here: the service (`mushroom-backup`, `service::proto`) generates its server on
//! these same message types with its own strict decoding codec (a request that does not decode
//! is `INVALID_ARGUMENT` there), so an engine that embeds the client
//! (`mushroom-node-client`) builds no server, router or HTTP server stack.
//!
//! Depends on no other crate of the workspace.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("mushroom.backup.v1");

/// The encoded file descriptor set of `mushroom.backup.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mushroom_backup_descriptor.bin"));

//! The generated `mushroom.backup.v1` types, client and server.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("mushroom.backup.v1");

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/mushroom_backup_descriptor.bin"));

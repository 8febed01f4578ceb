//! The `mushroom.backup.v1` protocol as the service sees it: the messages, the client and the
//! reflection descriptor of the `mushroom-proto` crate, and the server generated here (by
//! `build.rs`) on those same types with the strict decoding codec ([`super::codec`]).
#![allow(clippy::all, missing_docs)]

pub use mushroom_proto::*;

tonic::include_proto!("mushroom.backup.v1");

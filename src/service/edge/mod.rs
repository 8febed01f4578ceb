//! The gRPC edge: the handlers, auth, request decoding and the one mapping to status codes.

pub mod api;
pub mod auth;
pub mod error;
pub mod forward_stream;
pub mod health_watch;
pub mod peer_auth;
mod position_stream;
pub mod request;
pub mod server_limits;
pub mod tls_files;
pub mod watch_events;

//! The instances together: owners, forwarding, failover, planned moves.

pub mod failover;
pub mod forward;
pub mod forward_stream;
pub mod moves;
pub mod owner_cache;

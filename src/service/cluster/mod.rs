//! The instances together: owners, forwarding, failover, planned moves.

pub mod failover;
pub mod forward;
pub mod moves;
pub mod owner_cache;

use crate::service::fleet::FleetError;

/// What the cluster answers when a call cannot be routed or forwarded, or a move cannot be
/// done, in its own terms (the edge chooses the status codes, `edge::error`).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Forward(#[from] forward::ForwardError),
    #[error(transparent)]
    Move(#[from] moves::MoveError),
}

impl From<crate::service::fleet::limits::FieldError> for ClusterError {
    fn from(e: crate::service::fleet::limits::FieldError) -> Self {
        ClusterError::Fleet(e.into())
    }
}

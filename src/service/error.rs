//! The service's errors, and their one mapping to gRPC status (the API edge).
//!
//! Every handler returns [`ServiceError`]; [`From<ServiceError> for tonic::Status`] is the only
//! place a status code is chosen. Internal errors become `INTERNAL` with a generic message; their
//! cause is logged here, once, and never sent to the client (it may name paths or hosts). No
//! message ever carries a token.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// A failure of ours; the cause is logged, the client sees a generic message.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError {
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        ServiceError::Internal(cause.to_string())
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        let (code, msg) = match e {
            ServiceError::InvalidArgument(m) => (Code::InvalidArgument, m),
            ServiceError::PermissionDenied(m) => (Code::PermissionDenied, m),
            ServiceError::AlreadyExists(m) => (Code::AlreadyExists, m),
            ServiceError::NotFound(m) => (Code::NotFound, m),
            ServiceError::Unauthenticated(m) => (Code::Unauthenticated, m),
            ServiceError::FailedPrecondition(m) => (Code::FailedPrecondition, m),
            ServiceError::Unavailable(m) => (Code::Unavailable, m),
            ServiceError::DeadlineExceeded(m) => (Code::DeadlineExceeded, m),
            ServiceError::ResourceExhausted(m) => (Code::ResourceExhausted, m),
            ServiceError::Internal(cause) => {
                tracing::error!(%cause, "internal error answering a request");
                (
                    Code::Internal,
                    "internal error (see the server's log)".to_string(),
                )
            }
        };
        Status::new(code, msg)
    }
}

impl From<crate::registry::RegistryError> for ServiceError {
    fn from(e: crate::registry::RegistryError) -> Self {
        use crate::registry::RegistryError as R;
        match e {
            R::AlreadyExists { what, value } => ServiceError::AlreadyExists(format!(
                "a store with {what} {value} is already registered"
            )),
            R::Unavailable { detail } => {
                ServiceError::Unavailable(format!("the registry is unavailable: {detail}"))
            }
            other => ServiceError::internal(other),
        }
    }
}

//! The service's errors, and their one mapping to gRPC status (the API edge).
//!
//! Every module says what went wrong in its own terms, never as a status code: a request
//! field out of bounds ([`FieldError`], `limits`), a caller without its token ([`AuthError`],
//! `auth`), a store directory or destination refused ([`StoreDirError`], [`DestinationError`]),
//! a contradiction with a registered store ([`Conflict`]), too many watchers ([`WatchersFull`]),
//! and whatever the fleet answers ([`FleetError`]: an unknown store, one owned elsewhere, a
//! destination that does not open, a restore that fails, the registry), and a call for
//! another instance that could not go there ([`ForwardError`]: `UNAVAILABLE` when the owner
//! cannot be reached, naming it and its address). Every handler returns
//! [`ServiceError`], and [`From<ServiceError> for tonic::Status`] is the only place a status
//! code is chosen: this module is the one place that knows gRPC codes (the tower timeout layer
//! and the codec build their status through [`ServiceError`] and [`malformed_request`] too).
//!
//! A destination that does not open is `INVALID_ARGUMENT` when its URL is bad, `UNAVAILABLE`
//! when its endpoint cannot be reached and `FAILED_PRECONDITION` when it is missing, refuses
//! access or cannot be opened, whichever call opened it (`Register`, `Adopt`,
//! `ListRestorePoints`).
//!
//! Internal errors become `INTERNAL` with a generic message; their cause is logged here, once,
//! and never sent to the client (it may name paths or hosts). No message ever carries a token.

use crate::branch::BranchError;
use tonic::{Code, Status};

pub use super::auth::AuthError;
use crate::bucket::{BucketError, OpenError};
use crate::registry::RegistryError;
use crate::restore::RestoreError;
use crate::service::cluster::ClusterError;
pub use crate::service::cluster::forward::ForwardError;
pub use crate::service::fleet::FleetError;
pub use crate::service::fleet::conflicts::Conflict;
pub use crate::service::fleet::destination::DestinationError;
pub use crate::service::fleet::limits::FieldError;
pub use crate::service::fleet::paths::StoreDirError;

/// One more watcher than `max_health_watchers` (`RESOURCE_EXHAUSTED`): `health_watch.rs`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{max} WatchHealth streams are open, the server's limit (max_health_watchers): close one, \
     or poll Health"
)]
pub struct WatchersFull {
    pub max: usize,
}

/// One more event stream than the server allows (`RESOURCE_EXHAUSTED`): `watch_events.rs`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{max} WatchEvents streams are open, the server's limit (max_health_watchers): close one")]
pub struct EventWatchersFull {
    pub max: usize,
}

/// Why a call failed, as the API answers it.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    WatchersFull(#[from] WatchersFull),
    #[error(transparent)]
    EventWatchersFull(#[from] EventWatchersFull),
    /// A `ReportPosition` stream whose first report did not come in time.
    #[error(
        "no first report within {ms} ms: a ReportPosition stream starts with a report naming \
         its store (the server's first_report_timeout_ms)"
    )]
    NoFirstReport { ms: u128 },
    /// A call's handler cut by its timeout (`server_limits`).
    #[error("{method} did not finish within {ms} ms (the server's {setting})")]
    CallTimeout {
        method: String,
        ms: u128,
        setting: &'static str,
    },
    /// What the long-lived streams end with when the service stops: retry (another instance,
    /// or this one restarted).
    #[error("the service is shutting down")]
    ShuttingDown,
    /// What a store's position streams end with once it is deregistered (and what a stream
    /// that arrives while it is being deregistered gets).
    #[error("store {0} was deregistered")]
    Deregistered(String),
    /// A `ReportPosition` stream more than its store takes (`wal_source::streamed`).
    #[error(
        "store {store} already has {cap} position streams attached, the server's \
         max_streams_per_store: end one (a node needs one) or raise the limit"
    )]
    TooManyStreams { store: String, cap: usize },
    /// What a store's position streams end with once another instance owns it (a failover
    /// claim, a planned move): reconnect, and be relayed to the new owner.
    #[error("store {store} moved to instance {owner}: reconnect")]
    Moved { store: String, owner: String },
    /// A call for another instance that could not be forwarded there.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A planned move refused (nothing changed), or raced by a claim.
    #[error(transparent)]
    Move(#[from] crate::service::cluster::moves::MoveError),
}

impl From<ClusterError> for ServiceError {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::Fleet(e) => ServiceError::Fleet(e),
            ClusterError::Forward(e) => ServiceError::Forward(e),
            ClusterError::Move(e) => ServiceError::Move(e),
        }
    }
}

impl From<ClusterError> for Status {
    fn from(e: ClusterError) -> Status {
        ServiceError::from(e).into()
    }
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        let code = match &e {
            ServiceError::Field(_) => Code::InvalidArgument,
            ServiceError::Auth(_) => Code::Unauthenticated,
            ServiceError::Fleet(f) => match fleet_code(f) {
                Some(code) => code,
                None => return internal(f),
            },
            ServiceError::WatchersFull(_)
            | ServiceError::EventWatchersFull(_)
            | ServiceError::TooManyStreams { .. } => Code::ResourceExhausted,
            ServiceError::NoFirstReport { .. } | ServiceError::CallTimeout { .. } => {
                Code::DeadlineExceeded
            }
            ServiceError::ShuttingDown | ServiceError::Moved { .. } => Code::Unavailable,
            ServiceError::Deregistered(_) => Code::NotFound,
            ServiceError::Move(crate::service::cluster::moves::MoveError::Raced { .. }) => {
                Code::Aborted
            }
            ServiceError::Move(_) => Code::FailedPrecondition,
            ServiceError::Forward(f) => match f {
                ForwardError::Unreachable { .. } => Code::Unavailable,
                ForwardError::UnknownInstance(_) => Code::InvalidArgument,
                ForwardError::NoAddress { .. }
                | ForwardError::NotThisInstance { .. }
                | ForwardError::BadAddress { .. }
                | ForwardError::NoPeerCa
                | ForwardError::NoPeerToken { .. } => Code::FailedPrecondition,
            },
        };
        Status::new(code, e.to_string())
    }
}

/// The code of a fleet error; `None`: a failure of ours (`INTERNAL`).
fn fleet_code(e: &FleetError) -> Option<Code> {
    Some(match e {
        FleetError::Field(_) => Code::InvalidArgument,
        FleetError::StoreDir(StoreDirError::Bad(_)) => Code::InvalidArgument,
        FleetError::StoreDir(StoreDirError::OutsideRoots(_)) => Code::PermissionDenied,
        FleetError::Destination(DestinationError::Bad(_)) => Code::InvalidArgument,
        FleetError::Destination(DestinationError::Placement(_)) => Code::PermissionDenied,
        FleetError::Conflict(Conflict::SameDir(_)) => Code::AlreadyExists,
        FleetError::Conflict(Conflict::NestedDir(_) | Conflict::SharedDestination(_)) => {
            Code::FailedPrecondition
        }
        FleetError::NotHere(_) | FleetError::UnknownStore(_) => Code::NotFound,
        FleetError::OwnedElsewhere { .. }
        | FleetError::OwnerAlive { .. }
        | FleetError::Paused { .. } => Code::FailedPrecondition,
        FleetError::AdoptTarget(_) => Code::FailedPrecondition,
        FleetError::Open(OpenError::BadUrl { .. }) => Code::InvalidArgument,
        FleetError::Open(OpenError::Refused(BucketError::Unreachable { .. })) => Code::Unavailable,
        FleetError::Open(
            OpenError::Unavailable { .. } | OpenError::Missing { .. } | OpenError::Refused(_),
        ) => Code::FailedPrecondition,
        FleetError::Listing(_) | FleetError::LeaseRoot(_) => Code::Unavailable,
        FleetError::Restore(r) => match r {
            RestoreError::TargetNotEmpty { .. }
            | RestoreError::BadTarget { .. }
            | RestoreError::NoRestorePoint { .. }
            | RestoreError::Unreachable { .. }
            | RestoreError::BeforeEarliest { .. }
            | RestoreError::Manifest(_)
            | RestoreError::CrcMismatch { .. }
            | RestoreError::BadObject { .. }
            | RestoreError::Partial { .. }
            | RestoreError::Key { .. }
            | RestoreError::ReadBack { .. } => Code::FailedPrecondition,
            RestoreError::BadTime { .. } => Code::InvalidArgument,
            RestoreError::Bucket(_) => Code::Unavailable,
            RestoreError::Io { .. } | RestoreError::Disk(_) => return None,
        },
        FleetError::Branch(b) => match b {
            BranchError::Destination { .. }
            | BranchError::NotABranch { .. }
            | BranchError::Parent { .. } => Code::InvalidArgument,
            BranchError::Raced { .. } => Code::Aborted,
            BranchError::Bucket(_) | BranchError::Restore(RestoreError::Bucket(_)) => {
                Code::Unavailable
            }
            BranchError::Restore(RestoreError::BadTime { .. }) => Code::InvalidArgument,
            BranchError::Restore(_) => Code::FailedPrecondition,
        },
        FleetError::Registry(r) => match r {
            RegistryError::AlreadyExists { .. } => Code::AlreadyExists,
            RegistryError::Unavailable { .. } => Code::Unavailable,
            _ => return None,
        },
        FleetError::IsStandby { .. } => Code::FailedPrecondition,
        FleetError::Promote(p) if p.is_unavailable() => Code::Unavailable,
        FleetError::Promote(_) => Code::FailedPrecondition,
        FleetError::Internal(_) => return None,
        FleetError::InstanceIdShared(_) => Code::FailedPrecondition,
    })
}

/// A failure of ours: the cause is logged, the client sees a generic message.
fn internal(cause: &FleetError) -> Status {
    tracing::error!(%cause, "internal error answering a request");
    Status::new(Code::Internal, "internal error (see the server's log)")
}

/// What the codec answers for a request that does not decode (`decoded` is prost's
/// complaint): the client sent bad input, `INVALID_ARGUMENT`, not tonic's default `INTERNAL`.
pub fn malformed_request(decoded: &Status) -> Status {
    Status::new(
        Code::InvalidArgument,
        format!("malformed request: {}", decoded.message()),
    )
}

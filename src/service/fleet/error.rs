//! The fleet's errors, in its own terms: what it answers when it cannot do what it was asked.
//! Their status codes are chosen at the edge (`edge::error`), never here; their messages
//! (audited, and sent to the client unless internal) are written here.

use super::admission::conflicts::Conflict;
use super::admission::destination::DestinationError;
use super::admission::limits::FieldError;
use super::admission::paths::StoreDirError;
use crate::bucket::OpenError;
use crate::registry::{self, RegistryError};
use crate::restore::{self, RestoreError};

/// What the fleet answers when it cannot do what it was asked, in its own terms (the status
/// codes are chosen in `edge::error`).
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A field of the request out of bounds (a store id, labels, options).
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error(transparent)]
    StoreDir(#[from] StoreDirError),
    #[error(transparent)]
    Destination(#[from] DestinationError),
    /// The new store contradicts a registered one.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// No such store runs on this instance (it may be registered elsewhere).
    #[error("no store {0} on this instance")]
    NotHere(String),
    /// No instance has this store.
    #[error("no store {0}")]
    UnknownStore(String),
    /// The store is registered, but another instance runs it.
    #[error("store {store} belongs to instance {owner}: call that instance")]
    OwnedElsewhere { store: String, owner: String },
    /// A call that would upload (Trigger) on a paused store.
    #[error("store {store} is paused ({reason}): Resume it first")]
    Paused { store: String, reason: String },
    /// Deregistering a store whose owner is still heard from.
    #[error(
        "store {store} belongs to instance {owner}, which is alive: deregister it there (a \
         store can be deregistered elsewhere once its owner has been silent for {silent_ms} ms)"
    )]
    OwnerAlive {
        store: String,
        owner: String,
        silent_ms: i64,
    },
    /// Adopt's target directory is not empty, or cannot be read.
    #[error("{0}")]
    AdoptTarget(String),
    /// The destination does not open.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The destination's restore points cannot be listed.
    #[error(transparent)]
    Listing(#[from] crate::listing::ListingError),
    #[error("{}", restore_message(.0))]
    Restore(#[from] restore::RestoreError),
    /// A branch refused or failed (`crate::branch`).
    #[error("branch: {0}")]
    Branch(#[from] crate::branch::BranchError),
    #[error("{}", registry_message(.0))]
    Registry(#[from] registry::RegistryError),
    /// The lease root of the destination (where the instance lease lives) cannot be opened.
    #[error("{0}")]
    LeaseRoot(String),
    /// A call that needs a backup worker, on a standby (`standby.rs`).
    #[error(
        "store {store} is a standby of {destination}: it has no backup worker (nothing to \
         pause, resume, trigger, drill or move); promote it first (ctl promote {store}), or \
         deregister it"
    )]
    IsStandby { store: String, destination: String },
    /// A promotion refused or failed (`promote.rs`).
    #[error("promotion of store: {0}")]
    Promote(#[from] super::promote::PromoteError),
    /// A failure of ours.
    #[error("internal error: {0}")]
    Internal(String),
    /// At start: another live `serve` holds this instance id's lease in a bucket this one's
    /// stores use (finding 4 of security review 4); the message names both.
    #[error("{0}")]
    InstanceIdShared(String),
}

/// How a restore error reads (audited, and sent to the client unless internal).
fn restore_message(e: &RestoreError) -> String {
    match e {
        RestoreError::Manifest(_)
        | RestoreError::CrcMismatch { .. }
        | RestoreError::BadObject { .. }
        | RestoreError::ReadBack { .. } => format!("the destination cannot be restored: {e}"),
        RestoreError::Bucket(b) => format!("the destination is unavailable: {b}"),
        RestoreError::Io { .. } | RestoreError::Disk(_) => format!("internal error: {e}"),
        _ => e.to_string(),
    }
}

/// How a registry error reads (audited, and sent to the client unless internal).
fn registry_message(e: &RegistryError) -> String {
    match e {
        RegistryError::AlreadyExists { what, value } => {
            format!("a store with {what} {value} is already registered")
        }
        RegistryError::Unavailable { detail } => format!("the registry is unavailable: {detail}"),
        other => format!("internal error: {other}"),
    }
}

//! What a step's children borrow of the worker: [`Ctx`].
//!
//! The children (`generation`, `segment`, `restore_point`, `retention`, and the resume in
//! `view`) take a `&Ctx`, the worker's [`super::view::View`] by `&mut`, and the disk state and
//! position the step read, and return what they did. They see nothing else of the
//! [`super::BackupWorker`]: its timers, requests, idle state and counters are the step's
//! (`step_as`) to update from their outcome.

use std::path::PathBuf;

use super::upload::Uploader;
use crate::bucket::{DynBucket, PutCondition};
use crate::health::StepActivity;
use crate::store::dir::StoreDir;

/// The worker's parts one step's children use.
pub(super) struct Ctx<'a> {
    /// The store directory's path (for messages); every read goes through `store`.
    pub dir: &'a PathBuf,
    pub store: &'a StoreDir,
    pub bucket: &'a DynBucket,
    /// Every write-once upload of store data goes through it.
    pub uploader: Uploader,
    /// Conditional writes (`If-None-Match`, `If-Match`) are on.
    pub conditional_writes: bool,
    /// Where the child says which phase it is in (at most once per object or phase), for health.
    pub activity: &'a StepActivity,
    /// What the worker encrypts with (no keys: plaintext).
    pub encryption: &'a crate::crypto::WriterEncryption,
    /// The form of the pointer to the newest restore point (`src/latest.rs`).
    pub form: crate::latest::Form,
    /// How a write-once prefix's objects are locked (`None`: the mutable layout).
    pub lock: Option<crate::bucket::write_once::ObjectLock>,
    /// What holding reused objects costs and found (`hold.rs`).
    pub holds: &'a crate::bucket::write_once::HoldCounts,
}

impl Ctx<'_> {
    /// The condition of a write-once object: `If-None-Match: *` unless conditional writes are off.
    pub fn cond_create(&self) -> PutCondition {
        cond_create(self.conditional_writes)
    }
}

/// `If-None-Match: *`, or nothing with conditional writes off.
pub(super) fn cond_create(conditional_writes: bool) -> PutCondition {
    if conditional_writes {
        PutCondition::IfNoneMatch
    } else {
        PutCondition::None
    }
}

//! The record of an act on a store (register, adopt, deregister, pause, resume, a move, a
//! claim, a release): its audit row in the registry and, when the act changed something, its
//! event on the bus, written together by [`Fleet::record`], the row first. A refused act
//! is audited only ([`Fleet::refused`]). The event goes to the fleet's event log before any
//! watcher hears it (`event_log.rs`: appended by the log's writer, in a batch, shortly after;
//! [`Fleet::record`] does not wait for it). A crash between the row and the append leaves the
//! row without the event; a row that cannot be written is logged, and the act stands.

use super::{Fleet, FleetError, now_ms};
use crate::events::NewEvent;
use crate::registry::{AuditEntry, StoreRecord};

/// An act done on a store, as its audit row names it.
pub(in crate::service) struct Done<'a> {
    pub action: &'a str,
    pub store_id: &'a str,
    pub store_dir: &'a str,
    /// What the row says of it.
    pub detail: String,
    /// Who asked, as the audit log names them; `None`: the service itself.
    pub peer: Option<String>,
}

impl<'a> Done<'a> {
    /// An act done on the store of `record`.
    pub(in crate::service) fn on(
        action: &'a str,
        record: &'a StoreRecord,
        detail: String,
        peer: Option<String>,
    ) -> Done<'a> {
        Done {
            action,
            store_id: &record.store_id,
            store_dir: &record.store_dir,
            detail,
            peer,
        }
    }
}

impl Fleet {
    /// The one record of an act done: its audit row, then its `event`.
    pub(in crate::service) async fn record(&self, done: Done<'_>, event: Option<NewEvent>) {
        let Done {
            action,
            store_id,
            store_dir,
            detail,
            peer,
        } = done;
        self.audit(action, Some(store_id), Some(store_dir), "ok", detail, peer)
            .await;
        if let Some(event) = event {
            self.events().publish(event);
        }
    }

    pub(in crate::service) async fn audit(
        &self,
        action: &str,
        store_id: Option<&str>,
        store_dir: Option<&str>,
        outcome: &str,
        detail: String,
        peer: Option<String>,
    ) {
        let entry = AuditEntry {
            at_ms: now_ms(),
            instance_id: self.config.instance_id.clone(),
            action: action.into(),
            store_id: store_id.map(Into::into),
            store_dir: store_dir.map(Into::into),
            outcome: outcome.into(),
            detail,
            peer,
        };
        if let Err(e) = self.registry.record_audit(&entry).await {
            tracing::warn!(error = %e, action, "cannot write the audit log");
        }
    }

    /// Audits a refused call (bad input, permission), then returns the error.
    pub async fn refused(
        &self,
        action: &str,
        store_dir: Option<&str>,
        e: FleetError,
        peer: Option<String>,
    ) -> FleetError {
        self.audit(action, None, store_dir, "refused", e.to_string(), peer)
            .await;
        e
    }
}

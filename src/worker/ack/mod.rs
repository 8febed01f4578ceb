//! The acknowledgement room: the store's **durable position** (how far a restore of the prefix,
//! run right now, reaches), the one watch it is published on ([`DurableTx`]), and in
//! `durability = sync` the window that gates it ([`AckWindow`], `window.rs`). The position is
//! what the service acknowledges to a node on its `ReportPosition` stream, so an engine can
//! hold a commit's acknowledgement until its bytes are in the bucket (the node's side:
//! `crates/node-client/src/durable.rs`).
//!
//! # What "durable" means
//!
//! A restore (`crate::restore::plan`) reads LATEST, restores the manifest it names, then
//! extends it with the segments *of that manifest's generation* that continue its last
//! segment, frame by frame. So commit `n` is durable when:
//! - LATEST names a manifest of this worker's lineage (`View::latest`, as this worker last
//!   wrote or read it, naming `View::newest_own`), and
//! - either that manifest holds `n`, or the generation it is of is the one being shipped
//!   (`View::current`) and its shipped segments — each written with `If-None-Match: *` and
//!   recorded in the view only after the bucket accepted the PUT — reach `n`.
//!
//! Commits of a generation no manifest names yet (its first restore point is written at the
//! step after it starts) are *not* durable: a restore cannot reach them. Nothing is computed
//! from the store's files or the node's reports; only from what this worker saw the bucket
//! accept, so a commit is never acknowledged that a restore could not reach.
//!
//! # When it advances, and why it never goes backwards
//!
//! After every step that succeeded ([`super::BackupWorker::step_as`]): a segment shipped, a
//! restore point written, a generation started, a resume; and when a runner spawned paused
//! read the restore point LATEST names (`runner/paused.rs`). The step's counters are booked
//! first, and health shows the position with them ([`DurableTx::offered`], `figures.rs`). The
//! position is ordered by `(commit_seq, in_restore_point)` and only ever raised within a
//! **chain**: a lower value computed meanwhile (a new generation started and has no manifest
//! yet, while LATEST still names the previous one whose trailing segments the restore still
//! reads) is not published, because the bucket still holds what was published.
//!
//! # When the chain breaks
//!
//! Whatever this worker published holds only while it is the prefix's one writer: on a lost
//! lease (expired, taken over, the instance lease ended), a write refused by another writer,
//! a refused prefix, or the worker stopping, the runner calls [`DurableTx::break_chain`] with
//! the reason. The watched value then says so explicitly (`chain` counts breaks, `broken`
//! says why, `position` is `None`), and a stream reader (`position_stream.rs`) says
//! `DurabilityLost` to the node before any later position: the node fails the waits pending
//! at that moment instead of acknowledging them on the new chain's word. The next chain starts
//! from the bucket's state (a resume) and may publish a position equal to or even below the
//! old one (another writer's history): that is why it is a new chain and not a step back.
//!
//! # Published only within the acknowledgement window (`durability = sync`)
//!
//! A promotion (`standby::promote`) takes the prefix's lease from a live holder and must know,
//! within about a second and not a lease TTL, that the old holder acknowledges nothing more:
//! a commit acknowledged after the promotion read the prefix would be lost with the old
//! primary. So a sync worker's lease record promises [`crate::lease::ACK_WINDOW`]
//! ([`crate::lease::LeaseRecord::ack_window_ms`]) and its position is **gated**: a step
//! *offers* what it made durable ([`DurableTx::offer`]), and the runner's [`AckWindow`]
//! (`window.rs`) *releases* it ([`DurableTx::release`]) after the step. An async worker
//! publishes at once, and promises nothing (a promotion then waits for its deadline).
//!
//! Around each step the runner makes two calls: [`AckWindow::before_step`] (a confirming read
//! starts beside a step that may need one) and [`AckWindow::after_step`] (what the step offered
//! is released once a read allows it). When it holds a new lease it calls
//! [`AckWindow::reset`].
//!
//! **The invariant**, stated here once: every position published at instant `t` follows the
//! start, at `s >= t - window`, of a read of the lease object
//! ([`crate::lease::LeaseHandle::confirm`]) that found this worker's record. So no position is
//! published later than a window after another holder's write of the lease object landed. A
//! read that finds the lease taken ends it, nothing offered is released, and the chain breaks.
//!
//! # What a crash leaves behind
//!
//! Nothing: the position is in memory only. A restarted worker resumes from the bucket and
//! publishes what it finds; a node's waits that were pending on the old process failed with
//! the stream.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::view::View;

mod window;
pub(super) use window::{AckWindow, Settled};

/// A commit a restore of the prefix reaches now (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurablePosition {
    /// The generation of the restore point a restore starts from.
    pub generation: u64,
    /// Commits a restore reaches.
    pub commit_seq: u64,
    /// Whether a restore point (the manifest LATEST names) holds exactly this far, so that a
    /// restore needs no trailing segment.
    pub in_restore_point: bool,
}

impl DurablePosition {
    fn rank(&self) -> (u64, bool) {
        (self.commit_seq, self.in_restore_point)
    }
}

/// The watched durable state of one store's worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Durability {
    /// Counts the breaks so far: a reader that saw another chain learns of a break even if it
    /// missed the moment (a watch keeps only the newest value).
    pub chain: u64,
    /// The newest durable position of this chain; `None` until the first one.
    pub position: Option<DurablePosition>,
    /// Why the last chain ended (`None` before the first break).
    pub broken: Option<String>,
}

/// The worker's side of the watch: the one writer of [`Durability`].
#[derive(Debug, Clone)]
pub struct DurableTx(watch::Sender<Durability>, Arc<Mutex<Gate>>);

/// Positions offered while gated wait here for [`DurableTx::release`].
#[derive(Debug, Default)]
struct Gate {
    on: bool,
    pending: Option<DurablePosition>,
}

impl Default for DurableTx {
    fn default() -> Self {
        Self(
            watch::channel(Durability::default()).0,
            Arc::new(Mutex::new(Gate::default())),
        )
    }
}

impl DurableTx {
    /// Readers of the durable state, from now on.
    pub fn subscribe(&self) -> watch::Receiver<Durability> {
        self.0.subscribe()
    }

    /// The durable state now.
    pub fn current(&self) -> Durability {
        self.0.borrow().clone()
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gates publication (see "Published only within the acknowledgement window" in the
    /// module docs): from now on [`DurableTx::offer`] holds positions back until
    /// [`DurableTx::release`].
    pub fn set_gated(&self, on: bool) {
        self.gate().on = on;
    }

    /// A position the bucket now holds: published at once, or, while gated, at the next
    /// [`DurableTx::release`].
    pub fn offer(&self, pos: DurablePosition) {
        let mut gate = self.gate();
        if !gate.on {
            drop(gate);
            return self.advance(pos);
        }
        if gate.pending.is_none_or(|p| p.rank() < pos.rank()) {
            gate.pending = Some(pos);
        }
    }

    /// The highest position offered in this chain, published or still held back: what the
    /// bucket holds now, as health shows it (`figures.rs`).
    pub fn offered(&self) -> Option<DurablePosition> {
        let pending = self.gate().pending;
        let published = self.0.borrow().position;
        pending
            .into_iter()
            .chain(published)
            .max_by_key(|p| p.rank())
    }

    /// Whether a position waits for [`DurableTx::release`].
    pub fn has_pending(&self) -> bool {
        self.gate().pending.is_some()
    }

    /// Publishes the position held back, if any.
    pub fn release(&self) {
        let pending = self.gate().pending.take();
        if let Some(pos) = pending {
            self.advance(pos);
        }
    }

    /// Raises the position to `pos` when it is higher (see the module docs); never lowers it.
    pub fn advance(&self, pos: DurablePosition) {
        self.0.send_if_modified(|d| {
            if d.position.is_some_and(|p| p.rank() >= pos.rank()) {
                return false;
            }
            d.position = Some(pos);
            true
        });
    }

    /// Ends the chain: what was published may no longer hold (see the module docs). A chain
    /// that never published anything is not broken again.
    pub fn break_chain(&self, reason: &str) {
        self.gate().pending = None;
        self.0.send_if_modified(|d| {
            if d.position.is_none() {
                return false;
            }
            d.chain += 1;
            d.position = None;
            d.broken = Some(reason.to_string());
            true
        });
    }
}

/// How far a restore of the prefix reaches, by what the view says the bucket accepted; `None`
/// while LATEST names no restore point of this lineage.
pub(super) fn of_view(view: &View) -> Option<DurablePosition> {
    let (latest, _) = view.latest.as_ref()?;
    let m = view.newest_own.as_ref()?;
    if latest.lineage != view.lineage || latest.manifest != m.key() {
        return None;
    }
    let shipped = view
        .current
        .as_ref()
        .filter(|g| g.number == m.generation)
        .map_or(m.commit_seq, |g| g.shipped_seq().max(m.commit_seq));
    Some(DurablePosition {
        generation: m.generation,
        commit_seq: shipped,
        in_restore_point: shipped == m.commit_seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(commit_seq: u64, in_restore_point: bool) -> DurablePosition {
        DurablePosition {
            generation: 1,
            commit_seq,
            in_restore_point,
        }
    }

    #[test]
    fn advances_only_upwards_and_breaks_explicitly() {
        let tx = DurableTx::default();
        let mut rx = tx.subscribe();
        // Nothing published: a break says nothing.
        tx.break_chain("lost");
        assert!(!rx.has_changed().unwrap());
        tx.advance(at(5, false));
        tx.advance(at(4, true));
        assert_eq!(rx.borrow_and_update().position, Some(at(5, false)));
        tx.advance(at(5, true));
        assert_eq!(rx.borrow_and_update().position, Some(at(5, true)));
        tx.advance(at(5, false));
        assert!(!rx.has_changed().unwrap());
        tx.break_chain("the bucket lease expired");
        tx.advance(at(3, true));
        let d = rx.borrow_and_update().clone();
        assert_eq!(d.chain, 1);
        assert_eq!(d.position, Some(at(3, true)));
        assert_eq!(d.broken.as_deref(), Some("the bucket lease expired"));
    }

    #[test]
    fn a_gated_position_waits_for_its_release_and_a_break_drops_it() {
        let tx = DurableTx::default();
        let mut rx = tx.subscribe();
        tx.offer(at(1, false));
        assert_eq!(rx.borrow_and_update().position, Some(at(1, false)));
        tx.set_gated(true);
        tx.offer(at(3, false));
        tx.offer(at(2, true));
        assert!(tx.has_pending());
        assert!(!rx.has_changed().unwrap(), "published before its release");
        tx.release();
        assert_eq!(rx.borrow_and_update().position, Some(at(3, false)));
        assert!(!tx.has_pending());
        tx.offer(at(4, false));
        tx.break_chain("the bucket lease was taken over");
        tx.release();
        let d = rx.borrow_and_update().clone();
        assert_eq!(d.position, None, "a position held back crossed a break");
        assert_eq!(d.chain, 1);
    }
}

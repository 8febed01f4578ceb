//! [`PositionHandle`]: the engine's durable position, readable by another task or thread
//! without any engine lock (the in-process `WalSource` reads it).
//!
//! The engine publishes a new value only after the fsync it describes (and after rewriting
//! `wal.position`), so a reader never sees bytes that are not durable.

use tokio::sync::watch;

use crate::store::format::WalPosition;

/// A cheap, clonable, `Send + Sync` view of an engine's durable [`WalPosition`].
///
/// It outlives the engine: after the engine is dropped, [`get`](Self::get) keeps returning
/// the last position and [`changed`](Self::changed) returns `None`.
#[derive(Debug, Clone)]
pub struct PositionHandle {
    rx: watch::Receiver<WalPosition>,
}

impl PositionHandle {
    pub(super) fn new(rx: watch::Receiver<WalPosition>) -> Self {
        Self { rx }
    }

    /// The latest durable position.
    pub fn get(&self) -> WalPosition {
        *self.rx.borrow()
    }

    /// Waits for a position this handle has not yet returned from `changed` (values read
    /// with [`get`](Self::get) do not count) and returns it; `None` once the engine is gone.
    pub async fn changed(&mut self) -> Option<WalPosition> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }

    /// A watch receiver of the position, for `select!` loops.
    pub fn subscribe(&self) -> watch::Receiver<WalPosition> {
        self.rx.clone()
    }
}

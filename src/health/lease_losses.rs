//! [`LeaseLosses`]: how often a store lost its bucket lease lately, for health's reason 4.
//!
//! A lease taken from a store over and over (one bucket named by two spellings of its query,
//! two processes with one instance id) fails the sync nodes' waits at every loss, yet between
//! losses the store holds its lease again and looked healthy. So the runner records each loss
//! ([`LeaseLosses::lost`], the latest [`LEASE_LOSSES_UNHEALTHY`] instants), the supervisor
//! counts those within [`LEASE_LOSS_WINDOW`] at every evaluation ([`LeaseLosses::count`]), and
//! [`super::evaluate`] names [`LEASE_LOSSES_UNHEALTHY`] or more as unhealthy
//! ([`LeaseLosses::reason`]) until they age out.
//!
//! # What a crash leaves
//! Nothing: in memory only; a restarted process starts counting afresh.

use std::time::Duration;

use tokio::time::Instant;

/// How far back lease losses are counted.
pub const LEASE_LOSS_WINDOW: Duration = Duration::from_secs(600);
/// How many lease losses within [`LEASE_LOSS_WINDOW`] make a store unhealthy.
pub const LEASE_LOSSES_UNHEALTHY: usize = 3;

/// The latest lease losses of one store's runner (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseLosses {
    /// When the lease was lost, the latest [`LEASE_LOSSES_UNHEALTHY`] times at most.
    at: Vec<Instant>,
    /// Of those, within [`LEASE_LOSS_WINDOW`] of the last [`LeaseLosses::count`].
    recent: usize,
}

impl LeaseLosses {
    /// The lease was lost now.
    pub fn lost(&mut self) {
        let now = Instant::now();
        self.at.push(now);
        let excess = self.at.len().saturating_sub(LEASE_LOSSES_UNHEALTHY);
        self.at.drain(..excess);
        self.count(now);
    }

    /// Counts the losses within [`LEASE_LOSS_WINDOW`] of `now`.
    pub fn count(&mut self, now: Instant) {
        self.recent = self
            .at
            .iter()
            .filter(|t| now.saturating_duration_since(**t) < LEASE_LOSS_WINDOW)
            .count();
    }

    /// The losses within the window at the last count.
    pub fn recent(&self) -> usize {
        self.recent
    }

    /// The unhealthy reason, when [`LEASE_LOSSES_UNHEALTHY`] or more were recent.
    pub fn reason(&self) -> Option<String> {
        (self.recent >= LEASE_LOSSES_UNHEALTHY).then(|| {
            format!(
                "the bucket lease was lost {} times within {} s: another holder keeps taking \
                 it, or the instance lease fencing it keeps ending (one bucket named by two \
                 spellings of its query, or two processes with one instance id?)",
                self.recent,
                LEASE_LOSS_WINDOW.as_secs()
            )
        })
    }
}

impl super::RunnerStatus {
    /// The runner lost the lease now: `state` says how ([`crate::lease::LeaseState::Lost`]).
    pub fn lease_lost(&mut self, state: crate::lease::LeaseState) {
        self.lease = Some(state);
        self.lease_losses.lost();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LeaseState, Progress, RunnerStatus, evaluate};
    use super::*;

    /// Issue 40, finding 3: a lease lost over and over is named even while held again, until
    /// the losses age out of the window.
    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_repeatedly_is_unhealthy_until_the_losses_age_out() {
        let policy = super::super::HealthPolicy {
            wal_interval: Duration::from_secs(1),
            min_unhealthy_lag: Duration::from_secs(30),
            unhealthy_after_failures: 5,
        };
        let mut s = RunnerStatus {
            lease: Some(LeaseState::Holding),
            ..RunnerStatus::default()
        };
        for _ in 0..LEASE_LOSSES_UNHEALTHY - 1 {
            s.lease_losses.lost();
        }
        assert!(evaluate(&s, Progress::default(), &policy, "me").healthy);
        for _ in 0..5 {
            s.lease_losses.lost();
        }
        assert_eq!(s.lease_losses.at.len(), LEASE_LOSSES_UNHEALTHY);
        let h = evaluate(&s, Progress::default(), &policy, "me");
        assert!(!h.healthy);
        assert!(h.reason.contains("lost 3 times"), "{}", h.reason);
        tokio::time::advance(LEASE_LOSS_WINDOW).await;
        s.lease_losses.count(Instant::now());
        assert_eq!(s.lease_losses.recent(), 0);
        assert!(evaluate(&s, Progress::default(), &policy, "me").healthy);
    }
}

//! The renewal of this process's instance claim ([`keep_claim`]), a task of the fleet.

use std::sync::Arc;
use std::time::Duration;

use super::Fleet;
use crate::registry::ClaimError;

/// Renews the instance claim until shutdown; a claim another process took over cancels
/// [`Fleet::claim_lost`]. A registry out of reach is retried at the next tick: the claim goes
/// stale only after `stale_after` without a renewal.
pub(super) async fn keep_claim(fleet: Arc<Fleet>) {
    let period = (fleet.claim.stale_after() / 3)
        .min(fleet.config.health_report_interval)
        .max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = fleet.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match fleet.claim.renew().await {
            Ok(()) => {}
            Err(e @ ClaimError::Lost { .. }) => {
                let why = e.to_string();
                tracing::error!(instance_id = %fleet.config.instance_id, "{why}");
                *fleet.claim_lost_why.lock().expect("not poisoned") = Some(why);
                fleet.claim_lost.cancel();
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot renew the instance claim"),
        }
    }
}

//! `Pause` and `Resume`: an operator stops a store's uploads for a while, and lets them go on.
//!
//! A paused store's worker uploads nothing — no segment, archive, snapshot, manifest, LATEST,
//! retention delete, nor the last flush at shutdown — and keeps its bucket lease, so no
//! standby takes the prefix over (under the instance lease the store stays fenced by its
//! instance's). See `crate::worker` (`pause.rs`) for how the worker stops between steps.
//!
//! # What a call does
//!
//! - `Pause` checks its fields first (before the store is looked up, so a bad field is
//!   `INVALID_ARGUMENT` whichever store it names), then the store: unknown is `NOT_FOUND`,
//!   another instance's is `FAILED_PRECONDITION` naming the owner, as for every store-scoped
//!   call. It writes the pause to the registry, then pauses the worker and returns once no
//!   upload of the store is in flight. Pausing a paused store replaces its reason and
//!   deadline and keeps when it was paused.
//! - `Resume` deletes the registry's row, then resumes the worker, which steps at once from the
//!   bucket's state (continuity and lineage checks as after a restart; a new generation if
//!   the store's files moved on). Resuming a store that is not paused is OK.
//! - Both are audited (`pause`, `resume`) when they change something; a refused call is not
//!   (as for `Trigger`: it names no path and changes nothing).
//!
//! Calls are taken one at a time per service (a pause waits at most for a step's
//! `shutdown_grace`), so the registry and the worker never end up disagreeing after two calls
//! for one store race.
//!
//! # The fields
//!
//! - `reason`: at most [`MAX_REASON_BYTES`] bytes, no control character (so it prints on one
//!   line); surrounding whitespace is trimmed, and a blank one is stored as
//!   [`DEFAULT_REASON`] — a pause always says something in health.
//! - `until_unix_ms`: 0 is now + the server's default ([`PauseLimits::default`], `serve
//!   --pause-default-ms`, 1 h); otherwise it must be in the future and at most the server's
//!   maximum ([`PauseLimits::max`], `--pause-max-ms`, 24 h) from now. Negative, past (or
//!   now) and too far are `INVALID_ARGUMENT` naming `until_unix_ms`.
//!
//! # The deadline
//!
//! Within it the store is healthy and visibly paused (health's `paused`, a note, the
//! `mushroom_backup_store_paused` gauge). Past it the store is unhealthy, "paused past its
//! deadline", and **stays paused** until Resume: the deadline is an alarm, not a resume, so
//! that nobody's maintenance window is cut short by the clock, and a pause nobody ended is
//! seen instead of silently hiding a stopped backup.
//!
//! # What a crash leaves
//!
//! The registry is written before the worker is paused, and before it is resumed: a crash
//! between the two leaves the registry's word, which the next start follows (a store with a
//! pause row starts paused).

use crate::events::{EventKind, NewEvent};
use crate::health::{Pause, rfc3339_ms};
use crate::registry::PauseRecord;
pub use crate::service::config::limits::PauseLimits;
use crate::service::fleet::limits::{FieldError, check_text};
use crate::service::fleet::{Done, Fleet, FleetError, ReplicaEntry};
use crate::units::{millis_i64, unix_now_ms};

/// The longest reason accepted.
pub const MAX_REASON_BYTES: usize = 512;
/// What a pause with a blank reason says.
pub const DEFAULT_REASON: &str = "no reason given";

impl PauseLimits {
    /// The default must lie within the maximum.
    pub fn check(&self) -> Result<(), String> {
        if self.default > self.max {
            return Err(format!(
                "the default pause ({} ms, --pause-default-ms) is longer than the maximum ({} ms, \
                 --pause-max-ms)",
                self.default.as_millis(),
                self.max.as_millis()
            ));
        }
        Ok(())
    }
}

/// A `Pause` as it arrived.
#[derive(Debug, Clone)]
pub struct PauseAsk {
    pub reason: String,
    pub until_unix_ms: i64,
}

/// What a `Pause` did.
#[derive(Debug, Clone)]
pub struct Paused {
    pub pause: Pause,
    /// The store was paused already (its reason and deadline were replaced).
    pub was_paused: bool,
}

/// Checks a `Pause`'s fields at `now_ms`: the reason to store and the deadline.
pub fn check(
    ask: &PauseAsk,
    limits: &PauseLimits,
    now_ms: i64,
) -> Result<(String, i64), FieldError> {
    check_text("reason", &ask.reason, MAX_REASON_BYTES)?;
    let reason = match ask.reason.trim() {
        "" => DEFAULT_REASON.to_string(),
        r => r.to_string(),
    };
    let max_ms = millis_i64(limits.max);
    let until = match ask.until_unix_ms {
        0 => now_ms.saturating_add(millis_i64(limits.default)),
        t if t < 0 => {
            return Err(FieldError(format!(
                "until_unix_ms must not be negative (got {t}): it is milliseconds since the epoch, \
                 or 0 for the server's default pause of {} ms",
                millis_i64(limits.default)
            )));
        }
        t if t <= now_ms => {
            return Err(FieldError(format!(
                "until_unix_ms {t} ({}) is not in the future (now is {})",
                rfc3339_ms(t),
                rfc3339_ms(now_ms)
            )));
        }
        t if t - now_ms > max_ms => {
            return Err(FieldError(format!(
                "until_unix_ms {t} ({}) is beyond the server's maximum pause of {max_ms} ms from \
                 now (at most {}; serve --pause-max-ms)",
                rfc3339_ms(t),
                rfc3339_ms(now_ms.saturating_add(max_ms))
            )));
        }
        t => t,
    };
    Ok((reason, until))
}

/// Pause and Resume calls, one at a time (see the module docs).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `Pause` (see the module docs).
pub async fn pause(
    fleet: &Fleet,
    store_id: &str,
    ask: PauseAsk,
    peer: Option<String>,
) -> Result<Paused, FleetError> {
    let now = unix_now_ms();
    let (reason, until) = check(&ask, &fleet.config().pause, now)?;
    let _turn = ONE_AT_A_TIME.lock().await;
    let entry = fleet.get_owned(store_id).await?;
    let pause = Pause {
        reason,
        // A pause replaced goes on from when it began.
        paused_at_unix_ms: entry.handle.paused().map_or(now, |p| p.paused_at_unix_ms),
        until_unix_ms: until,
    };
    let record = PauseRecord {
        reason: pause.reason.clone(),
        paused_at_ms: pause.paused_at_unix_ms,
        until_ms: pause.until_unix_ms,
    };
    if !fleet.registry().set_pause(store_id, &record).await? {
        return Err(FleetError::UnknownStore(store_id.to_string()));
    }
    let was_paused = entry.handle.pause(pause.clone()).await;
    // The replica pauses with the store (its own gate; the primary does not wait for it).
    if let Some(h) = entry.replica.as_ref().and_then(ReplicaEntry::handle) {
        h.pause(pause.clone()).await;
    }
    let detail = format!(
        "until {} ({}): {}",
        rfc3339_ms(pause.until_unix_ms),
        if was_paused { "replaced" } else { "new" },
        pause.reason
    );
    tracing::info!(store_id, until = %rfc3339_ms(pause.until_unix_ms), reason = %pause.reason, was_paused, "paused a store");
    let again = if was_paused { " (pause replaced)" } else { "" };
    let event = NewEvent::new(
        EventKind::Paused,
        store_id,
        format!(
            "paused until {}{again}: {}",
            rfc3339_ms(pause.until_unix_ms),
            pause.reason
        ),
    );
    let done = Done::on("pause", &entry.record, detail, peer);
    fleet.record(done, Some(event)).await;
    Ok(Paused { pause, was_paused })
}

/// `Resume` (see the module docs): whether the store was paused.
pub async fn resume(
    fleet: &Fleet,
    store_id: &str,
    peer: Option<String>,
) -> Result<bool, FleetError> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let entry = fleet.get_owned(store_id).await?;
    let stored = fleet.registry().clear_pause(store_id).await?;
    let was_paused = entry.handle.resume().await || stored;
    if let Some(h) = entry.replica.as_ref().and_then(ReplicaEntry::handle) {
        h.resume().await;
    }
    if was_paused {
        tracing::info!(store_id, "resumed a store");
        let done = Done::on("resume", &entry.record, String::new(), peer);
        let event = NewEvent::new(EventKind::Resumed, store_id, "resumed");
        fleet.record(done, Some(event)).await;
    }
    Ok(was_paused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ask(reason: &str, until_unix_ms: i64) -> PauseAsk {
        PauseAsk {
            reason: reason.into(),
            until_unix_ms,
        }
    }

    #[test]
    fn the_fields_are_checked_and_defaulted() {
        let limits = PauseLimits::default();
        let now = 1_800_000_000_000;
        assert_eq!(
            check(&ask("  ", 0), &limits, now).unwrap(),
            (DEFAULT_REASON.to_string(), now + 3_600_000)
        );
        assert_eq!(
            check(&ask(" upgrade ", now + 1), &limits, now).unwrap(),
            ("upgrade".to_string(), now + 1)
        );
        let max = now + 24 * 3_600_000;
        assert_eq!(check(&ask("x", max), &limits, now).unwrap().1, max);
        for (until, fragment) in [
            (-1, "must not be negative"),
            (now, "not in the future"),
            (now - 5, "not in the future"),
            (max + 1, "beyond the server's maximum pause"),
            (i64::MAX, "beyond the server's maximum pause"),
        ] {
            let e = check(&ask("x", until), &limits, now).unwrap_err().0;
            assert!(
                e.contains("until_unix_ms") && e.contains(fragment),
                "{until}: {e}"
            );
        }
        let long = "r".repeat(MAX_REASON_BYTES + 1);
        let e = check(&ask(&long, 0), &limits, now).unwrap_err().0;
        assert!(e.contains("reason is longer than 512 bytes"), "{e}");
        let e = check(&ask("a\nb", 0), &limits, now).unwrap_err().0;
        assert!(
            e.contains("reason must not contain a control character"),
            "{e}"
        );
        assert!(
            PauseLimits {
                default: Duration::from_secs(2),
                max: Duration::from_secs(1)
            }
            .check()
            .is_err()
        );
    }
}

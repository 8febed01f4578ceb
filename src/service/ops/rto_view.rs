//! A local store's predicted restore times and running drill, as `Health` shows them
//! (`StoreHealth.predicted_rto_*`, `rto_target_seconds`, `drilling`, `activity`): the
//! prediction from the shapes the worker publishes and the rates kept for the destination's
//! endpoint (`crate::service::fleet::rto`), a note when it is over the store's target, and
//! the drill's progress from its restore's counters. Arithmetic on memory: no request, no
//! registry read.
//!
//! What a crash leaves: nothing; this is a view.

use crate::restore::progress::{Phase, ProgressLine};
use crate::service::fleet::{Fleet, StoreEntry, rto::Predicted};
use crate::service::proto;

/// The store's predicted restore times (see the module docs).
pub fn predicted(fleet: &Fleet, e: &StoreEntry) -> Predicted {
    let known = e.handle.counters().shapes.get();
    fleet.rto().predict(&e.record.destination, &known)
}

/// `h` with the prediction, its note over the target, and the drill running now.
pub(super) fn with_rto(
    mut h: proto::StoreHealth,
    fleet: &Fleet,
    e: &StoreEntry,
) -> proto::StoreHealth {
    let p = predicted(fleet, e);
    let target = e.options.rto_target_seconds.filter(|t| *t > 0);
    h.predicted_rto_seconds = p.latest;
    h.predicted_rto_worst_seconds = p.worst;
    h.rto_calibrated = p.calibrated;
    h.rto_target_seconds = target.unwrap_or(0);
    h.notes.extend(p.note(target));
    if let Some((line, predicted)) = fleet.rto().drilling(&e.record.store_id) {
        h.activity = format!("drilling: {}", drilling_text(&line));
        h.drilling = Some(drill_progress(&line, predicted));
    }
    h
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Plan => "plan",
        Phase::Download => "download",
        Phase::Finish => "finish",
        Phase::Done => "done",
    }
}

/// A running drill's line, for `activity`.
fn drilling_text(l: &ProgressLine) -> String {
    let eta = l
        .eta_seconds
        .map_or_else(|| "eta unknown".to_string(), |e| format!("eta {e:.0} s"));
    format!(
        "{} {} of {} bytes, {} of {} objects, {eta}",
        phase_name(l.phase),
        l.bytes_done,
        l.bytes_total,
        l.objects_done,
        l.objects_total
    )
}

/// `StoreHealth.drilling` from a running drill's line.
fn drill_progress(l: &ProgressLine, predicted: Option<f64>) -> proto::DrillProgress {
    proto::DrillProgress {
        phase: phase_name(l.phase).into(),
        bytes_done: l.bytes_done,
        bytes_total: l.bytes_total,
        objects_done: l.objects_done,
        objects_total: l.objects_total,
        elapsed_seconds: l.elapsed_seconds,
        rate_bytes_per_second: l.rate_bytes_per_second,
        eta_seconds: l.eta_seconds.unwrap_or(-1.0),
        predicted_seconds: predicted.unwrap_or(0.0),
    }
}

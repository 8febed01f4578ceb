//! `ctl drill STORE [--at SEQ]`: a restore drill (the service's `Drill`), and how `ctl health`
//! shows a store's last drill, its predicted restore times and a drill running now. A drill
//! that ran but failed prints its error and exits 1 (so a cron job or a CI step fails on it); a
//! call the service refused exits 1 with the call's code.
//!
//! While the `Drill` call runs and stderr is a terminal, a bar on stderr shows the drill's
//! progress: `Health` of the store every [`POLL`], its `drilling` (bytes done and total, the
//! ETA). A poll that fails leaves the bar as it was; the drill's answer is what counts.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::proto;

use super::client::{Ctl, failed, print};

/// `ctl drill`: whether the drill succeeded.
pub(super) async fn drill(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    at: Option<u64>,
) -> anyhow::Result<bool> {
    let req = proto::DrillRequest {
        store_id: store_id.clone(),
        at_commit_seq: at.unwrap_or(0),
    };
    // A drill restores a whole store: the service bounds it (its adopt_timeout), not --timeout-ms.
    let mut client = ctl.client.clone();
    let call = client.drill(ctl.request(req, false));
    let r = match std::io::stderr().is_terminal() {
        true => {
            tokio::pin!(call);
            let bar = ProgressBar::new(0).with_style(
                ProgressStyle::with_template(
                    "drilling [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            let mut tick = tokio::time::interval(POLL);
            let r = loop {
                tokio::select! {
                    r = &mut call => break r,
                    _ = tick.tick() => show(ctl, &store_id, &bar).await,
                }
            };
            bar.finish_and_clear();
            r
        }
        false => call.await,
    };
    let r = r.map_err(|s| failed("Drill", s))?.into_inner();
    print(
        j,
        json!({
            "store_id": store_id,
            "ok": r.ok,
            "commit_seq": r.commit_seq,
            "manifest_key": r.manifest_key,
            "duration_ms": r.duration_ms,
            "bytes": r.bytes,
            "error": r.error,
            "finished_at_unix_ms": r.finished_at_unix_ms,
            "predicted_seconds": r.predicted_seconds,
            "seconds": r.seconds,
        }),
        if r.ok {
            format!(
                "drill of store {store_id} succeeded: commit {} from {} restored and checked in \
                 {} ms ({} bytes; predicted {:.1} s)",
                r.commit_seq, r.manifest_key, r.duration_ms, r.bytes, r.predicted_seconds
            )
        } else {
            format!("drill of store {store_id} FAILED: {}", r.error)
        },
    )?;
    Ok(r.ok)
}

/// `last_drill` of `ctl health --json`.
pub(super) fn last_drill_json(d: Option<&proto::DrillResult>) -> Value {
    match d {
        None => Value::Null,
        Some(d) => json!({
            "ok": d.ok,
            "commit_seq": d.commit_seq,
            "manifest_key": d.manifest_key,
            "duration_ms": d.duration_ms,
            "bytes": d.bytes,
            "error": d.error,
            "finished_at_unix_ms": d.finished_at_unix_ms,
            "last_ok_at_unix_ms": d.last_ok_at_unix_ms,
            "predicted_ms": d.predicted_ms,
        }),
    }
}

/// How often `ctl drill` asks how far the drill is (see the module docs).
pub(super) const POLL: Duration = Duration::from_millis(500);

/// One poll of the store's health into `bar`.
async fn show(ctl: &mut Ctl, store_id: &str, bar: &ProgressBar) {
    let Ok(h) = ctl.health(Some(store_id.to_string()), false).await else {
        return;
    };
    let Some(d) = h.stores.first().and_then(|s| s.drilling.as_ref()) else {
        return;
    };
    bar.set_length(d.bytes_total);
    bar.set_position(d.bytes_done);
    bar.set_message(match d.eta_seconds >= 0.0 {
        true => format!("{} eta {:.0} s", d.phase, d.eta_seconds),
        false => d.phase.clone(),
    });
}

/// `drilling` of `ctl health --json`: a drill running now.
pub(super) fn drilling_json(d: &proto::DrillProgress) -> Value {
    json!({
        "phase": d.phase,
        "bytes_done": d.bytes_done,
        "bytes_total": d.bytes_total,
        "objects_done": d.objects_done,
        "objects_total": d.objects_total,
        "elapsed_seconds": d.elapsed_seconds,
        "rate_bytes_per_second": d.rate_bytes_per_second,
        "eta_seconds": (d.eta_seconds >= 0.0).then_some(d.eta_seconds),
        "predicted_seconds": d.predicted_seconds,
    })
}

/// The lines `ctl health` prints of a store's predicted restore times and a drill running.
pub(super) fn rto_text(s: &proto::StoreHealth) -> String {
    let mut out = String::new();
    if s.predicted_rto_seconds > 0.0 {
        out.push_str(&format!(
            "\n  predicted restore {:.1} s (worst retained {:.1} s){}{}",
            s.predicted_rto_seconds,
            s.predicted_rto_worst_seconds,
            match s.rto_calibrated {
                true => "",
                false => ", uncalibrated: default rates until a drill",
            },
            match s.rto_target_seconds {
                0 => String::new(),
                t => format!(", target {t} s"),
            }
        ));
    }
    if let Some(d) = &s.drilling {
        out.push_str(&format!(
            "\n  drilling: {} {} of {} bytes{}",
            d.phase,
            d.bytes_done,
            d.bytes_total,
            match d.eta_seconds >= 0.0 {
                true => format!(", eta {:.0} s", d.eta_seconds),
                false => String::new(),
            }
        ));
    }
    out
}

/// The line `ctl health` prints for a store's last drill (empty: never drilled).
pub(super) fn last_drill_text(d: Option<&proto::DrillResult>) -> String {
    match d {
        None => String::new(),
        Some(d) if d.ok => format!(
            "\n  last drill: ok at {} (commit {}, {} ms, {} bytes)",
            rfc3339_ms(d.finished_at_unix_ms),
            d.commit_seq,
            d.duration_ms,
            d.bytes
        ),
        Some(d) => format!(
            "\n  last drill: FAILED at {}: {}",
            rfc3339_ms(d.finished_at_unix_ms),
            d.error
        ),
    }
}

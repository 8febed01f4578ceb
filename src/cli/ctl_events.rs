//! `ctl watch-events [--store ID] [--count N]`: one line per event until interrupted,
//! `TIME KIND STORE DETAIL` (and `trace=…` when the work that caused it was traced), or one
//! JSON object per line with `--json`. A `lagged` line says how many events this watcher
//! missed (it read too slowly); the stream goes on after it.

use clap::Args;
use serde_json::{Value, json};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::proto;

use super::{Ctl, failed, print};

#[derive(Args)]
pub(super) struct WatchEventsArgs {
    /// Only this store's events [default: every store's].
    #[arg(long)]
    store: Option<String>,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
}

pub(super) async fn watch_events(ctl: &mut Ctl, j: bool, a: WatchEventsArgs) -> anyhow::Result<()> {
    let req = proto::WatchEventsRequest {
        store_id: a.store.unwrap_or_default(),
    };
    let mut stream = ctl
        .client
        .watch_events(ctl.request(req, false))
        .await
        .map_err(|s| failed("WatchEvents", s))?
        .into_inner();
    let mut seen = 0u64;
    while a.count.is_none_or(|c| seen < c) {
        match stream.message().await {
            Ok(Some(e)) => {
                seen += 1;
                print(j, event_json(&e), event_text(&e))?;
            }
            Ok(None) => break,
            Err(s) => return Err(failed("WatchEvents", s)),
        }
    }
    Ok(())
}

fn event_json(e: &proto::BackupEvent) -> Value {
    let mut v = json!({
        "seq": e.seq,
        "id": e.id,
        "kind": e.kind_name,
        "store_id": e.store_id,
        "time": rfc3339_ms(e.time_unix_ms),
        "detail": e.detail,
    });
    let o = v.as_object_mut().expect("an object");
    let mut put = |k: &str, x: Value| {
        o.insert(k.into(), x);
    };
    if !e.trace_id.is_empty() {
        put("trace_id", e.trace_id.clone().into());
    }
    use proto::EventKind as K;
    match K::try_from(e.kind).unwrap_or(K::Unspecified) {
        K::RestorePointWritten => put("commit_seq", e.commit_seq.into()),
        K::GenerationStarted => put("generation", e.generation.into()),
        K::RetentionDeleted | K::BudgetExceeded => put("count", e.count.into()),
        K::HealthChanged => put("healthy", e.healthy.into()),
        K::Lagged => put("dropped", e.dropped.into()),
        K::DrillFinished => {
            put("ok", e.ok.into());
            put("commit_seq", e.commit_seq.into());
            put("duration_ms", e.duration_ms.into());
            put("bytes", e.bytes.into());
        }
        _ => {}
    }
    v
}

fn event_text(e: &proto::BackupEvent) -> String {
    let store = if e.store_id.is_empty() {
        "-"
    } else {
        &e.store_id
    };
    let mut line = format!(
        "{} {} {store} {}",
        rfc3339_ms(e.time_unix_ms),
        e.kind_name,
        e.detail
    );
    if !e.trace_id.is_empty() {
        line.push_str(&format!(" trace={}", e.trace_id));
    }
    line
}

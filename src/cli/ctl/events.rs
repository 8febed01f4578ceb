//! `ctl watch-events [--store ID] [--after POS] [--count N] [--timeout-ms MS]`: one line per
//! event, `POSITION ID TIME KIND STORE DETAIL` (and `trace=…` when the work that caused it was
//! traced; `-` for a position or id an event has none of), or one JSON object per line with
//! `--json` (`position`, `id`, `seq`, `kind`, …). Without `--after` it hears what happens from
//! now on; a `lagged` line says how many events this watcher missed (it read too slowly), and
//! the stream goes on after it. With `--after POS` it first prints everything in the fleet's
//! event log after position POS (0: from the oldest kept), then goes on live: give it the last
//! position printed to resume without a gap or a duplicate; a `pruned` line says positions
//! were dropped from the log before they could be read. It ends after `--count` events, or
//! `--timeout-ms` after it started (exit 0 either way: the events it printed are all it
//! heard), or when the server ends the stream.

use clap::Args;
use serde_json::{Value, json};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::proto;

use super::client::{Ctl, failed, print};

#[derive(Args)]
pub(super) struct WatchEventsArgs {
    /// Only this store's events [default: every store's].
    #[arg(long)]
    store: Option<String>,
    /// Resume from the fleet's event log after this position (the last one printed; 0: from
    /// the oldest kept), then go on live [default: live only].
    #[arg(long)]
    after: Option<u64>,
    /// Stop after this many events (1 or more).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Stop this long after starting, ms (1 to 86400000; exit 0) [default: no end].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    timeout_ms: Option<u64>,
}

pub(super) async fn watch_events(ctl: &mut Ctl, j: bool, a: WatchEventsArgs) -> anyhow::Result<()> {
    let req = proto::WatchEventsRequest {
        store_id: a.store.unwrap_or_default(),
        after: a.after,
    };
    let until = a
        .timeout_ms
        .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
    let ended = async {
        match until {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(ended);
    let mut stream = tokio::select! {
        s = ctl.client.watch_events(ctl.request(req, false)) => {
            s.map_err(|s| failed("WatchEvents", s))?.into_inner()
        }
        _ = &mut ended => return Ok(()),
    };
    let mut seen = 0u64;
    while a.count.is_none_or(|c| seen < c) {
        let next = tokio::select! {
            m = stream.message() => m,
            _ = &mut ended => break,
        };
        match next {
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
        "position": e.position,
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
        K::RestorePointWritten | K::Promoted => put("commit_seq", e.commit_seq.into()),
        K::GenerationStarted => put("generation", e.generation.into()),
        K::RetentionDeleted | K::BudgetExceeded => put("count", e.count.into()),
        K::HealthChanged => put("healthy", e.healthy.into()),
        K::Lagged | K::Pruned => put("dropped", e.dropped.into()),
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
    let position = match e.position {
        0 => "-".to_string(),
        p => p.to_string(),
    };
    let id = if e.id.is_empty() { "-" } else { &e.id };
    let mut line = format!(
        "{position} {id} {} {} {store} {}",
        rfc3339_ms(e.time_unix_ms),
        e.kind_name,
        e.detail
    );
    if !e.trace_id.is_empty() {
        line.push_str(&format!(" trace={}", e.trace_id));
    }
    line
}

//! The fleet's event log in the registry (`registry::events`, `registry::webhook_cursor`), on
//! SQLite and PostgreSQL alike: positions only grow and come back in order, one store's or
//! every store's; pruning by age and by count from the oldest end, and the oldest available
//! position known even when every row is gone; webhook cursors claimed by one holder at a
//! time, taken over once the hold lapsed, moved only forward and only by their holder. Two
//! handles appending at once (two instances) never make a reader that tails the log miss a
//! position. And the cost of a start's burst: 10,000 events appended in batches.

mod support;

use std::time::Instant;

use mushroom_backup::registry::{EventRow, EventSpan, Registry};
use support::registry::{PgDatabase, postgres_server, sqlite_registry};

both_backends!(
    positions_grow_and_read_back_in_order,
    pruning_by_age_and_count_keeps_the_newest_and_knows_the_oldest,
    a_webhook_cursor_has_one_holder_and_only_moves_forward,
    ten_thousand_events_in_batches,
);

fn rows(store: &str, at_ms: i64, n: usize) -> Vec<EventRow> {
    (0..n)
        .map(|i| EventRow {
            id: uuid::Uuid::new_v4().to_string(),
            store_id: store.to_string(),
            at_ms: at_ms + i as i64,
            body: format!("{{\"n\":{i}}}"),
        })
        .collect()
}

mod suite {
    use super::*;

    pub async fn positions_grow_and_read_back_in_order(reg: Registry) {
        assert_eq!(reg.event_span().await.unwrap(), EventSpan::default());
        assert!(reg.append_events(&[]).await.unwrap().is_empty());
        let a = rows("a", 1000, 3);
        let pa = reg.append_events(&a).await.unwrap();
        let pb = reg.append_events(&rows("b", 2000, 2)).await.unwrap();
        let all: Vec<u64> = pa.iter().chain(&pb).copied().collect();
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
        let read = reg.events_after(0, None, 100).await.unwrap();
        assert_eq!(read.iter().map(|e| e.position).collect::<Vec<_>>(), all);
        assert_eq!(read[0].row, a[0], "a row reads back as written");
        let after = reg.events_after(pa[1], None, 2).await.unwrap();
        assert_eq!(
            after.iter().map(|e| e.position).collect::<Vec<_>>(),
            [pa[2], pb[0]],
            "after a position, at most the limit"
        );
        let b = reg.events_after(0, Some("b"), 100).await.unwrap();
        assert_eq!(b.iter().map(|e| e.position).collect::<Vec<_>>(), pb);
        assert!(reg.has_events_of("a").await.unwrap());
        assert!(!reg.has_events_of("c").await.unwrap());
        let span = reg.event_span().await.unwrap();
        assert_eq!((span.pruned_through, span.last), (0, pb[1]));
        assert_eq!(span.oldest_available(), 1);
        // An id is the event's: the log refuses it twice, and the batch is not half written.
        let dup = vec![rows("c", 1, 1).remove(0), a[0].clone()];
        assert!(reg.append_events(&dup).await.is_err());
        assert!(!reg.has_events_of("c").await.unwrap(), "all or nothing");
    }

    pub async fn pruning_by_age_and_count_keeps_the_newest_and_knows_the_oldest(reg: Registry) {
        let p = reg.append_events(&rows("s", 1000, 10)).await.unwrap();
        // Nothing older than 500, at most 100: nothing goes.
        assert_eq!(reg.prune_events(500, 100).await.unwrap(), 0);
        // Older than 1003 (at 1000, 1001, 1002) go.
        assert_eq!(reg.prune_events(1003, 100).await.unwrap(), 3);
        let span = reg.event_span().await.unwrap();
        assert_eq!(span.pruned_through, p[2]);
        assert_eq!(span.oldest_available(), p[3]);
        // All but the newest 4.
        assert_eq!(reg.prune_events(0, 4).await.unwrap(), 3);
        let kept = reg.events_after(0, None, 100).await.unwrap();
        assert_eq!(
            kept.iter().map(|e| e.position).collect::<Vec<_>>(),
            p[6..].to_vec()
        );
        // Everything gone: the span still says which positions are.
        assert_eq!(reg.prune_events(i64::MAX, 1000).await.unwrap(), 4);
        let span = reg.event_span().await.unwrap();
        assert_eq!((span.pruned_through, span.last), (p[9], p[9]));
        // Positions are never reused.
        let next = reg.append_events(&rows("s", 5000, 1)).await.unwrap();
        assert!(next[0] > p[9], "{next:?} after {p:?}");
    }

    pub async fn a_webhook_cursor_has_one_holder_and_only_moves_forward(reg: Registry) {
        reg.init_webhook_cursor("k", "h:80", 7).await.unwrap();
        reg.init_webhook_cursor("k", "h:80", 99).await.unwrap();
        assert_eq!(reg.claim_webhook("nope", "a", 0, 10).await.unwrap(), None);
        assert_eq!(
            reg.claim_webhook("k", "a", 100, 200).await.unwrap(),
            Some(7),
            "an existing cursor stays"
        );
        // b waits while a's hold lasts; a keeps it.
        assert_eq!(reg.claim_webhook("k", "b", 150, 250).await.unwrap(), None);
        assert_eq!(
            reg.claim_webhook("k", "a", 150, 250).await.unwrap(),
            Some(7)
        );
        assert!(reg.webhook_delivered("k", "a", 12, 300).await.unwrap());
        assert!(
            !reg.webhook_delivered("k", "b", 50, 300).await.unwrap(),
            "not b's"
        );
        assert!(reg.webhook_delivered("k", "a", 9, 300).await.unwrap());
        // The hold lapsed: b takes over where a left it (never back).
        assert_eq!(
            reg.claim_webhook("k", "b", 301, 400).await.unwrap(),
            Some(12)
        );
        assert!(
            !reg.webhook_delivered("k", "a", 13, 500).await.unwrap(),
            "a lost it"
        );
        // Given up, it is anyone's at once.
        reg.release_webhook("k", "b").await.unwrap();
        assert_eq!(
            reg.claim_webhook("k", "a", 302, 400).await.unwrap(),
            Some(12)
        );
    }

    pub async fn ten_thousand_events_in_batches(reg: Registry) {
        let kind = reg.kind();
        let all = rows("s", 1, 10_000);
        let start = Instant::now();
        let mut last = 0;
        for batch in all.chunks(mushroom_backup::events::journal::BATCH) {
            let p = reg.append_events(batch).await.unwrap();
            assert!(p[0] > last);
            last = *p.last().unwrap();
        }
        let took = start.elapsed();
        println!(
            "{kind}: 10,000 events appended in batches of {} in {} ms",
            mushroom_backup::events::journal::BATCH,
            took.as_millis()
        );
        let mut read = 0;
        let mut after = 0;
        loop {
            let page = reg.events_after(after, None, 1000).await.unwrap();
            let Some(l) = page.last() else { break };
            after = l.position;
            read += page.len();
        }
        assert_eq!(read, 10_000);
    }
}

/// Two handles (two instances) append at once while a third tails the log: the reader never
/// sees a position appear below one it has already read past.
async fn concurrent_appends_never_open_a_gap_behind_a_reader(
    a: Registry,
    b: Registry,
    r: Registry,
) {
    let write = |reg: Registry, store: &'static str| async move {
        for _ in 0..40 {
            reg.append_events(&rows(store, 1, 5)).await.unwrap();
        }
    };
    let read = async {
        let mut seen = Vec::new();
        let mut after = 0;
        while seen.len() < 400 {
            for e in r.events_after(after, None, 1000).await.unwrap() {
                after = e.position;
                seen.push(e.position);
            }
        }
        seen
    };
    let (_, _, seen) = tokio::join!(write(a, "a"), write(b, "b"), read);
    let mut everything: Vec<u64> = r
        .events_after(0, None, 1000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.position)
        .collect();
    everything.sort();
    assert_eq!(seen, everything, "the tail saw every position, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_never_open_a_gap_behind_a_reader_on_sqlite() {
    let (_dir, url, a) = sqlite_registry().await;
    let b = Registry::open(&url).await.unwrap();
    let r = Registry::open(&url).await.unwrap();
    concurrent_appends_never_open_a_gap_behind_a_reader(a, b, r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_never_open_a_gap_behind_a_reader_on_postgres() {
    let Some(server) = postgres_server() else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let open = || async { Registry::open(&db.url).await.unwrap() };
    let (a, b, r) = (open().await, open().await, open().await);
    concurrent_appends_never_open_a_gap_behind_a_reader(a.clone(), b.clone(), r.clone()).await;
    for reg in [a, b, r] {
        reg.close().await;
    }
    db.drop_database().await;
}

//! Where forwarded calls go when a store's owner changes, and streams relayed to the owner
//! (issue 15; `src/service/forward.rs`, `owner_cache.rs`, `forward_stream.rs`): real `serve`
//! processes on one PostgreSQL registry, real gRPC between them.
//!
//! - A non-owner remembers a store's owner (the owner cache). When the registry row changes
//!   under a warm cache, the next call through it still reaches the new owner: the old owner
//!   disowns the store (`FAILED_PRECONDITION`) or cannot be reached, and the call is retried
//!   once where the registry now says.
//! - `WatchHealth` and `WatchEvents` of one store through a non-owner are the owner's own
//!   streams (they take the owner's watcher slot, and free it when the caller goes away); an
//!   owner that dies ends them with `UNAVAILABLE` naming it.
//!
//! Needs `MUSHROOM_TEST_POSTGRES_URL` (`scripts/test.sh` starts a server); without it a SKIP
//! line, except under `CI=true`, where it fails.

mod support;

use mushroom_backup::service::proto;
use sqlx::{Connection, PgConnection};
use support::binary::write_store;
use support::instances::Fleet;
use support::served::{Client, DEADLINE};
use tonic::Code;

/// Points the registry row of `store_id` at `owner`, as a failover claim or a move would.
async fn set_owner(url: &str, store_id: &str, owner: &str) {
    let mut db = PgConnection::connect(url).await.expect("connect");
    let changed = sqlx::query("UPDATE stores SET instance_id = $1 WHERE store_id = $2")
        .bind(owner)
        .bind(store_id)
        .execute(&mut db)
        .await
        .expect("update the store's owner")
        .rows_affected();
    assert_eq!(changed, 1, "no registry row for store {store_id}");
    db.close().await.ok();
}

async fn trigger(c: &mut Client, id: &str) -> Result<(), tonic::Status> {
    c.trigger(proto::TriggerRequest {
        store_id: id.to_string(),
        kind: proto::TriggerKind::Ship as i32,
    })
    .await
    .map(|_| ())
}

/// The instance whose own view of the store answers a fresh `Health` through `c`.
async fn fresh_owner(c: &mut Client, id: &str) -> String {
    let h = c
        .health(proto::HealthRequest {
            store_id: id.to_string(),
            fresh: true,
        })
        .await
        .expect("fresh Health")
        .into_inner();
    h.stores[0].instance_id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_through_a_warm_owner_cache_reaches_the_new_owner() {
    let Some(fleet) = Fleet::create("forward_routes_cache").await else {
        return;
    };
    let (db, shared_root, bucket) = (&fleet.db, &fleet.shared_root, &fleet.bucket);
    let store = shared_root.join("s1");
    write_store(&store, 10);

    let mut a = fleet.start("a", &[]);
    let mut b = fleet.start("b", &[]);
    // c remembers an owner for a minute: the cache is surely warm for every step below.
    let c = fleet.start("c", &["--owner-cache-ms", "60000"]);
    let mut cc = c.client().await;

    let id = a
        .client()
        .await
        .register(support::register_req(&store, &support::file_url(bucket)))
        .await
        .unwrap_or_else(|e| a.child.fail(&format!("Register on a: {e}")))
        .into_inner()
        .store_id;
    // Through c: c reads the registry once and remembers a.
    trigger(&mut cc, &id)
        .await
        .unwrap_or_else(|e| c.child.fail(&format!("Trigger through c: {e}")));
    assert_eq!(fresh_owner(&mut cc, &id).await, "a");

    // The store moves to b while c remembers a, and a comes back where it was (on the same
    // address), no longer running the store: a disowns it, and c retries at b.
    b.stop();
    a.stop();
    set_owner(&db.url, &id, "b").await;
    b.start_again(false);
    a.start_again(true);
    trigger(&mut cc, &id).await.unwrap_or_else(|e| {
        c.child
            .fail(&format!("Trigger through c after the move to b: {e}"))
    });
    assert_eq!(fresh_owner(&mut cc, &id).await, "b");

    // The store moves back to a (on a new address) while c remembers b, which is gone: c
    // cannot reach b, reads the registry again, and reaches a.
    b.stop();
    a.stop();
    set_owner(&db.url, &id, "a").await;
    a.start_again(false);
    trigger(&mut cc, &id).await.unwrap_or_else(|e| {
        c.child
            .fail(&format!("Trigger through c after the move back to a: {e}"))
    });
    assert_eq!(fresh_owner(&mut cc, &id).await, "a");

    // An owner that is gone for good (the registry still names it) is UNAVAILABLE naming it.
    a.stop();
    let gone = trigger(&mut cc, &id)
        .await
        .expect_err("a Trigger for a store whose owner is gone");
    assert_eq!(gone.code(), Code::Unavailable, "{gone:?}");
    assert!(gone.message().contains("instance a"), "{gone:?}");

    drop((a, b, c));
    fleet.db.drop_database().await;
}

async fn watch_health(
    c: &mut Client,
    id: &str,
) -> Result<tonic::Streaming<proto::HealthResponse>, tonic::Status> {
    c.watch_health(proto::HealthRequest {
        store_id: id.to_string(),
        fresh: false,
    })
    .await
    .map(|r| r.into_inner())
}

async fn watch_events(
    c: &mut Client,
    id: &str,
) -> Result<tonic::Streaming<proto::BackupEvent>, tonic::Status> {
    c.watch_events(proto::WatchEventsRequest {
        store_id: id.to_string(),
        after: None,
    })
    .await
    .map(|r| r.into_inner())
}

/// The next message of a stream, or the status it ended with (`None`: it ended cleanly).
async fn next<M>(s: &mut tonic::Streaming<M>) -> Result<Option<M>, tonic::Status> {
    tokio::time::timeout(DEADLINE, s.message())
        .await
        .expect("a message or the stream's end in time")
}

/// Waits until `open` succeeds at the owner (its slot freed), dropping what it opened.
async fn slot_freed<F, Fut, T>(what: &str, open: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    support::wait_for(DEADLINE, what, || {
        let opened = open();
        async move {
            opened
                .await
                .map(drop)
                .map_err(|e| format!("still refused: {e}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watches_of_one_store_through_a_non_owner_are_the_owners_streams() {
    let Some(fleet) = Fleet::create("forward_routes_watch").await else {
        return;
    };
    let (shared_root, bucket) = (&fleet.shared_root, &fleet.bucket);
    let store = shared_root.join("s1");
    write_store(&store, 10);

    // a serves one watcher of each kind: a relayed watch takes a's only slot.
    let mut a = fleet.start("a", &["--max-health-watchers", "1"]);
    let c = fleet.start("c", &[]);
    let mut ca = a.client().await;
    let mut cc = c.client().await;
    let id = ca
        .register(support::register_req(&store, &support::file_url(bucket)))
        .await
        .unwrap_or_else(|e| a.child.fail(&format!("Register on a: {e}")))
        .into_inner()
        .store_id;

    // WatchHealth through c is a's stream: it holds a's slot until the caller drops it.
    let mut health = watch_health(&mut cc, &id)
        .await
        .unwrap_or_else(|e| c.child.fail(&format!("WatchHealth through c: {e}")));
    let first = next(&mut health).await.unwrap().expect("a first health");
    assert_eq!(first.stores[0].store_id, id, "{first:?}");
    assert_eq!(first.stores[0].instance_id, "a", "{first:?}");
    let full = watch_health(&mut ca, &id)
        .await
        .expect_err("a second WatchHealth on a, whose one slot the relay holds");
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    drop(health);
    slot_freed(
        "a's WatchHealth slot to be freed once c's caller left",
        || {
            let mut ca = ca.clone();
            let id = id.clone();
            async move { watch_health(&mut ca, &id).await }
        },
    )
    .await;

    // WatchEvents of a's store through c (refused before: c does not run it) is a's stream:
    // a Pause through c shows on it, and it holds a's slot.
    let mut events = watch_events(&mut cc, &id)
        .await
        .unwrap_or_else(|e| c.child.fail(&format!("WatchEvents through c: {e}")));
    let full = watch_events(&mut ca, &id)
        .await
        .expect_err("a second WatchEvents on a, whose one slot the relay holds");
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    cc.pause(proto::PauseRequest {
        store_id: id.clone(),
        reason: "maintenance window".into(),
        until_unix_ms: 0,
    })
    .await
    .unwrap_or_else(|e| c.child.fail(&format!("Pause through c: {e}")));
    loop {
        let e = next(&mut events)
            .await
            .unwrap_or_else(|s| panic!("the relayed WatchEvents ended: {s:?}"))
            .expect("the relayed WatchEvents ended");
        assert_eq!(e.store_id, id, "{e:?}");
        if e.kind == proto::EventKind::Paused as i32 {
            assert!(e.detail.contains("maintenance window"), "{e:?}");
            break;
        }
    }

    // a dies: the relayed stream ends UNAVAILABLE naming a, and so does a new watch.
    a.child.kill();
    let lost = loop {
        match next(&mut events).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the relayed WatchEvents ended cleanly when a died"),
            Err(s) => break s,
        }
    };
    assert_eq!(lost.code(), Code::Unavailable, "{lost:?}");
    assert!(lost.message().contains("instance a"), "{lost:?}");
    let refused = watch_events(&mut cc, &id)
        .await
        .expect_err("WatchEvents through c of a dead owner's store");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("instance a"), "{refused:?}");
    let refused = watch_health(&mut cc, &id)
        .await
        .expect_err("WatchHealth through c of a dead owner's store");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("instance a"), "{refused:?}");

    drop((a, c));
    fleet.db.drop_database().await;
}

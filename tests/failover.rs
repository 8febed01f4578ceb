//! Failover groups (issue 15 part 4): three real `serve` processes of one failover group on
//! one PostgreSQL registry, store directories visible to all; when the owner is SIGKILLed its
//! stores are claimed by the survivors (exactly one each), the bucket lease keeps one writer
//! through the handover, a node reporting to a survivor keeps writing, and a restore
//! afterwards holds every commit the node wrote. And the claim itself: two claimants racing
//! for many stores on each backend, exactly one winner each.
//!
//! Needs `MUSHROOM_TEST_POSTGRES_URL` (`scripts/test.sh` starts a server); without it a SKIP
//! line, except under `CI=true`, where it fails.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use mushroom_backup::registry::{Claimed, Registry, StoreRecord};
use mushroom_backup::service::proto;
use support::binary::{self, write_store};
use support::instances::Fleet;
use support::served::{self, Client};

/// Every member's settings: a short silence limit and lease TTL, so the test is quick.
const GROUP: &[&str] = &support::instances::group_member("2000");

/// Fresh health of one store, asked of `c` (forwarded to the owner).
async fn fresh(c: &Client, id: &str) -> Result<proto::StoreHealth, String> {
    served::health(c, id, true).await
}

/// A node writing 300 commits into `dir` at 40 a second, reporting to `server`; the thread
/// ends with the node (its run checked).
fn steady_node(
    dir: &Path,
    server: SocketAddr,
    store_id: &str,
    token: &str,
) -> std::thread::JoinHandle<String> {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.arg("node")
        .arg("--store")
        .arg(dir)
        .args([
            "--server",
            &format!("http://{server}"),
            "--store-id",
            store_id,
        ])
        .args([
            "--commits",
            "300",
            "--rate",
            "40",
            "--flush-timeout-ms",
            "120000",
        ])
        .env("MUSHROOMDB_BACKUP_NODE_TOKEN", token);
    std::thread::spawn(move || binary::run_ok("node", cmd, Duration::from_secs(300)))
}

/// Waits until the owner of `id`, asked fresh through `c`, has shipped commit `n`.
async fn wait_shipped(c: &Client, id: &str, n: u64) {
    served::wait_health_as(c, id, true, "the owner to ship the node's commits", |h| {
        h.shipped_commit_seq >= n
    })
    .await;
}

/// Every store's owner, as `ListStores` through `c` says: each once, owned since it was
/// registered or later.
async fn owners(c: &Client) -> BTreeMap<String, String> {
    let listed = served::list_stores(c).await;
    let n = listed.len();
    let owners: BTreeMap<String, String> = listed
        .into_iter()
        .map(|s| {
            assert!(s.owner_since_unix_ms >= s.registered_at_unix_ms, "{s:?}");
            (s.store_id, s.owner_instance_id)
        })
        .collect();
    assert_eq!(owners.len(), n, "a store listed twice: {owners:?}");
    owners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_owners_stores_are_claimed_by_its_group_and_lose_no_commit() {
    let Some(fleet) = Fleet::create("failover_test").await else {
        return;
    };
    let (base, shared_root, bucket) = (&fleet.base, &fleet.shared_root, &fleet.bucket);
    let mut a = fleet.start("a", GROUP);
    let b = fleet.start("b", GROUP);
    let c = fleet.start("c", GROUP);
    let ca = served::client(a.addr).await;
    let cb = served::client(b.addr).await;
    let cc = served::client(c.addr).await;
    let (events_b, events_c) = (record_events(&cb), record_events(&cc));

    // Four stores on a, each with a restore point.
    let mut stores = Vec::new();
    for i in 0..4 {
        let dir = shared_root.join(format!("s{i}"));
        write_store(&dir, 20);
        let dest = support::file_url(&bucket.join(format!("s{i}")));
        let r = a.register(support::register_req(&dir, &dest)).await;
        stores.push((r.store_id, r.node_token, dir, dest));
    }
    // And one in a's own root, which b and c do not see: it stays a's.
    let private = a.register_own_store("private", 5, bucket).await;
    for (id, ..) in &stores {
        served::wait_health(&ca, id, "a restore point on a", |h| {
            h.healthy && h.restore_point_commit_seq >= 20 && h.instance_id == "a"
        })
        .await;
    }

    // A node writes into s0 at a steady rate, reporting to b (which relays to a, the owner).
    let (s0, token, s0_dir, s0_dest) = stores[0].clone();
    let node = steady_node(&s0_dir, b.addr, &s0, &token);
    wait_shipped(&cb, &s0, 40).await;

    // SIGKILL a: every one of its stores turns healthy on b or c, claimed by exactly one.
    let before = fresh(&cb, &s0).await.unwrap();
    assert_eq!(before.owner_instance_id, "a", "{before:?}");
    let registered_at = before.owner_since_unix_ms;
    assert!(registered_at > 0, "{before:?}");
    a.child.signal(libc::SIGKILL);
    a.child.wait_exit(served::DEADLINE);
    let killed = Instant::now();
    let killed_ms = mushroom_backup::units::unix_now_ms();
    let mut healthy_after = Vec::new();
    for (id, ..) in &stores {
        let h = support::wait_for(
            Duration::from_secs(180),
            &format!("store {id} healthy on b or c"),
            || {
                let cb = cb.clone();
                let id = id.clone();
                async move {
                    match fresh(&cb, &id).await? {
                        h if h.healthy && h.lease_held && h.instance_id != "a" => Ok(h),
                        h => Err(format!("{h:?}")),
                    }
                }
            },
        )
        .await;
        healthy_after.push((h.instance_id.clone(), killed.elapsed()));
        // Health says who owns it since the claim, as the registry does.
        assert_eq!(h.owner_instance_id, h.instance_id, "{h:?}");
        assert!(h.owner_since_unix_ms >= killed_ms, "{h:?}");
    }
    eprintln!("FIGURE failover: SIGKILL to healthy on the claimant, per store: {healthy_after:?}");
    let now = owners(&cb).await;
    for (id, ..) in &stores {
        let owner = now.get(id).map(String::as_str);
        assert!(matches!(owner, Some("b" | "c")), "{id}: {now:?}");
    }
    let through_c = owners(&cc).await;
    assert_eq!(now, through_c, "b and c agree on the owners");
    // Each claim was published once, by its winner, naming the silent owner it was taken from.
    let changed = proto::EventKind::OwnerChanged as i32;
    let claims = |seen: &std::sync::Mutex<Vec<proto::BackupEvent>>, id: &str| {
        let seen = seen.lock().unwrap();
        seen.iter()
            .filter(|e| e.kind == changed && e.store_id == id)
            .map(|e| e.detail.clone())
            .collect::<Vec<String>>()
    };
    support::wait_for(
        served::DEADLINE,
        "an owner_changed event per claimed store",
        || {
            let ids: Vec<String> = stores.iter().map(|(id, ..)| id.clone()).collect();
            let (eb, ec) = (events_b.clone(), events_c.clone());
            async move {
                match ids
                    .iter()
                    .find(|id| claims(&eb, id).len() + claims(&ec, id).len() == 0)
                {
                    None => Ok(()),
                    Some(id) => Err(format!("none yet for {id}")),
                }
            }
        },
    )
    .await;
    for (id, ..) in &stores {
        let (on_b, on_c) = (claims(&events_b, id), claims(&events_c, id));
        let (winner, loser) = match now[id].as_str() {
            "b" => (&on_b, &on_c),
            _ => (&on_c, &on_b),
        };
        assert_eq!(winner.len(), 1, "{id}: {on_b:?} on b, {on_c:?} on c");
        assert!(
            winner[0].starts_with("claimed from a (silent "),
            "{winner:?}"
        );
        assert!(loser.is_empty(), "{id}: the loser published {loser:?}");
    }
    // The store b and c cannot see: both looked (past twice the silence limit anyone may
    // claim), neither claimed it.
    let (mut b, mut c) = (b, c);
    for member in [&mut b, &mut c] {
        served::wait_logged(
            &mut member.child,
            &["not claiming", &private, "not under an allowed root"],
        );
    }
    assert_eq!(
        owners(&cb).await[&private],
        "a",
        "the store nobody else sees"
    );

    // The node kept writing through the handover; every commit it wrote is restorable.
    let out = node.join().expect("the node thread");
    let written = binary::json(&out);
    let total = written["commit_seq"].as_u64().expect("commit_seq");
    assert_eq!(total, 320, "{out}");
    served::wait_health_as(
        &cb,
        &s0,
        true,
        "every commit of s0 in a restore point",
        |h| h.restore_point_commit_seq == total,
    )
    .await;
    let into = base.join("restored");
    let restored = binary::restore_digest("http://unused.invalid", &s0_dest, &into);
    let local = binary::store_digest(&s0_dir);
    assert_eq!(
        restored, local,
        "the restore holds every commit the node wrote"
    );

    // a back (same id, same data directory): it loads only the rows it still owns (none).
    a.start_again(false);
    let a2 = a;
    let ca2 = served::client(a2.addr).await;
    for (id, ..) in &stores {
        let seen = served::wait_health(&ca2, id, "owned by b or c, seen from a", |h| {
            h.instance_id != "a"
        })
        .await;
        // Asked fresh, a relays the owner's own answer: the instance the registry names runs
        // the store, holds its lease, and names itself as the owner since the claim.
        let own = fresh(&ca2, id).await.unwrap();
        assert_eq!(own.instance_id, seen.instance_id, "{own:?}");
        assert_eq!(own.owner_instance_id, own.instance_id, "{own:?}");
        assert!(
            own.lease_held && own.owner_since_unix_ms >= killed_ms,
            "{own:?}"
        );
    }
    assert_eq!(
        owners(&ca2).await,
        owners(&cb).await,
        "a's return changes no owner"
    );
    served::wait_health(&ca2, &private, "a's own store running again on a", |h| {
        h.instance_id == "a" && h.healthy
    })
    .await;
    drop((a2, b, c));
    fleet.db.drop_database().await;
}

/// `n` stores owned by `dead`, in `reg`.
async fn dead_owners_stores(reg: &Registry, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = uuid::Uuid::new_v4().to_string();
        reg.insert_store(&StoreRecord {
            store_id: id.clone(),
            store_dir: format!("/stores/race/{i}"),
            destination: format!("file:///bucket/race/{i}"),
            labels: BTreeMap::new(),
            options: serde_json::json!({}),
            node_token_hash: "0".repeat(64),
            instance_id: "dead".into(),
            registered_at_ms: 1,
            owner_since_ms: 1,
        })
        .await
        .expect("insert");
        ids.push(id);
    }
    ids
}

/// Two handles claim every store at once, in opposite orders: one winner per store, and the
/// row names it.
async fn race(one: Registry, two: Registry) {
    let ids = dead_owners_stores(&one, 64).await;
    let claim_all = |reg: Registry, me: &'static str, mut ids: Vec<String>| async move {
        if me == "y" {
            ids.reverse();
        }
        let mut won = Vec::new();
        for id in ids {
            match reg.change_owner(&id, "dead", me, 2).await.expect("claim") {
                Claimed::Won => won.push(id),
                Claimed::Lost { owner } => assert_ne!(owner, "dead", "{id}"),
                Claimed::Gone => panic!("{id} is gone"),
            }
        }
        won
    };
    let (x, y) = tokio::join!(
        tokio::spawn(claim_all(one.clone(), "x", ids.clone())),
        tokio::spawn(claim_all(two.clone(), "y", ids.clone())),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.len() + y.len(), ids.len(), "x won {x:?}, y won {y:?}");
    let owners = two.owners().await.expect("owners");
    for id in &ids {
        let winner = match (x.contains(id), y.contains(id)) {
            (true, false) => "x",
            (false, true) => "y",
            both => panic!("{id}: won by (x, y) = {both:?}"),
        };
        assert_eq!(owners[id].instance_id, winner, "{id}");
        assert_eq!(owners[id].since_ms, 2, "{id}");
    }
    // The loser of a store that moved on cannot take it back from the old owner's name.
    let id = &ids[0];
    let again = one.change_owner(id, "dead", "z", 3).await.unwrap();
    assert!(matches!(again, Claimed::Lost { .. }), "{again:?}");
    one.close().await;
    two.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_claimants_racing_on_sqlite_win_each_store_once() {
    let (_dir, url, one) = support::registry::sqlite_registry().await;
    let two = Registry::open(&url).await.expect("a second handle");
    race(one, two).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_claimants_racing_on_postgres_win_each_store_once() {
    let Some(server) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&server, "failover_race").await;
    let one = Registry::open(&db.url).await.expect("open");
    let two = Registry::open(&db.url).await.expect("a second handle");
    race(one, two).await;
    db.drop_database().await;
}

/// `ctl ARGS` against `addr`: whether it succeeded, and its stdout (its stderr too when it
/// failed).
fn ctl(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    match served::ctl(addr, args) {
        (true, child) => (true, child.stdout()),
        (false, child) => (false, child.output()),
    }
}

/// Every event `c` publishes from now on, kept for a look at the end.
fn record_events(c: &Client) -> std::sync::Arc<std::sync::Mutex<Vec<proto::BackupEvent>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (mut c, kept) = (c.clone(), seen.clone());
    tokio::spawn(async move {
        let mut events = c
            .watch_events(proto::WatchEventsRequest::default())
            .await
            .expect("WatchEvents")
            .into_inner();
        while let Ok(Some(e)) = events.message().await {
            kept.lock().unwrap().push(e);
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_and_a_drain_lose_no_commit_and_never_have_two_writers() {
    let Some(fleet) = Fleet::create("moves_test").await else {
        return;
    };
    let (base, shared_root, bucket) = (&fleet.base, &fleet.shared_root, &fleet.bucket);
    let a = fleet.start("a", GROUP);
    let b = fleet.start("b", GROUP);
    let c = fleet.start("c", GROUP);
    let (ca, cb, cc) = (
        served::client(a.addr).await,
        served::client(b.addr).await,
        served::client(c.addr).await,
    );
    let events: Vec<_> = [&ca, &cb, &cc].into_iter().map(record_events).collect();

    let mut stores = Vec::new();
    for i in 0..3 {
        let dir = shared_root.join(format!("m{i}"));
        write_store(&dir, 20);
        let dest = support::file_url(&bucket.join(format!("m{i}")));
        let r = a.register(support::register_req(&dir, &dest)).await;
        stores.push((r.store_id, r.node_token, dir, dest));
    }
    for (id, ..) in &stores {
        served::wait_health(&ca, id, "a restore point on a", |h| {
            h.healthy && h.restore_point_commit_seq >= 20
        })
        .await;
    }
    let (m0, token, m0_dir, m0_dest) = stores[0].clone();
    let node = steady_node(&m0_dir, c.addr, &m0, &token);
    wait_shipped(&cc, &m0, 40).await;

    // Refused moves change nothing: to itself, to an instance that never started.
    let before = owners(&cb).await;
    let (ok, out) = ctl(c.addr, &["move", &stores[1].0, "--to", "a"]);
    assert!(!ok && out.contains("nothing to move"), "{out}");
    let (ok, out) = ctl(c.addr, &["move", &stores[1].0, "--to", "nowhere"]);
    assert!(!ok && out.contains("nowhere"), "{out}");
    assert_eq!(owners(&cb).await, before);

    // ctl move through c (not the owner): a flushes, hands over, b runs m0.
    let moved = Instant::now();
    let (ok, out) = ctl(c.addr, &["--json", "move", &m0, "--to", "b"]);
    assert!(ok, "{out}");
    let r = binary::json(&out);
    assert_eq!(r["from_instance_id"], "a", "{out}");
    assert_eq!(r["to_instance_id"], "b", "{out}");
    assert!(
        r["restore_point_commit_seq"].as_u64().unwrap() >= 40,
        "{out}"
    );
    served::wait_health(&cb, &m0, "m0 running on b", |h| {
        h.instance_id == "b" && h.healthy && h.lease_held
    })
    .await;
    let move_took = moved.elapsed();

    // ctl drain a through b: a's other stores go to b or c; a runs nothing.
    let drained = Instant::now();
    let (ok, out) = ctl(b.addr, &["--json", "drain", "a"]);
    assert!(ok, "{out}");
    let r = binary::json(&out);
    assert_eq!(r["moved"].as_array().unwrap().len(), 2, "{out}");
    assert_eq!(r["failed"].as_array().unwrap().len(), 0, "{out}");
    for (id, ..) in &stores[1..] {
        served::wait_health(&cb, id, "drained to b or c, running", |h| {
            h.instance_id != "a" && h.healthy && h.lease_held
        })
        .await;
    }
    let drain_took = drained.elapsed();
    eprintln!(
        "FIGURE moves: move of a store with a node writing: {move_took:?} to healthy on the \
         target; drain of 2 stores: {drain_took:?}"
    );
    let now = owners(&cb).await;
    assert!(now.values().all(|o| o != "a"), "{now:?}");
    // Through a, the health of m0 is b's (a forwards to the owner). Seen once under a full
    // test run on a busy machine (issue 40's stop): right after the drain, b answered m0
    // "starting: the bucket lease is not acquired yet" for a moment; the ownership is what is
    // checked here, so an unhealthy answer is asked again (at most 10 s) and said.
    let asked = Instant::now();
    let (ok, out) = loop {
        let (ok, out) = ctl(a.addr, &["health", &m0]);
        if ok || asked.elapsed() > Duration::from_secs(10) {
            break (ok, out);
        }
        eprintln!("m0 not healthy through a right after the drain, asking again: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(ok && out.contains("owner b since"), "{out}");

    // Every commit the node wrote is restorable.
    let out = node.join().expect("the node thread");
    let total = binary::json(&out)["commit_seq"].as_u64().unwrap();
    assert_eq!(total, 320, "{out}");
    served::wait_health_as(
        &cb,
        &m0,
        true,
        "every commit of m0 in a restore point",
        |h| h.restore_point_commit_seq == total,
    )
    .await;
    let restored = binary::restore_digest("http://unused.invalid", &m0_dest, &base.join("r"));
    assert_eq!(restored, binary::store_digest(&m0_dir));

    // Never two writers: no worker anywhere lost its lease or had it taken over.
    let lost = proto::EventKind::LeaseLost as i32;
    let taken = proto::EventKind::LeaseTakenOver as i32;
    let changed = proto::EventKind::OwnerChanged as i32;
    let mut owner_changes = 0;
    for seen in &events {
        for e in seen.lock().unwrap().iter() {
            assert!(e.kind != lost && e.kind != taken, "{e:?}");
            owner_changes += usize::from(e.kind == changed);
        }
    }
    assert!(owner_changes >= 3, "an owner_changed event per move");

    // A rewound directory (its lineage, fewer commits than its newest restore point) is one
    // the worker's lineage rule refuses: the target applies that rule, and refuses the move.
    let dir = shared_root.join("rewound");
    write_store(&dir, 20);
    let dest = support::file_url(&bucket.join("rewound"));
    let rewound = b
        .register(support::register_req(&dir, &dest))
        .await
        .store_id;
    served::wait_health(&cb, &rewound, "a restore point on b", |h| {
        h.healthy && h.restore_point_commit_seq >= 20
    })
    .await;
    let older = shared_root.join("older");
    write_store(&older, 5);
    std::fs::copy(dir.join("backup.lineage"), older.join("backup.lineage")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::rename(&older, &dir).unwrap();
    let before = owners(&cb).await;
    let (ok, out) = ctl(a.addr, &["move", &rewound, "--to", "c"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("instance c cannot take") && out.contains("fewer commits than the newest"),
        "{out}"
    );
    assert_eq!(owners(&cb).await, before, "a refused move changes nothing");
    drop((a, b, c));
    fleet.db.drop_database().await;
}

//! `ctl drain` moving several stores at once (issue 15 part 5, `service::moves`): two real
//! `serve` processes of one failover group on the project's PostgreSQL, the store
//! directories visible to both but one, which only the drained instance sees. A parallel
//! drain moves every other store, each healthy on the target holding its lease, and leaves
//! the one refused where it was, running; the answer lists every store. A serial drain back
//! moves them all again. The two drains' times are printed (a figure, not an assertion).
//! A paused store (issue 25 part 5) moves and drains without an upload, stays paused on each
//! target, and ships everything after Resume there.
//!
//! Needs `MUSHROOM_TEST_POSTGRES_URL` (`scripts/test.sh` starts a server); without it a SKIP
//! line, except under `CI=true`, where it fails.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Instant;

use mushroom_backup::service::proto;
use support::binary::{self, write_store};
use support::instances::Fleet;
use support::served::{self, Client};

/// Both members' settings: a short silence limit and lease TTL, so the test is quick.
const GROUP: &[&str] = &support::instances::group_member("3000");

/// `ctl --json ARGS` against `addr`: whether it exited 0, and its stdout.
fn ctl(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    let (ok, child) = served::ctl(addr, &[&["--json"], args].concat());
    (ok, child.stdout())
}

/// Waits until every one of `ids` runs on `on`, healthy and holding its lease.
async fn running_on(c: &Client, ids: &[String], on: &str) {
    for id in ids {
        served::wait_health(c, id, &format!("running on {on}"), |h| {
            h.instance_id == on && h.healthy && h.lease_held
        })
        .await;
    }
}

/// The store ids a drain answer lists as moved, and the failure lines.
fn answer(out: &str) -> (BTreeSet<String>, Vec<String>) {
    let r = binary::json(out);
    let moved = r["moved"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"))
        .iter()
        .map(|m| m["store_id"].as_str().unwrap().to_string())
        .collect();
    let failed = r["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    (moved, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_parallel_drain_moves_every_store_it_can_and_leaves_the_refused_one_running() {
    let Some(fleet) = Fleet::create("drain_test").await else {
        return;
    };
    let (shared_root, bucket) = (&fleet.shared_root, &fleet.bucket);
    let a = fleet.start("a", GROUP);
    let b = fleet.start("b", GROUP);
    let (a_addr, b_addr) = (a.addr, b.addr);
    let (ca, cb) = (served::client(a_addr).await, served::client(b_addr).await);

    // Eight stores b sees too, and one in a's own root, which b does not.
    let mut stores = Vec::new();
    for i in 0..8 {
        let dir = shared_root.join(format!("d{i}"));
        write_store(&dir, 10);
        let dest = support::file_url(&bucket.join(format!("d{i}")));
        let r = a.register(support::register_req(&dir, &dest)).await;
        stores.push(r.store_id);
    }
    let private = a.register_own_store("private", 5, bucket).await;
    running_on(&ca, &stores, "a").await;
    running_on(&ca, std::slice::from_ref(&private), "a").await;

    // A parallel too wide is refused before anything moves.
    let (ok, _) = ctl(b_addr, &["drain", "a", "--parallel", "17"]);
    assert!(!ok, "--parallel 17 accepted");
    let mut c = cb.clone();
    let too_wide = c
        .drain(proto::DrainRequest {
            instance_id: "a".into(),
            parallel: 17,
        })
        .await
        .expect_err("DrainRequest.parallel 17 accepted");
    assert_eq!(
        too_wide.code(),
        tonic::Code::InvalidArgument,
        "{too_wide:?}"
    );
    assert!(too_wide.message().contains("parallel"), "{too_wide:?}");
    running_on(&ca, &stores, "a").await;

    // Drain a through b, four at once: the eight move, the private one is refused and stays.
    let parallel = Instant::now();
    let (ok, out) = ctl(b_addr, &["drain", "a", "--parallel", "4"]);
    assert!(!ok, "a drain with a store left must exit 1: {out}");
    let (moved, failed) = answer(&out);
    let parallel_took = parallel.elapsed();
    assert_eq!(
        moved,
        stores.iter().cloned().collect::<BTreeSet<_>>(),
        "{out}"
    );
    assert_eq!(failed.len(), 1, "{out}");
    assert!(
        failed[0].starts_with(&format!("{private}: ")) && failed[0].contains("cannot take"),
        "{out}"
    );
    running_on(&cb, &stores, "b").await;
    let parallel_healthy = parallel.elapsed();
    // The refused store is where it was, running.
    running_on(&ca, std::slice::from_ref(&private), "a").await;

    // And back, one at a time: all eight.
    let serial = Instant::now();
    let (ok, out) = ctl(a_addr, &["drain", "b", "--parallel", "1"]);
    assert!(ok, "{out}");
    let (moved, failed) = answer(&out);
    let serial_took = serial.elapsed();
    assert_eq!(
        moved,
        stores.iter().cloned().collect::<BTreeSet<_>>(),
        "{out}"
    );
    assert!(failed.is_empty(), "{out}");
    running_on(&ca, &stores, "a").await;
    let serial_healthy = serial.elapsed();
    // The same two drains again, in the other order (each instance has hosted every store by
    // now), for figures that do not favour either.
    let serial2 = Instant::now();
    let (_, out) = ctl(b_addr, &["drain", "a", "--parallel", "1"]);
    assert_eq!(answer(&out).0.len(), 8, "{out}");
    running_on(&cb, &stores, "b").await;
    let serial2 = serial2.elapsed();
    let parallel2 = Instant::now();
    let (ok, out) = ctl(a_addr, &["drain", "b", "--parallel", "4"]);
    assert!(ok && answer(&out).0.len() == 8, "{out}");
    running_on(&ca, &stores, "a").await;
    let parallel2 = parallel2.elapsed();
    eprintln!(
        "FIGURE drain of 8 stores: 4 at once (and 1 refused) {parallel_took:?} to the answer, \
         {parallel_healthy:?} to all healthy on the target; 1 at a time {serial_took:?} to the \
         answer, {serial_healthy:?} to all healthy; again, to all healthy: 1 at a time \
         {serial2:?} (and 1 refused), 4 at once {parallel2:?}"
    );
    drop(a);
    fleet.db.drop_database().await;
}

/// A pause is total, a move included: a paused store with unshipped commits, moved (`ctl move`)
/// and drained back (`ctl drain`), leaves its prefix as it was, is paused on each target
/// (holding its lease there), and after Resume on the last one ships every commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_store_moves_and_drains_without_an_upload_and_stays_paused() {
    let Some(fleet) = Fleet::create("drain_paused_test").await else {
        return;
    };
    let (base, shared_root, bucket) = (&fleet.base, &fleet.shared_root, &fleet.bucket);
    let prefix = bucket.join("paused");
    let a = fleet.start("a", GROUP);
    let b = fleet.start("b", GROUP);
    let (a_addr, b_addr) = (a.addr, b.addr);
    let (ca, cb) = (served::client(a_addr).await, served::client(b_addr).await);

    let dir = shared_root.join("paused");
    write_store(&dir, 10);
    let r = a
        .register(support::register_req(&dir, &support::file_url(&prefix)))
        .await;
    let (id, token) = (r.store_id, r.node_token);
    served::wait_health(&ca, &id, "10 commits in a restore point on a", |h| {
        h.instance_id == "a" && h.healthy && h.lease_held && h.restore_point_commit_seq == 10
    })
    .await;
    served::pause(&ca, &id, "bucket maintenance").await;
    // Twenty commits the pause keeps in the (shared) directory only.
    served::node_writes(a_addr, &dir, &id, &token, 20);
    served::wait_health(
        &ca,
        &id,
        "paused on a, 30 commits durable, 10 shipped",
        |h| h.paused && h.durable_commit_seq == 30 && h.shipped_commit_seq == 10,
    )
    .await;
    let frozen = support::store::tree_but_leases(&prefix);
    assert!(!frozen.is_empty());

    let (ok, out) = ctl(a_addr, &["move", &id, "--to", "b"]);
    assert!(ok, "ctl move: {out}");
    assert_eq!(binary::json(&out)["restore_point_commit_seq"], 10, "{out}");
    // Its first health may come before it read the prefix's restore point: wait for that too.
    let on_b = served::wait_health(&cb, &id, "paused on b, holding its lease", |h| {
        h.instance_id == "b"
            && h.paused
            && h.lease_held
            && h.healthy
            && h.restore_point_commit_seq == 10
    })
    .await;
    assert_eq!(on_b.paused_reason, "bucket maintenance", "{on_b:?}");
    assert_eq!(on_b.restore_point_commit_seq, 10, "{on_b:?}");
    assert_eq!(
        support::store::tree_but_leases(&prefix),
        frozen,
        "the move of a paused store uploaded"
    );

    let (ok, out) = ctl(a_addr, &["drain", "b"]);
    assert!(ok, "ctl drain: {out}");
    assert_eq!(answer(&out).0, BTreeSet::from([id.clone()]), "{out}");
    served::wait_health(&ca, &id, "paused on a again, holding its lease", |h| {
        h.instance_id == "a" && h.paused && h.lease_held && h.healthy
    })
    .await;
    assert_eq!(
        support::store::tree_but_leases(&prefix),
        frozen,
        "the drain of a paused store uploaded"
    );

    assert!(
        served::resume(&ca, &id).await,
        "the pause did not follow the store"
    );
    served::wait_health(&ca, &id, "unpaused, 30 commits in a restore point", |h| {
        !h.paused && h.healthy && h.shipped_commit_seq == 30 && h.restore_point_commit_seq == 30
    })
    .await;
    let restored = base.join("restored");
    let digest = binary::restore_digest(
        "http://unused.invalid",
        &support::file_url(&prefix),
        &restored,
    );
    assert_eq!(digest, binary::store_digest(&dir));
    drop(a);
    fleet.db.drop_database().await;
}

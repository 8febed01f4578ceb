//! One `Health` answer never contradicts itself (issue 40, finding 9), through the real `serve`
//! binary over gRPC, a `durability = sync` store, the reference node and a `file://` bucket:
//! in every answer read while the node commits, while the store is paused, across a restart of
//! the service with the store still paused, and after Resume,
//!
//! - a restore never reaches past what was shipped (`bucket_durable_commit_seq <=
//!   shipped_commit_seq`), nor was more shipped than is durable;
//! - it reaches at least the restore point, whenever one is known (so never 0 beside one).
//!
//! The old answer read the durable position live beside counters of the supervisor's last
//! evaluation (a restore "reaching" past what was shipped), and a store spawned paused never
//! set it (0 beside the restore point LATEST holds). No timed assertion: answers are read as
//! fast as they come, and every wait is for a health condition with a generous deadline.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use mushroom_backup::service::proto;
use support::binary::Running;
use support::served::{self, Client, fast_serve as serve};

/// What is wrong with one answer, if anything.
fn contradiction(h: &proto::StoreHealth) -> Option<String> {
    let (reaches, shipped, rp) = (
        h.bucket_durable_commit_seq,
        h.shipped_commit_seq,
        h.restore_point_commit_seq,
    );
    if reaches > shipped {
        return Some(format!(
            "a restore reaches {reaches}, past the {shipped} commits shipped"
        ));
    }
    if shipped > h.durable_commit_seq {
        return Some(format!(
            "{shipped} commits shipped, past the {} durable",
            h.durable_commit_seq
        ));
    }
    if rp > 0 && reaches < rp {
        return Some(format!(
            "a restore reaches {reaches}, below the restore point at {rp}"
        ));
    }
    None
}

/// Reads `Health` of `id` until `done` holds of an answer, failing at the first answer that
/// contradicts itself; the number of answers read.
async fn consistent_until(
    c: &Client,
    id: &str,
    what: &str,
    done: impl Fn(&proto::StoreHealth) -> bool,
) -> (usize, proto::StoreHealth) {
    let mut read = 0;
    let h = support::wait_for(served::DEADLINE, &format!("store {id}: {what}"), || {
        read += 1;
        let n = read;
        let done = &done;
        async move {
            let h = served::health(c, id, false).await?;
            if let Some(why) = contradiction(&h) {
                panic!("answer {n} contradicts itself: {why}: {h:?}");
            }
            if done(&h) {
                Ok(h)
            } else {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Err(format!("{h:?}"))
            }
        }
    })
    .await;
    (read, h)
}

/// `serve`, a sync store of 20 commits registered, its first restore point taken.
async fn started(d: &served::Dirs) -> (Running, SocketAddr, Client, proto::RegisterResponse) {
    let dir = d.root.join("figures");
    support::store::write(&dir, 20, 0, 0);
    let (server, addr) = served::start("serve", serve(d, &[]));
    let c = served::client(addr).await;
    let url = support::file_url(&d.base.join("bucket"));
    let r = served::register_sync(&c, &dir, &url).await;
    consistent_until(&c, &r.store_id, "20 commits in a restore point", |h| {
        h.restore_point_commit_seq == 20 && h.bucket_durable_commit_seq == 20
    })
    .await;
    (server, addr, c, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_answer_read_while_the_node_commits_is_one_snapshot() {
    let d = served::dirs();
    let (mut server, addr, c, r) = started(&d).await;
    let id = r.store_id.clone();
    // The node commits while health is read as fast as it answers.
    let log = d.base.join("acked.log");
    let dir = d.root.join("figures");
    let mut node = Running::spawn(
        "node",
        served::sync_node(addr, &dir, (&id, &r.node_token), &log, "100"),
    );
    let (read, _) = consistent_until(&c, &id, "150 commits acknowledged", |h| {
        h.bucket_durable_commit_seq >= 150
    })
    .await;
    eprintln!("{read} answers while the node committed, none contradicting itself");
    node.kill();
    let (_, done) = consistent_until(&c, &id, "everything durable shipped", |h| {
        h.shipped_commit_seq == h.durable_commit_seq
            && h.bucket_durable_commit_seq == h.durable_commit_seq
            && h.durable_commit_seq >= 150
    })
    .await;
    assert!(done.healthy, "{done:?}");

    // Restarted (not paused): every answer from the first on is consistent, up to the same
    // figures read back from the bucket.
    served::terminate(&mut server);
    let (mut server, addr) = served::start("serve (restarted)", serve(&d, &[]));
    let c = served::client(addr).await;
    let (_, again) = consistent_until(&c, &id, "the bucket's figures read back", |h| {
        h.bucket_durable_commit_seq >= done.bucket_durable_commit_seq
            && h.bucket_durable_commit_seq == h.durable_commit_seq
    })
    .await;
    assert!(again.restore_point_commit_seq > 0, "{again:?}");
    served::terminate(&mut server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_store_restarted_shows_what_a_restore_reaches_and_resume_stays_consistent() {
    let d = served::dirs();
    let (mut server, _, c, r) = started(&d).await;
    let id = r.store_id.clone();
    let dir = d.root.join("figures");
    served::pause(&c, &id, "figures").await;
    assert_eq!(support::store::commit_more(&dir, 10), 30);
    consistent_until(&c, &id, "paused, 30 durable, 20 shipped", |h| {
        h.paused && h.durable_commit_seq == 30 && h.shipped_commit_seq == 20
    })
    .await;

    // Restarted with the store paused: the restore point LATEST holds is what a restore
    // reaches, never 0 beside it.
    served::terminate(&mut server);
    let (mut server, addr) = served::start("serve (restarted)", serve(&d, &[]));
    let c = served::client(addr).await;
    let (_, h) = consistent_until(
        &c,
        &id,
        "paused after the restart, the bucket's figures read",
        |h| h.paused && h.lease_held && h.restore_point_commit_seq > 0,
    )
    .await;
    assert_eq!(
        (
            h.bucket_durable_commit_seq,
            h.restore_point_commit_seq,
            h.shipped_commit_seq
        ),
        (20, 20, 20),
        "{h:?}"
    );
    let text = {
        let (ok, child) = served::ctl(addr, &["health", &id]);
        assert!(ok, "ctl health: {}", child.output());
        child.stdout()
    };
    assert!(
        text.contains("restore point 20") && text.contains("(a restore reaches) 20"),
        "ctl health after the restart: {text}"
    );

    // Resumed: everything durable ships, every answer on the way consistent.
    assert!(served::resume(&c, &id).await);
    let (_, done) = consistent_until(&c, &id, "30 commits shipped after Resume", |h| {
        !h.paused && h.shipped_commit_seq == 30 && h.bucket_durable_commit_seq == 30
    })
    .await;
    assert!(done.healthy, "{done:?}");
    served::terminate(&mut server);
}

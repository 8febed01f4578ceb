//! Pause and Resume through the real `serve` binary over gRPC (and `ctl`): a paused store
//! uploads no object while its node writes — its bucket is byte for byte what it was, leases
//! aside — holds its bucket lease, stays paused over a restart of the service (reporting the
//! position the bucket holds, read from LATEST, not 0), and after Resume
//! ships every commit, which a restore then holds. A pause past its deadline (a short one,
//! through `serve --pause-default-ms`) turns the store unhealthy (`ctl health` exits 3) and
//! leaves it paused until Resume. No timed assertion: every wait is for a health condition, with a generous deadline.

mod support;

use std::net::SocketAddr;

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary;
use support::served::{
    self, DEADLINE, client, fast_serve as serve, node_writes, terminate, wait_health,
};
use tonic::Code;
use tonic::transport::Channel;

type Client = BackupControlClient<Channel>;

async fn shipped(c: &Client, id: &str, commits: u64) -> proto::StoreHealth {
    wait_health(
        c,
        id,
        &format!("healthy, unpaused, {commits} commits shipped and in a restore point"),
        |h| {
            h.healthy
                && !h.paused
                && h.shipped_commit_seq == commits
                && h.restore_point_commit_seq == commits
        },
    )
    .await
}

/// `ctl --server … ARGS`, to its end: its stdout.
fn ctl(addr: SocketAddr, args: &[&str]) -> String {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["ctl", "--server", &format!("http://{addr}")])
        .args(args);
    binary::run_ok("ctl", cmd, DEADLINE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_store_uploads_nothing_stays_paused_over_a_restart_and_catches_up_on_resume() {
    let d = served::dirs();
    let dir = d.root.join("paused");
    let bucket = d.base.join("bucket");
    support::store::write(&dir, 20, 0, 0);
    let (mut server, addr) = served::start("serve", serve(&d, &[]));
    let c = client(addr).await;
    let registered = c
        .clone()
        .register(support::register_req(&dir, &support::file_url(&bucket)))
        .await
        .expect("Register")
        .into_inner();
    let (id, token) = (registered.store_id, registered.node_token);
    let before_pause = shipped(&c, &id, 20).await;

    let paused = c
        .clone()
        .pause(proto::PauseRequest {
            store_id: id.clone(),
            reason: "  disk maintenance ".into(),
            until_unix_ms: 0,
        })
        .await
        .expect("Pause")
        .into_inner();
    assert_eq!(paused.reason, "disk maintenance", "trimmed");
    assert!(!paused.was_paused);
    assert_eq!(
        paused.until_unix_ms - paused.paused_at_unix_ms,
        3_600_000,
        "the default pause is an hour: {paused:?}"
    );
    // Pause returns once nothing of the store is in flight: from here on the bucket stands.
    let frozen = support::store::tree_but_leases(&bucket);
    assert!(!frozen.is_empty());

    node_writes(addr, &dir, &id, &token, 30);
    let h = wait_health(&c, &id, "paused, healthy, 50 commits durable", |h| {
        h.paused && h.healthy && h.durable_commit_seq == 50
    })
    .await;
    assert_eq!(h.shipped_commit_seq, 20, "{h:?}");
    assert_eq!(h.paused_reason, "disk maintenance");
    assert!(h.lease_held, "a paused store keeps its lease: {h:?}");
    assert_eq!(h.lease_holder, before_pause.lease_holder);
    assert!(h.notes.iter().any(|n| n.contains("paused since")), "{h:?}");
    let refused = c
        .clone()
        .trigger(proto::TriggerRequest {
            store_id: id.clone(),
            kind: proto::TriggerKind::Ship as i32,
        })
        .await
        .expect_err("Trigger on a paused store");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("is paused"), "{refused:?}");
    assert!(
        ctl(addr, &["health", &id]).contains("PAUSED since"),
        "ctl health shows the pause"
    );

    // Pausing again replaces the reason and deadline, and keeps when the pause began.
    let until = paused.paused_at_unix_ms + 7_200_000;
    let again = c
        .clone()
        .pause(proto::PauseRequest {
            store_id: id.clone(),
            reason: "longer maintenance".into(),
            until_unix_ms: until,
        })
        .await
        .expect("Pause again")
        .into_inner();
    assert!(again.was_paused);
    assert_eq!(again.until_unix_ms, until);
    assert_eq!(again.paused_at_unix_ms, paused.paused_at_unix_ms);
    assert_eq!(
        support::store::tree_but_leases(&bucket),
        frozen,
        "a paused store uploaded"
    );

    // A clean stop does not flush a paused store; the restarted service starts it paused.
    terminate(&mut server);
    assert_eq!(
        support::store::tree_but_leases(&bucket),
        frozen,
        "the last flush uploaded"
    );
    assert_eq!(support::store::commit_more(&dir, 10), 60);
    let (_server, addr) = served::start("serve (restarted)", serve(&d, &[]));
    let c = client(addr).await;
    // Paused from its start, the worker reads LATEST (a read: the bucket stands) and reports
    // the position the bucket holds, not 0.
    let h = wait_health(
        &c,
        &id,
        "paused after the restart, holding the lease, 60 commits durable, 20 shipped",
        |h| {
            h.paused
                && h.lease_held
                && h.durable_commit_seq == 60
                && h.shipped_commit_seq == 20
                && h.restore_point_commit_seq == 20
        },
    )
    .await;
    assert!(h.healthy, "{h:?}");
    assert_eq!(h.paused_reason, "longer maintenance");
    assert_eq!(h.paused_until_unix_ms, until);
    assert!(h.notes.iter().any(|n| n.contains("paused since")), "{h:?}");
    let text = ctl(addr, &["health", &id]);
    assert!(
        text.contains(&format!(
            "PAUSED since {}",
            mushroom_backup::health::rfc3339_ms(paused.paused_at_unix_ms)
        )) && text.contains("shipped 20  restore point 20"),
        "ctl health after the restart: {text}"
    );
    assert_eq!(
        support::store::tree_but_leases(&bucket),
        frozen,
        "a paused store uploaded after a restart"
    );

    assert!(served::resume(&c, &id).await);
    shipped(&c, &id, 60).await;
    let twice = c
        .clone()
        .resume(proto::ResumeRequest {
            store_id: id.clone(),
        })
        .await
        .expect("Resume of a store not paused")
        .into_inner();
    assert!(!twice.was_paused);

    // Every commit, those written while paused included, restores.
    let restored = d.base.join("restored");
    let digest = binary::restore_digest(
        "http://unused.invalid",
        &support::file_url(&bucket),
        &restored,
    );
    assert_eq!(digest, binary::store_digest(&dir));
    assert_eq!(digest["commit_seq"], 60, "{digest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_past_its_deadline_is_unhealthy_and_stays_paused_until_resume() {
    let d = served::dirs();
    let dir = d.root.join("overdue");
    let bucket = d.base.join("bucket");
    support::store::write(&dir, 10, 0, 0);
    let flags = ["--pause-default-ms", "300", "--pause-max-ms", "600000"];
    let (mut server, addr) = served::start("serve", serve(&d, &flags));
    let c = client(addr).await;
    let id = served::register(&c, support::register_req(&dir, &support::file_url(&bucket))).await;
    shipped(&c, &id, 10).await;

    // Unknown stores, and fields the server's limits refuse.
    let unknown = "00000000-0000-0000-0000-000000000000";
    let pause = |store_id: &str, until_unix_ms: i64| proto::PauseRequest {
        store_id: store_id.into(),
        reason: String::new(),
        until_unix_ms,
    };
    let e = c
        .clone()
        .pause(pause(unknown, 0))
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = c
        .clone()
        .resume(proto::ResumeRequest {
            store_id: unknown.into(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let now = mushroom_backup::units::unix_now_ms();
    let e = c
        .clone()
        .pause(pause(&id, now + 3_600_000))
        .await
        .expect_err("beyond the maximum");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("until_unix_ms") && e.message().contains("maximum pause of 600000 ms"),
        "{e:?}"
    );
    let h = wait_health(&c, &id, "healthy", |h| h.healthy).await;
    assert!(!h.paused, "a refused pause paused: {h:?}");

    // The default deadline (300 ms here) passes: unhealthy, and still paused.
    let paused = c
        .clone()
        .pause(pause(&id, 0))
        .await
        .expect("Pause")
        .into_inner();
    assert_eq!(paused.reason, "no reason given");
    assert_eq!(paused.until_unix_ms - paused.paused_at_unix_ms, 300);
    let h = wait_health(&c, &id, "unhealthy: paused past its deadline", |h| {
        !h.healthy && h.reason.starts_with("paused past its deadline")
    })
    .await;
    assert!(h.paused && h.lease_held, "{h:?}");
    assert!(h.reason.contains("until Resume"), "{h:?}");
    // `ctl health` shows it, and exits 3 (a store it shows is unhealthy): scripts rely on it.
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["ctl", "--server", &format!("http://{addr}"), "health", &id]);
    let out = cmd.output().expect("run ctl health");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "ctl health of an unhealthy store: {out:?}"
    );
    assert!(
        text.contains("UNHEALTHY: paused past its deadline") && text.contains("PAUSED since"),
        "{text}"
    );

    // A new deadline through ctl makes it healthy again, still paused; ctl resume ends it.
    let out = ctl(
        addr,
        &["pause", &id, "--reason", "kernel upgrade", "--for", "5m"],
    );
    assert!(
        out.contains("re-paused store") && out.contains("kernel upgrade"),
        "{out}"
    );
    wait_health(&c, &id, "healthy and paused again", |h| {
        h.healthy && h.paused && h.paused_reason == "kernel upgrade"
    })
    .await;
    // Killed (no clean stop), the service starts the store paused again.
    server.kill();
    let (_server, addr) = served::start("serve (after SIGKILL)", serve(&d, &flags));
    let c = client(addr).await;
    wait_health(&c, &id, "paused after a SIGKILL and a restart", |h| {
        h.healthy && h.paused && h.paused_reason == "kernel upgrade" && h.lease_held
    })
    .await;
    let out = ctl(addr, &["--json", "resume", &id]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("ctl --json resume");
    assert_eq!(v["was_paused"], true, "{v}");
    support::store::write(&dir, 5, 0, 0);
    shipped(&c, &id, 15).await;
}

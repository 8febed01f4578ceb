//! One live process per instance id: the registry's claim (`InstanceClaim`) on SQLite and
//! PostgreSQL, and the `serve` binary refusing to start beside a live holder of its id, taking
//! over a dead one's stale claim, and stopping when its own claim is taken over.

mod support;

use std::time::{Duration, Instant};

use support::registry::{PgDatabase, postgres_server};

use mushroom_backup::registry::{ClaimError, ClaimRecord, InstanceClaim, Registry};
use support::binary::Running;
use support::serve::{self, DEADLINE, Serve};

both_backends!(
    a_live_claim_refuses_a_second_process,
    a_stale_claim_is_taken_over_and_its_holder_loses_it,
    a_released_claim_is_taken_at_once,
);

/// Long enough that no claim in a test goes stale by itself.
const LIVE: Duration = Duration::from_secs(3600);

/// A claim row posing as process `pid` on `host`.
fn process(instance_id: &str, host: &str, pid: i64) -> ClaimRecord {
    ClaimRecord {
        instance_id: instance_id.into(),
        nonce: uuid::Uuid::new_v4().to_string(),
        host: host.into(),
        pid,
        started_at_ms: 1_764_000_000_000,
        heartbeat_ms: 0,
    }
}

/// Tries to take `mine` with `stale_after` until it is taken (the holder's heartbeat must age
/// past `stale_after` first), for at most [`DEADLINE`].
async fn take_when_stale(
    reg: &Registry,
    mine: ClaimRecord,
    stale_after: Duration,
) -> InstanceClaim {
    let start = Instant::now();
    loop {
        match InstanceClaim::take_as(reg, mine.clone(), stale_after).await {
            Ok(c) => return c,
            Err(ClaimError::HeldElsewhere { .. }) if start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("taking a stale claim: {e}"),
        }
    }
}

mod suite {
    use super::*;

    pub async fn a_live_claim_refuses_a_second_process(reg: Registry) {
        let first = InstanceClaim::take_as(&reg, process("i1", "db-a", 101), LIVE)
            .await
            .expect("the first claim");
        assert!(first.taken_over().is_none());
        first.renew().await.expect("renew");
        let e = InstanceClaim::take_as(&reg, process("i1", "db-b", 202), LIVE)
            .await
            .expect_err("a second process with the same id");
        let text = e.to_string();
        match &e {
            ClaimError::HeldElsewhere { holder, .. } => {
                assert_eq!(holder.record.nonce, first.record().nonce, "{text}");
                assert!(holder.heartbeat_age < LIVE, "{text}");
            }
            other => panic!("expected HeldElsewhere, got {other:?}"),
        }
        for part in ["\"i1\"", "pid 101", "db-a", "started 2025-"] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        // Another id is another claim.
        InstanceClaim::take_as(&reg, process("i2", "db-b", 202), LIVE)
            .await
            .expect("another instance id");
        // The refused process changed nothing.
        first.renew().await.expect("the first still holds");
        let now = reg.instance_claim("i1").await.unwrap().expect("a claim");
        assert_eq!(now.record.pid, 101);
    }

    pub async fn a_stale_claim_is_taken_over_and_its_holder_loses_it(reg: Registry) {
        let old = InstanceClaim::take_as(&reg, process("i1", "db-a", 101), LIVE)
            .await
            .expect("the first claim");
        // A successor that counts a claim stale after 50 ms, and the first stops renewing.
        let new =
            take_when_stale(&reg, process("i1", "db-b", 202), Duration::from_millis(50)).await;
        let replaced = new
            .taken_over()
            .expect("a take-over names what it replaced");
        assert_eq!(replaced.record.nonce, old.record().nonce);
        assert_eq!(replaced.record.pid, 101);
        // The first process renews: its claim is gone, and the error names who has it.
        let e = old
            .renew()
            .await
            .expect_err("the old holder lost its claim");
        assert!(matches!(e, ClaimError::Lost { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("pid 202") && text.contains("db-b"), "{text}");
        // Its release on the way out leaves the successor's claim alone.
        old.release().await.expect("release");
        new.renew().await.expect("the successor still holds");
        assert_eq!(
            reg.instance_claim("i1")
                .await
                .unwrap()
                .expect("a claim")
                .record
                .nonce,
            new.record().nonce
        );
    }

    pub async fn a_released_claim_is_taken_at_once(reg: Registry) {
        let first = InstanceClaim::take_as(&reg, process("i1", "db-a", 101), LIVE)
            .await
            .expect("the first claim");
        first.release().await.expect("release");
        assert!(reg.instance_claim("i1").await.unwrap().is_none());
        let second = InstanceClaim::take_as(&reg, process("i1", "db-b", 202), LIVE)
            .await
            .expect("a released claim is free");
        assert!(second.taken_over().is_none());
        let e = first.renew().await.expect_err("released is released");
        assert!(matches!(e, ClaimError::Lost { .. }), "{e:?}");
    }
}

// ---- the serve binary --------------------------------------------------------------------

/// A temp dir with a data dir and an allowed root.
struct Dirs {
    _tmp: tempfile::TempDir,
    data: std::path::PathBuf,
    root: std::path::PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    Dirs {
        data: base.join("data"),
        root: base.join("stores"),
        _tmp: tmp,
    }
}

fn serve_cmd(d: &Dirs, extra: &[&str]) -> std::process::Command {
    let mut args = vec![
        "--instance-id",
        "shared-id",
        "--health-report-interval-ms",
        "100",
    ];
    args.extend_from_slice(extra);
    serve::command(&d.data, &d.root, &args)
}

/// Runs a `serve` that must refuse to start; returns what it printed.
fn refused(name: &str, cmd: std::process::Command) -> String {
    let mut child = Running::spawn(name, cmd);
    let status = child.wait_exit(DEADLINE);
    assert!(!status.success(), "{name} started beside a live holder");
    child.output()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_with_the_same_instance_id_refuses_to_start() {
    let d = dirs();
    let first = Serve::start("serve (first)", serve_cmd(&d, &[]));
    let out = tokio::task::block_in_place(|| refused("serve (second)", serve_cmd(&d, &[])));
    let host = mushroom_backup::lease::host_name();
    for part in [
        "held by another live process".to_string(),
        format!("pid {}", first.child.pid()),
        format!("host {host}"),
        "started ".to_string(),
    ] {
        assert!(out.contains(&part), "{part:?} missing from:\n{out}");
    }

    // A clean stop releases the claim: a successor starts at once, even one that would wait
    // an hour for a claim to go stale.
    first.terminate();
    let second = Serve::start(
        "serve (after a clean stop)",
        serve_cmd(&d, &["--owner-silent-after-ms", "3600000"]),
    );

    // A killed holder's claim goes stale and is taken over.
    let mut second = second;
    second.child.kill();
    let start = Instant::now();
    let third = loop {
        let mut child = Running::spawn(
            "serve (after a kill)",
            serve_cmd(&d, &["--owner-silent-after-ms", "300"]),
        );
        let listening = tokio::task::block_in_place(|| {
            let deadline = Instant::now() + DEADLINE;
            while let Some(line) = child.next_line(deadline) {
                if line.text.contains("\"listening\"") {
                    return true;
                }
            }
            false
        });
        if listening {
            break child;
        }
        let status = tokio::task::block_in_place(|| child.wait_exit(DEADLINE));
        assert!(!status.success());
        assert!(
            child.output().contains("held by another live process"),
            "{}",
            child.output()
        );
        assert!(
            start.elapsed() < DEADLINE,
            "the stale claim was never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        third.output().contains("took over the stale claim"),
        "{}",
        third.output()
    );
}

/// A start that fails before it serves (here: its TLS key is missing) leaves no claim behind,
/// so the operator's next start, with the file fixed, is not refused for a claim nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_leaves_no_claim_behind() {
    let d = dirs();
    let missing = d.data.with_file_name("no-such-key.pem");
    let missing = missing.to_str().unwrap();
    // A claim that would take an hour to go stale: only a claim never taken (or released)
    // lets the next start through.
    let out = tokio::task::block_in_place(|| {
        refused(
            "serve (TLS key missing)",
            serve_cmd(
                &d,
                &[
                    "--tls-cert",
                    missing,
                    "--tls-key",
                    missing,
                    "--owner-silent-after-ms",
                    "3600000",
                ],
            ),
        )
    });
    assert!(
        out.contains("no-such-key.pem"),
        "the error does not name the file:\n{out}"
    );
    let next = Serve::start(
        "serve (TLS fixed)",
        serve_cmd(&d, &["--owner-silent-after-ms", "3600000"]),
    );
    next.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_whose_claim_is_taken_over_stops() {
    let d = dirs();
    let mut server = Serve::start("serve (to be displaced)", serve_cmd(&d, &[]));
    // Another process takes the id over (as if it had judged this one dead).
    let url = format!("sqlite://{}", d.data.join("registry.db").display());
    let reg = Registry::open(&url).await.expect("the serve's registry");
    let _taker = take_when_stale(&reg, process("shared-id", "db-z", 999), Duration::ZERO).await;
    let status = tokio::task::block_in_place(|| server.child.wait_exit(DEADLINE));
    assert!(
        !status.success(),
        "it exited {status} after losing its claim"
    );
    let out = server.child.output();
    assert!(
        out.contains("was taken over by another process") && out.contains("pid 999"),
        "{out}"
    );
    reg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serves_sharing_a_postgres_registry_cannot_share_an_instance_id() {
    let Some(pg) = postgres_server() else { return };
    let db = PgDatabase::create(&pg).await;
    let (a, b) = (dirs(), dirs());
    let cmd = |d: &Dirs| serve_cmd(d, &["--registry", &db.url]);
    let first = Serve::start("serve (postgres, first)", cmd(&a));
    let out = tokio::task::block_in_place(|| refused("serve (postgres, second)", cmd(&b)));
    let part = format!("pid {}", first.child.pid());
    assert!(
        out.contains("held by another live process") && out.contains(&part),
        "{part:?} missing from:\n{out}"
    );
    first.terminate();
    Serve::start("serve (postgres, after a clean stop)", cmd(&b)).terminate();
    db.drop_database().await;
}

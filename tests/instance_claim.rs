//! One live process per instance id: the registry's claim (`InstanceClaim`) on SQLite and
//! PostgreSQL, and the `serve` binary refusing to start beside a live holder of its id, taking
//! over a dead one's stale claim, and stopping when its own claim is taken over.

mod support;

use std::time::{Duration, Instant};

use support::registry::{PgDatabase, postgres_server};

use mushroom_backup::instance_lock::DeadHolder;
use mushroom_backup::registry::{ClaimError, ClaimRecord, InstanceClaim, Predecessor, Registry};
use support::binary::Running;
use support::serve::{self, DEADLINE, Serve};

both_backends!(
    a_live_claim_refuses_a_second_process,
    a_stale_claim_is_taken_over_and_its_holder_loses_it,
    a_released_claim_is_taken_at_once,
    a_claim_whose_holder_is_proven_dead_is_taken_at_once,
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
        // Stale is all that is known of it: not proven dead.
        assert!(
            matches!(new.predecessor(), Some(Predecessor::Stale(v)) if v == replaced),
            "{:?}",
            new.predecessor()
        );
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

    pub async fn a_claim_whose_holder_is_proven_dead_is_taken_at_once(reg: Registry) {
        let old = InstanceClaim::take_as(&reg, process("i1", "db-a", 101), LIVE)
            .await
            .expect("the first claim");
        old.renew().await.expect("a fresh heartbeat");
        let dead = |nonce: &str, host: &str, pid| DeadHolder {
            nonce: nonce.into(),
            host: host.into(),
            pid,
        };
        // Proofs about other processes prove nothing about this one: the claim is live.
        let nonce = old.record().nonce.clone();
        for wrong in [
            dead("another-nonce", "db-a", 101),
            dead(&nonce, "db-b", 101),
            dead(&nonce, "db-a", 102),
        ] {
            let e = InstanceClaim::take_as_after(
                &reg,
                process("i1", "db-a", 303),
                LIVE,
                std::slice::from_ref(&wrong),
            )
            .await
            .expect_err("a proof about another process");
            assert!(
                matches!(e, ClaimError::HeldElsewhere { .. }),
                "{wrong:?}: {e:?}"
            );
        }
        // Proven dead: taken over at once, though its heartbeat is fresh and staleness an hour.
        let proofs = [dead("older", "db-a", 99), dead(&nonce, "db-a", 101)];
        let new = InstanceClaim::take_as_after(&reg, process("i1", "db-a", 303), LIVE, &proofs)
            .await
            .expect("a proven-dead holder's claim");
        match new.predecessor() {
            Some(p @ Predecessor::ProvenDead(v)) => {
                assert!(p.proven_dead());
                assert_eq!(p.nonce(), nonce);
                assert_eq!(v.record.pid, 101);
                assert!(v.heartbeat_age < LIVE);
            }
            other => panic!("expected ProvenDead, got {other:?}"),
        }
        assert_eq!(new.taken_over().map(|v| v.record.pid), Some(101));
        let e = old
            .renew()
            .await
            .expect_err("the dead holder's claim is gone");
        assert!(matches!(e, ClaimError::Lost { .. }), "{e:?}");
        new.renew().await.expect("the successor holds");
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
    serve_cmd_as(d, "shared-id", extra)
}

fn serve_cmd_as(d: &Dirs, instance_id: &str, extra: &[&str]) -> std::process::Command {
    let mut args = vec![
        "--instance-id",
        instance_id,
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

/// A second `serve` on a data directory in use is refused by the directory's lock, naming
/// the holder, whatever instance id it was given; a clean stop frees the lock and the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_one_data_dir_is_refused_naming_the_lock() {
    let d = dirs();
    let first = Serve::start("serve (first)", serve_cmd(&d, &[]));
    let host = mushroom_backup::lease::host_name();
    for (name, id) in [
        ("serve (second)", "shared-id"),
        ("serve (another id)", "other-id"),
    ] {
        let out = tokio::task::block_in_place(|| refused(name, serve_cmd_as(&d, id, &[])));
        for part in [
            "instance.lock is held by another live process".to_string(),
            format!("pid {} on host {host}", first.child.pid()),
        ] {
            assert!(out.contains(&part), "{name}: {part:?} missing from:\n{out}");
        }
    }

    // A clean stop releases the lock and the claim: a successor starts at once, even one that
    // would wait an hour for a claim to go stale, and has no predecessor to take over.
    first.terminate();
    let mut second = Serve::start(
        "serve (after a clean stop)",
        serve_cmd(&d, &["--owner-silent-after-ms", "3600000"]),
    );
    second.child.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| second.child.wait_exit(DEADLINE));
    let out = second.child.output();
    assert!(status.success() && !out.contains("took over"), "{out}");
}

/// Waits until `child` has printed a line containing `part` (stdout and stderr are read by
/// two threads, so a log line on stderr may arrive after a later line on stdout).
fn printed(child: &mut Running, part: &str) {
    if child.seen().iter().any(|l| l.text.contains(part)) {
        return;
    }
    tokio::task::block_in_place(|| {
        child.wait_for(&format!("print {part:?}"), DEADLINE, |l| {
            l.text.contains(part).then_some(())
        })
    });
}

/// Where the serves of one test keep their registry: a SQLite file outside every data dir, or
/// a database of its own on the PostgreSQL server.
enum SharedRegistry {
    Sqlite {
        _tmp: tempfile::TempDir,
        url: String,
    },
    Postgres(support::postgres::Database),
}

impl SharedRegistry {
    fn sqlite() -> SharedRegistry {
        let tmp = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/shared.db", tmp.path().display());
        SharedRegistry::Sqlite { _tmp: tmp, url }
    }

    async fn postgres() -> Option<SharedRegistry> {
        let pg = postgres_server()?;
        Some(SharedRegistry::Postgres(PgDatabase::create(&pg).await))
    }

    fn url(&self) -> &str {
        match self {
            SharedRegistry::Sqlite { url, .. } => url,
            SharedRegistry::Postgres(db) => &db.url,
        }
    }

    /// The claim on the tests' instance id.
    async fn claim(&self) -> ClaimRecord {
        let reg = Registry::open(self.url())
            .await
            .expect("the shared registry");
        let claim = reg
            .instance_claim("shared-id")
            .await
            .unwrap()
            .expect("a claim");
        reg.close().await;
        claim.record
    }

    async fn done(self) {
        if let SharedRegistry::Postgres(db) = self {
            db.drop_database().await;
        }
    }
}

/// A SIGKILLed `serve` restarted at once on its data directory claims its id at once: its
/// lock is free, so the process whose nonce the claim names is dead, however fresh its
/// heartbeat (and the restart would wait an hour for it to go stale).
async fn a_killed_serve_restarted_at_once_claims_at_once(reg: SharedRegistry) {
    let d = dirs();
    let args = [
        "--registry",
        reg.url(),
        "--owner-silent-after-ms",
        "3600000",
    ];
    let mut first = Serve::start("serve (to be killed)", serve_cmd(&d, &args));
    let killed = first.child.pid();
    assert_eq!(reg.claim().await.pid, i64::from(killed));
    first.child.kill();
    let mut second = Serve::start("serve (restarted at once)", serve_cmd(&d, &args));
    printed(&mut second.child, "proven stopped by its lock");
    let out = second.child.output();
    assert!(out.contains(&format!("previous=pid {killed} ")), "{out}");
    assert_eq!(reg.claim().await.pid, i64::from(second.child.pid()));
    second.terminate();
    reg.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_serve_restarted_at_once_claims_at_once_on_sqlite() {
    a_killed_serve_restarted_at_once_claims_at_once(SharedRegistry::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_serve_restarted_at_once_claims_at_once_on_postgres() {
    let Some(reg) = SharedRegistry::postgres().await else {
        return;
    };
    a_killed_serve_restarted_at_once_claims_at_once(reg).await;
}

/// A data directory copied while its `serve` runs carries a lock record naming the live
/// claim's nonce; a `serve` on the copy is free to lock the copied file, but that file is not
/// the one the live process holds, so it proves nothing: the copy is refused by the live
/// claim, and the claim stays the original's.
async fn a_copied_data_dir_does_not_steal_a_live_claim(reg: SharedRegistry) {
    let (original, copy) = (dirs(), dirs());
    let args = [
        "--registry",
        reg.url(),
        "--owner-silent-after-ms",
        "3600000",
    ];
    let live = Serve::start("serve (original)", serve_cmd(&original, &args));
    std::fs::create_dir_all(&copy.data).unwrap();
    let lock = |d: &Dirs| d.data.join("instance.lock");
    std::fs::copy(lock(&original), lock(&copy)).unwrap();
    // The copied record names the live claim: only the file's identity tells them apart.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(lock(&copy)).unwrap()).unwrap();
    let held = reg.claim().await;
    assert_eq!(record["holder"]["nonce"], held.nonce.as_str());
    assert_eq!(held.pid, i64::from(live.child.pid()));

    let out = tokio::task::block_in_place(|| refused("serve (on a copy)", serve_cmd(&copy, &args)));
    for part in [
        "its record names another file".to_string(),
        "is held by another live process".to_string(),
        format!("pid {}", live.child.pid()),
    ] {
        assert!(out.contains(&part), "{part:?} missing from:\n{out}");
    }
    let now = reg.claim().await;
    assert_eq!(
        (now.nonce, now.pid, now.started_at_ms),
        (held.nonce, held.pid, held.started_at_ms),
        "the copy changed the live claim (only its heartbeat moves)"
    );
    live.terminate();
    reg.done().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_data_dir_does_not_steal_a_live_claim_on_sqlite() {
    a_copied_data_dir_does_not_steal_a_live_claim(SharedRegistry::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_data_dir_does_not_steal_a_live_claim_on_postgres() {
    let Some(reg) = SharedRegistry::postgres().await else {
        return;
    };
    a_copied_data_dir_does_not_steal_a_live_claim(reg).await;
}

/// A killed holder of the id on *another* data directory is not proven dead by any lock this
/// one holds: its claim is taken over only once its heartbeat is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_serve_elsewhere_is_taken_over_once_stale() {
    let reg = SharedRegistry::sqlite();
    let (a, b) = (dirs(), dirs());
    let mut first = Serve::start(
        "serve (elsewhere)",
        serve_cmd(&a, &["--registry", reg.url()]),
    );
    first.child.kill();
    let start = Instant::now();
    let taker = loop {
        let mut child = Running::spawn(
            "serve (after a kill elsewhere)",
            serve_cmd(
                &b,
                &["--registry", reg.url(), "--owner-silent-after-ms", "300"],
            ),
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
    let mut taker = taker;
    printed(&mut taker, "took over the stale claim");
    drop(taker);
    reg.done().await;
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

/// The `instance_id` of a `serve`'s listening line.
fn listening_id(child: &Running) -> String {
    child
        .seen()
        .iter()
        .find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
            v.get("listening")?;
            Some(v["instance_id"].as_str()?.to_string())
        })
        .unwrap_or_else(|| child.fail("no instance_id in a listening line"))
}

/// Issue 40, finding 4: two `serve`s on one host, each with its own data directory and no
/// `--instance-id`, used to share the host name as instance id, and so one instance lease per
/// bucket: the second's stores in a shared bucket waited on "another process with this
/// instance id" for good. Now each data directory gets an id of its own (`<host>-<random>`,
/// kept in it across restarts), and both back up into one bucket under two instance leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serves_of_one_host_default_to_instance_ids_of_their_own() {
    use support::served;
    let host = mushroom_backup::lease::host_name();
    let shared = served::dirs();
    let bucket = shared.base.join("bucket");
    let mut ids = Vec::new();
    let mut running = Vec::new();
    for name in ["a", "b"] {
        let d = served::dirs();
        let dir = d.root.join("store");
        support::store::write(&dir, 5, 0, 0);
        let (child, addr) = served::start(&format!("serve {name}"), served::fast_serve(&d, &[]));
        let id = listening_id(&child);
        assert!(
            id.starts_with(&format!("{host}-")) && id.len() == host.len() + 9,
            "{id}"
        );
        let c = served::client(addr).await;
        let url = support::file_url(&bucket.join(name));
        let store = served::register(&c, support::register_req(&dir, &url)).await;
        ids.push(id);
        running.push((child, c, store, d));
    }
    assert_ne!(ids[0], ids[1], "two data directories share one instance id");
    for (_, c, store, _) in &running {
        served::wait_health(c, store, "holding its lease, 5 commits shipped", |h| {
            h.healthy && h.lease_held && h.restore_point_commit_seq == 5
        })
        .await;
    }
    for id in &ids {
        let lease = bucket
            .join(".mushroom-backup")
            .join(mushroom_backup::lease::instance::key_for(id));
        assert!(lease.is_file(), "no instance lease {}", lease.display());
    }

    // A restart keeps the data directory's id.
    let (mut child, _, _, d) = running.remove(0);
    served::terminate(&mut child);
    let (again, _) = served::start("serve a (again)", served::fast_serve(&d, &[]));
    assert_eq!(listening_id(&again), ids[0]);
}

/// Finding 4, the rest: two `serve`s given one `--instance-id` (each its own data directory
/// and registry) on one bucket would take each other's store leases in turn; the second is
/// refused at its start, naming the live holder and itself. (Before, it started and its
/// store waited, unhealthy, on "another process with this instance id" for as long as the
/// first lived.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_given_an_instance_id_live_in_its_bucket_is_refused_at_start_naming_both() {
    use support::served;
    let shared = served::dirs();
    let bucket = shared.base.join("bucket");
    let extra = ["--instance-id", "one-id"];
    let (a, b) = (served::dirs(), served::dirs());
    let (dir_a, dir_b) = (a.root.join("store"), b.root.join("store"));
    support::store::write(&dir_a, 5, 0, 0);
    support::store::write(&dir_b, 5, 0, 0);
    let (_first, addr) = served::start("serve a", served::fast_serve(&a, &extra));
    let c = served::client(addr).await;
    let url = support::file_url(&bucket.join("a"));
    let store = served::register(&c, support::register_req(&dir_a, &url)).await;
    served::wait_health(&c, &store, "a holding its lease", |h| {
        h.healthy && h.lease_held && h.restore_point_commit_seq == 5
    })
    .await;
    // The second, with a store in the same bucket: it starts (it had no store), its store
    // cannot hold the lease; at its next start it is refused.
    let (mut second, addr_b) = served::start("serve b", served::fast_serve(&b, &extra));
    let cb = served::client(addr_b).await;
    let url_b = support::file_url(&bucket.join("b"));
    served::register(&cb, support::register_req(&dir_b, &url_b)).await;
    served::terminate(&mut second);
    let out = refused("serve b (again)", served::fast_serve(&b, &extra));
    let host = mushroom_backup::lease::host_name();
    assert!(
        out.contains("another live `serve` uses instance id one-id")
            && out.contains(&format!("on host {host}"))
            && out.contains("one-id/"),
        "{out}"
    );
    // The first runs on, healthy.
    served::wait_health(&c, &store, "a still healthy", |h| h.healthy && h.lease_held).await;
}

//! Registrations that contradict the registered stores, refused through real gRPC against the
//! `serve` binary, on SQLite and on PostgreSQL (`MUSHROOM_TEST_POSTGRES_URL`, set by
//! `scripts/test.sh`; without it the PostgreSQL cases print a SKIP line and pass, except under
//! `CI=true`, where they fail). With PostgreSQL the contradicting calls go to a second instance
//! sharing the registry: what one instance registered binds the other.
//!
//! - a store directory inside or above a registered one;
//! - a destination sharing objects with a registered store's (nested prefixes, one bucket);
//! - `Adopt` from a prefix a registered store still backs up (refused before reading it);
//! - `file://` destinations among the stores, in the data directory, or outside
//!   `--allow-destination-root` (service-local: SQLite only);
//! - two registrations at once, each nested in the other, through the registry itself: one
//!   wins, the other sees it.

mod support;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use mushroom_backup::registry::{Registry, StoreRecord};
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::service::{self, DEADLINE, Dirs, Server};
use tonic::Code;
use tonic::transport::Channel;

type Client = BackupControlClient<Channel>;

fn register_req(store_dir: &str, destination: &str) -> proto::RegisterRequest {
    proto::RegisterRequest {
        store_dir: store_dir.into(),
        destination: destination.into(),
        ..Default::default()
    }
}

async fn register(c: &mut Client, dir: &str, dest: &str) -> Result<String, tonic::Status> {
    c.register(register_req(dir, dest))
        .await
        .map(|r| r.into_inner().store_id)
}

/// Asserts `r` failed with `code` and a message holding every one of `fragments`.
fn refused<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, tonic::Status>,
    code: Code,
    fragments: &[&str],
) {
    match r {
        Ok(v) => panic!("{what}: accepted ({v:?})"),
        Err(s) => assert!(
            s.code() == code && fragments.iter().all(|f| s.message().contains(f)),
            "{what}: {:?} {:?}; expected {code:?} naming {fragments:?}",
            s.code(),
            s.message()
        ),
    }
}

async fn store_count(c: &mut Client) -> usize {
    support::served::list_stores(c).await.len()
}

/// Two clients: `a` registers, `b` contradicts (another instance on PostgreSQL, the same one
/// on SQLite).
async fn nested_dirs_and_shared_prefixes(d: &Dirs, a: &mut Client, b: &mut Client) {
    let group = d.store("group");
    let s1 = register(a, &format!("{group}/s1"), &d.bucket("s1"))
        .await
        .expect("Register s1");

    refused(
        "the same directory",
        register(b, &format!("{group}/s1"), &d.bucket("other")).await,
        Code::AlreadyExists,
        &["is already registered", &s1],
    );
    refused(
        "a directory inside a registered one",
        register(b, &format!("{group}/s1/inner"), &d.bucket("x1")).await,
        Code::FailedPrecondition,
        &["is inside the directory", &s1],
    );
    refused(
        "a directory above a registered one",
        register(b, &group, &d.bucket("x2")).await,
        Code::FailedPrecondition,
        &["is above the directory", &s1],
    );

    for (what, dest) in [
        ("the same destination", d.bucket("s1")),
        ("a destination inside", d.bucket("s1/deeper")),
        (
            "a destination above",
            format!("file://{}", d.buckets.display()),
        ),
        (
            "the same destination, trailing slash",
            format!("{}/", d.bucket("s1")),
        ),
    ] {
        refused(
            what,
            register(b, &d.store("s2"), &dest).await,
            Code::FailedPrecondition,
            &["shares objects with", &s1],
        );
    }
    // Through a link: the destination is compared resolved.
    std::fs::create_dir_all(d.buckets.join("s1")).unwrap();
    std::os::unix::fs::symlink(d.buckets.join("s1"), d.buckets.join("link-to-s1")).unwrap();
    refused(
        "a destination through a link",
        register(b, &d.store("s2"), &d.bucket("link-to-s1/x")).await,
        Code::FailedPrecondition,
        &["shares objects with", &s1],
    );

    let s4 = register(a, &d.store("s4"), "s3://fleet-bucket/nodes/s4")
        .await
        .expect("Register an S3 destination");
    for dest in [
        "s3://fleet-bucket/nodes",
        "s3://fleet-bucket",
        "s3://fleet-bucket/nodes/s4/",
        "s3://fleet-bucket/nodes/s4/deeper",
    ] {
        refused(
            dest,
            register(b, &d.store("s5"), dest).await,
            Code::FailedPrecondition,
            &["shares objects with", &s4],
        );
    }
    assert_eq!(store_count(a).await, 2, "refusals registered nothing");

    // Neighbours are fine: a sibling directory, a prefix that only starts with the same
    // letters, another bucket.
    register(b, &format!("{group}/s1x"), &d.bucket("s1x"))
        .await
        .expect("a sibling directory and destination");
    register(b, &d.store("s6"), "s3://fleet-bucket/nodes/s4x")
        .await
        .expect("a prefix that is not nested");
    register(b, &d.store("s7"), "s3://other-bucket/nodes/s4")
        .await
        .expect("another bucket");
    assert_eq!(store_count(a).await, 5);
}

/// A store `name` of 200 commits under the root, backed up once to the bucket `name`.
fn backed_up(d: &Dirs, name: &str) -> (std::path::PathBuf, String) {
    let source = d.root.join(name);
    support::store::write(&source, 200, 80, 4096);
    let dest = d.bucket(name);
    let mut backup = support::binary::command("http://127.0.0.1:1");
    backup
        .args(["backup", "--store"])
        .arg(&source)
        .args(["--to", &dest, "--once"]);
    support::binary::run_ok("backup --once", backup, DEADLINE);
    (source, dest)
}

/// `a` backs up a store; `b` is asked to adopt that store's prefix while it is registered.
async fn adopt_from_a_live_prefix(d: &Dirs, a: &mut Client, b: &mut Client) {
    let (source, dest) = backed_up(d, "source");
    let id = register(a, source.to_str().unwrap(), &dest)
        .await
        .expect("Register the source");

    let target = d.root.join("adopted");
    let adopt = |c: &mut Client| {
        let mut c = c.clone();
        let req = proto::AdoptRequest {
            store_dir: target.to_str().unwrap().into(),
            destination: dest.clone(),
            ..Default::default()
        };
        async move { c.adopt(req).await.map(|r| r.into_inner()) }
    };
    refused(
        "Adopt from a prefix a registered store backs up",
        adopt(b).await,
        Code::FailedPrecondition,
        &[
            &format!("store {id} "),
            "still backs up to",
            "deregister it",
        ],
    );
    assert!(
        !target.exists(),
        "a refused Adopt restored into {}",
        target.display()
    );

    // Once the store is deregistered the same Adopt goes through.
    a.deregister(proto::DeregisterRequest {
        store_id: id.clone(),
        flush: true,
    })
    .await
    .expect("Deregister");
    let adopted = adopt(b).await.expect("Adopt once the prefix is free");
    assert_eq!(adopted.commit_seq, 200, "{adopted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contradicting_registrations_are_refused_on_sqlite() {
    let d = service::dirs();
    let server = Server::start("serve", service::serve_command(&d, "a", None, &[]));
    let mut c = server.client().await;
    let mut same = c.clone();
    nested_dirs_and_shared_prefixes(&d, &mut c, &mut same).await;
    adopt_from_a_live_prefix(&d, &mut c, &mut same).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contradicting_registrations_are_refused_across_instances_on_postgres() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "contradictions").await;
    let d = service::dirs();
    let a = Server::start(
        "serve a",
        service::serve_command(&d, "a", Some(&db.url), &[]),
    );
    let b = Server::start(
        "serve b",
        service::serve_command(&d, "b", Some(&db.url), &[]),
    );
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    nested_dirs_and_shared_prefixes(&d, &mut ca, &mut cb).await;
    adopt_from_a_live_prefix(&d, &mut ca, &mut cb).await;
    drop((ca, cb, a, b));
    db.drop_database().await;
}

/// After a host loss the dead owner's store still stands in the registry, and while it does
/// its prefix cannot be adopted: another instance may deregister it once the owner has been
/// silent (never while it is heard from), and the prefix is then adopted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_owners_store_is_deregistered_elsewhere_and_its_prefix_adopted() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "silent_owner").await;
    let d = service::dirs();
    let fast = ["--health-report-interval-ms", "100"];
    let mut a = Server::start(
        "serve a",
        service::serve_command(&d, "a", Some(&db.url), &fast),
    );
    let b = Server::start(
        "serve b",
        service::serve_command(
            &d,
            "b",
            Some(&db.url),
            &[
                "--health-report-interval-ms",
                "100",
                "--owner-silent-after-ms",
                "1000",
            ],
        ),
    );
    let (source, dest) = backed_up(&d, "lost");
    let mut ca = a.client().await;
    let mut cb = b.client().await;
    let id = register(&mut ca, source.to_str().unwrap(), &dest)
        .await
        .expect("Register on a");
    let deregister = |c: &mut Client| {
        let mut c = c.clone();
        let req = proto::DeregisterRequest {
            store_id: id.clone(),
            flush: false,
        };
        async move { c.deregister(req).await.map(|r| r.into_inner()) }
    };
    // (A Deregister through b while a runs is forwarded to a: see tests/control_plane.rs.)

    // The host is lost: a stops without a word.
    tokio::task::block_in_place(|| a.child.kill());
    let start = std::time::Instant::now();
    loop {
        match deregister(&mut cb).await {
            Ok(_) => break,
            Err(s) if s.code() == Code::FailedPrecondition && start.elapsed() < DEADLINE => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("Deregister of a silent owner's store: {s:?}"),
        }
    }
    assert_eq!(store_count(&mut cb).await, 0);
    let adopted = cb
        .adopt(proto::AdoptRequest {
            store_dir: d.root.join("adopted").to_str().unwrap().into(),
            destination: dest.clone(),
            ..Default::default()
        })
        .await
        .expect("Adopt once the dead owner's store is deregistered")
        .into_inner();
    assert_eq!(adopted.commit_seq, 200, "{adopted:?}");
    drop((ca, cb, a, b));
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_destinations_stay_out_of_the_stores_and_the_data_dir_and_inside_their_roots() {
    let d = service::dirs();
    let data = d.base.join("a");
    let server = Server::start("serve", service::serve_command(&d, "a", None, &[]));
    let mut c = server.client().await;
    let url = |p: &Path| format!("file://{}", p.display());
    for (what, dest, fragment) in [
        (
            "inside the store root",
            url(&d.root.join("bucket")),
            "overlaps the allowed store root",
        ),
        (
            "the store root itself",
            url(&d.root),
            "overlaps the allowed store root",
        ),
        (
            "inside the data dir",
            url(&data.join("bucket")),
            "overlaps the service's data directory",
        ),
        (
            "above the data dir",
            url(&d.base),
            "overlaps the allowed store root",
        ),
    ] {
        refused(
            what,
            register(&mut c, &d.store("s"), &dest).await,
            Code::PermissionDenied,
            &[fragment],
        );
    }
    assert_eq!(store_count(&mut c).await, 0);
    drop(c);
    drop(server);

    // With allowed destination roots (here from the environment), only under them.
    let allowed = d.base.join("backups");
    let mut cmd = service::serve_command(&d, "b", None, &[]);
    cmd.env("MUSHROOMDB_BACKUP_ALLOW_DESTINATION_ROOTS", &allowed);
    let server = Server::start("serve with destination roots", cmd);
    let mut c = server.client().await;
    let elsewhere = d.base.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, allowed.join("escape")).unwrap();
    let nowhere = d.base.join("nowhere");
    std::os::unix::fs::symlink(&nowhere, allowed.join("dangling")).unwrap();
    let outside = [
        "is not under an allowed destination root",
        allowed.to_str().unwrap(),
    ];
    for (what, dest, code, fragments) in [
        (
            "outside every destination root",
            url(&elsewhere),
            Code::PermissionDenied,
            &outside[..],
        ),
        (
            "the destination root itself",
            url(&allowed),
            Code::PermissionDenied,
            &outside[..],
        ),
        (
            "out through a link",
            url(&allowed.join("escape/x")),
            Code::PermissionDenied,
            &outside[..],
        ),
        (
            "through a dangling link",
            url(&allowed.join("dangling/x")),
            Code::InvalidArgument,
            &["is a symbolic link to a missing target"][..],
        ),
    ] {
        refused(
            what,
            register(&mut c, &d.store("s"), &dest).await,
            code,
            fragments,
        );
    }
    assert!(
        !elsewhere.join("x").exists() && !nowhere.exists(),
        "a refused destination was created"
    );
    register(&mut c, &d.store("s"), &url(&allowed.join("s")))
        .await
        .expect("a destination under the root");

    // A link planted inside an allowed destination leads nowhere (issue 25, part 2): the
    // store's worker refuses the bucket, naming the link, and nothing lands behind it.
    let planted = allowed.join("planted");
    std::fs::create_dir_all(&planted).unwrap();
    std::os::unix::fs::symlink(&elsewhere, planted.join("gen")).unwrap();
    support::store::write(&d.root.join("p"), 50, 0, 0);
    let id = register(&mut c, &d.store("p"), &url(&planted))
        .await
        .expect("a destination under the root");
    let named = format!("{} is a symbolic link", planted.join("gen").display());
    support::served::wait_health(&c, &id, "unhealthy, naming the link", |h| {
        !h.healthy && h.reason.contains(&named)
    })
    .await;
    let behind: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert!(
        behind.is_empty(),
        "the worker wrote behind the link: {behind:?}"
    );
}

// ---- the registry decides races --------------------------------------------------------

fn record(dir: &str) -> StoreRecord {
    StoreRecord {
        store_id: uuid::Uuid::new_v4().to_string(),
        store_dir: dir.into(),
        destination: format!("file:///b{dir}"),
        labels: Default::default(),
        options: serde_json::json!({}),
        node_token_hash: "h".into(),
        instance_id: "i".into(),
        registered_at_ms: 0,
        owner_since_ms: 0,
    }
}

/// The registered directory `dir` is nested with, if any.
fn nested(registered: &[StoreRecord], dir: &str) -> Option<String> {
    registered
        .iter()
        .find(|r| {
            Path::new(dir).starts_with(&r.store_dir) || Path::new(&r.store_dir).starts_with(dir)
        })
        .map(|r| r.store_dir.clone())
}

/// `first` checks and is held inside its check until `second` is done or two seconds pass;
/// `second` registers a directory nested in `first`'s. With the lock, `second` waits for
/// `first` and sees its row; without it, both would pass their checks.
async fn registrations_take_turns(first: Registry, second: Registry) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let outer = record("/r/a");
    let inner = record("/r/a/inner");
    let one = tokio::spawn(async move {
        let dir = outer.store_dir.clone();
        first
            .insert_store_unless(&outer, move |registered| {
                entered_tx.send(()).unwrap();
                // Bounds the wait only; the outcome does not depend on it.
                let _ = done_rx.recv_timeout(Duration::from_secs(2));
                nested(registered, &dir)
            })
            .await
    });
    tokio::task::block_in_place(|| entered_rx.recv_timeout(DEADLINE)).expect("first checks");
    let two = tokio::spawn(async move {
        let r = second
            .insert_store_unless(&inner, |registered| nested(registered, &inner.store_dir))
            .await;
        let _ = done_tx.send(());
        r
    });
    let one = one.await.unwrap();
    let two = two.await.unwrap();
    assert!(matches!(one, Ok(Ok(()))), "the first registration: {one:?}");
    assert_eq!(
        two.as_ref().ok(),
        Some(&Err("/r/a".to_string())),
        "the second registration must see the first: {two:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registrations_take_turns_on_sqlite() {
    let t = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/registry.db", t.path().display());
    let reg = Registry::open(&url).await.expect("open");
    registrations_take_turns(reg.clone(), reg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registrations_take_turns_on_postgres() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "registration_lock").await;
    let a = Registry::open(&db.url).await.expect("open a");
    let b = Registry::open(&db.url).await.expect("open b");
    registrations_take_turns(a.clone(), b.clone()).await;
    a.close().await;
    b.close().await;
    db.drop_database().await;
}

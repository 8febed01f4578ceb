//! What the service takes from a node, over real gRPC against the `serve` binary: a position
//! the store's files contradict never counts (and shows in health while its stream stays), a
//! late report on an old stream never rewinds the position, `Deregister` ends the store's
//! streams, and an unknown store is answered exactly like a wrong token.
//!
//! The engine runs in the test process, holding the store open; the test reports by hand on
//! raw `ReportPosition` streams, which is how a lying or confused node would.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mushroom_backup::node_client::position_report;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use mushroom_backup::store::format::WalPosition;
use support::serve::{self, DEADLINE, Serve};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

type Client = BackupControlClient<Channel>;

/// A temp dir with an allowed root and a data dir, and `serve` on it.
struct Setup {
    _tmp: tempfile::TempDir,
    base: std::path::PathBuf,
    root: std::path::PathBuf,
    server: Serve,
}

fn setup(name: &str) -> Setup {
    setup_with(name, &[])
}

/// A `serve` named `name` with the arguments `extra` too.
fn setup_with(name: &str, extra: &[&str]) -> Setup {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    let root = base.join("stores");
    std::fs::create_dir_all(&root).unwrap();
    let server = Serve::start(name, serve::command(&base.join("data"), &root, extra));
    Setup {
        _tmp: tmp,
        base,
        root,
        server,
    }
}

impl Setup {
    /// The store `node` under the allowed root, held open (and locked) by an engine in this
    /// test, registered to back up to `bucket`: its directory, the engine, a client and the
    /// registration.
    async fn held_store(&self) -> (PathBuf, Engine, Client, proto::RegisterResponse) {
        let store = self.root.join("node");
        let engine = open_engine(&store);
        let mut c = self.server.client().await;
        let reg = register(&mut c, &store, &self.base.join("bucket")).await;
        (store, engine, c, reg)
    }
}

async fn register(c: &mut Client, dir: &Path, bucket: &Path) -> proto::RegisterResponse {
    c.register(tonic::Request::new(proto::RegisterRequest {
        store_dir: dir.to_str().unwrap().to_string(),
        destination: format!("file://{}", bucket.display()),
        ..Default::default()
    }))
    .await
    .expect("Register")
    .into_inner()
}

async fn health(c: &mut Client, id: &str) -> proto::StoreHealth {
    support::served::health_of(c, id, tonic::Request::new).await
}

/// Polls the store's health until `ok` holds for one, checking `always` on every one seen;
/// panics after [`DEADLINE`] naming `what` and the last health.
async fn wait_health(
    c: &mut Client,
    id: &str,
    what: &str,
    always: impl Fn(&proto::StoreHealth),
    ok: impl Fn(&proto::StoreHealth) -> bool,
) -> proto::StoreHealth {
    let start = Instant::now();
    loop {
        let h = health(c, id).await;
        always(&h);
        if ok(&h) {
            return h;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "waited {DEADLINE:?} for {what}; last health: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

use mushroom_backup::store::engine::Engine;
use support::store::{commit_synced as commit, open_engine};

/// Whether a health shows commit `n` shipped.
fn shipped(n: u64) -> impl Fn(&proto::StoreHealth) -> bool {
    move |h| h.shipped_commit_seq == n
}

/// A raw `ReportPosition` stream: its sender and the server's commands.
struct RawStream {
    tx: mpsc::Sender<proto::PositionReport>,
    commands: Streaming<proto::NodeCommand>,
}

async fn open_stream(
    c: &mut Client,
    id: &str,
    token: &str,
    first: &WalPosition,
) -> Result<RawStream, Status> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(position_report(id, first)).await.unwrap();
    let commands = c
        .report_position(support::with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            token,
        ))
        .await?
        .into_inner();
    Ok(RawStream { tx, commands })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_position_the_files_contradict_never_counts() {
    let s = setup("serve (lies)");
    let (store, mut engine, mut c, reg) = s.held_store().await;
    let id = reg.store_id.clone();

    let honest = open_stream(&mut c, &id, &reg.node_token, &engine.position())
        .await
        .expect("the honest stream");
    let p10 = commit(&mut engine, 10);
    honest.tx.send(position_report(&id, &p10)).await.unwrap();
    wait_health(
        &mut c,
        &id,
        "10 commits shipped",
        |_| {},
        |h| h.healthy && h.shipped_commit_seq == 10,
    )
    .await;

    // A second stream with the store's own token claims commits the files do not hold.
    let lie = WalPosition {
        commit_seq: u64::MAX - 1,
        ..p10
    };
    let liar = open_stream(&mut c, &id, &reg.node_token, &lie)
        .await
        .expect("the liar's stream is accepted: its token is right");
    // And one naming a WAL file that does not exist, past every commit on disk.
    liar.tx
        .send(position_report(
            &id,
            &WalPosition {
                wal_id: uuid::Uuid::from_u128(7),
                commit_seq: 1 << 40,
                ..p10
            },
        ))
        .await
        .unwrap();
    let truthful = |h: &proto::StoreHealth| {
        assert!(
            h.durable_commit_seq <= engine_commits(&store),
            "health shows commits the store does not have: {h:?}"
        );
    };
    let h = wait_health(
        &mut c,
        &id,
        "health naming the contradicted report",
        truthful,
        |h| !h.healthy && h.reason.contains("position reports refused"),
    )
    .await;
    assert!(h.reason.contains("contradict"), "{h:?}");

    // The honest node goes on: its positions ship while the liar's stream stays attached.
    let p30 = commit(&mut engine, 20);
    honest.tx.send(position_report(&id, &p30)).await.unwrap();
    let h = wait_health(
        &mut c,
        &id,
        "30 commits shipped beside the liar",
        truthful,
        |h| h.shipped_commit_seq == 30,
    )
    .await;
    assert!(
        !h.healthy,
        "the lie no longer shows while its stream stays: {h:?}"
    );
    assert_eq!(h.durable_commit_seq, 30, "{h:?}");

    // Once the liar's stream ends its reports no longer count, nor show.
    drop(liar);
    wait_health(&mut c, &id, "healthy after the liar left", truthful, |h| {
        h.healthy && h.durable_commit_seq == 30 && h.shipped_commit_seq == 30
    })
    .await;

    // The node reconnects (a new stream) and reports on; then a late report arrives on the
    // old stream. It does not rewind the position, not even once the new stream is gone.
    let p40 = commit(&mut engine, 10);
    let newer = open_stream(&mut c, &id, &reg.node_token, &p40)
        .await
        .expect("the newer stream");
    wait_health(&mut c, &id, "40 commits shipped", truthful, |h| {
        h.healthy && h.shipped_commit_seq == 40
    })
    .await;
    honest.tx.send(position_report(&id, &p30)).await.unwrap();
    drop(newer);
    let p41 = commit(&mut engine, 1);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        let h = health(&mut c, &id).await;
        assert!(
            h.durable_commit_seq >= 40 && h.consecutive_failures == 0,
            "a late report rewound the position: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    honest.tx.send(position_report(&id, &p41)).await.unwrap();
    wait_health(&mut c, &id, "41 commits shipped", truthful, |h| {
        h.healthy && h.shipped_commit_seq == 41
    })
    .await;
    drop(honest);
    drop(c);
    s.server.terminate();
}

/// The commits the store's files hold (the engine in this test holds it open; a digest reads
/// the files, so it is what a restart would find).
fn engine_commits(store: &Path) -> u64 {
    let wal = std::fs::read(store.join("wal.bin")).expect("wal.bin");
    mushroom_backup::store::format::scan_wal(&wal)
        .expect("wal.bin scans")
        .last_seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deregister_ends_the_stores_position_streams() {
    let s = setup("serve (deregister)");
    let (_, mut engine, mut c, reg) = s.held_store().await;
    let id = reg.store_id.clone();
    let p = commit(&mut engine, 3);
    let mut stream = open_stream(&mut c, &id, &reg.node_token, &p)
        .await
        .expect("ReportPosition");
    wait_health(&mut c, &id, "3 commits shipped", |_| {}, shipped(3)).await;

    c.deregister(tonic::Request::new(proto::DeregisterRequest {
        store_id: id.clone(),
        flush: true,
    }))
    .await
    .expect("Deregister");
    let status = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.commands.message().await {
                Ok(Some(_refresh)) => continue,
                Ok(None) => panic!("the stream ended without a status"),
                Err(status) => break status,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the stream did not end within {DEADLINE:?} of Deregister"));
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(
        status.message(),
        format!("store {id} was deregistered"),
        "{status:?}"
    );
    // The server has let go of the stream: what the node sends now goes nowhere.
    let _ = stream.tx.send(position_report(&id, &p)).await;

    // A new stream for the store is refused like any unknown store.
    let again = open_stream(&mut c, &id, &reg.node_token, &p).await;
    assert_eq!(again.err().map(|e| e.code()), Some(Code::Unauthenticated));
    drop(c);
    s.server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_store_and_a_wrong_token_get_the_same_answer() {
    let s = setup("serve (oracle)");
    let (_, engine, mut c, reg) = s.held_store().await;
    let p = engine.position();

    let unknown = open_stream(
        &mut c,
        &uuid::Uuid::new_v4().to_string(),
        &reg.node_token,
        &p,
    )
    .await
    .err()
    .expect("an unknown store is refused");
    let wrong = open_stream(&mut c, &reg.store_id, &"0".repeat(64), &p)
        .await
        .err()
        .expect("a wrong token is refused");
    assert_eq!(unknown.code(), Code::Unauthenticated, "{unknown:?}");
    assert_eq!(
        (unknown.code(), unknown.message()),
        (wrong.code(), wrong.message()),
        "an unknown store and a wrong token must be answered alike"
    );
    assert!(!unknown.message().contains(&reg.store_id), "{unknown:?}");
    // The right token still works.
    open_stream(&mut c, &reg.store_id, &reg.node_token, &p)
        .await
        .expect("the right token");
    drop(c);
    s.server.terminate();
}

/// One stream more than `--max-streams-per-store` is refused `RESOURCE_EXHAUSTED`, naming the
/// limit; the streams attached go on, and once one ends another attaches (security review 4,
/// Low 4: lying streams cannot pile up on a store).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_takes_at_most_max_streams_per_store_streams() {
    let s = setup_with("serve (stream cap)", &["--max-streams-per-store", "2"]);
    let (_, mut engine, mut c, reg) = s.held_store().await;
    let id = reg.store_id.clone();
    let p = commit(&mut engine, 3);
    let first = open_stream(&mut c, &id, &reg.node_token, &p)
        .await
        .expect("the first stream");
    let second = open_stream(&mut c, &id, &reg.node_token, &p)
        .await
        .expect("the second stream");
    let refused = open_stream(&mut c, &id, &reg.node_token, &p)
        .await
        .err()
        .expect("a third stream is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains(&id)
            && refused.message().contains("2 position streams")
            && refused.message().contains("max_streams_per_store"),
        "{refused:?}"
    );
    // The attached streams still count: their position ships.
    wait_health(&mut c, &id, "3 commits shipped", |_| {}, shipped(3)).await;

    // One ends (the server sees its end when its requests end): another attaches.
    drop(second);
    let start = Instant::now();
    let third = loop {
        match open_stream(&mut c, &id, &reg.node_token, &p).await {
            Ok(s) => break s,
            Err(e) if e.code() == Code::ResourceExhausted => {
                assert!(
                    start.elapsed() < DEADLINE,
                    "no stream attached within {DEADLINE:?} of one ending: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    drop((first, third, c));
    s.server.terminate();
}

//! Events you can resume, through the real `serve` binary: a watcher (`WatchEvents` with
//! `after`, over gRPC, and `ctl watch-events --after`) and a webhook receiver (a real HTTP
//! server in this test) across a SIGKILL of the service and its restart, on SQLite, and on
//! PostgreSQL across a SIGKILL, a restart and a `Move` of the store to a second instance, then
//! the death of the instance that delivered the webhook (the other takes it over). The
//! webhook refuses (503) from before the kill until after it, so deliveries are pending when
//! the process dies. After resuming from the last position it saw, the watcher saw every event
//! of the log exactly once, in position order, as any instance reads the log; the receiver got
//! every one at least once (exactly once by id), each with its position. No timed assertion:
//! every wait is for a condition, with a generous deadline.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener};

use mushroom_backup::service::proto;
use support::served::{self, DEADLINE};
use support::webhooks::Receiver;

type Stream = tonic::Streaming<proto::BackupEvent>;

/// What a resuming client keeps: every event it read, and so where to resume after.
#[derive(Default)]
struct Watcher {
    seen: Vec<proto::BackupEvent>,
}

impl Watcher {
    fn last(&self) -> u64 {
        self.seen.last().map_or(0, |e| e.position)
    }

    /// Every store's events after the last position read, from the instance at `addr`.
    async fn open(&self, addr: SocketAddr) -> Stream {
        served::client(addr)
            .await
            .watch_events(proto::WatchEventsRequest {
                store_id: String::new(),
                after: Some(self.last()),
            })
            .await
            .expect("WatchEvents after")
            .into_inner()
    }

    /// Reads `stream` until what was read satisfies `done`.
    async fn read_until(
        &mut self,
        stream: &mut Stream,
        what: &str,
        done: impl Fn(&[proto::BackupEvent]) -> bool,
    ) {
        let read = async {
            while !done(&self.seen) {
                let e = stream
                    .message()
                    .await
                    .unwrap_or_else(|s| panic!("waiting for {what}, the stream failed: {s}"))
                    .unwrap_or_else(|| panic!("waiting for {what}, the stream ended"));
                self.seen.push(e);
            }
        };
        if tokio::time::timeout(DEADLINE, read).await.is_err() {
            panic!("waited {DEADLINE:?} for {what}; saw {:?}", self.seen);
        }
    }

    /// Reads `stream` until it fails or ends (its server died), keeping what came before.
    async fn read_to_the_end(&mut self, stream: &mut Stream) {
        let read = async {
            while let Ok(Some(e)) = stream.message().await {
                self.seen.push(e);
            }
        };
        tokio::time::timeout(DEADLINE, read)
            .await
            .expect("the stream of a killed server ends");
    }
}

fn count(seen: &[proto::BackupEvent], store: &str, kind: proto::EventKind) -> usize {
    seen.iter()
        .filter(|e| e.store_id == store && e.kind == kind as i32)
        .count()
}

async fn pause_and_resume(c: &served::Client, id: &str, why: &str) {
    served::pause(c, id, why).await;
    served::resume(c, id).await;
}

/// What must hold once the watcher resumed: it saw the log (as the instance at `addr` reads it
/// from the start) exactly once, in order; `hook` got every event of it at least once.
async fn check(w: &Watcher, addr: SocketAddr, hook: &Receiver) {
    let mut log = Watcher::default();
    let mut stream = log.open(addr).await;
    log.read_until(&mut stream, "the log up to the watcher's last", |seen| {
        seen.last().is_some_and(|e| e.position >= w.last())
    })
    .await;
    let log: Vec<&proto::BackupEvent> =
        log.seen.iter().filter(|e| e.position <= w.last()).collect();
    let positions: Vec<u64> = w.seen.iter().map(|e| e.position).collect();
    assert!(
        positions.windows(2).all(|p| p[0] < p[1]) && positions[0] > 0,
        "in position order, none twice: {positions:?}"
    );
    let ids = |events: &mut dyn Iterator<Item = &proto::BackupEvent>| -> Vec<(u64, String)> {
        events.map(|e| (e.position, e.id.clone())).collect()
    };
    assert_eq!(
        ids(&mut w.seen.iter()),
        ids(&mut log.iter().copied()),
        "the watcher saw every event of the log, once, in order"
    );

    // The webhook: every event of the log at least once, each with its id and position.
    let want: BTreeMap<String, u64> = log.iter().map(|e| (e.id.clone(), e.position)).collect();
    let got = hook
        .wait_for("every event of the log posted", |p| {
            let ids: BTreeSet<&str> = p.iter().filter_map(|p| p.body["id"].as_str()).collect();
            want.keys().all(|id| ids.contains(id.as_str()))
        })
        .await;
    for p in &got {
        let id = p.body["id"].as_str().unwrap();
        let position: u64 = p.body["position"].as_str().unwrap().parse().unwrap();
        assert_eq!(p.body["data"]["position"], position, "{p:?}");
        if let Some(&at) = want.get(id) {
            assert_eq!(position, at, "the position the log gives it: {p:?}");
        }
    }
    let mut by_id: Vec<(u64, &str)> = got
        .iter()
        .map(|p| {
            let position = p.body["position"].as_str().unwrap().parse().unwrap();
            (position, p.body["id"].as_str().unwrap())
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    by_id.retain(|(position, _)| *position <= w.last());
    let by_position: Vec<(u64, String)> = by_id.iter().map(|(p, i)| (*p, i.to_string())).collect();
    assert_eq!(
        by_position,
        ids(&mut log.iter().copied()),
        "deduplicated by id, the webhook got the log"
    );
    let posts_in_order: Vec<u64> = got
        .iter()
        .map(|p| p.body["position"].as_str().unwrap().parse().unwrap())
        .collect();
    eprintln!(
        "FIGURE {} events in the log; the watcher read {} across the kill (and the move); the \
         webhook took {} posts, duplicates included",
        log.len(),
        w.seen.len(),
        posts_in_order.len()
    );
}

/// `ctl watch-events --after` prints the log's events with their positions and ids, and ends
/// after `--count` events or `--timeout-ms`.
fn ctl_resumes(addr: SocketAddr, w: &Watcher) {
    let (ok, out) = served::ctl(
        addr,
        &[
            "--json",
            "watch-events",
            "--after",
            "0",
            "--count",
            "3",
            "--timeout-ms",
            "60000",
        ],
    );
    assert!(ok, "{}", out.output());
    let lines: Vec<serde_json::Value> = out
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let want: Vec<(u64, &str)> = w.seen[..3]
        .iter()
        .map(|e| (e.position, e.id.as_str()))
        .collect();
    let got: Vec<(u64, &str)> = lines
        .iter()
        .map(|l| (l["position"].as_u64().unwrap(), l["id"].as_str().unwrap()))
        .collect();
    assert_eq!(got, want, "{}", out.stdout());
    let after = w.last().to_string();
    let (ok, out) = served::ctl(
        addr,
        &["watch-events", "--after", &after, "--timeout-ms", "300"],
    );
    assert!(ok, "a timeout ends it, exit 0: {}", out.output());
    for line in out.stdout().lines() {
        let position: u64 = line.split(' ').next().unwrap().parse().expect(line);
        assert!(position > w.last(), "{line}");
    }
}

/// A webhook receiver, and the URL to give `serve`.
fn receiver() -> (Receiver, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    (Receiver::serve(listener), url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_and_a_webhook_resume_across_a_sigkill_on_sqlite() {
    let d = served::dirs();
    let (hook, url) = receiver();
    let serve = || served::fast_serve(&d, &["--webhook-url", &url]);
    let (mut server, addr) = served::start("serve", serve());
    let c = served::client(addr).await;
    let dir = d.root.join("resumed");
    support::store::write(&dir, 20, 0, 0);
    let destination = support::file_url(&d.base.join("bucket"));
    let id = served::register(&c, support::register_req(&dir, &destination)).await;

    let mut w = Watcher::default();
    let mut stream = w.open(addr).await;
    use proto::EventKind as K;
    w.read_until(&mut stream, "the first restore point", |s| {
        count(s, &id, K::RestorePointWritten) >= 1
    })
    .await;
    hook.refuse(true);
    for i in 0..2 {
        pause_and_resume(&c, &id, &format!("before the kill {i}")).await;
    }
    w.read_until(&mut stream, "two resumes", |s| {
        count(s, &id, K::Resumed) >= 2
    })
    .await;
    server.kill();
    w.read_to_the_end(&mut stream).await;

    hook.refuse(false);
    let (_server, addr) = served::start("serve again", serve());
    let c = served::client(addr).await;
    let mut stream = w.open(addr).await;
    pause_and_resume(&c, &id, "after the restart").await;
    w.read_until(&mut stream, "the resume after the restart", |s| {
        count(s, &id, K::Resumed) >= 3
    })
    .await;
    check(&w, addr, &hook).await;
    ctl_resumes(addr, &w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_and_a_webhook_resume_across_a_sigkill_and_a_move_on_postgres() {
    use support::instances::{Fleet, group_member};
    let Some(fleet) = Fleet::create("events_resume_test").await else {
        return;
    };
    let (hook, url) = receiver();
    let mut extra = group_member("30000").to_vec();
    extra.extend(["--webhook-url", &url]);
    let mut a = fleet.start("a", &extra);
    let b = fleet.start("b", &extra);
    let dir = fleet.shared_root.join("moving");
    support::binary::write_store(&dir, 10);
    let destination = support::file_url(&fleet.bucket.join("moving"));
    let id = a
        .register(support::register_req(&dir, &destination))
        .await
        .store_id;

    let mut w = Watcher::default();
    let mut stream = w.open(a.addr).await;
    use proto::EventKind as K;
    w.read_until(&mut stream, "the first restore point", |s| {
        count(s, &id, K::RestorePointWritten) >= 1
    })
    .await;
    hook.refuse(true);
    let ca = served::client(a.addr).await;
    for i in 0..2 {
        pause_and_resume(&ca, &id, &format!("before the kill {i}")).await;
    }
    w.read_until(&mut stream, "two resumes", |s| {
        count(s, &id, K::Resumed) >= 2
    })
    .await;
    a.child.kill();
    w.read_to_the_end(&mut stream).await;

    a.start_again(false);
    hook.refuse(false);
    let mut stream = w.open(a.addr).await;
    let (ok, out) = served::ctl(a.addr, &["move", &id, "--to", "b"]);
    assert!(ok, "ctl move: {}", out.output());
    // Events of the store on b reach a watcher of a through the log.
    let cb = served::client(b.addr).await;
    pause_and_resume(&cb, &id, "on b").await;
    w.read_until(&mut stream, "the resume on b", |s| {
        count(s, &id, K::Resumed) >= 3
    })
    .await;
    assert!(count(&w.seen, &id, K::OwnerChanged) >= 1, "{:?}", w.seen);
    // Any instance reads the same log.
    check(&w, b.addr, &hook).await;
    check(&w, a.addr, &hook).await;
    ctl_resumes(b.addr, &w);

    // a, which delivered the webhook, dies for good: b takes the delivery over once a's hold
    // lapsed, from the cursor a left.
    a.child.kill();
    let mut stream = w.open(b.addr).await;
    pause_and_resume(&cb, &id, "after a died").await;
    w.read_until(&mut stream, "the resume after a died", |s| {
        count(s, &id, K::Resumed) >= 4
    })
    .await;
    check(&w, b.addr, &hook).await;
    drop((a, b));
    fleet.db.drop_database().await;
}

#[test]
fn retention_flags_out_of_range_are_refused_at_start_naming_the_flag_and_range() {
    let d = served::dirs();
    for (flag, value, range) in [
        ("--events-keep-days", "0", "from 1 to 3650 days"),
        ("--events-keep-days", "3651", "from 1 to 3650 days"),
        ("--events-keep", "999", "from 1000 to 100000000"),
    ] {
        let err = served::refused("serve", served::fast_serve(&d, &[flag, value]));
        assert!(
            err.contains(&format!("{flag} = {value} is out of range")) && err.contains(range),
            "{flag} {value}: {err}"
        );
    }
}

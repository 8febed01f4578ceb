//! [`NodeClient`] against a fake `BackupControl` that only answers `ReportPosition` (the real
//! service is tested end to end in `tests/service.rs` and `tests/service_edge.rs`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::Stream;
use mushroom_backup::node_client::{
    ConnectionState, NodeClient, NodeClientConfig, NodeClientError,
};
use mushroom_backup::service::proto::{
    self,
    backup_control_server::{BackupControl, BackupControlServer},
};
use mushroom_backup::store::format::WalPosition;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status, Streaming};

const WAIT: Duration = Duration::from_secs(20);

/// What the fake saw: every report, and `None` when a stream ended.
type Seen = mpsc::UnboundedSender<Option<proto::PositionReport>>;

struct Fake {
    seen: Seen,
    /// Refresh commands to send on every stream.
    refresh: broadcast::Sender<String>,
    /// Ends every stream with UNAVAILABLE.
    kill: CancellationToken,
    calls: Arc<AtomicUsize>,
}

type Cmds = Pin<Box<dyn Stream<Item = Result<proto::NodeCommand, Status>> + Send>>;
type Health = Pin<Box<dyn Stream<Item = Result<proto::HealthResponse, Status>> + Send>>;

fn no<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("fake"))
}

#[tonic::async_trait]
impl BackupControl for Fake {
    async fn pause(
        &self,
        _: Request<proto::PauseRequest>,
    ) -> Result<Response<proto::PauseResponse>, Status> {
        no()
    }
    async fn resume(
        &self,
        _: Request<proto::ResumeRequest>,
    ) -> Result<Response<proto::ResumeResponse>, Status> {
        no()
    }
    async fn drill(
        &self,
        _: Request<proto::DrillRequest>,
    ) -> Result<Response<proto::DrillResponse>, Status> {
        no()
    }
    async fn r#move(
        &self,
        _: Request<proto::MoveRequest>,
    ) -> Result<Response<proto::MoveResponse>, Status> {
        no()
    }
    async fn drain(
        &self,
        _: Request<proto::DrainRequest>,
    ) -> Result<Response<proto::DrainResponse>, Status> {
        no()
    }
    async fn can_host(
        &self,
        _: Request<proto::CanHostRequest>,
    ) -> Result<Response<proto::CanHostResponse>, Status> {
        no()
    }
    async fn host(
        &self,
        _: Request<proto::HostRequest>,
    ) -> Result<Response<proto::HostResponse>, Status> {
        no()
    }
    async fn promote(
        &self,
        _: Request<proto::PromoteRequest>,
    ) -> Result<Response<proto::PromoteResponse>, Status> {
        no()
    }
    async fn branch(
        &self,
        _: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        no()
    }
    async fn get_limits(
        &self,
        _: Request<proto::GetLimitsRequest>,
    ) -> Result<Response<proto::LimitsResponse>, Status> {
        no()
    }
    async fn set_limits(
        &self,
        _: Request<proto::SetLimitsRequest>,
    ) -> Result<Response<proto::LimitsResponse>, Status> {
        no()
    }
    async fn register(
        &self,
        _: Request<proto::RegisterRequest>,
    ) -> Result<Response<proto::RegisterResponse>, Status> {
        no()
    }
    async fn deregister(
        &self,
        _: Request<proto::DeregisterRequest>,
    ) -> Result<Response<proto::DeregisterResponse>, Status> {
        no()
    }
    async fn trigger(
        &self,
        _: Request<proto::TriggerRequest>,
    ) -> Result<Response<proto::TriggerResponse>, Status> {
        no()
    }
    async fn health(
        &self,
        _: Request<proto::HealthRequest>,
    ) -> Result<Response<proto::HealthResponse>, Status> {
        no()
    }
    type WatchEventsStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<proto::BackupEvent, Status>> + Send>>;
    async fn watch_events(
        &self,
        _: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        no()
    }
    type WatchHealthStream = Health;
    async fn watch_health(
        &self,
        _: Request<proto::HealthRequest>,
    ) -> Result<Response<Health>, Status> {
        no()
    }
    async fn list_stores(
        &self,
        _: Request<proto::ListStoresRequest>,
    ) -> Result<Response<proto::ListStoresResponse>, Status> {
        no()
    }
    async fn list_restore_points(
        &self,
        _: Request<proto::ListRestorePointsRequest>,
    ) -> Result<Response<proto::ListRestorePointsResponse>, Status> {
        no()
    }
    async fn adopt(
        &self,
        _: Request<proto::AdoptRequest>,
    ) -> Result<Response<proto::AdoptResponse>, Status> {
        no()
    }
    type ReportPositionStream = Cmds;
    async fn report_position(
        &self,
        req: Request<Streaming<proto::PositionReport>>,
    ) -> Result<Response<Cmds>, Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let good = req
            .metadata()
            .get("authorization")
            .is_some_and(|v| v == "Bearer good");
        let mut inbound = req.into_inner();
        let first = inbound
            .next()
            .await
            .ok_or_else(|| Status::invalid_argument("empty"))??;
        if !good {
            return Err(Status::unauthenticated("bad token"));
        }
        if first.store_id != "s" {
            return Err(Status::not_found("no such store"));
        }
        let _ = self.seen.send(Some(first));
        let (tx, rx) = mpsc::channel(8);
        let (seen, kill, mut refresh) = (
            self.seen.clone(),
            self.kill.clone(),
            self.refresh.subscribe(),
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = kill.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("killed"))).await;
                        return;
                    }
                    m = inbound.next() => match m {
                        Some(Ok(r)) => { let _ = seen.send(Some(r)); }
                        _ => { let _ = seen.send(None); return; }
                    },
                    Ok(reason) = refresh.recv() => {
                        let cmd = proto::NodeCommand {
                            command: Some(proto::node_command::Command::Refresh(
                                proto::Refresh { reason },
                            )),
                        };
                        let _ = tx.send(Ok(cmd)).await;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

struct Running {
    addr: std::net::SocketAddr,
    seen: mpsc::UnboundedReceiver<Option<proto::PositionReport>>,
    refresh: broadcast::Sender<String>,
    kill: CancellationToken,
    calls: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

async fn fake(addr: &str) -> Running {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let (tx, seen) = mpsc::unbounded_channel();
    let refresh = broadcast::channel(8).0;
    let kill = CancellationToken::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = Fake {
        seen: tx,
        refresh: refresh.clone(),
        kill: kill.clone(),
        calls: calls.clone(),
    };
    let stop = kill.clone();
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(BackupControlServer::new(svc))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                stop.cancelled_owned(),
            )
            .await;
    });
    Running {
        addr,
        seen,
        refresh,
        kill,
        calls,
        server,
    }
}

fn pos(commit_seq: u64) -> WalPosition {
    WalPosition {
        snapshot_id: None,
        wal_id: uuid::Uuid::from_u128(7),
        wal_number: 1,
        durable_len: 48 + commit_seq * 10,
        commit_seq,
    }
}

fn config(addr: std::net::SocketAddr, token: &str) -> NodeClientConfig {
    let mut c = NodeClientConfig::new(format!("http://{addr}"), "s", token);
    c.first_backoff = Duration::from_millis(10);
    c.max_backoff = Duration::from_millis(100);
    c
}

async fn next_seen(r: &mut Running) -> Option<proto::PositionReport> {
    tokio::time::timeout(WAIT, r.seen.recv())
        .await
        .expect("the fake saw something in time")
        .expect("the fake is running")
}

#[tokio::test]
async fn reports_flush_refresh_and_close() {
    let mut f = fake("127.0.0.1:0").await;
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cfg = config(f.addr, "good");
    let counted = calls.clone();
    cfg.on_refresh = Some(Arc::new(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
    }));
    let c = NodeClient::connect(cfg).unwrap();
    assert!(c.flush(WAIT).await.is_ok(), "nothing to flush");
    c.report(pos(1));
    c.flush(WAIT).await.unwrap();
    assert_eq!(c.state(), ConnectionState::Connected);
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 1);
    // The same position twice is sent twice (a refresh answer may repeat it).
    c.report(pos(2));
    c.flush(WAIT).await.unwrap();
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 2);
    c.report(pos(2));
    c.flush(WAIT).await.unwrap();
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 2);

    let mut rx = c.refresh_requests();
    f.refresh.send("look again".into()).unwrap();
    let r = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.reason, "look again");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Close sends the newest, then the server sees the end of the stream.
    c.report(pos(3));
    c.close().await;
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 3);
    assert!(next_seen(&mut f).await.is_none(), "the stream ended");
    assert_eq!(c.state(), ConnectionState::Closed);
    assert!(matches!(
        c.flush(WAIT).await,
        Ok(()) | Err(NodeClientError::Closed)
    ));
    f.kill.cancel();
}

#[tokio::test]
async fn a_refusal_is_permanent() {
    let f = fake("127.0.0.1:0").await;
    let c = NodeClient::connect(config(f.addr, "bad")).unwrap();
    c.report(pos(1));
    let e = c.flush(WAIT).await.unwrap_err();
    assert!(
        matches!(
            e,
            NodeClientError::Rejected {
                code: Code::Unauthenticated,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(c.state(), ConnectionState::Failed);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(f.calls.load(Ordering::SeqCst), 1, "no reconnect loop");
    assert!(c.last_error().unwrap().is_permanent());

    let mut cfg = config(f.addr, "good");
    cfg.store_id = "other".into();
    let c = NodeClient::connect(cfg).unwrap();
    c.report(pos(1));
    let e = c.flush(WAIT).await.unwrap_err();
    assert!(e.to_string().contains("NOT_FOUND"), "{e}");
    f.kill.cancel();
}

#[tokio::test]
async fn reconnects_with_backoff_and_resends_the_newest() {
    let mut f = fake("127.0.0.1:0").await;
    let addr = f.addr;
    let c = first_reported(&mut f, config(addr, "good")).await;
    f.kill.cancel();
    tokio::time::timeout(WAIT, f.server).await.unwrap().unwrap();
    tokio::time::timeout(WAIT, async {
        while !matches!(c.state(), ConnectionState::Backoff { .. }) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the client notices");
    // Reports while down are cheap; only the newest is sent after the reconnect.
    for n in 2..=50 {
        c.report(pos(n));
    }
    assert!(c.last_error().is_some_and(|e| !e.is_permanent()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut f = fake(&addr.to_string()).await;
    c.flush(WAIT).await.unwrap();
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 50);
    c.close().await;
    f.kill.cancel();
}

/// A client of `f` with `cfg`, once its first report (commit 1) has reached `f`.
async fn first_reported(f: &mut Running, cfg: NodeClientConfig) -> NodeClient {
    let c = NodeClient::connect(cfg).unwrap();
    c.report(pos(1));
    c.flush(WAIT).await.unwrap();
    assert_eq!(next_seen(f).await.unwrap().commit_seq, 1);
    c
}

/// A fake server and a client of it reporting at most once a second, once its first report
/// (commit 1) has reached the server.
async fn paced_client() -> (Running, NodeClient) {
    let mut f = fake("127.0.0.1:0").await;
    let mut cfg = config(f.addr, "good");
    cfg.min_report_interval = Duration::from_secs(1);
    let c = first_reported(&mut f, cfg).await;
    (f, c)
}

/// Reports faster than `min_report_interval` coalesce: at most one per interval reaches the
/// server (after the first), always the newest, and closing does not wait the interval out.
#[tokio::test]
async fn fast_reports_coalesce_into_the_newest() {
    let (mut f, c) = paced_client().await;

    // Fifty reports with room between them for the client to send each (it would, unpaced).
    let start = std::time::Instant::now();
    for seq in 2..=51 {
        c.report(pos(seq));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    c.flush(WAIT).await.unwrap();
    let elapsed = start.elapsed();
    let mut seen = Vec::new();
    loop {
        let r = next_seen(&mut f).await.expect("a report");
        seen.push(r.commit_seq);
        if r.commit_seq == 51 {
            break;
        }
    }
    let bound = 2 + elapsed.as_secs() as usize;
    assert!(
        seen.len() <= bound,
        "{} reports in {elapsed:?} at one a second: {seen:?}",
        seen.len()
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {seen:?}");

    // One more inside the interval: close sends it at once, then ends the stream.
    c.report(pos(52));
    c.close().await;
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 52);
    assert!(next_seen(&mut f).await.is_none(), "the stream ended");
    f.kill.cancel();
}

/// Someone waiting for an acknowledgement (a `wait_durable` pending, a `durable()` receiver
/// alive) makes every report go at once; with nobody waiting, the spacing holds it back.
#[tokio::test]
async fn a_waiter_sends_reports_at_once() {
    let (mut f, c) = paced_client().await;

    // Nobody waits: the spacing holds the next report back.
    c.report(pos(2));
    let held = tokio::time::timeout(Duration::from_millis(300), f.seen.recv()).await;
    assert!(held.is_err(), "sent inside the spacing: {held:?}");
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 2);

    // A wait pending (the fake never acknowledges): the report goes at once, whether the wait
    // starts before or after it.
    let start = std::time::Instant::now();
    let seen = tokio::select! {
        r = c.wait_durable(100, WAIT) => panic!("the fake acknowledges nothing: {r:?}"),
        r = async { c.report(pos(3)); next_seen(&mut f).await } => r,
    };
    assert_eq!(seen.unwrap().commit_seq, 3);
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_millis(500), "waited {elapsed:?}");

    // A `durable()` receiver alive: at once too; dropped, the spacing is back.
    let rx = c.durable();
    let start = std::time::Instant::now();
    c.report(pos(4));
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 4);
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_millis(500), "waited {elapsed:?}");
    drop(rx);
    c.report(pos(5));
    let held = tokio::time::timeout(Duration::from_millis(300), f.seen.recv()).await;
    assert!(held.is_err(), "sent inside the spacing: {held:?}");
    assert_eq!(next_seen(&mut f).await.unwrap().commit_seq, 5);
    c.close().await;
    f.kill.cancel();
}

#[test]
fn bad_configurations_are_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (server, token) in [
            ("ftp://x:1", "t"),
            ("not a url", "t"),
            ("http://127.0.0.1:1", ""),
            ("http://127.0.0.1:1", "bad\ntoken"),
        ] {
            let r = NodeClient::connect(NodeClientConfig::new(server, "s", token));
            assert!(
                matches!(r, Err(NodeClientError::Config(_))),
                "{server} {token:?}"
            );
        }
        let mut slow = NodeClientConfig::new("http://127.0.0.1:1", "s", "t");
        slow.min_report_interval = Duration::from_secs(2);
        assert!(matches!(
            NodeClient::connect(slow),
            Err(NodeClientError::Config(_))
        ));
    });
}

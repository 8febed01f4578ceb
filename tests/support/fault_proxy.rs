//! [`FaultProxy`]: an HTTP proxy in front of an S3 endpoint that injects faults, so a real
//! process talking real S3 meets the failures real S3 has.
//!
//! It listens on `127.0.0.1:0` and forwards every request to the upstream endpoint (moto),
//! except that, per [`FaultPlan`], some requests meet one of:
//! - **slow down**: answered `503 SlowDown` with S3's XML error body, *without* being forwarded
//!   (a determinate failure: the request did not happen);
//! - **drop after**: forwarded, the upstream's whole answer received, and then the client's
//!   connection is closed without a byte of that answer (an indeterminate failure: the request
//!   took effect, the client cannot know);
//! - **delay**: held for a while (200–800 ms by default) before being forwarded.
//!
//! [`FaultProxy::set_down`] takes the endpoint away altogether, whatever the plan: while it is
//! down every new connection is closed at once and every request on an open one is hung up on
//! unanswered and unforwarded (the endpoint is unreachable), until it is set up again.
//!
//! # Replayable randomness
//! Faults are dealt from a deck: every block of 100 requests, in arrival order, holds exactly
//! `slow_down` + `drop_after` + `delay` faults at positions shuffled by a ChaCha8 generator
//! seeded with [`FaultProxy::seed`]. So the rates are exact over every 100 requests (a run of
//! 100 requests or more meets every kind), and the seed, printed at start and read from
//! [`SEED_ENV`] when set, replays the same fault sequence. What a replay cannot fix is which
//! request arrives n-th when a client has several in flight; every fault is logged with its
//! request number, method and path.
//!
//! # Forwarding
//! hyper 1 on both sides, HTTP/1.1 with keep-alive towards the client. A request's body is
//! read whole first (hyper answers `Expect: 100-continue` and undoes `Transfer-Encoding:
//! chunked`; an `aws-chunked` content encoding is the payload and passes through untouched),
//! then sent upstream on a fresh connection with a `Content-Length`; the answer is read whole
//! and passed back. Hop-by-hop headers are not forwarded; `Host` is, so signatures still match.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Set to a seed printed by an earlier run to replay its faults.
pub const SEED_ENV: &str = "MUSHROOM_FAULT_SEED";

/// Headers that describe one connection, not the request: never forwarded.
const HOP_BY_HOP: [header::HeaderName; 7] = [
    header::CONNECTION,
    header::EXPECT,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// How many requests of every 100 meet each fault, and how long a delay lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPlan {
    pub slow_down: usize,
    pub drop_after: usize,
    pub delay: usize,
    pub delay_for: RangeInclusive<Duration>,
}

impl Default for FaultPlan {
    /// 5% `503 SlowDown`, 3% dropped after forwarding, 2% delayed 200–800 ms.
    fn default() -> Self {
        FaultPlan {
            slow_down: 5,
            drop_after: 3,
            delay: 2,
            delay_for: Duration::from_millis(200)..=Duration::from_millis(800),
        }
    }
}

impl FaultPlan {
    /// No random fault: every request forwarded as it came (a partition is `set_hold`, an
    /// outage `set_down`).
    pub fn none() -> Self {
        FaultPlan {
            slow_down: 0,
            drop_after: 0,
            delay: 0,
            ..FaultPlan::default()
        }
    }
}

/// What the proxy did, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Requests received.
    pub requests: u64,
    /// Requests forwarded upstream (delayed and dropped ones included).
    pub forwarded: u64,
    pub slow_down: u64,
    pub dropped: u64,
    pub delayed: u64,
    /// Requests the upstream did not answer (answered `502` to the client).
    pub upstream_errors: u64,
    /// Requests and connections hung up on while the proxy was down ([`FaultProxy::set_down`]).
    pub refused_down: u64,
    /// Bytes of the bodies of the answers passed back to the client (what a client was sent,
    /// counted at the server side of its connection).
    pub answered_bytes: u64,
}

impl FaultCounts {
    /// Panics unless the proxy injected every kind of fault: a run through it that met none
    /// of a kind proves less than it claims.
    pub fn assert_every_kind_injected(&self) {
        assert!(
            self.slow_down > 0 && self.dropped > 0 && self.delayed > 0,
            "the proxy did not inject every kind of fault, so this proves less than it claims: \
             {self:?}"
        );
    }

    /// Panics if the upstream (moto) failed a request.
    pub fn assert_no_upstream_error(&self) {
        assert_eq!(self.upstream_errors, 0, "moto failed requests: {self:?}");
    }
}

/// A running proxy; stops (dropping every connection) when dropped.
pub struct FaultProxy {
    url: String,
    seed: u64,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct Shared {
    upstream: SocketAddr,
    deck: Mutex<Deck>,
    next_request: AtomicU64,
    requests: AtomicU64,
    forwarded: AtomicU64,
    slow_down: AtomicU64,
    dropped: AtomicU64,
    delayed: AtomicU64,
    upstream_errors: AtomicU64,
    down: std::sync::atomic::AtomicBool,
    refused_down: AtomicU64,
    answered_bytes: AtomicU64,
    /// While set ([`FaultProxy::set_hold`]): every request arriving is held this long, then
    /// forwarded and answered.
    hold: Mutex<Option<Duration>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    SlowDown,
    DropAfter,
    Delay(Duration),
}

/// The shuffled blocks of 100 faults; see the module docs.
struct Deck {
    rng: ChaCha8Rng,
    plan: FaultPlan,
    /// The rest of the current block, drawn from the end.
    block: Vec<Fault>,
}

impl Deck {
    fn draw(&mut self) -> Fault {
        if self.block.is_empty() {
            let p = &self.plan;
            assert!(
                p.slow_down + p.drop_after + p.delay <= 100,
                "more than 100 faults per 100 requests: {p:?}"
            );
            let mut block = vec![Fault::None; 100 - p.slow_down - p.drop_after - p.delay];
            block.extend(std::iter::repeat_n(Fault::SlowDown, p.slow_down));
            block.extend(std::iter::repeat_n(Fault::DropAfter, p.drop_after));
            block.extend(std::iter::repeat_n(Fault::Delay(Duration::ZERO), p.delay));
            block.shuffle(&mut self.rng);
            self.block = block;
        }
        match self.block.pop().expect("a full block") {
            Fault::Delay(_) => Fault::Delay(self.rng.random_range(self.plan.delay_for.clone())),
            other => other,
        }
    }
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (`http://host:port`) on its own runtime, with the
    /// seed from [`SEED_ENV`] or a fresh one; prints the seed.
    pub fn start(upstream: &str, plan: FaultPlan) -> FaultProxy {
        let seed = seed_from_env();
        eprintln!("fault proxy: seed {seed} (replay with {SEED_ENV}={seed}), plan {plan:?}");
        Self::start_seeded(upstream, plan, seed)
    }

    /// [`FaultProxy::start`] with the given seed.
    pub fn start_seeded(upstream: &str, plan: FaultPlan, seed: u64) -> FaultProxy {
        let parsed = url::Url::parse(upstream)
            .unwrap_or_else(|e| panic!("fault proxy: bad upstream {upstream}: {e}"));
        assert_eq!(parsed.scheme(), "http", "fault proxy: upstream {upstream}");
        let upstream_addr = parsed
            .socket_addrs(|| Some(80))
            .ok()
            .and_then(|a| a.into_iter().next())
            .unwrap_or_else(|| panic!("fault proxy: cannot resolve {upstream}"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fault-proxy")
            .enable_all()
            .build()
            .expect("fault proxy: a runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("fault proxy: bind");
        listener
            .set_nonblocking(true)
            .expect("fault proxy: nonblocking");
        let addr = listener.local_addr().expect("fault proxy: local address");
        let shared = Arc::new(Shared {
            upstream: upstream_addr,
            deck: Mutex::new(Deck {
                rng: ChaCha8Rng::seed_from_u64(seed),
                plan,
                block: Vec::new(),
            }),
            next_request: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            slow_down: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
            down: std::sync::atomic::AtomicBool::new(false),
            refused_down: AtomicU64::new(0),
            answered_bytes: AtomicU64::new(0),
            hold: Mutex::new(None),
        });
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).expect("fault proxy: a tokio listener")
        };
        runtime.spawn(accept_loop(listener, shared.clone()));
        FaultProxy {
            url: format!("http://{addr}"),
            seed,
            shared,
            runtime: Some(runtime),
        }
    }

    /// The URL to use as the S3 endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn counts(&self) -> FaultCounts {
        let s = &self.shared;
        let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
        FaultCounts {
            requests: load(&s.requests),
            forwarded: load(&s.forwarded),
            slow_down: load(&s.slow_down),
            dropped: load(&s.dropped),
            delayed: load(&s.delayed),
            upstream_errors: load(&s.upstream_errors),
            refused_down: load(&s.refused_down),
            answered_bytes: load(&s.answered_bytes),
        }
    }

    /// Holds every request arriving from now on for `hold` before forwarding it (and answering
    /// it): a partition that delays writes without losing them. `None` ends it (requests
    /// already held stay held for their time).
    pub fn set_hold(&self, hold: Option<Duration>) {
        eprintln!("fault proxy: hold {hold:?}");
        *self.shared.hold.lock().unwrap_or_else(|p| p.into_inner()) = hold;
    }

    /// Takes the endpoint away (`true`: every connection and request is hung up on, nothing
    /// forwarded) or brings it back (`false`); see the module docs.
    pub fn set_down(&self, down: bool) {
        eprintln!("fault proxy: {}", if down { "down" } else { "up again" });
        self.shared.down.store(down, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The seed from [`SEED_ENV`], or a fresh one from the clock and the process id.
pub fn seed_from_env() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_ENV}={s:?} is not a u64: {e}")),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ (u64::from(std::process::id()) << 32)
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                eprintln!("fault proxy: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.down.load(Ordering::SeqCst) {
            shared.refused_down.fetch_add(1, Ordering::SeqCst);
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(stream, shared.clone()));
    }
}

/// Serves one client connection until it closes, or until a request asks to hang up on it.
async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let hang_up = Arc::new(Notify::new());
    let asked = hang_up.clone();
    let service = service_fn(move |req| handle(req, shared.clone(), asked.clone()));
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        // Dropping the connection closes the socket with the answer unsent.
        _ = hang_up.notified() => {}
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    hang_up: Arc<Notify>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    if shared.down.load(Ordering::SeqCst) {
        shared.refused_down.fetch_add(1, Ordering::SeqCst);
        hang_up.notify_one();
        return std::future::pending().await;
    }
    let n = shared.next_request.fetch_add(1, Ordering::SeqCst);
    let fault = shared.deck.lock().unwrap_or_else(|p| p.into_inner()).draw();
    let (parts, body) = req.into_parts();
    let what = format!("#{n} {} {}", parts.method, parts.uri);
    // Read the whole body first, whatever happens next: the client has sent it.
    let body = body.collect().await?.to_bytes();
    let hold = *shared.hold.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(hold) = hold {
        eprintln!("fault proxy: {what}: held {hold:?}");
        tokio::time::sleep(hold).await;
    }
    match fault {
        Fault::SlowDown => {
            shared.slow_down.fetch_add(1, Ordering::SeqCst);
            eprintln!("fault proxy: {what}: 503 SlowDown (not forwarded)");
            return Ok(slow_down(n));
        }
        Fault::Delay(d) => {
            shared.delayed.fetch_add(1, Ordering::SeqCst);
            eprintln!("fault proxy: {what}: delayed {d:?}");
            tokio::time::sleep(d).await;
        }
        Fault::DropAfter | Fault::None => {}
    }
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    let answer = match forward(shared.upstream, parts, body).await {
        Ok(answer) => answer,
        Err(e) => {
            shared.upstream_errors.fetch_add(1, Ordering::SeqCst);
            eprintln!("fault proxy: {what}: the upstream failed: {e}");
            return Ok(plain(StatusCode::BAD_GATEWAY, format!("upstream: {e}")));
        }
    };
    if fault == Fault::DropAfter {
        shared.dropped.fetch_add(1, Ordering::SeqCst);
        eprintln!(
            "fault proxy: {what}: forwarded, upstream answered {}, connection dropped",
            answer.status()
        );
        hang_up.notify_one();
        return std::future::pending().await;
    }
    let len = hyper::body::Body::size_hint(answer.body())
        .exact()
        .unwrap_or(0);
    shared.answered_bytes.fetch_add(len, Ordering::SeqCst);
    Ok(answer)
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends the request upstream on a fresh connection and reads the whole answer (hop-by-hop
/// headers dropped both ways).
pub async fn forward(
    upstream: SocketAddr,
    mut parts: hyper::http::request::Parts,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let had_length = parts.headers.contains_key(header::CONTENT_LENGTH)
        || parts.headers.contains_key(header::TRANSFER_ENCODING);
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if had_length || !body.is_empty() {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    let stream = TcpStream::connect(upstream).await?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let answer = sender
        .send_request(Request::from_parts(parts, Full::new(body)))
        .await?;
    let (mut parts, body) = answer.into_parts();
    let body = body.collect().await?.to_bytes();
    drop(sender);
    let _ = conn.await;
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}

/// S3's answer to a request rate it does not take.
fn slow_down(n: u64) -> Response<Full<Bytes>> {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
         <Message>Please reduce your request rate. (injected by the test's fault proxy)</Message>\
         <RequestId>fault-proxy-{n}</RequestId><HostId>fault-proxy</HostId></Error>"
    );
    let mut r = Response::new(Full::new(Bytes::from(xml)));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    r
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r
}

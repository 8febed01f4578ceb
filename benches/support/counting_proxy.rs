//! [`CountingProxy`]: an HTTP proxy in front of an S3 endpoint that forwards every request as
//! it came and records each one (method, target, the bytes of its body, the answer's status),
//! so a bench counts a process's requests at the server side of its connections, not by the
//! process's own count.
//!
//! The forwarding is that of the tests' fault proxy ([`crate::fault_proxy::forward`]: the
//! body read whole, sent upstream on a fresh connection with a `Content-Length`, `Host` kept
//! so that signatures still match), so a bench including this file includes
//! `tests/support/fault_proxy.rs` as `mod fault_proxy` at its root too:
//!
//! ```ignore
//! #[path = "../tests/support/fault_proxy.rs"]
//! #[allow(dead_code)]
//! mod fault_proxy;
//! #[path = "support/counting_proxy.rs"]
//! mod counting_proxy;
//! ```
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// One request the proxy passed on.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Bytes of the request's payload: `x-amz-decoded-content-length` when the body is
    /// `aws-chunked`, else the body's length.
    pub body_bytes: u64,
    /// The upstream's status (502 when it did not answer).
    pub status: u16,
}

impl Seen {
    /// Its kind: the method, a GET with `list-type` a LIST, and a status other than 2xx.
    pub fn kind(&self) -> String {
        let method = if self.method == "GET" && self.target.contains("list-type=") {
            "LIST"
        } else {
            &self.method
        };
        if (200..300).contains(&self.status) {
            method.to_string()
        } else {
            format!("{method}→{}", self.status)
        }
    }
}

/// Requests by kind: `GET 1, HEAD 1, LIST 3, PUT 3`.
pub fn kinds(seen: &[Seen]) -> String {
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for s in seen {
        *counts.entry(s.kind()).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    parts.join(", ")
}

/// Payload bytes of the writes (PUT and POST) among `seen`.
pub fn written(seen: &[Seen]) -> u64 {
    seen.iter()
        .filter(|s| s.method == "PUT" || s.method == "POST")
        .map(|s| s.body_bytes)
        .sum()
}

/// A running proxy; stops when dropped.
pub struct CountingProxy {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl CountingProxy {
    /// Starts a proxy on a free loopback port in front of `upstream` (`http://host:port`), on
    /// a runtime of its own.
    pub fn start(upstream: &str) -> anyhow::Result<CountingProxy> {
        let upstream: SocketAddr = url::Url::parse(upstream)?
            .socket_addrs(|| Some(80))?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("counting proxy: cannot resolve {upstream}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("counting-proxy")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let seen = Arc::new(Mutex::new(Vec::new()));
        runtime.spawn(accept_loop(listener, upstream, seen.clone()));
        Ok(CountingProxy {
            url,
            seen,
            runtime: Some(runtime),
        })
    }

    /// The URL to use as the S3 endpoint.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Requests passed on so far.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The requests passed on since the `from`-th (a [`CountingProxy::count`] taken before).
    pub fn since(&self, from: usize) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(from..).map(<[Seen]>::to_vec).unwrap_or_default()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, seen: Arc<Mutex<Vec<Seen>>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let seen = seen.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, upstream, seen.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    upstream: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let decoded = parts
        .headers
        .get("x-amz-decoded-content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let mut record = Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.to_string(), |p| p.to_string()),
        body_bytes: decoded.unwrap_or(body.len() as u64),
        status: StatusCode::BAD_GATEWAY.as_u16(),
    };
    let answer = match crate::fault_proxy::forward(upstream, parts, body).await {
        Ok(answer) => answer,
        Err(e) => {
            let mut r = Response::new(Full::new(Bytes::from(format!("upstream: {e}"))));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    };
    record.status = answer.status().as_u16();
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(record);
    Ok(answer)
}

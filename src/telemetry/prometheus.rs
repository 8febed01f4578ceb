//! The Prometheus recorder and the `GET /metrics` server.
//!
//! The exporter's own HTTP listener does not report the address it bound, so this module
//! binds the listener itself (port 0 works) and serves the rendered text with hyper: HTTP/1.1,
//! one task per connection, `GET /metrics` (or `HEAD`), 404 for any other path, 405 for any
//! other method. The recorder's upkeep (draining histogram samples) runs every
//! [`UPKEEP_INTERVAL`] beside it. Every task (the upkeep, the accept loop, each connection) is
//! spawned on the server's [`TaskTracker`], so [`MetricsServer::shutdown`] can wait for them
//! all to end.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::TelemetryError;
use super::metrics::{
    BUCKET_DURATION_BUCKETS, BUCKET_REQUEST_DURATION, describe, set_recording, without_hidden,
};

/// How often the recorder's upkeep runs.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// The longest a scrape connection may stay idle before it is closed.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The running `/metrics` server; [`MetricsServer::stop`] ends it, [`MetricsServer::shutdown`]
/// ends it and waits for its tasks.
pub(super) struct MetricsServer {
    addr: SocketAddr,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl MetricsServer {
    /// Installs the global recorder, describes the contract's metrics and starts serving on
    /// `addr`. Must run inside a Tokio runtime.
    pub(super) fn start(addr: SocketAddr) -> Result<Self, TelemetryError> {
        let bind = |source| TelemetryError::MetricsBind { addr, source };
        let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let bound = listener.local_addr().map_err(bind)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(bind)?;

        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(BUCKET_REQUEST_DURATION.to_string()),
                BUCKET_DURATION_BUCKETS,
            )?
            .install_recorder()?;
        set_recording();
        describe();

        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(upkeep(handle.clone(), stop.clone()));
        tasks.spawn(serve(listener, handle, stop.clone(), tasks.clone()));
        tracing::info!(addr = %bound, "serving metrics on /metrics");
        Ok(Self {
            addr: bound,
            stop,
            tasks,
        })
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Tells every task to end, without waiting for them.
    pub(super) fn stop(&self) {
        self.stop.cancel();
        self.tasks.close();
    }

    /// Ends the server and waits until every one of its tasks has ended.
    pub(super) async fn shutdown(self) {
        self.stop();
        self.tasks.wait().await;
    }
}

async fn upkeep(handle: PrometheusHandle, stop: CancellationToken) {
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => handle.run_upkeep(),
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: back off rather than spin.
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let handle = handle.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let handle = handle.clone();
                async move { Ok::<_, Infallible>(respond(&req, &handle)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                _ = stop.cancelled() => {}
                result = conn => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "metrics connection");
                    }
                }
            }
        });
    }
}

fn respond<B>(req: &http::Request<B>, handle: &PrometheusHandle) -> http::Response<Full<Bytes>> {
    let status = |code: http::StatusCode, text: &'static str| {
        let mut r = http::Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = code;
        r
    };
    if req.uri().path() != "/metrics" {
        return status(
            http::StatusCode::NOT_FOUND,
            "not found: metrics are on /metrics\n",
        );
    }
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return status(http::StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
    }
    let text = without_hidden(handle.render());
    let mut r = http::Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

//! A span per gRPC call: [`grpc_trace_layer`], a tower layer for `tonic`'s server.
//!
//! ```ignore
//! Server::builder().layer(telemetry::grpc_trace_layer()).add_service(…)
//! ```
//!
//! Each request gets an INFO span `grpc.request` (target `mushroom_backup::telemetry::grpc`)
//! with `rpc.system = "grpc"`, `rpc.service` and `rpc.method` from the path
//! (`/mushroom.backup.v1.BackupControl/Register`), exported as a server span named
//! `service/method`. Its parent is the caller's W3C `traceparent` header, extracted with the
//! global propagator, when the caller sent one; otherwise it is a root span. The handler
//! runs inside the span, so its logs and child spans belong to the call.
//!
//! The span declares an empty `store_id` field: a handler records the store its call concerns
//! (`tracing::Span::current().record("store_id", id)`), the same attribute the worker's spans
//! carry, so a trace search by store finds the calls beside the worker's steps.
//!
//! `rpc.grpc.status_code` is read from the response headers: an error a handler returns is a
//! trailers-only response, with `grpc-status` in the headers, and marks the span as an error.
//! A response without it is recorded as `0` (OK); a streaming call that fails after its
//! headers were sent reports its status only in trailers, which this layer does not read.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::Extractor;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The tower layer of [`grpc_trace_layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcTraceLayer;

/// A span per gRPC call, continuing an incoming `traceparent`; see the module docs.
pub fn grpc_trace_layer() -> GrpcTraceLayer {
    GrpcTraceLayer
}

impl<S> tower::Layer<S> for GrpcTraceLayer {
    type Service = GrpcTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTrace { inner }
    }
}

/// The service [`GrpcTraceLayer`] wraps around the server's routes.
#[derive(Debug, Clone)]
pub struct GrpcTrace<S> {
    inner: S,
}

/// `(service, method)` of a gRPC path `/package.Service/Method`.
fn rpc_names(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    match path.split_once('/') {
        Some((service, method)) => (service, method),
        None => (path, ""),
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one call, its parent taken from the request's headers.
fn call_span(path: &str, headers: &http::HeaderMap) -> tracing::Span {
    let (service, method) = rpc_names(path);
    let span = tracing::info_span!(
        "grpc.request",
        otel.name = %format_args!("{service}/{method}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
        store_id = tracing::field::Empty,
    );
    if !span.is_disabled() {
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&HeaderExtractor(headers))
        });
        // Fails only when no OpenTelemetry layer is installed: then there is nothing to join.
        let _ = span.set_parent(parent);
    }
    span
}

/// Records the call's gRPC status (from a trailers-only response's headers) on its span.
fn record_status(span: &tracing::Span, headers: &http::HeaderMap) {
    let code = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    span.record("rpc.grpc.status_code", code);
    if code != 0 {
        span.record("otel.status_code", "ERROR");
    }
}

impl<S, B, ResBody> tower::Service<http::Request<B>> for GrpcTrace<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let span = call_span(req.uri().path(), req.headers());
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        Box::pin(
            async move {
                let result = future.await;
                let span = tracing::Span::current();
                match &result {
                    Ok(response) => record_status(&span, response.headers()),
                    Err(_) => {
                        span.record("otel.status_code", "ERROR");
                    }
                }
                result
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_and_method_come_from_the_path() {
        assert_eq!(
            rpc_names("/mushroom.backup.v1.BackupControl/Register"),
            ("mushroom.backup.v1.BackupControl", "Register")
        );
        assert_eq!(
            rpc_names("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
        assert_eq!(rpc_names("/odd"), ("odd", ""));
    }
}

//! A real OTLP/gRPC trace receiver on 127.0.0.1:0, keeping what it receives: the collector's
//! `TraceService` from `opentelemetry-proto`, served by tonic. Used by `tests/telemetry.rs`
//! and `benches/telemetry_cost.rs` (`#[path]`-included, so it stands alone).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;

/// Every export request received, in order.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

struct Service(Received);

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// One span as received, with its resource's attributes.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub resource: Vec<KeyValue>,
    pub span: Span,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }
    pub fn resource_attr(&self, key: &str) -> Option<String> {
        attr(&self.resource, key)
    }
}

/// An attribute's value as text (strings as they are, other kinds debug-printed).
pub fn attr(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .map(|kv| match &kv.value {
            Some(AnyValue {
                value: Some(any_value::Value::StringValue(s)),
            }) => s.clone(),
            Some(AnyValue {
                value: Some(any_value::Value::IntValue(i)),
            }) => i.to_string(),
            other => format!("{other:?}"),
        })
}

impl Received {
    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        let mut out = Vec::new();
        for req in self.0.lock().unwrap().iter() {
            for rs in &req.resource_spans {
                let resource = rs
                    .resource
                    .as_ref()
                    .map(|r| r.attributes.clone())
                    .unwrap_or_default();
                for ss in &rs.scope_spans {
                    for span in &ss.spans {
                        out.push(ReceivedSpan {
                            resource: resource.clone(),
                            span: span.clone(),
                        });
                    }
                }
            }
        }
        out
    }

    /// Export requests received so far.
    pub fn requests(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Waits until `done` holds for the spans received, or `timeout` passes.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || tokio::time::Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Starts the receiver on 127.0.0.1:0 as a task of the current runtime.
pub async fn start() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the OTLP receiver");
    let addr = listener.local_addr().expect("receiver address");
    let received = Received::default();
    let service = TraceServiceServer::new(Service(received.clone()));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("the OTLP receiver failed");
    });
    (addr, received)
}

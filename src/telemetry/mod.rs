//! Logs, traces and metrics of the process: one [`init`] at startup, one [`TelemetryGuard`]
//! kept until the end.
//!
//! # What is emitted, and when
//!
//! - **Logs** always: `tracing` events to stderr, filtered by `MUSHROOMDB_BACKUP_LOG`, else
//!   `RUST_LOG`, else `warn,mushroom_backup=info` with the AWS SDK's crates at `error`
//!   ([`DEFAULT_LOG_FILTER`]; a set but malformed filter is an error, not silently the
//!   default). [`LogFormat::Json`] writes one JSON object a line; while a span
//!   exported to OTLP is current, the line starts with its `trace_id` and `span_id`, so a log
//!   line finds its trace.
//! - **Traces** only when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//!   is set (and not empty): spans that pass the log filter are exported with OTLP over gRPC
//!   through a batch span processor (its own thread, bounded queue: spans are dropped, never
//!   waited for, when the collector is slow). The resource comes from the SDK's detectors:
//!   `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, with
//!   [`TelemetryConfig::service_name_default`] when neither names the service. The W3C
//!   TraceContext propagator is installed globally, and [`grpc_trace_layer`] continues an
//!   incoming `traceparent`. The other standard `OTEL_*` exporter variables (headers,
//!   timeout, compression, `OTEL_TRACES_SAMPLER`) are the SDK's. Spans of the transport crates
//!   (`h2`, `hyper`, `tonic`, `tower`, `opentelemetry*`) are never exported: the exporter's
//!   own requests would otherwise trace themselves. When unset, no OpenTelemetry layer is
//!   installed at all and nothing is exported or buffered.
//! - **Metrics** only when [`TelemetryConfig::metrics_listen`] is set: the Prometheus recorder
//!   is installed as the `metrics` crate's global recorder and `GET /metrics` on that address
//!   serves the text format ([`TelemetryGuard::metrics_addr`] is the bound address, so port 0
//!   works). Without it every `metrics` call is a no-op. The metric names are a contract with
//!   dashboards and alert rules: see [`metrics`].
//!
//! # Runtime and shutdown
//!
//! [`init`] must run inside a Tokio runtime context when traces or metrics are on (the gRPC
//! channel and the `/metrics` server are tasks of that runtime). Dropping the guard flushes
//! the spans still queued and shuts the tracer provider down, waiting at most
//! [`SHUTDOWN_TIMEOUT`], and stops the `/metrics` server ([`TelemetryGuard::shutdown`] does
//! the same after waiting for the server's tasks to end). The export itself runs on the
//! runtime, so drop the guard while the runtime is alive — after `block_on` returns, before
//! the runtime is dropped. (Dropped on a multi-threaded runtime's worker it moves off the
//! worker with `block_in_place`; on a current-thread runtime's own thread the flush can only
//! time out.)
//!
//! The subscriber, the propagator, the tracer provider and the metrics recorder are
//! process-wide: [`init`] succeeds once per process.

pub mod grpc;
mod logs;
pub mod metrics;
mod otlp;
mod prometheus;

use std::net::SocketAddr;
use std::time::Duration;

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

pub use grpc::{GrpcTraceLayer, grpc_trace_layer};
pub use logs::current_trace_id;
pub use metrics::{hide_store, record_fleet, recording, show_store};

/// The log filter's own variable; `RUST_LOG` is read when it is unset.
pub const LOG_ENV: &str = "MUSHROOMDB_BACKUP_LOG";
/// The filter when neither [`LOG_ENV`] nor `RUST_LOG` is set: our own lines from `info`,
/// others' from `warn`, but the AWS SDK's from `error` only. Its warnings (each credential
/// provider that found nothing, each region source missing, each retried request) come by
/// the dozen, hundreds of characters each, before our one line that says what is wrong
/// (`bucket::s3`: "no AWS credentials found (…)", "no AWS region configured"). Set the
/// variable (e.g. `warn,mushroom_backup=info`) to see them.
pub const DEFAULT_LOG_FILTER: &str = "warn,mushroom_backup=info,aws_config=error,\
aws_runtime=error,aws_credential_types=error,aws_sdk_s3=error,aws_sdk_sso=error,\
aws_sdk_ssooidc=error,aws_sdk_sts=error,aws_smithy_runtime=error,aws_smithy_runtime_api=error,\
aws_smithy_http=error,aws_smithy_http_client=error,aws_smithy_types=error";
/// How long dropping the guard may wait for queued spans to be exported.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line, with `trace_id` / `span_id` when a traced span is current.
    Json,
}

/// What [`init`] sets up; the OTLP side is configured by the standard `OTEL_*` variables.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub log_format: LogFormat,
    /// Serve Prometheus metrics on `GET /metrics` here; `None` records no metrics at all.
    pub metrics_listen: Option<SocketAddr>,
    /// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` sets it.
    pub service_name_default: &'static str,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Text,
            metrics_listen: None,
            service_name_default: "mushroom-backup",
        }
    }
}

/// Why telemetry could not be set up. Nothing is half-installed on an error but the
/// pieces before it (the propagator, a tracer provider that is then shut down).
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log filter {var}={value:?}: {source}")]
    BadFilter {
        var: &'static str,
        value: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("{what} needs a Tokio runtime: call telemetry::init inside one (Runtime::enter)")]
    NoRuntime { what: &'static str },
    #[error("the OTLP span exporter: {0}")]
    Otlp(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("a global tracing subscriber is already installed")]
    SubscriberAlreadySet,
    #[error("the Prometheus recorder: {0}")]
    MetricsRecorder(#[from] metrics_exporter_prometheus::BuildError),
    #[error("cannot serve metrics on {addr}: {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Keeps telemetry running; dropping it flushes and shuts down (see the module docs).
#[must_use = "dropping the guard shuts tracing export and the /metrics server down"]
pub struct TelemetryGuard {
    tracer_provider: Option<SdkTracerProvider>,
    metrics: Option<prometheus::MetricsServer>,
}

impl TelemetryGuard {
    /// Shuts telemetry down as dropping the guard does, but first waits until every task of
    /// the `/metrics` server (its upkeep, its listener, its connections) has ended.
    pub async fn shutdown(mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.shutdown().await;
        }
    }

    /// Where `/metrics` is served, when metrics are on.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr())
    }

    /// Whether spans are exported with OTLP.
    pub fn traces_exported(&self) -> bool {
        self.tracer_provider.is_some()
    }
}

impl std::fmt::Debug for TelemetryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryGuard")
            .field("traces_exported", &self.traces_exported())
            .field("metrics_addr", &self.metrics_addr())
            .finish()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.stop();
        }
        let Some(provider) = self.tracer_provider.take() else {
            return;
        };
        let shutdown = move || {
            if let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
                eprintln!("warning: flushing the OTLP span exporter: {e}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(shutdown)
            }
            _ => shutdown(),
        }
    }
}

/// Sets up logs, traces and metrics for the process; see the module docs.
pub fn init(cfg: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let filter = env_filter()?;
    let needs_runtime = if otlp::endpoint_configured() {
        Some("OTLP export")
    } else if cfg.metrics_listen.is_some() {
        Some("the /metrics server")
    } else {
        None
    };
    if let Some(what) = needs_runtime
        && tokio::runtime::Handle::try_current().is_err()
    {
        return Err(TelemetryError::NoRuntime { what });
    }

    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer_provider = if otlp::endpoint_configured() {
        Some(otlp::tracer_provider(cfg.service_name_default)?)
    } else {
        None
    };
    let otel_layer = tracer_provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(env!("CARGO_PKG_NAME")))
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                !otlp::is_transport_target(meta.target())
            }))
    });
    let traced = tracer_provider.is_some();
    let fmt_layer = match cfg.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_ansi(false)
            .event_format(logs::WithTraceIds::new(
                tracing_subscriber::fmt::format().json(),
                traced,
            ))
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt_layer)
        .with(otel_layer)
        .try_init();
    if installed.is_err() {
        if let Some(p) = &tracer_provider {
            let _ = p.shutdown_with_timeout(Duration::from_millis(100));
        }
        return Err(TelemetryError::SubscriberAlreadySet);
    }
    if let Some(p) = &tracer_provider {
        opentelemetry::global::set_tracer_provider(p.clone());
    }

    let metrics = match cfg.metrics_listen {
        Some(addr) => Some(prometheus::MetricsServer::start(addr)?),
        None => None,
    };
    Ok(TelemetryGuard {
        tracer_provider,
        metrics,
    })
}

/// The log filter: [`LOG_ENV`], else `RUST_LOG`, else [`DEFAULT_LOG_FILTER`].
fn env_filter() -> Result<EnvFilter, TelemetryError> {
    for var in [LOG_ENV, "RUST_LOG"] {
        if let Ok(value) = std::env::var(var)
            && !value.trim().is_empty()
        {
            return EnvFilter::try_new(&value).map_err(|source| TelemetryError::BadFilter {
                var,
                value,
                source,
            });
        }
    }
    Ok(EnvFilter::new(DEFAULT_LOG_FILTER))
}

//! The OTLP/gRPC tracer provider: built only when an endpoint variable is set.

use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector as _};
use opentelemetry_sdk::trace::SdkTracerProvider;

use super::TelemetryError;

const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Whether spans are to be exported: an endpoint variable is set and not empty, and the SDK
/// is not disabled (`OTEL_SDK_DISABLED=true`).
pub(super) fn endpoint_configured() -> bool {
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && ENDPOINT_VARS
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// Targets whose spans are never exported: the exporter's own requests go through them.
pub(super) fn is_transport_target(target: &str) -> bool {
    [
        "h2",
        "hyper",
        "hyper_util",
        "tonic",
        "tower",
        "opentelemetry",
    ]
    .iter()
    .any(|t| target.starts_with(t))
}

/// The resource: the SDK's detectors (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
/// `telemetry.sdk.*`), with `default_name` when neither variable names the service.
pub(super) fn resource(default_name: &'static str) -> Resource {
    let named_by_env = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|s| !s.is_empty())
        || EnvResourceDetector::new()
            .detect()
            .get(&opentelemetry::Key::new("service.name"))
            .is_some();
    let builder = Resource::builder();
    if named_by_env {
        builder.build()
    } else {
        builder
            .with_attribute(KeyValue::new("service.name", default_name))
            .build()
    }
}

/// A provider exporting through a batch span processor to the configured endpoint. Must run
/// inside a Tokio runtime (the channel connects lazily on it).
pub(super) fn tracer_provider(
    default_name: &'static str,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_protocol(opentelemetry_otlp::Protocol::Grpc)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource(default_name))
        .build();
    Ok(provider)
}

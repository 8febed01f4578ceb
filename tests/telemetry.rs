//! Telemetry end to end: spans exported with OTLP/gRPC to a real receiver (in a child
//! process, since the subscriber, the tracer provider and the environment are process-wide),
//! and `/metrics` on port 0 served as valid Prometheus text with the per-store series.

#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/prometheus.rs"]
mod prometheus;
mod support;

use prometheus::{Family, parse_prometheus};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::metered::MeteredBucket;
use mushroom_backup::bucket::{Body, Bucket, PutCondition};
use mushroom_backup::health::{StoreHealth, WorkerState};
use mushroom_backup::service::store_metrics::{forget_store, record_store};
use mushroom_backup::telemetry::{self, LogFormat, TelemetryConfig};
use mushroom_backup::worker::BackupCounters;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::Instrument as _;

/// Set in the child process: [`otlp_child`] then does its work instead of returning.
const CHILD: &str = "MUSHROOM_TELEMETRY_TEST_CHILD";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

/// The child's side of [`spans_reach_an_otlp_receiver_with_parent_resource_and_store_id`]: a
/// gRPC server behind `grpc_trace_layer` called with a `traceparent`, and worker-like spans.
#[test]
fn otlp_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let entered = rt.enter();
    let guard = telemetry::init(&TelemetryConfig {
        log_format: LogFormat::Json,
        metrics_listen: None,
        service_name_default: "not-this-name",
    })
    .expect("init telemetry");
    assert!(guard.traces_exported());
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_reporter, health) = tonic_health::server::health_reporter();
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer(telemetry::grpc_trace_layer())
                .add_service(health)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
        let mut req = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        req.metadata_mut().insert(
            "traceparent",
            format!("00-{TRACE_ID}-{CALLER_SPAN_ID}-01")
                .parse()
                .unwrap(),
        );
        client.check(req).await.expect("health check");
        let missing = client
            .check(tonic_health::pb::HealthCheckRequest {
                service: "no.such.Service".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(missing.code(), tonic::Code::NotFound);

        let bucket = MeteredBucket::new(Arc::new(MemBucket::new()));
        async {
            tracing::info!("shipping a segment");
            bucket
                .put(
                    "wal/1",
                    Body::from(Bytes::from_static(b"frames")),
                    PutCondition::IfNoneMatch,
                )
                .instrument(tracing::info_span!(
                    "ship_segment",
                    store_id = "store-7",
                    bytes = 6
                ))
                .await
                .unwrap();
        }
        .instrument(tracing::info_span!("backup_step", store_id = "store-7"))
        .await;
        tracing::info_span!("restore_point", store_id = "store-7", commit_seq = 42)
            .in_scope(|| tracing::info!("restore point written"));
        tracing::info!("outside every span");
    });
    // Flush while the runtime is alive, outside its async context (as `main` will).
    drop(guard);
    drop(entered);
}

fn hex_id(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_receiver_with_parent_resource_and_store_id() {
    let (addr, received) = otlp::start().await;
    let exe = std::env::current_exe().unwrap();
    let child = tokio::process::Command::new(exe)
        .args(["otlp_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env("OTEL_SERVICE_NAME", "mushroom-backup-under-test")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment.name=test,service.namespace=mushroom",
        )
        .env(
            telemetry::LOG_ENV,
            "warn,mushroom_backup=debug,telemetry=info",
        )
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), child)
        .await
        .expect("the child process took over 120 s")
        .expect("run the child process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed: {}\n{stderr}",
        out.status
    );

    let spans = received
        .wait_for(Duration::from_secs(10), |s| s.len() >= 6)
        .await;
    let names: Vec<&str> = spans.iter().map(|s| s.span.name.as_str()).collect();
    let one = |name: &str| {
        let found: Vec<_> = spans.iter().filter(|s| s.span.name == name).collect();
        assert_eq!(found.len(), 1, "{name} in {names:?}");
        found[0].clone()
    };

    for s in &spans {
        assert_eq!(
            s.resource_attr("service.name").as_deref(),
            Some("mushroom-backup-under-test"),
            "{}",
            s.span.name
        );
        assert_eq!(
            s.resource_attr("deployment.environment.name").as_deref(),
            Some("test")
        );
    }

    // The API call continues the caller's trace, as a server span under the caller's span.
    let calls: Vec<_> = spans
        .iter()
        .filter(|s| s.span.name == "grpc.health.v1.Health/Check")
        .collect();
    assert_eq!(calls.len(), 2, "{names:?}");
    let (traced, untraced) = if hex_id(&calls[0].span.trace_id) == TRACE_ID {
        (calls[0], calls[1])
    } else {
        (calls[1], calls[0])
    };
    assert_eq!(hex_id(&traced.span.trace_id), TRACE_ID);
    assert_eq!(hex_id(&traced.span.parent_span_id), CALLER_SPAN_ID);
    assert_eq!(traced.span.kind, 2, "SPAN_KIND_SERVER");
    assert_eq!(
        traced.attr("rpc.service").as_deref(),
        Some("grpc.health.v1.Health")
    );
    assert_eq!(traced.attr("rpc.method").as_deref(), Some("Check"));
    assert_eq!(traced.attr("rpc.system").as_deref(), Some("grpc"));
    assert_eq!(traced.attr("rpc.grpc.status_code").as_deref(), Some("0"));
    // A call without traceparent is a root span of its own trace; its error is recorded.
    assert!(untraced.span.parent_span_id.is_empty());
    assert_ne!(hex_id(&untraced.span.trace_id), TRACE_ID);
    assert_eq!(untraced.attr("rpc.grpc.status_code").as_deref(), Some("5"));
    assert_eq!(untraced.span.status.as_ref().map(|s| s.code), Some(2));

    // Worker-like spans carry store_id, nest, and the bucket request is a child span.
    let step = one("backup_step");
    let ship = one("ship_segment");
    let point = one("restore_point");
    let request = one("bucket.request");
    for s in [&step, &ship, &point] {
        assert_eq!(
            s.attr("store_id").as_deref(),
            Some("store-7"),
            "{}",
            s.span.name
        );
    }
    assert_eq!(ship.span.parent_span_id, step.span.span_id);
    assert_eq!(request.span.parent_span_id, ship.span.span_id);
    assert_eq!(request.attr("bucket.op").as_deref(), Some("put"));
    assert_eq!(request.attr("bucket.key").as_deref(), Some("wal/1"));
    assert_eq!(point.attr("commit_seq").as_deref(), Some("42"));
    assert!(
        spans.iter().all(|s| !s.span.name.contains("h2")
            && !s.span.name.starts_with("hyper")
            && s.span.name != "export"),
        "transport spans exported: {names:?}"
    );

    // JSON log lines carry the ids of the span they were logged in, and none outside.
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let line = |message: &str| {
        lines
            .iter()
            .find(|v| v["fields"]["message"] == message)
            .unwrap_or_else(|| panic!("no log line {message:?} in\n{stderr}"))
            .clone()
    };
    let shipping = line("shipping a segment");
    assert_eq!(shipping["trace_id"], hex_id(&step.span.trace_id));
    assert_eq!(shipping["span_id"], hex_id(&step.span.span_id));
    let written = line("restore point written");
    assert_eq!(written["span_id"], hex_id(&point.span.span_id));
    assert!(line("outside every span").get("trace_id").is_none());
}

/// The real service exports a span per call, and each call's span carries the store it
/// concerns, so a trace search by `store_id` finds the calls beside the worker's steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_spans_of_the_real_service_carry_the_store_id() {
    use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
    use support::binary::{self, run_ok};
    use support::served as serve;

    let (otlp_addr, received) = otlp::start().await;
    let d = serve::dirs();
    // A destination with a restore point, for Adopt (outside the allowed root).
    let source = d.base.join("source");
    let backed_up = format!("file://{}", d.base.join("bucket-a").display());
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["store", "write"])
        .arg(&source)
        .args(["--commits", "20"]);
    run_ok("store write", cmd, serve::DEADLINE);
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["backup", "--once", "--store"])
        .arg(&source)
        .args(["--to", &backed_up]);
    run_ok("backup --once", cmd, serve::DEADLINE);

    let mut cmd = serve::command(&d);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp_addr}"))
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env("OTEL_SERVICE_NAME", "mushroom-backup-under-test");
    let (mut server, addr) = serve::start("serve (OTLP)", cmd);
    let mut c = BackupControlClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");

    let reg = c
        .register(proto::RegisterRequest {
            store_dir: d.root.join("s1").display().to_string(),
            destination: format!("file://{}", d.base.join("bucket-b").display()),
            ..Default::default()
        })
        .await
        .expect("Register")
        .into_inner();
    let id = reg.store_id.clone();
    c.health(proto::HealthRequest {
        store_id: id.clone(),
        fresh: false,
    })
    .await
    .expect("Health");
    c.trigger(proto::TriggerRequest {
        store_id: id.clone(),
        kind: proto::TriggerKind::Ship as i32,
    })
    .await
    .expect("Trigger");
    // Its answer does not matter here (the destination is still empty); its span does.
    let _ = c
        .list_restore_points(proto::ListRestorePointsRequest {
            store_id: id.clone(),
            ..Default::default()
        })
        .await;
    let first = proto::PositionReport {
        store_id: id.clone(),
        wal_id: uuid::Uuid::new_v4().to_string(),
        ..Default::default()
    };
    let mut report = tonic::Request::new(tokio_stream::iter(vec![first]));
    report.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", reg.node_token).parse().unwrap(),
    );
    c.report_position(report).await.expect("ReportPosition");
    c.deregister(proto::DeregisterRequest {
        store_id: id.clone(),
        flush: false,
    })
    .await
    .expect("Deregister");
    let adopted = c
        .adopt(proto::AdoptRequest {
            store_dir: d.root.join("adopted").display().to_string(),
            destination: backed_up.clone(),
            ..Default::default()
        })
        .await
        .expect("Adopt")
        .into_inner();

    // SIGTERM: the service exits, flushing the spans still queued.
    server.signal(libc::SIGTERM);
    let status = server.wait_exit(serve::DEADLINE);
    assert!(status.success(), "serve exited with {status}");

    let want = [
        ("Register", &id),
        ("Health", &id),
        ("Trigger", &id),
        ("ListRestorePoints", &id),
        ("ReportPosition", &id),
        ("Deregister", &id),
        ("Adopt", &adopted.store_id),
    ];
    let of = |spans: &[otlp::ReceivedSpan], method: &str| {
        spans
            .iter()
            .find(|s| {
                s.attr("rpc.service").as_deref() == Some("mushroom.backup.v1.BackupControl")
                    && s.attr("rpc.method").as_deref() == Some(method)
            })
            .cloned()
    };
    let spans = received
        .wait_for(Duration::from_secs(30), |spans| {
            want.iter().all(|(m, _)| of(spans, m).is_some())
        })
        .await;
    for (method, store_id) in want {
        let span = of(&spans, method).unwrap_or_else(|| {
            let names: Vec<&str> = spans.iter().map(|s| s.span.name.as_str()).collect();
            panic!("no span of {method} among {names:?}")
        });
        assert_eq!(
            span.attr("store_id").as_deref(),
            Some(store_id.as_str()),
            "{method}"
        );
    }
}

// ---- /metrics -------------------------------------------------------------------------

/// One HTTP/1.1 GET; the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    (status, body.to_string())
}

fn health(healthy: bool, lag: f64, lease_held: bool, holder: &str) -> StoreHealth {
    StoreHealth {
        healthy,
        reason: String::new(),
        reasons: Vec::new(),
        notes: Vec::new(),
        durable_commit_seq: 900,
        shipped_commit_seq: 850,
        restore_point_commit_seq: 800,
        bucket_durable_commit_seq: 800,
        lag_seconds: lag,
        lease_holder: holder.to_string(),
        lease_held,
        consecutive_failures: 0,
        last_error: None,
        worker: WorkerState::Running,
        activity: String::new(),
        paused: None,
        last_drill: None,
        immutable: None,
        starting: false,
        branched_from: None,
    }
}

/// The value of the one sample of `name` with exactly `labels`.
fn value(
    families: &BTreeMap<String, Family>,
    family: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    families
        .get(family)?
        .samples
        .iter()
        .find(|s| s.name == name && s.labels == want)
        .map(|s| s.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_on_port_0_as_prometheus_text() {
    let guard = telemetry::init(&TelemetryConfig {
        log_format: LogFormat::Text,
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        service_name_default: "mushroom-backup",
    })
    .expect("init telemetry");
    let addr = guard.metrics_addr().expect("metrics are on");
    assert_ne!(addr.port(), 0);

    let a = BackupCounters::default();
    a.bytes_shipped.store(4096, Ordering::Relaxed);
    a.objects_shipped.store(3, Ordering::Relaxed);
    a.restore_points.store(1, Ordering::Relaxed);
    let b = BackupCounters::default();
    b.failures.store(7, Ordering::Relaxed);
    let mut drilled = health(true, 2.5, true, "me@host");
    drilled.last_drill = Some(mushroom_backup::health::DrillResult {
        ok: true,
        commit_seq: 800,
        manifest_key: "manifests/00000000000000000800.json".into(),
        duration_ms: 1500,
        bytes: 65536,
        error: String::new(),
        finished_at_unix_ms: 1_800_000_000_000,
        last_ok_at_unix_ms: 1_800_000_000_000,
        predicted_ms: 1400,
    });
    record_store("store-a", "a", &drilled, &a);
    record_store("store-b", "b", &health(false, 0.0, false, "other@db7"), &b);
    mushroom_backup::service::store_metrics::record_rto("store-a", 12.5, 40.0, Some(30));
    mushroom_backup::service::store_metrics::record_rto("store-b", 0.0, 0.0, Some(30));
    telemetry::record_fleet(2, 1);
    let bucket = MeteredBucket::new(Arc::new(MemBucket::new()));
    bucket
        .put(
            "k",
            Body::from(Bytes::from_static(b"v")),
            PutCondition::None,
        )
        .await
        .unwrap();
    assert!(bucket.head("missing").await.unwrap().is_none());

    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    let families = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let g = |name: &str, id: &str| value(&families, name, name, &[("store_id", id)]);
    assert_eq!(g("mushroom_backup_store_lag_seconds", "store-a"), Some(2.5));
    assert_eq!(g("mushroom_backup_store_healthy", "store-a"), Some(1.0));
    assert_eq!(
        g("mushroom_backup_store_last_drill_ok", "store-a"),
        Some(1.0)
    );
    assert_eq!(
        g(
            "mushroom_backup_store_last_drill_duration_seconds",
            "store-a"
        ),
        Some(1.5)
    );
    assert_eq!(
        g("mushroom_backup_store_last_drill_bytes", "store-a"),
        Some(65536.0)
    );
    assert_eq!(
        g(
            "mushroom_backup_store_last_drill_success_timestamp_seconds",
            "store-a"
        ),
        Some(1_800_000_000.0)
    );
    let rto = |id: &str, point: &str| {
        let name = "mushroom_backup_predicted_rto_seconds";
        value(&families, name, name, &[("store_id", id), ("point", point)])
    };
    assert_eq!(rto("store-a", "latest"), Some(12.5));
    assert_eq!(rto("store-a", "worst"), Some(40.0));
    assert_eq!(
        rto("store-b", "latest"),
        None,
        "no prediction before a restore point"
    );
    assert_eq!(
        g("mushroom_backup_rto_target_seconds", "store-a"),
        Some(30.0)
    );
    assert_eq!(
        g("mushroom_backup_store_last_drill_ok", "store-b"),
        None,
        "a store never drilled has no drill series"
    );
    assert_eq!(g("mushroom_backup_store_healthy", "store-b"), Some(0.0));
    assert_eq!(
        g("mushroom_backup_store_durable_commit_seq", "store-a"),
        Some(900.0)
    );
    assert_eq!(
        g("mushroom_backup_store_shipped_commit_seq", "store-a"),
        Some(850.0)
    );
    assert_eq!(
        g("mushroom_backup_store_restore_point_commit_seq", "store-a"),
        Some(800.0)
    );
    assert_eq!(g("mushroom_backup_store_lease_held", "store-a"), Some(1.0));
    assert_eq!(
        g("mushroom_backup_store_lease_held_elsewhere", "store-a"),
        Some(0.0)
    );
    assert_eq!(
        g("mushroom_backup_store_lease_held_elsewhere", "store-b"),
        Some(1.0)
    );
    assert_eq!(
        g("mushroom_backup_store_shipped_bytes_total", "store-a"),
        Some(4096.0)
    );
    assert_eq!(
        g("mushroom_backup_store_shipped_objects_total", "store-a"),
        Some(3.0)
    );
    assert_eq!(
        g("mushroom_backup_store_restore_points_total", "store-a"),
        Some(1.0)
    );
    assert_eq!(
        g("mushroom_backup_store_failures_total", "store-b"),
        Some(7.0)
    );
    assert_eq!(
        g("mushroom_backup_store_shipped_bytes_total", "store-b"),
        Some(0.0)
    );
    // store-a wrote a restore point: its time is recorded; store-b has none.
    let ts = g(
        "mushroom_backup_store_last_restore_point_timestamp_seconds",
        "store-a",
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - ts).abs() < 60.0, "{ts} vs {now}");
    assert_eq!(
        value(
            &families,
            "mushroom_backup_stores",
            "mushroom_backup_stores",
            &[]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &families,
            "mushroom_backup_stores_unhealthy",
            "mushroom_backup_stores_unhealthy",
            &[]
        ),
        Some(1.0)
    );
    for (name, kind) in [
        ("mushroom_backup_store_lag_seconds", "gauge"),
        ("mushroom_backup_store_shipped_bytes_total", "counter"),
        ("mushroom_backup_store_healthy", "gauge"),
        (
            "mushroom_backup_bucket_request_duration_seconds",
            "histogram",
        ),
        ("mushroom_backup_bucket_requests_total", "counter"),
    ] {
        let f = &families[name];
        assert_eq!(f.kind.as_deref(), Some(kind), "{name}");
        assert!(
            f.help.as_ref().is_some_and(|h| !h.is_empty()),
            "{name} has no help"
        );
    }
    let requests = "mushroom_backup_bucket_requests_total";
    assert_eq!(
        value(
            &families,
            requests,
            requests,
            &[("op", "put"), ("outcome", "ok")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &families,
            requests,
            requests,
            &[("op", "head"), ("outcome", "not_found")]
        ),
        Some(1.0)
    );
    let duration = "mushroom_backup_bucket_request_duration_seconds";
    assert_eq!(
        value(
            &families,
            duration,
            &format!("{duration}_count"),
            &[("op", "put"), ("outcome", "ok")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &families,
            duration,
            &format!("{duration}_bucket"),
            &[("op", "put"), ("outcome", "ok"), ("le", "+Inf")]
        ),
        Some(1.0)
    );

    // A new worker for store-a counts from zero: the exported counter goes on rising.
    a.bytes_shipped.store(5000, Ordering::Relaxed);
    record_store("store-a", "a", &health(true, 0.0, true, "me@host"), &a);
    let restarted = BackupCounters::default();
    restarted.bytes_shipped.store(100, Ordering::Relaxed);
    record_store(
        "store-a",
        "restarted",
        &health(true, 0.0, true, "me@host"),
        &restarted,
    );
    // A deregistered store disappears, and comes back when recorded again.
    forget_store("store-b");
    let (_, text) = get(addr, "/metrics").await;
    let families = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let g = |name: &str, id: &str| value(&families, name, name, &[("store_id", id)]);
    assert_eq!(
        g("mushroom_backup_store_shipped_bytes_total", "store-a"),
        Some(5100.0)
    );
    assert!(!text.contains("store-b"), "{text}");
    assert_eq!(g("mushroom_backup_store_lag_seconds", "store-a"), Some(0.0));
    record_store("store-b", "b", &health(true, 0.0, true, "me@host"), &b);
    let (_, text) = get(addr, "/metrics").await;
    let families = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let g = |name: &str, id: &str| value(&families, name, name, &[("store_id", id)]);
    assert_eq!(g("mushroom_backup_store_healthy", "store-b"), Some(1.0));
    assert_eq!(
        g("mushroom_backup_store_failures_total", "store-b"),
        Some(7.0)
    );

    assert_eq!(get(addr, "/").await.0, 404);
    drop(guard);
    // The server stops with the guard.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still serving after the guard dropped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_parser_rejects_broken_expositions() {
    let ok = "# HELP m h\n# TYPE m counter\nm{a=\"x\\\"y\",b=\"2\"} 3\nm 4 1700000000\n";
    let f = parse_prometheus(ok).unwrap();
    assert_eq!(f["m"].samples[0].labels["a"], "x\"y");
    for bad in [
        "m 1\n",
        "# TYPE m counter\nm{a=x} 1\n",
        "# TYPE m counter\nm{a=\"x} 1\n",
        "# TYPE m counter\nm one\n",
        "# TYPE m counter\n# TYPE m gauge\n",
        "# TYPE m wat\n",
        "# TYPE 1m counter\n",
    ] {
        assert!(parse_prometheus(bad).is_err(), "{bad:?} parsed");
    }
}

/// `serve` (`cmd` with `--metrics-listen` on port 0): the child, its gRPC and its metrics
/// addresses.
fn serve_with_metrics(
    name: &str,
    mut cmd: std::process::Command,
) -> (
    support::binary::Running,
    std::net::SocketAddr,
    std::net::SocketAddr,
) {
    cmd.args(["--metrics-listen", "127.0.0.1:0"]);
    let mut child = support::binary::Running::spawn(name, cmd);
    let (mut listening, mut metrics) = (None, None);
    let (listening, metrics) = child.wait_for(
        "print its listening line and log its metrics address",
        support::served::DEADLINE,
        |line| {
            listening = listening.or_else(|| line.listening()?.parse().ok());
            metrics = metrics.or_else(|| line.metrics_addr());
            listening.zip(metrics)
        },
    );
    (child, listening, metrics)
}

/// Every `mushroom_backup_store_healthy` sample of a scrape, by store id.
async fn healthy_gauges(addr: std::net::SocketAddr) -> (BTreeMap<String, f64>, Option<f64>) {
    let (status, text) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    let families = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let healthy = families
        .get("mushroom_backup_store_healthy")
        .map(|f| {
            f.samples
                .iter()
                .map(|s| (s.labels["store_id"].clone(), s.value))
                .collect()
        })
        .unwrap_or_default();
    let unhealthy = value(
        &families,
        "mushroom_backup_stores_unhealthy",
        "mushroom_backup_stores_unhealthy",
        &[],
    );
    (healthy, unhealthy)
}

/// Issue 30: right after a restart every worker is still acquiring its lease ("starting") for
/// a moment; `/metrics` must not show those stores unhealthy (until the next health report,
/// seconds later) while `Health` already says healthy. A store's gauges appear from its first
/// evaluation after the start: every scrape from the first one shows each store healthy or
/// not at all, until every store shows healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_scrapes_after_a_restart_show_no_healthy_store_unhealthy() {
    use support::served;
    const STORES: usize = 6;
    let d = served::dirs();
    let bucket = format!("file://{}", d.base.join("buckets").display());
    let (mut server, addr, _) = serve_with_metrics("serve", served::command(&d));
    let c = served::client(addr).await;
    let mut ids = Vec::new();
    for i in 0..STORES {
        let dir = d.root.join(format!("s{i}"));
        support::store::write(&dir, 5, 0, 0);
        let req = support::register_req(&dir, &format!("{bucket}/s{i}"));
        ids.push(served::register(&c, req).await);
    }
    for id in &ids {
        served::wait_health(&c, id, "healthy", |h| h.healthy).await;
    }
    drop(c);
    served::terminate(&mut server);

    // The default health report interval (3 s): before the fix, the first report after the
    // start recorded every store "starting" (unhealthy) until the next one.
    let (_server, addr, metrics_addr) = serve_with_metrics("serve again", served::command(&d));
    let deadline = std::time::Instant::now() + served::DEADLINE;
    let mut scrapes = 0;
    loop {
        let (healthy, unhealthy) = healthy_gauges(metrics_addr).await;
        scrapes += 1;
        let shown_unhealthy: Vec<_> = healthy.iter().filter(|(_, v)| **v != 1.0).collect();
        assert!(
            shown_unhealthy.is_empty() && unhealthy.unwrap_or(0.0) == 0.0,
            "scrape {scrapes} after the restart shows stores unhealthy: {shown_unhealthy:?}, \
             mushroom_backup_stores_unhealthy {unhealthy:?}"
        );
        if ids.iter().all(|id| healthy.get(id) == Some(&1.0)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "every store healthy on /metrics ({healthy:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = served::client(addr).await;
    for id in &ids {
        let h = served::health(&c, id, false).await.expect("Health");
        assert!(h.healthy, "{h:?}");
    }
    assert!(
        scrapes > 1,
        "every store showed at the first scrape: the start was not seen"
    );
}

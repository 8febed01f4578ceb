//! What an operator sees of the real `serve` binary: its traces at an OTLP receiver (continuing
//! the caller's `traceparent`, worker spans carrying `store_id`), its Prometheus `/metrics`, and
//! two instances sharing one PostgreSQL registry, where calls through either reach the
//! owner and the survivor reports a silent owner.
//!
//! Every wait has a deadline and says what it waited for and what it saw last; every child is
//! killed when its guard drops (and prints its output when the test fails).
//!
//! The PostgreSQL test needs `MUSHROOM_TEST_POSTGRES_URL` (`scripts/test.sh` starts a server);
//! without it, it prints a SKIP line and passes, except under `CI=true`, where it fails.

mod support;

#[path = "support/otlp.rs"]
mod otlp;
#[path = "support/prometheus.rs"]
mod prometheus;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary::{self, Running, write_store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

/// Generous: the machine running the tests may be busy.
const DEADLINE: Duration = Duration::from_secs(90);

// ---- the serve binary -------------------------------------------------------------------

/// The directories of one test.
struct Dirs {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    /// The allowed root (canonical).
    root: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    let root = base.join("stores");
    std::fs::create_dir_all(&root).unwrap();
    Dirs {
        _tmp: tmp,
        base,
        root,
    }
}

/// `serve` on 127.0.0.1:0 with its own data dir under `d`, the allowed root of `d`, and
/// `extra` arguments.
fn serve_command(d: &Dirs, data: &str, extra: &[&str]) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(d.base.join(data))
        .arg("--allow-root")
        .arg(&d.root)
        .args(extra)
        .env_remove("MUSHROOMDB_BACKUP_ADMIN_TOKEN")
        .env_remove("MUSHROOMDB_BACKUP_CONFIG")
        .env_remove("MUSHROOMDB_BACKUP_REGISTRY")
        .env_remove("MUSHROOMDB_BACKUP_METRICS_LISTEN")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED");
    cmd
}

/// A running `serve`: its gRPC address and, when it serves metrics, theirs.
struct Server {
    child: Running,
    addr: String,
    metrics: Option<SocketAddr>,
}

impl Server {
    /// Spawns `cmd` and waits for its listening line (and, with `metrics`, for the log line
    /// naming the metrics address).
    fn start(name: &str, cmd: Command, metrics: bool) -> Server {
        let mut child = Running::spawn(name, cmd);
        let mut addr: Option<String> = None;
        let mut metrics_addr: Option<SocketAddr> = None;
        let what = if metrics {
            "print its listening line and log its metrics address"
        } else {
            "print its listening line"
        };
        tokio::task::block_in_place(|| {
            child.wait_for(what, DEADLINE, |line| {
                addr = addr.take().or_else(|| line.listening());
                metrics_addr = metrics_addr.or_else(|| line.metrics_addr());
                (addr.is_some() && (!metrics || metrics_addr.is_some())).then_some(())
            })
        });
        Server {
            child,
            addr: addr.expect("the listening address"),
            metrics: metrics_addr,
        }
    }

    async fn client(&self) -> BackupControlClient<Channel> {
        BackupControlClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap_or_else(|e| self.child.fail(&format!("cannot be connected to: {e}")))
    }

    /// SIGTERM, then a clean exit within the deadline.
    fn terminate(&mut self) {
        self.child.signal(libc::SIGTERM);
        let status = tokio::task::block_in_place(|| self.child.wait_exit(DEADLINE));
        if !status.success() {
            self.child
                .fail(&format!("exited with {status} after SIGTERM, not 0"));
        }
    }
}

/// The health of one store as `c`'s instance reports it.
async fn health(
    c: &mut BackupControlClient<Channel>,
    id: &str,
) -> Result<proto::StoreHealth, String> {
    let r = c
        .health(proto::HealthRequest {
            store_id: id.into(),
            fresh: false,
        })
        .await
        .map_err(|e| format!("Health failed: {e}"))?
        .into_inner();
    r.stores
        .into_iter()
        .find(|s| s.store_id == id)
        .ok_or_else(|| format!("Health names no store {id}"))
}

// ---- 1. traces --------------------------------------------------------------------------

fn hex_id(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Worker spans that carry `store_id` (others, like `backup.segment`, inherit it from their
/// `backup.step` parent in the trace but not as an attribute).
const WORKER_SPANS: [&str; 7] = [
    "backup.step",
    "lease.acquire",
    "backup.segment",
    "backup.generation",
    "backup.restore_point",
    "backup.retention",
    "lease.renew",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn traces_continue_the_callers_traceparent_and_worker_spans_carry_the_store_id() {
    let (otlp_addr, received) = otlp::start().await;
    let d = dirs();
    let store = d.root.join("traced");
    write_store(&store, 200);

    let mut cmd = serve_command(&d, "data", &[]);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp_addr}"))
        .env("OTEL_SERVICE_NAME", "mushroom-ops-test")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env("MUSHROOMDB_BACKUP_WAL_INTERVAL_MS", "100");
    let server = Server::start("serve (traces)", cmd, false);
    let mut c = server.client().await;

    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT_ID: &str = "00f067aa0ba902b7";
    let mut req = tonic::Request::new(support::register_req(
        &store,
        &support::file_url(&d.base.join("bucket")),
    ));
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{PARENT_ID}-01").parse().unwrap(),
    );
    let id = c
        .register(req)
        .await
        .unwrap_or_else(|e| server.child.fail(&format!("Register failed: {e}")))
        .into_inner()
        .store_id;

    let is_register = |s: &otlp::ReceivedSpan| s.span.name.ends_with("/Register");
    let worker_kinds = |spans: &[otlp::ReceivedSpan]| {
        spans
            .iter()
            .filter(|s| {
                WORKER_SPANS.contains(&s.span.name.as_str())
                    && s.attr("store_id").as_deref() == Some(id.as_str())
            })
            .map(|s| s.span.name.clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let spans = received
        .wait_for(DEADLINE, |spans| {
            spans.iter().any(|s| {
                is_register(s)
                    && hex_id(&s.span.trace_id) == TRACE_ID
                    && hex_id(&s.span.parent_span_id) == PARENT_ID
            }) && worker_kinds(spans).len() >= 2
        })
        .await;
    let names: BTreeMap<String, usize> = spans.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.span.name.clone()).or_default() += 1;
        m
    });

    let register: Vec<_> = spans.iter().filter(|s| is_register(s)).collect();
    let joined = register.iter().find(|s| {
        hex_id(&s.span.trace_id) == TRACE_ID && hex_id(&s.span.parent_span_id) == PARENT_ID
    });
    let Some(joined) = joined else {
        server.child.fail(&format!(
            "within {DEADLINE:?}, no Register span in trace {TRACE_ID} with parent {PARENT_ID}; \
             Register spans (trace, parent): {:?}; every span name received (count): {names:?}",
            register
                .iter()
                .map(|s| (hex_id(&s.span.trace_id), hex_id(&s.span.parent_span_id)))
                .collect::<Vec<_>>()
        ))
    };
    assert_eq!(
        joined.resource_attr("service.name").as_deref(),
        Some("mushroom-ops-test"),
        "the Register span's resource: {:?}",
        joined.resource
    );
    let kinds = worker_kinds(&spans);
    if kinds.len() < 2 {
        server.child.fail(&format!(
            "within {DEADLINE:?}, worker spans with store_id={id} of only {kinds:?} (want two of \
             {WORKER_SPANS:?}); every span name received (count): {names:?}; store_id of \
             worker spans: {:?}",
            spans
                .iter()
                .filter(|s| WORKER_SPANS.contains(&s.span.name.as_str()))
                .map(|s| (s.span.name.clone(), s.attr("store_id")))
                .collect::<std::collections::BTreeSet<_>>()
        ));
    }
    for s in spans.iter().filter(|s| {
        WORKER_SPANS.contains(&s.span.name.as_str())
            && s.attr("store_id").as_deref() == Some(id.as_str())
    }) {
        assert_eq!(
            s.resource_attr("service.name").as_deref(),
            Some("mushroom-ops-test"),
            "resource of {}: {:?}",
            s.span.name,
            s.resource
        );
    }
    eprintln!("received spans (count): {names:?}; worker kinds with store_id: {kinds:?}");
}

// ---- 2. metrics -------------------------------------------------------------------------

/// One HTTP/1.1 GET: the status code and the body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(format!(
            "a chunked response this test does not decode: {head}"
        ));
    }
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_show_the_registered_stores_lag_shipped_bytes_and_health() {
    let d = dirs();
    let store = d.root.join("metered");
    write_store(&store, 100);
    let cmd = serve_command(&d, "data", &["--metrics-listen", "127.0.0.1:0"]);
    let server = Server::start("serve (metrics)", cmd, true);
    let metrics = server.metrics.expect("a metrics address");
    let mut c = server.client().await;
    let id = c
        .register(support::register_req(
            &store,
            &support::file_url(&d.base.join("bucket")),
        ))
        .await
        .unwrap_or_else(|e| server.child.fail(&format!("Register failed: {e}")))
        .into_inner()
        .store_id;

    let (lag, shipped) = support::wait_for(
        DEADLINE,
        &format!("/metrics on {metrics} to show store {id} healthy with bytes shipped"),
        || async {
            let (status, text) = get(metrics, "/metrics").await?;
            if status != 200 {
                return Err(format!("HTTP {status}: {text}"));
            }
            let families = prometheus::parse_prometheus(&text)
                .unwrap_or_else(|e| panic!("/metrics is not Prometheus text ({e}):\n{text}"));
            let find = |name: &str| {
                prometheus::samples(&families)
                    .find(|s| {
                        s.name == name
                            && s.labels.get("store_id").map(String::as_str) == Some(id.as_str())
                    })
                    .map(|s| s.value)
            };
            let ours: Vec<String> = text
                .lines()
                .filter(|l| l.contains(&format!("store_id=\"{id}\"")))
                .map(str::to_string)
                .collect();
            match (
                find("mushroom_backup_store_lag_seconds"),
                find("mushroom_backup_store_shipped_bytes_total"),
                find("mushroom_backup_store_healthy"),
            ) {
                (Some(lag), Some(shipped), Some(healthy)) if shipped > 0.0 && healthy == 1.0 => {
                    Ok((lag, shipped))
                }
                other => Err(format!(
                    "(lag, shipped bytes, healthy) = {other:?}; the store's samples: {ours:#?}"
                )),
            }
        },
    )
    .await;
    assert!(lag.is_finite() && lag >= 0.0, "lag {lag}");
    eprintln!("store {id}: lag {lag} s, {shipped} bytes shipped");

    // The paused gauge follows Pause and Resume.
    let paused_is = |want: f64| {
        let id = id.clone();
        async move {
            support::wait_for(
                DEADLINE,
                &format!("/metrics on {metrics} to show store {id} paused = {want}"),
                || async {
                    let (_, text) = get(metrics, "/metrics").await?;
                    let families = prometheus::parse_prometheus(&text)
                        .unwrap_or_else(|e| panic!("/metrics is not Prometheus text ({e})"));
                    let found = prometheus::samples(&families)
                        .find(|s| {
                            s.name == "mushroom_backup_store_paused"
                                && s.labels.get("store_id") == Some(&id)
                        })
                        .map(|s| s.value);
                    if found == Some(want) {
                        Ok(())
                    } else {
                        Err(format!("{found:?}"))
                    }
                },
            )
            .await
        }
    };
    paused_is(0.0).await;
    c.pause(proto::PauseRequest {
        store_id: id.clone(),
        reason: "metered pause".into(),
        until_unix_ms: 0,
    })
    .await
    .unwrap_or_else(|e| server.child.fail(&format!("Pause failed: {e}")));
    paused_is(1.0).await;
    c.resume(proto::ResumeRequest {
        store_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| server.child.fail(&format!("Resume failed: {e}")));
    paused_is(0.0).await;
}

// ---- 3. two instances, one PostgreSQL registry ------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_instance_lists_the_first_ones_store_and_reports_it_silent_once_it_stops() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "operations_test").await;
    let registry = db.url.clone();
    let d = dirs();
    let store = d.root.join("shared");
    write_store(&store, 50);

    let common = [
        "--registry",
        registry.as_str(),
        "--health-report-interval-ms",
        "300",
        "--owner-silent-after-ms",
        "2000",
    ];
    let mut a = Server::start(
        "serve a",
        serve_command(
            &d,
            "data-a",
            &[&common[..], &["--instance-id", "a"]].concat(),
        ),
        false,
    );
    let b = Server::start(
        "serve b",
        serve_command(
            &d,
            "data-b",
            &[&common[..], &["--instance-id", "b"]].concat(),
        ),
        false,
    );
    let mut ca = a.client().await;
    let cb = b.client().await;
    let id = ca
        .register(support::register_req(
            &store,
            &support::file_url(&d.base.join("bucket")),
        ))
        .await
        .unwrap_or_else(|e| a.child.fail(&format!("Register on a failed: {e}")))
        .into_inner()
        .store_id;

    support::wait_for(
        DEADLINE,
        &format!("b's ListStores to list {id} owned by a"),
        || {
            let mut cb = cb.clone();
            let id = id.clone();
            async move {
                let stores = cb
                    .list_stores(proto::ListStoresRequest {})
                    .await
                    .map_err(|e| format!("ListStores failed: {e}"))?
                    .into_inner()
                    .stores;
                match stores.iter().find(|s| s.store_id == id) {
                    Some(s) if s.instance_id == "a" => Ok(()),
                    _ => Err(format!("{stores:?}")),
                }
            }
        },
    )
    .await;

    let healthy = support::wait_for(
        DEADLINE,
        &format!("b's Health to show {id} healthy"),
        || {
            let mut cb = cb.clone();
            let id = id.clone();
            async move {
                let h = health(&mut cb, &id).await?;
                if h.healthy {
                    Ok(h)
                } else {
                    Err(format!("{h:?}"))
                }
            }
        },
    )
    .await;
    assert_eq!(healthy.instance_id, "a", "{healthy:?}");

    // Pause and Resume through b are forwarded to a, the owner, and answered as a answers.
    let paused = cb
        .clone()
        .pause(proto::PauseRequest {
            store_id: id.clone(),
            reason: "from b".into(),
            until_unix_ms: 0,
        })
        .await
        .unwrap_or_else(|e| b.child.fail(&format!("Pause through b failed: {e}")))
        .into_inner();
    assert_eq!(paused.reason, "from b", "{paused:?}");
    assert!(!paused.was_paused, "{paused:?}");
    // Fresh health through b asks a: paused at once.
    let fresh = cb
        .clone()
        .health(proto::HealthRequest {
            store_id: id.clone(),
            fresh: true,
        })
        .await
        .unwrap_or_else(|e| b.child.fail(&format!("fresh Health through b failed: {e}")))
        .into_inner()
        .stores;
    assert!(
        fresh.len() == 1 && fresh[0].paused && fresh[0].paused_reason == "from b",
        "{fresh:?}"
    );
    // The pause is in a's health reports: b's registry view shows it too.
    support::wait_for(
        DEADLINE,
        &format!("b's Health to show {id} paused through b"),
        || {
            let mut cb = cb.clone();
            let id = id.clone();
            async move {
                let h = health(&mut cb, &id).await?;
                if h.paused && h.paused_reason == "from b" && h.healthy {
                    Ok(h)
                } else {
                    Err(format!("{h:?}"))
                }
            }
        },
    )
    .await;
    let resumed = cb
        .clone()
        .resume(proto::ResumeRequest {
            store_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| b.child.fail(&format!("Resume through b failed: {e}")))
        .into_inner();
    assert!(resumed.was_paused, "{resumed:?}");
    // A's own view agrees: the store runs there, unpaused.
    let on_a = health(&mut ca, &id).await.unwrap();
    assert!(!on_a.paused && on_a.instance_id == "a", "{on_a:?}");

    let stopped = Instant::now();
    a.terminate();

    let silent = support::wait_for(
        DEADLINE,
        &format!("b's Health to show {id} unhealthy, its owner a silent"),
        || {
            let mut cb = cb.clone();
            let id = id.clone();
            async move {
                let h = health(&mut cb, &id).await?;
                if !h.healthy && h.reason.contains("instance a ") {
                    Ok(h)
                } else {
                    Err(format!("{h:?}"))
                }
            }
        },
    )
    .await;
    eprintln!(
        "{:?} after SIGTERM to a, b reports: {}",
        stopped.elapsed(),
        silent.reason
    );
    assert_eq!(silent.instance_id, "a", "{silent:?}");
    // A call for a's store through b now finds nobody: UNAVAILABLE naming a.
    let gone = cb
        .clone()
        .trigger(proto::TriggerRequest {
            store_id: id.clone(),
            kind: proto::TriggerKind::Ship as i32,
        })
        .await
        .expect_err("Trigger through b of a stopped a's store");
    assert_eq!(gone.code(), tonic::Code::Unavailable, "{gone:?}");
    assert!(gone.message().contains("instance a "), "{gone:?}");

    drop(ca);
    drop(cb);
    drop(b);
    db.drop_database().await;
}

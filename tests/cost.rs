//! Cost accounting through the real `serve` binary on a moto S3 of the test's own, whose
//! request log counts every request at the server: a store's `usage` (Health, ListStores,
//! `ctl cost`, `/metrics`) agrees with what moto logged for the store's prefix, class by class
//! (its lease and retention included); the TOML's `[prices]` table is what the estimate is
//! priced at; a request budget below the projection is a health note on a healthy store; a
//! price table with a negative price or an unknown key is refused at start, naming it; a budget
//! overrun is one event, and a store back within its budget is published again when it goes
//! over again, its health note gone and back.
//!
//! The counts are compared without a timed assertion: moto logs a request once it answered it,
//! the service counts it when it starts, so the usage read between two reads of moto's log lies
//! between their counts (the second read is taken once moto has caught up, with a generous
//! deadline).

mod support;

#[path = "../benches/support/moto.rs"]
#[allow(dead_code)]
mod moto;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use mushroom_backup::bucket::usage::UsageSnapshot;
use mushroom_backup::cost::{self, Prices};
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary::{self, Running};
use support::served::{self, DEADLINE, Dirs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

type Client = BackupControlClient<Channel>;

/// The request classes, as `Usage` names them.
const CLASSES: [&str; 5] = ["put", "get", "list", "head", "delete"];

/// Requests moto logged for `prefix` of `bucket`, by class. A LIST is attributed by its
/// `prefix` parameter; the instance lease (`.mushroom-backup/`) is no store's.
fn moto_counts(m: &moto::Moto, bucket: &str, prefix: &str) -> BTreeMap<&'static str, u64> {
    let mut counts: BTreeMap<&'static str, u64> = CLASSES.iter().map(|c| (*c, 0)).collect();
    let objects = format!("/{bucket}/{prefix}/");
    for line in m.request_lines() {
        let Some(request) = line.split('"').nth(1) else {
            continue;
        };
        let mut parts = request.split(' ');
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            continue;
        };
        let target = decode(target);
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let listed = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("prefix="))
            .map(str::to_string);
        let class =
            if method == "GET" && (path == format!("/{bucket}") || path == format!("/{bucket}/")) {
                match listed {
                    Some(p) if p.starts_with(&format!("{prefix}/")) => "list",
                    _ => continue,
                }
            } else if path.starts_with(&objects) {
                match method {
                    "PUT" | "POST" => "put",
                    "GET" => "get",
                    "HEAD" => "head",
                    "DELETE" => "delete",
                    _ => continue,
                }
            } else {
                continue;
            };
        *counts.get_mut(class).unwrap() += 1;
    }
    counts
}

/// `s` with its %XX escapes decoded.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn usage_counts(u: &proto::Usage) -> BTreeMap<&'static str, u64> {
    BTreeMap::from([
        ("put", u.put_requests),
        ("get", u.get_requests),
        ("list", u.list_requests),
        ("head", u.head_requests),
        ("delete", u.delete_requests),
    ])
}

fn snapshot(u: &proto::Usage) -> UsageSnapshot {
    UsageSnapshot {
        put: u.put_requests,
        get: u.get_requests,
        list: u.list_requests,
        head: u.head_requests,
        delete: u.delete_requests,
        bytes_uploaded: u.bytes_uploaded,
        bytes_downloaded: u.bytes_downloaded,
        bytes_stored: u.bytes_stored,
        objects_stored: u.objects_stored,
        since_unix_ms: u.since_unix_ms,
        window_ms: u.window_ms,
    }
}

/// `serve` against `endpoint` with fast intervals (retention every 200 ms, keeping only the
/// newest generation and nothing for its age, so it deletes), `/metrics`, and `config`.
fn serve(d: &Dirs, endpoint: &str, config: &Path) -> Command {
    let mut cmd = served::command(d);
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args(["--config"])
        .arg(config)
        .args([
            "--wal-interval-ms",
            "50",
            "--restore-point-interval-ms",
            "100",
            "--retention-interval-ms",
            "200",
            "--keep-for-ms",
            "1",
            "--keep-generations",
            "1",
            "--orphan-grace-ms",
            "1",
            "--metrics-listen",
            "127.0.0.1:0",
        ]);
    cmd
}

/// Starts `cmd`: the child, its gRPC address and its metrics address.
fn start(cmd: Command) -> (Running, SocketAddr, SocketAddr) {
    let mut child = Running::spawn("serve", cmd);
    let (mut addr, mut metrics) = (None, None);
    child.wait_for("listen and serve metrics", DEADLINE, |line| {
        addr = addr.or_else(|| line.listening()?.parse().ok());
        metrics = metrics.or_else(|| line.metrics_addr());
        addr.zip(metrics)
    });
    (child, addr.unwrap(), metrics.unwrap())
}

async fn health(c: &Client, id: &str) -> Result<proto::StoreHealth, String> {
    served::health(c, id, false).await
}

async fn metrics_text(addr: SocketAddr) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// The value of the `/metrics` sample `name{store_id="id"[,op="op"]}`.
fn sample(text: &str, name: &str, id: &str, op: Option<&str>) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| l.contains(&format!("store_id=\"{id}\"")))
        .find(|l| op.is_none_or(|op| l.contains(&format!("op=\"{op}\""))))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Prices unlike any provider's, so an estimate priced at the defaults cannot pass for one
/// priced at these.
const PRICES: &str = "[prices]\nstorage_gb_month = 1000.0\nput_per_1000 = 2.0\nlist_per_1000 = 3.0\n\
                      get_per_1000 = 5.0\nhead_per_1000 = 7.0\ndelete_per_1000 = 11.0\n";

fn prices() -> Prices {
    Prices {
        storage_gb_month: 1000.0,
        put_per_1000: 2.0,
        list_per_1000: 3.0,
        get_per_1000: 5.0,
        head_per_1000: 7.0,
        delete_per_1000: 11.0,
        egress_per_gb: 0.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_agrees_with_the_requests_moto_logged_and_is_priced_at_the_config() {
    if support::s3::endpoint().is_none() {
        return;
    }
    let d = served::dirs();
    let m = moto::Moto::start(&d.base.join("moto.log")).expect("start moto");
    let bucket = support::s3::create_bucket(&m.url, "cost").await;
    let config = d.base.join("serve.toml");
    std::fs::write(&config, PRICES).unwrap();
    let (dir, other) = (d.root.join("costed"), d.root.join("budgeted"));
    support::store::write(&dir, 40, 10, 2000);
    support::store::write(&other, 5, 0, 0);
    let (mut server, addr, metrics) = start(serve(&d, &m.url, &config));
    let c: Client = BackupControlClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let mut req = support::register_req(&dir, &format!("s3://{bucket}/costed"));
    req.options = Some(proto::StoreOptions {
        monthly_request_budget: u64::MAX,
        ..Default::default()
    });
    let id = served::register(&c, req).await;
    let mut req = support::register_req(&other, &format!("s3://{bucket}/budgeted"));
    req.options = Some(proto::StoreOptions {
        monthly_request_budget: 1,
        ..Default::default()
    });
    let over = served::register(&c, req).await;

    // Shipped and in a restore point; then a snapshot starts a new generation, and
    // retention (keeping one generation) deletes the first one's objects: every class but
    // HEAD has run (HEAD may or may not).
    support::wait_for(DEADLINE, "the store shipped", || async {
        let h = health(&c, &id).await?;
        if h.healthy && h.restore_point_commit_seq == 40 {
            Ok(())
        } else {
            Err(format!("{h:?}"))
        }
    })
    .await;
    {
        let mut engine = support::store::open_engine(&dir);
        engine.snapshot().expect("snapshot");
        support::store::commit_synced(&mut engine, 5);
    }
    let h = support::wait_for(
        DEADLINE,
        "a new generation, and retention's deletes",
        || async {
            let h = health(&c, &id).await?;
            let u = h.usage.ok_or("no usage")?;
            if h.healthy && h.restore_point_commit_seq == 45 && u.delete_requests > 0 {
                Ok(h)
            } else {
                Err(format!("{h:?}"))
            }
        },
    )
    .await;
    assert!(
        h.notes.iter().all(|n| !n.contains("request budget")),
        "{h:?}"
    );

    // The sandwich: moto before ≤ usage ≤ moto after, class by class.
    let before = moto_counts(&m, &bucket, "costed");
    let u = health(&c, &id).await.unwrap().usage.unwrap();
    let counted = usage_counts(&u);
    let after = support::wait_for(DEADLINE, "moto to log what the service counted", || async {
        let now = moto_counts(&m, &bucket, "costed");
        if CLASSES.iter().all(|k| now[k] >= counted[k]) {
            Ok(now)
        } else {
            Err(format!("moto {now:?}, service {counted:?}"))
        }
    })
    .await;
    eprintln!("moto before {before:?}\nservice     {counted:?}\nmoto after  {after:?}");
    for k in CLASSES {
        assert!(
            before[k] <= counted[k] && counted[k] <= after[k],
            "{k}: moto logged {} then {}, the service counted {}",
            before[k],
            after[k],
            counted[k]
        );
    }
    assert!(counted["put"] > 0 && counted["list"] > 0 && counted["delete"] > 0);
    assert!(u.bytes_uploaded > 0 && u.bytes_stored > 0, "{u:?}");

    // Priced at the config's table, not the default one.
    let s = snapshot(&u);
    let want = cost::estimate(&s, &prices());
    assert!(
        (u.estimated_monthly_cost_usd - want.monthly_usd).abs() <= 1e-6 * want.monthly_usd,
        "{u:?} vs {want:?}"
    );
    let default = cost::estimate(&s, &Prices::default());
    assert!(
        u.estimated_monthly_cost_usd > 100.0 * default.monthly_usd,
        "{u:?}"
    );
    assert_eq!(u.projected_monthly_requests, want.monthly_requests);

    // What is stored: what S3 holds under the prefix, once the store is quiet.
    let s3 = support::s3::client(&m.url);
    support::wait_for(DEADLINE, "bytes_stored to be what S3 holds", || async {
        let listed = s3
            .list_objects_v2()
            .bucket(&bucket)
            .prefix("costed/")
            .send()
            .await
            .map_err(|e| format!("{e:?}"))?;
        let held: i64 = listed.contents().iter().filter_map(|o| o.size()).sum();
        let u = health(&c, &id).await?.usage.ok_or("no usage")?;
        if u.bytes_stored == u64::try_from(held).unwrap() {
            Ok(())
        } else {
            Err(format!(
                "S3 holds {held} bytes in {} objects, usage says {} in {}",
                listed.contents().len(),
                u.bytes_stored,
                u.objects_stored
            ))
        }
    })
    .await;

    // The store with a budget of 1 request a month: a note, still healthy.
    let h = support::wait_for(DEADLINE, "the over-budget store healthy", || async {
        let h = health(&c, &over).await?;
        if h.healthy {
            Ok(h)
        } else {
            Err(format!("{h:?}"))
        }
    })
    .await;
    let u = h.usage.unwrap();
    assert!(u.over_budget && u.monthly_request_budget == 1, "{u:?}");
    assert!(
        h.notes
            .iter()
            .any(|n| n.contains("request budget") && n.contains("budget of 1")),
        "{h:?}"
    );

    // ListStores carries the same usage; `ctl cost` prints it.
    let listed = c
        .clone()
        .list_stores(proto::ListStoresRequest {})
        .await
        .unwrap()
        .into_inner();
    let info = listed.stores.iter().find(|s| s.store_id == id).unwrap();
    assert!(info.usage.as_ref().unwrap().put_requests >= counted["put"]);
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args([
        "ctl",
        "--server",
        &format!("http://{addr}"),
        "--json",
        "cost",
        "--store",
        &id,
    ]);
    let out = binary::json(&binary::run_ok("ctl cost", cmd, DEADLINE));
    let usage = &out["stores"][0]["usage"];
    assert!(
        usage["requests"]["put"].as_u64().unwrap() >= counted["put"],
        "{out}"
    );
    assert!(
        usage["estimated_monthly_cost_usd"].as_f64().unwrap() > 0.0,
        "{out}"
    );
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["ctl", "--server", &format!("http://{addr}"), "cost"]);
    let table = binary::run_ok("ctl cost", cmd, DEADLINE);
    assert!(
        table.contains("USD/MONTH") && table.contains(&id) && table.contains(&over),
        "{table}"
    );
    assert!(table.contains("over budget (1 a month)"), "{table}");

    // /metrics: the per-class counters at least what the service had counted.
    support::wait_for(
        DEADLINE,
        "/metrics to show the store's requests",
        || async {
            let text = metrics_text(metrics).await?;
            for k in CLASSES {
                let v = sample(&text, "mushroom_backup_store_requests_total", &id, Some(k))
                    .ok_or(format!("no {k} sample"))?;
                if v < counted[k] as f64 {
                    return Err(format!("{k}: {v} < {}", counted[k]));
                }
            }
            sample(&text, "mushroom_backup_store_stored_bytes", &id, None)
                .ok_or("no stored bytes")?;
            sample(
                &text,
                "mushroom_backup_store_uploaded_bytes_total",
                &id,
                None,
            )
            .ok_or("no uploaded bytes")?;
            Ok(())
        },
    )
    .await;
    server.signal(libc::SIGTERM);
    server.wait_exit(DEADLINE);
}

#[test]
fn a_bad_price_table_is_refused_at_start_naming_it() {
    for (toml, named) in [
        (
            "[prices]\nput_per_1000 = -0.5\n",
            "prices.put_per_1000 = -0.5",
        ),
        ("[prices]\nputs_per_1000 = 1.0\n", "puts_per_1000"),
        ("[prices]\nget_per_1000 = \"cheap\"\n", "get_per_1000"),
    ] {
        let d = served::dirs();
        let config = d.base.join("serve.toml");
        std::fs::write(&config, toml).unwrap();
        let mut cmd = served::command(&d);
        cmd.arg("--config").arg(&config);
        let err = served::refused("serve", cmd);
        assert!(err.contains(named), "{toml:?}: {err}");
    }
}

/// Registers a store under `name` with a request budget of 1 a month (any request projects
/// over it) on a directory bucket.
async fn register_over_budget(c: &Client, d: &Dirs, name: &str) -> String {
    let dir = d.root.join(name);
    support::store::write(&dir, 5, 0, 0);
    let req = support::register_req(&dir, &support::file_url(&d.base.join(name)));
    let options = proto::StoreOptions {
        monthly_request_budget: 1,
        ..Default::default()
    };
    support::served::register_with(c, req, options).await
}

/// A fast `serve` on `d` that reports health every 100 ms, a client, and every event it
/// publishes from now on.
async fn serve_watching(d: &Dirs) -> (Running, Client, tonic::Streaming<proto::BackupEvent>) {
    let (server, addr) = served::start(
        "serve",
        served::fast_serve(d, &["--health-report-interval-ms", "100"]),
    );
    let c = served::client(addr).await;
    let events = c
        .clone()
        .watch_events(proto::WatchEventsRequest {
            store_id: String::new(),
            after: None,
        })
        .await
        .expect("WatchEvents")
        .into_inner();
    (server, c, events)
}

/// Reads `events` until the budget-overrun event of `store_id`: every event read, that one last.
async fn until_over(
    events: &mut tonic::Streaming<proto::BackupEvent>,
    store_id: &str,
) -> Vec<proto::BackupEvent> {
    served::until_event(events, &format!("{store_id}'s budget_exceeded"), |e| {
        e.kind == proto::EventKind::BudgetExceeded as i32 && e.store_id == store_id
    })
    .await
}

/// WatchEvents hears `budget_exceeded` for a store whose projection goes over its budget, with
/// the projection as `count` and the budget in the detail — and once, not at every health
/// tick while it stays over. Each store here is registered only after the one before was
/// published, so the next one's event comes from a later tick than the last one's, a tick at
/// which the earlier stores were (still) over budget: a republish would be among the events
/// read before the last store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_budget_overrun_is_one_event_on_watch_events() {
    let d = served::dirs();
    let (mut server, c, mut events) = serve_watching(&d).await;
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    for name in ["first", "second", "third"] {
        let id = register_over_budget(&c, &d, name).await;
        seen.extend(until_over(&mut events, &id).await);
        ids.push(id);
    }
    let over: Vec<&proto::BackupEvent> = seen
        .iter()
        .filter(|e| e.kind == proto::EventKind::BudgetExceeded as i32)
        .collect();
    let of = |id: &str| over.iter().filter(|e| e.store_id == id).count();
    assert_eq!(
        ids.iter().map(|id| of(id)).collect::<Vec<_>>(),
        [1, 1, 1],
        "{over:?}"
    );
    for e in &over {
        assert_eq!(e.kind_name, "budget_exceeded", "{e:?}");
        assert!(e.count > 1, "the projection is over the budget of 1: {e:?}");
        assert!(
            e.detail
                .contains(&format!("projected {} requests a month", e.count))
                && e.detail.contains("over the budget of 1"),
            "{e:?}"
        );
    }
    // Health says the same of the store, as a note on a healthy store.
    let h = served::wait_health(&c, &ids[0], "healthy, over budget", |h| {
        h.healthy && h.usage.as_ref().is_some_and(|u| u.over_budget)
    })
    .await;
    assert!(h.notes.iter().any(|n| n.contains("budget of 1")), "{h:?}");
    server.signal(libc::SIGTERM);
    server.wait_exit(DEADLINE);
}

/// A budget of 200 requests in a minute, projected to the month (200 × 43,800).
const RECOVERY_BUDGET: u64 = 200 * 43_800;

/// Commits to `dir` one at a time until `id`'s Health says its projection is over its budget.
async fn commit_until_over(c: &Client, dir: &Path, id: &str) -> proto::StoreHealth {
    let mut engine = support::store::open_engine(dir);
    let start = std::time::Instant::now();
    loop {
        let h = health(c, id).await.expect("Health");
        if h.usage.as_ref().is_some_and(|u| u.over_budget) {
            return h;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "committed for {DEADLINE:?} and the store is not over budget: {h:?}"
        );
        support::store::commit_synced(&mut engine, 1);
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
}

/// The recovery path of a budget overrun: a store over its budget (an event, a note), back
/// within it (its projection falls as the window grows while it is idle: the note goes), then
/// over again (a second event, the note back), all read through WatchEvents.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_back_within_its_budget_is_published_again_when_over() {
    let d = served::dirs();
    let (mut server, c, mut events) = serve_watching(&d).await;
    let dir = d.root.join("recovering");
    support::store::write(&dir, 5, 0, 0);
    let mut req = support::register_req(&dir, &support::file_url(&d.base.join("recovering")));
    req.options = Some(proto::StoreOptions {
        monthly_request_budget: RECOVERY_BUDGET,
        ..Default::default()
    });
    let id = served::register(&c, req).await;
    let noted = |h: &proto::StoreHealth| h.notes.iter().any(|n| n.contains("request budget"));
    let of_store = |seen: &[proto::BackupEvent]| {
        seen.iter()
            .filter(|e| e.kind == proto::EventKind::BudgetExceeded as i32 && e.store_id == id)
            .count()
    };

    let h = commit_until_over(&c, &dir, &id).await;
    assert!(h.healthy && noted(&h), "{h:?}");
    let first = until_over(&mut events, &id).await;
    assert_eq!(of_store(&first), 1, "{first:?}");

    // Idle: only lease renewals, so the projection falls under the budget as the window grows
    // past the burst (with a margin, so a renewal at the crossing does not tip it back).
    let h = support::wait_for(
        std::time::Duration::from_secs(300),
        "the projection back within the budget",
        || async {
            let h = health(&c, &id).await?;
            let u = h.usage.ok_or("no usage")?;
            if !u.over_budget && u.projected_monthly_requests < RECOVERY_BUDGET / 10 * 9 {
                Ok(h)
            } else {
                Err(format!("{u:?}"))
            }
        },
    )
    .await;
    assert!(h.healthy && !noted(&h), "the note is gone: {h:?}");

    let h = commit_until_over(&c, &dir, &id).await;
    assert!(h.healthy && noted(&h), "the note is back: {h:?}");
    let second = until_over(&mut events, &id).await;
    assert!(of_store(&second) >= 1, "{second:?}");
    let e = second.last().unwrap();
    assert!(
        e.count > RECOVERY_BUDGET && e.detail.contains(&format!("budget of {RECOVERY_BUDGET}")),
        "{e:?}"
    );
    server.signal(libc::SIGTERM);
    server.wait_exit(DEADLINE);
}

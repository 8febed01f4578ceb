//! Events through the real `serve` binary: `WatchEvents` over gRPC hears a store registered,
//! its restore points, a pause and a resume; `ctl watch-events --json` prints them; webhooks —
//! real HTTP servers in this test, on std's `TcpListener` — receive each as a CloudEvents 1.0
//! document naming the store, a `kinds` filter keeps only its kinds, and a receiver that
//! refuses connections for a while gets every event, in order, once it is back; with a
//! secret, every POST is signed as Standard Webhooks have it (checked here by an HMAC of the
//! test's own). Bad webhook flags are refused at start, never echoing a URL's query. No timed assertion: every wait is for a condition, with a
//! generous deadline.

#[path = "support/otlp.rs"]
mod otlp;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary;
use support::served::{self, DEADLINE, Dirs, client, fast_serve as serve};
use support::webhooks::{Posted, Receiver, kinds_of};
use tonic::transport::Channel;

type Client = BackupControlClient<Channel>;

async fn watch(c: &Client, store_id: &str) -> tonic::Streaming<proto::BackupEvent> {
    c.clone()
        .watch_events(proto::WatchEventsRequest {
            store_id: store_id.into(),
            after: None,
        })
        .await
        .expect("WatchEvents")
        .into_inner()
}

/// Reads `stream` until an event satisfies `ok`: every event read, that one last.
async fn until(
    stream: &mut tonic::Streaming<proto::BackupEvent>,
    what: &str,
    ok: impl Fn(&proto::BackupEvent) -> bool,
) -> Vec<proto::BackupEvent> {
    let mut seen = Vec::new();
    let read = async {
        loop {
            let e = stream
                .message()
                .await
                .expect("the stream fails")
                .expect("the stream ends");
            let done = ok(&e);
            seen.push(e);
            if done {
                return;
            }
        }
    };
    if tokio::time::timeout(DEADLINE, read).await.is_err() {
        panic!("waited {DEADLINE:?} for {what}; saw {seen:?}");
    }
    seen
}

fn kind(k: proto::EventKind) -> impl Fn(&proto::BackupEvent) -> bool {
    move |e| e.kind == k as i32
}

async fn register(c: &Client, d: &Dirs, name: &str) -> String {
    let dir = d.root.join(name);
    support::store::write(&dir, 20, 0, 0);
    let bucket = d.base.join(format!("{name}-bucket"));
    served::register(c, support::register_req(&dir, &support::file_url(&bucket))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watchers_and_webhooks_hear_registration_restore_points_pause_and_resume() {
    let d = served::dirs();
    let all = TcpListener::bind("127.0.0.1:0").unwrap();
    let some = TcpListener::bind("127.0.0.1:0").unwrap();
    let all_url = format!("http://{}/hooks/all?token=t1", all.local_addr().unwrap());
    let some_url = format!(
        "http://{}/hooks/some?kinds=paused,resumed",
        some.local_addr().unwrap()
    );
    let (all, some) = (Receiver::serve(all), Receiver::serve(some));
    let (_server, addr) = served::start(
        "serve",
        serve(&d, &["--webhook-url", &all_url, "--webhook-url", &some_url]),
    );
    let c = client(addr).await;
    let mut everything = watch(&c, "").await;

    let id = register(&c, &d, "watched").await;
    let mut mine = watch(&c, &id).await;
    let seen = until(
        &mut everything,
        "registered, then a restore point at 20",
        |e| e.kind == proto::EventKind::RestorePointWritten as i32 && e.commit_seq == 20,
    )
    .await;
    let registered = seen
        .iter()
        .find(|e| e.kind == proto::EventKind::Registered as i32)
        .unwrap_or_else(|| panic!("no registered event: {seen:?}"));
    assert_eq!(registered.store_id, id);
    assert_eq!(registered.kind_name, "registered");
    assert!(registered.detail.contains("watched"), "{registered:?}");
    let point = seen.last().unwrap();
    assert_eq!(
        (point.store_id.as_str(), point.commit_seq),
        (id.as_str(), 20)
    );
    assert!(
        seen.iter()
            .any(|e| e.kind == proto::EventKind::LeaseAcquired as i32),
        "{seen:?}"
    );
    assert!(
        seen.windows(2).all(|w| w[0].seq < w[1].seq),
        "in order: {seen:?}"
    );

    // `ctl watch-events` prints the next event of the store; pauses come until it has. An
    // event already on its way (the store's health turning healthy after its first restore
    // point) may come first: then another `ctl` is started, a few times at most.
    let mut n = 0;
    let mut line = serde_json::Value::Null;
    for _ in 0..5 {
        let mut ctl = binary::command("http://unused.invalid");
        ctl.args(["ctl", "--server", &format!("http://{addr}"), "--json"])
            .args(["watch-events", "--store", &id, "--count", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut ctl = ctl.spawn().expect("ctl watch-events");
        let start = Instant::now();
        while ctl.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < DEADLINE,
                "ctl watch-events printed nothing"
            );
            n += 1;
            served::pause(&c, &id, &format!("ctl {n}")).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let out = ctl.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        line = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())
            .expect("one JSON line");
        if line["kind"] == "paused" {
            break;
        }
        assert_eq!(line["kind"], "health_changed", "{line}");
    }
    assert_eq!(line["kind"], "paused", "{line}");
    assert_eq!(line["store_id"], id.as_str(), "{line}");
    assert!(line["detail"].as_str().unwrap().contains("ctl "), "{line}");
    served::resume(&c, &id).await;

    served::pause(&c, &id, "disk maintenance").await;
    served::resume(&c, &id).await;
    let seen = until(
        &mut mine,
        "the resume after ctl's pauses",
        kind(proto::EventKind::Resumed),
    )
    .await;
    assert!(seen.iter().all(|e| e.store_id == id), "{seen:?}");
    let seen = until(
        &mut mine,
        "the maintenance pause's resume",
        kind(proto::EventKind::Resumed),
    )
    .await;
    let paused = seen
        .iter()
        .find(|e| e.kind == proto::EventKind::Paused as i32)
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert!(paused.detail.contains("disk maintenance"), "{paused:?}");

    // Every webhook got CloudEvents naming the store; the filtered one only its kinds.
    let got = all
        .wait_for("the maintenance pause and its resume", |p| {
            let pause = p.iter().position(|p| {
                p.body["type"] == "dev.mushroom.backup.paused"
                    && p.body["data"]["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("disk maintenance"))
            });
            pause.is_some_and(|at| {
                p[at..]
                    .iter()
                    .any(|p| p.body["type"] == "dev.mushroom.backup.resumed")
            })
        })
        .await;
    for p in &got {
        assert_eq!(p.content_type, "application/cloudevents+json", "{p:?}");
        assert_eq!(p.path, "/hooks/all?token=t1");
        assert_eq!(p.body["specversion"], "1.0", "{p:?}");
        assert!(p.body["id"].as_str().is_some_and(|s| !s.is_empty()));
        assert!(
            p.body["source"]
                .as_str()
                .unwrap()
                .starts_with("/mushroom-backup/")
        );
        assert!(p.body["time"].as_str().unwrap().ends_with('Z'), "{p:?}");
        assert_eq!(p.body["data"]["store_id"], p.body["subject"]);
    }
    for t in ["registered", "restore_point_written", "paused", "resumed"] {
        assert!(
            got.iter()
                .any(|p| p.body["type"] == format!("dev.mushroom.backup.{t}")
                    && p.body["subject"] == id.as_str()),
            "no {t} naming {id}: {:?}",
            kinds_of(&got)
        );
    }
    let seqs: Vec<u64> = got
        .iter()
        .map(|p| p.body["data"]["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");

    let filtered = some
        .wait_for("the filtered webhook's last resume", |p| {
            p.iter()
                .filter(|p| p.body["type"] == "dev.mushroom.backup.resumed")
                .count()
                >= 2
        })
        .await;
    assert!(
        filtered.iter().all(|p| {
            p.body["type"] == "dev.mushroom.backup.paused"
                || p.body["type"] == "dev.mushroom.backup.resumed"
        }),
        "{:?}",
        kinds_of(&filtered)
    );
    assert!(
        filtered.iter().all(|p| p.path == "/hooks/some"),
        "the filter is not sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_down_for_a_while_gets_every_event_in_order_once_back() {
    let d = served::dirs();
    // A port nobody listens on (connections refused) until the receiver binds it again.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/down");
    let (mut server, addr) = served::start(
        "serve",
        serve(
            &d,
            &["--webhook-url", &url, "--metrics-listen", "127.0.0.1:0"],
        ),
    );
    let metrics = metrics_addr(&mut server);
    let c = client(addr).await;
    let mut everything = watch(&c, "").await;
    let id = register(&c, &d, "down").await;
    until(
        &mut everything,
        "a restore point",
        kind(proto::EventKind::RestorePointWritten),
    )
    .await;
    for i in 0..5 {
        served::pause(&c, &id, &format!("while the receiver is down {i}")).await;
        served::resume(&c, &id).await;
    }
    let mut last = 0;
    for i in 1..=5 {
        last = until(
            &mut everything,
            &format!("resume {i}"),
            kind(proto::EventKind::Resumed),
        )
        .await
        .last()
        .unwrap()
        .seq;
    }

    // The receiver was down for these: the service said so, and kept them.
    server.wait_for("log that the webhook fails", DEADLINE, |l| {
        l.text
            .contains("posting to the webhook failed")
            .then_some(())
    });
    let receiver = Receiver::serve(TcpListener::bind(("127.0.0.1", port)).expect("the port again"));
    let got = receiver
        .wait_for(&format!("every event up to seq {last}"), |p| {
            p.iter()
                .any(|p| p.body["data"]["seq"].as_u64() >= Some(last))
        })
        .await;
    let seqs: Vec<u64> = got
        .iter()
        .map(|p| p.body["data"]["seq"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(
        seqs, want,
        "every event from the first, in order, none twice"
    );
    let resumes = got
        .iter()
        .filter(|p| {
            p.body["type"] == "dev.mushroom.backup.resumed" && p.body["subject"] == id.as_str()
        })
        .count();
    assert_eq!(resumes, 5, "{:?}", kinds_of(&got));

    // The metrics count the failed attempts, the deliveries and the events published (the last
    // delivery is counted once its answer is in: polled for).
    let webhook = format!("webhook=\"127.0.0.1:{port}\"");
    let deliveries = "mushroom_backup_webhook_deliveries_total";
    let text = support::wait_for(DEADLINE, "every delivery counted ok", || {
        let text = get_metrics(metrics);
        let ok = value(&text, deliveries, &[&webhook, "outcome=\"ok\""]) >= seqs.len() as f64;
        async move { if ok { Ok(text) } else { Err(text) } }
    })
    .await;
    assert!(
        value(&text, deliveries, &[&webhook, "outcome=\"failed\""]) >= 1.0,
        "{text}"
    );
    assert_eq!(
        value(&text, deliveries, &["outcome=\"dropped\""]),
        0.0,
        "{text}"
    );
    assert!(
        value(
            &text,
            "mushroom_backup_events_published_total",
            &["kind=\"resumed\""]
        ) >= 5.0,
        "{text}"
    );
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn value(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The metrics address `serve --metrics-listen` logs.
fn metrics_addr(server: &mut binary::Running) -> SocketAddr {
    if let Some(a) = server.seen().iter().find_map(binary::Line::metrics_addr) {
        return a;
    }
    server.wait_for(
        "log its metrics address",
        DEADLINE,
        binary::Line::metrics_addr,
    )
}

/// GET /metrics: the body.
fn get_metrics(addr: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or(response)
}

#[test]
fn bad_webhook_flags_are_refused_at_start() {
    let d = served::dirs();
    for (flag, says) in [
        ("ftp://127.0.0.1/x", "not http or https"),
        (
            "http://127.0.0.1/x?kinds=paused,pasued",
            "unknown event kind \"pasued\"",
        ),
        ("not a url", "not a URL"),
    ] {
        let mut cmd = served::command(&d);
        cmd.args(["--webhook-url", flag]);
        let err = served::refused("serve", cmd);
        assert!(err.contains(says), "{flag}: {err}");
    }
    // A refused URL's path and query (a token, often) are never echoed: by the flag, the
    // variable or the config file.
    let leaky = "ftp://127.0.0.1/SEKRIT?token=SEKRIT";
    let config = d.base.join("webhooks.toml");
    std::fs::write(&config, format!("webhook_urls = [{leaky:?}]\n")).unwrap();
    for (how, mut cmd) in [
        ("flag", served::command(&d)),
        ("variable", served::command(&d)),
        ("config", served::command(&d)),
    ] {
        match how {
            "flag" => cmd.args(["--webhook-url", leaky]),
            "variable" => cmd.env("MUSHROOMDB_BACKUP_WEBHOOK_URLS", leaky),
            _ => cmd.arg("--config").arg(&config),
        };
        let err = served::refused("serve", cmd);
        assert!(
            err.contains("not http or https") && !err.contains("SEKRIT"),
            "{how}: {err}"
        );
    }
    // A bad secret file is refused naming the flag and the file, not showing what it holds.
    let secret = d.base.join("webhook.secret");
    std::fs::write(&secret, "whsec_SEKRIT\n").unwrap();
    let mut cmd = served::command(&d);
    cmd.args([
        "--webhook-url",
        "http://127.0.0.1:9/x",
        "--webhook-secret-file",
    ])
    .arg(&secret);
    let err = served::refused("serve", cmd);
    assert!(
        err.contains(&format!("--webhook-secret-file {}", secret.display()))
            && err.contains("not a webhook secret")
            && !err.contains("SEKRIT"),
        "{err}"
    );
}

/// HMAC-SHA256 (RFC 2104), written out here over `sha2` so the test checks the service's
/// signature with a computation of its own.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// What a Standard Webhooks receiver checks: the signature header holds `v1,` and the base64
/// HMAC of "id.timestamp.body" under the secret's bytes.
fn signed_by(key: &[u8], p: &Posted, body: &[u8]) -> bool {
    use base64::Engine as _;
    let header = |name: &str| {
        p.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let (id, ts) = (header("webhook-id"), header("webhook-timestamp"));
    let mut message = format!("{id}.{ts}.").into_bytes();
    message.extend_from_slice(body);
    let want = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(hmac_sha256(key, &message))
    );
    header("webhook-signature")
        .split(' ')
        .any(|sig| sig == want)
}

/// With `--webhook-secret-file`, every POST carries the Standard Webhooks headers: the id is
/// the CloudEvent's, the timestamp the attempt's (near now), and the signature checks with an
/// independent HMAC over the bytes received; a body changed by one byte does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_deliveries_are_signed_as_standard_webhooks_have_it() {
    use base64::Engine as _;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/signed", listener.local_addr().unwrap());
    let receiver = Receiver::serve(listener);
    let d = served::dirs();
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let secret = d.base.join("webhook.secret");
    std::fs::write(
        &secret,
        format!(
            "whsec_{}\n",
            base64::engine::general_purpose::STANDARD.encode(&key)
        ),
    )
    .unwrap();
    let mut cmd = serve(&d, &["--webhook-url", &url, "--webhook-secret-file"]);
    cmd.arg(&secret);
    let (_server, addr) = served::start("serve (signed webhooks)", cmd);
    let c = client(addr).await;
    register(&c, &d, "signed").await;
    let posted = receiver
        .wait_for("a registered event", |p| {
            p.iter()
                .any(|p| p.body["type"] == "dev.mushroom.backup.registered")
        })
        .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for p in &posted {
        let id = p.headers.iter().find(|(n, _)| n == "webhook-id");
        assert_eq!(
            id.map(|(_, v)| v.as_str()),
            p.body["id"].as_str(),
            "webhook-id is the event's id: {:?}",
            p.headers
        );
        let ts: u64 = p
            .headers
            .iter()
            .find(|(n, _)| n == "webhook-timestamp")
            .and_then(|(_, v)| v.parse().ok())
            .expect("a webhook-timestamp");
        assert!(ts <= now && now - ts < 3600, "timestamp {ts}, now {now}");
        assert!(signed_by(&key, p, &p.raw), "not signed: {:?}", p.headers);
        let mut tampered = p.raw.clone();
        let last = tampered.len() - 2;
        tampered[last] ^= 0x01;
        assert!(
            !signed_by(&key, p, &tampered),
            "a changed body still checks"
        );
        let wrong_key: Vec<u8> = key.iter().map(|b| b ^ 0x80).collect();
        assert!(!signed_by(&wrong_key, p, &p.raw), "another key checks");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_carries_the_trace_of_the_call_that_caused_it() {
    let (otlp_addr, received) = otlp::start().await;
    let d = served::dirs();
    let mut cmd = serve(&d, &[]);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp_addr}"))
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_SDK_DISABLED")
        .env("OTEL_SERVICE_NAME", "mushroom-backup-under-test");
    let (_server, addr) = served::start("serve (OTLP)", cmd);
    let c = client(addr).await;
    let id = register(&c, &d, "traced").await;
    let mut mine = watch(&c, &id).await;
    served::pause(&c, &id, "traced pause").await;
    let paused = until(&mut mine, "the pause", kind(proto::EventKind::Paused))
        .await
        .pop()
        .unwrap();
    assert_eq!(paused.trace_id.len(), 32, "{paused:?}");
    let spans = received
        .wait_for(DEADLINE, |spans| {
            spans
                .iter()
                .any(|s| hex::encode(&s.span.trace_id) == paused.trace_id)
        })
        .await;
    let span = spans
        .iter()
        .find(|s| hex::encode(&s.span.trace_id) == paused.trace_id)
        .unwrap_or_else(|| panic!("no span of trace {} exported", paused.trace_id));
    assert!(span.span.name.contains("Pause"), "{}", span.span.name);
}

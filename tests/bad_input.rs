//! One table of bad inputs, run through real gRPC against the `serve` binary with each
//! registry: SQLite, and PostgreSQL (`MUSHROOM_TEST_POSTGRES_URL`, which `scripts/test.sh`
//! sets; without it the PostgreSQL case prints a SKIP line and passes, except under `CI=true`,
//! where it fails).
//!
//! Each row changes one field of a request that is otherwise fine and expects
//! `INVALID_ARGUMENT` with a message naming the field and its limit, the same on both
//! registries (a NUL used to be stored by SQLite and refused by PostgreSQL as an internal
//! error). Afterwards the registry holds no store, every refused `Register` and `Adopt` left
//! one audit entry, and every audit field is bounded and NUL-free; then the unchanged requests
//! are shown to be good, so it was the changed field that was refused.

mod support;

use std::collections::HashMap;

use mushroom_backup::registry::{AUDIT_FIELD_MAX_BYTES, Registry};
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::service::{self, Server};
use tonic::Code;
use tonic::transport::Channel;

/// The request a row changes.
enum Call {
    Register(fn(&mut proto::RegisterRequest)),
    Adopt(fn(&mut proto::AdoptRequest)),
    ListRestorePoints(fn(&mut proto::ListRestorePointsRequest)),
    Health(fn(&mut proto::HealthRequest)),
    WatchHealth(fn(&mut proto::HealthRequest)),
    Trigger(fn(&mut proto::TriggerRequest)),
    Deregister(fn(&mut proto::DeregisterRequest)),
    Pause(fn(&mut proto::PauseRequest)),
    Resume(fn(&mut proto::ResumeRequest)),
    Drill(fn(&mut proto::DrillRequest)),
}

/// One bad input: what it is, the change, the code and a fragment of the message.
struct Case {
    what: &'static str,
    call: Call,
    code: Code,
    fragment: &'static str,
}

const fn bad(what: &'static str, call: Call, fragment: &'static str) -> Case {
    Case {
        what,
        call,
        code: Code::InvalidArgument,
        fragment,
    }
}

fn labels(n: usize) -> HashMap<String, String> {
    (0..n).map(|i| (format!("k{i}"), "v".into())).collect()
}

fn options(f: fn(&mut proto::StoreOptions)) -> Option<proto::StoreOptions> {
    let mut o = proto::StoreOptions::default();
    f(&mut o);
    Some(o)
}

/// Shorthand for a `Register` row.
const fn reg(what: &'static str, f: fn(&mut proto::RegisterRequest), m: &'static str) -> Case {
    bad(what, Call::Register(f), m)
}

const INTERVAL_LIMIT: &str = "must be 1 to 86400000 (1 day), or 0 for the service's default";
const KEEP_FOR_LIMIT: &str = "options.keep_for_ms must be 1 to 3153600000000 (100 years)";
const GENERATIONS_LIMIT: &str = "options.keep_generations must be 1 to 100000";
const NOT_A_STORE_ID: &str = "store_id must be a store id (a UUID of 36 characters)";

static CASES: &[Case] = &[
    Case {
        code: Code::PermissionDenied,
        ..reg(
            "destination inside the bucket's lease root",
            |r| r.destination = "s3://bucket/.mushroom-backup/instances".into(),
            "is inside a lease root (.mushroom-backup/)",
        )
    },
    reg(
        "destination over 4 KiB",
        |r| r.destination = format!("s3://bucket/{}", "p".repeat(4100)),
        "destination is longer than 4096 bytes",
    ),
    reg(
        "destination of 1 MiB",
        |r| r.destination = format!("s3://bucket/{}", "p".repeat(1 << 20)),
        "destination is longer than 4096 bytes",
    ),
    reg(
        "destination with a NUL",
        |r| r.destination.push_str("/a\0b"),
        "destination must not contain NUL",
    ),
    reg(
        "s3 destination with a NUL",
        |r| r.destination = "s3://bucket/a\0b".into(),
        "destination must not contain NUL",
    ),
    reg(
        "destination with a newline",
        |r| r.destination.push('\n'),
        "destination must not contain a control character (U+000A)",
    ),
    reg(
        "store_dir over 4 KiB",
        |r| r.store_dir.push_str(&"/d".repeat(2100)),
        "store_dir is longer than 4096 bytes",
    ),
    reg(
        "store_dir with a NUL",
        |r| r.store_dir.push_str("\0x"),
        "store_dir must not contain NUL",
    ),
    reg(
        "65 labels",
        |r| r.labels = labels(65),
        "labels: at most 64 entries",
    ),
    reg(
        "an empty label key",
        |r| r.labels = HashMap::from([(String::new(), "v".into())]),
        "label key must be 1 to 256 bytes",
    ),
    reg(
        "a label key of 257 bytes",
        |r| r.labels = HashMap::from([("k".repeat(257), "v".into())]),
        "label key must be 1 to 256 bytes",
    ),
    reg(
        "a label key with a NUL",
        |r| r.labels = HashMap::from([("k\0".into(), "v".into())]),
        "label key must not contain NUL",
    ),
    reg(
        "a label value of 1025 bytes",
        |r| r.labels = HashMap::from([("k".into(), "v".repeat(1025))]),
        "value is longer than 1024 bytes",
    ),
    reg(
        "a label value with a NUL",
        |r| r.labels = HashMap::from([("k".into(), "v\0".into())]),
        "value must not contain NUL",
    ),
    reg(
        "wal_interval_ms over a day",
        |r| r.options = options(|o| o.wal_interval_ms = 86_400_001),
        INTERVAL_LIMIT,
    ),
    reg(
        "restore_point_interval_ms of u64::MAX",
        |r| r.options = options(|o| o.restore_point_interval_ms = u64::MAX),
        INTERVAL_LIMIT,
    ),
    reg(
        "retention_interval_ms over a day",
        |r| r.options = options(|o| o.retention_interval_ms = 86_400_001),
        INTERVAL_LIMIT,
    ),
    reg(
        "drill_interval_ms under a minute",
        |r| r.options = options(|o| o.drill_interval_ms = 59_999),
        "options.drill_interval_ms must be 60000 (1 minute) to 2592000000 (30 days)",
    ),
    reg(
        "drill_interval_ms of u64::MAX",
        |r| r.options = options(|o| o.drill_interval_ms = u64::MAX),
        "options.drill_interval_ms must be 60000 (1 minute) to 2592000000 (30 days)",
    ),
    reg(
        "rto_target_seconds over 30 days",
        |r| r.options = options(|o| o.rto_target_seconds = 2_592_001),
        "options.rto_target_seconds must be 1 to 2592000 (30 days), or 0 for no target \
         (2592001 given)",
    ),
    reg(
        "rto_target_seconds of u64::MAX",
        |r| r.options = options(|o| o.rto_target_seconds = u64::MAX),
        "options.rto_target_seconds must be 1 to 2592000 (30 days)",
    ),
    reg(
        "keep_for_ms of 2^63 (wraps negative as i64)",
        |r| r.options = options(|o| o.keep_for_ms = 1 << 63),
        KEEP_FOR_LIMIT,
    ),
    reg(
        "keep_for_ms of u64::MAX",
        |r| r.options = options(|o| o.keep_for_ms = u64::MAX),
        KEEP_FOR_LIMIT,
    ),
    reg(
        "orphan_grace_ms over a year",
        |r| r.options = options(|o| o.orphan_grace_ms = 365 * 86_400_000 + 1),
        "options.orphan_grace_ms must be 1 to 31536000000, or 0 for the service's default",
    ),
    reg(
        "keep_generations over the maximum",
        |r| r.options = options(|o| o.keep_generations = 100_001),
        GENERATIONS_LIMIT,
    ),
    reg(
        "keep_generations of u64::MAX",
        |r| r.options = options(|o| o.keep_generations = u64::MAX),
        GENERATIONS_LIMIT,
    ),
    reg(
        "object_lock not one of the enum's values",
        |r| r.options = options(|o| o.object_lock = 7),
        "options.object_lock: object lock mode \"enum value 7\"",
    ),
    reg(
        "object_lock with a file:// destination",
        |r| r.options = options(|o| o.object_lock = proto::ObjectLockMode::Compliance as i32),
        "options.object_lock compliance needs an s3:// destination",
    ),
    bad(
        "Adopt: destination with a NUL",
        Call::Adopt(|r| r.destination.push('\0')),
        "destination must not contain NUL",
    ),
    bad(
        "Adopt: destination over 4 KiB",
        Call::Adopt(|r| r.destination = format!("s3://bucket/{}", "p".repeat(5000))),
        "destination is longer than 4096 bytes",
    ),
    bad(
        "Adopt: store_dir with a NUL",
        Call::Adopt(|r| r.store_dir.push('\0')),
        "store_dir must not contain NUL",
    ),
    bad(
        "Adopt: 65 labels",
        Call::Adopt(|r| r.labels = labels(65)),
        "labels: at most 64 entries",
    ),
    bad(
        "Adopt: keep_for_ms of 2^63",
        Call::Adopt(|r| r.options = options(|o| o.keep_for_ms = 1 << 63)),
        KEEP_FOR_LIMIT,
    ),
    bad(
        "ListRestorePoints: page_token over 64 bytes",
        Call::ListRestorePoints(|r| r.page_token = "m".repeat(65)),
        "page_token is longer than 64 bytes",
    ),
    bad(
        "ListRestorePoints: page_token with a NUL",
        Call::ListRestorePoints(|r| r.page_token = "manifests/\0".into()),
        "page_token must not contain NUL",
    ),
    bad(
        "ListRestorePoints: a page_token this server never gave",
        Call::ListRestorePoints(|r| r.page_token = "not-a-token".into()),
        "page_token \"not-a-token\" is not one this server gave",
    ),
    bad(
        "ListRestorePoints: store_id with a NUL",
        Call::ListRestorePoints(|r| r.store_id.push('\0')),
        NOT_A_STORE_ID,
    ),
    bad(
        "Health: store_id that is not a UUID",
        Call::Health(|r| r.store_id = "not-a-uuid".into()),
        NOT_A_STORE_ID,
    ),
    bad(
        "Health: store_id of 100 KiB",
        Call::Health(|r| r.store_id = "0".repeat(100 << 10)),
        NOT_A_STORE_ID,
    ),
    bad(
        "WatchHealth: store_id with a NUL",
        Call::WatchHealth(|r| r.store_id = "\0".into()),
        NOT_A_STORE_ID,
    ),
    bad(
        "Trigger: store_id with a NUL",
        Call::Trigger(|r| r.store_id.push('\0')),
        NOT_A_STORE_ID,
    ),
    bad(
        "Deregister: store_id with a NUL",
        Call::Deregister(|r| r.store_id.push('\0')),
        NOT_A_STORE_ID,
    ),
    bad(
        "Pause: store_id with a NUL",
        Call::Pause(|r| r.store_id.push('\0')),
        NOT_A_STORE_ID,
    ),
    bad(
        "Pause: reason over 512 bytes",
        Call::Pause(|r| r.reason = "r".repeat(513)),
        "reason is longer than 512 bytes (513 bytes)",
    ),
    bad(
        "Pause: reason with a NUL",
        Call::Pause(|r| r.reason = "disk\0swap".into()),
        "reason must not contain NUL",
    ),
    bad(
        "Pause: reason of two lines",
        Call::Pause(|r| r.reason = "disk\nswap".into()),
        "reason must not contain a control character (U+000A)",
    ),
    bad(
        "Pause: until_unix_ms negative",
        Call::Pause(|r| r.until_unix_ms = -1),
        "until_unix_ms must not be negative",
    ),
    bad(
        "Pause: until_unix_ms in the past",
        Call::Pause(|r| r.until_unix_ms = 1),
        "until_unix_ms 1 (1970-01-01T00:00:00.001Z) is not in the future",
    ),
    bad(
        "Pause: until_unix_ms beyond the maximum pause",
        Call::Pause(|r| r.until_unix_ms = i64::MAX),
        "is beyond the server's maximum pause of 86400000 ms",
    ),
    bad(
        "Resume: store_id with a NUL",
        Call::Resume(|r| r.store_id.push('\0')),
        NOT_A_STORE_ID,
    ),
    bad(
        "Drill: store_id with a NUL",
        Call::Drill(|r| r.store_id.push('\0')),
        NOT_A_STORE_ID,
    ),
];

/// The longest message a refusal may carry: it quotes at most a bounded part of the input.
const MAX_MESSAGE_BYTES: usize = 1024;

/// A store id that is well formed and registered nowhere.
const UNKNOWN: &str = "00000000-0000-0000-0000-000000000000";

/// The unchanged requests.
struct Base {
    register: proto::RegisterRequest,
    adopt: proto::AdoptRequest,
}

fn base(d: &service::Dirs) -> Base {
    Base {
        register: proto::RegisterRequest {
            store_dir: d.store("store"),
            destination: d.bucket("store"),
            ..Default::default()
        },
        adopt: proto::AdoptRequest {
            store_dir: d.store("adopted"),
            destination: d.bucket("empty"),
            ..Default::default()
        },
    }
}

/// Runs `call`, changed by its row when `row` is given; the status it failed with, or `None`.
async fn answer(
    c: &mut BackupControlClient<Channel>,
    b: &Base,
    call: &Call,
    change: bool,
) -> Option<tonic::Status> {
    macro_rules! run {
        ($f:expr, $req:expr, $method:ident) => {{
            let mut req = $req;
            if change {
                $f(&mut req);
            }
            c.$method(req).await.err()
        }};
    }
    match call {
        Call::Register(f) => run!(f, b.register.clone(), register),
        Call::Adopt(f) => run!(f, b.adopt.clone(), adopt),
        Call::ListRestorePoints(f) => run!(
            f,
            proto::ListRestorePointsRequest {
                store_id: UNKNOWN.into(),
                ..Default::default()
            },
            list_restore_points
        ),
        Call::Health(f) => run!(
            f,
            proto::HealthRequest {
                store_id: UNKNOWN.into(),
                fresh: false,
            },
            health
        ),
        Call::WatchHealth(f) => run!(
            f,
            proto::HealthRequest {
                store_id: UNKNOWN.into(),
                fresh: false,
            },
            watch_health
        ),
        Call::Trigger(f) => run!(
            f,
            proto::TriggerRequest {
                store_id: UNKNOWN.into(),
                kind: proto::TriggerKind::Ship as i32,
            },
            trigger
        ),
        Call::Deregister(f) => run!(
            f,
            proto::DeregisterRequest {
                store_id: UNKNOWN.into(),
                flush: false,
            },
            deregister
        ),
        Call::Pause(f) => run!(
            f,
            proto::PauseRequest {
                store_id: UNKNOWN.into(),
                reason: "maintenance".into(),
                until_unix_ms: 0,
            },
            pause
        ),
        Call::Resume(f) => run!(
            f,
            proto::ResumeRequest {
                store_id: UNKNOWN.into(),
            },
            resume
        ),
        Call::Drill(f) => run!(
            f,
            proto::DrillRequest {
                store_id: UNKNOWN.into(),
                at_commit_seq: 0,
            },
            drill
        ),
    }
}

/// The table against a service whose registry is at `registry_url`.
async fn the_table(d: &service::Dirs, server: &Server, registry_url: &str) {
    let mut c = server.client().await;
    let b = base(d);
    let mut failures = Vec::new();
    for case in CASES {
        match answer(&mut c, &b, &case.call, true).await {
            None => failures.push(format!("{}: accepted", case.what)),
            Some(s) => {
                let ok = s.code() == case.code
                    && s.message().contains(case.fragment)
                    && s.message().len() <= MAX_MESSAGE_BYTES;
                if !ok {
                    let shown: String = s.message().chars().take(300).collect();
                    failures.push(format!(
                        "{}: {:?} {shown:?} ({} bytes); expected {:?} with {:?}",
                        case.what,
                        s.code(),
                        s.message().len(),
                        case.code,
                        case.fragment
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} bad inputs were not refused as they should be:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );

    // Nothing was registered; every refused Register and Adopt left one bounded audit entry.
    let listed = support::served::list_stores(&c).await;
    assert!(
        listed.is_empty(),
        "bad inputs registered stores: {listed:?}"
    );
    let registry = Registry::open(registry_url)
        .await
        .expect("open the registry");
    let stores = registry.list_stores(None).await.expect("list stores");
    assert!(stores.is_empty(), "{stores:?}");
    let audit = registry.audit_log(1000).await.expect("read the audit log");
    let refusals = CASES
        .iter()
        .filter(|c| matches!(c.call, Call::Register(_) | Call::Adopt(_)))
        .count();
    assert_eq!(
        audit.iter().filter(|e| e.outcome == "refused").count(),
        refusals,
        "one audit entry per refused Register and Adopt: {audit:#?}"
    );
    for e in &audit {
        let texts = [&e.detail, &e.action, &e.outcome, &e.instance_id];
        let optional = [&e.store_dir, &e.store_id, &e.peer];
        for t in texts.into_iter().chain(optional.into_iter().flatten()) {
            assert!(
                t.len() <= AUDIT_FIELD_MAX_BYTES && !t.contains('\0'),
                "an audit field of {} bytes: {:?}",
                t.len(),
                t.chars().take(200).collect::<String>()
            );
        }
    }
    registry.close().await;

    // The unchanged requests are good: each row's change was what got it refused.
    for case in CASES {
        if let Some(s) = answer(&mut c, &b, &case.call, false).await {
            assert_ne!(s.code(), Code::InvalidArgument, "{}: {s:?}", case.what);
        }
    }
    let listed = support::served::list_stores(&c).await;
    assert_eq!(
        listed.len(),
        1,
        "the unchanged Register registers: {listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bad_input_table_on_sqlite() {
    let d = service::dirs();
    let server = Server::start("serve", service::serve_command(&d, "data", None, &[]));
    the_table(&d, &server, &d.sqlite_registry("data")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bad_input_table_on_postgres() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "bad_input").await;
    let d = service::dirs();
    let server = Server::start(
        "serve",
        service::serve_command(&d, "data", Some(&db.url), &[]),
    );
    the_table(&d, &server, &db.url).await;
    drop(server);
    db.drop_database().await;
}

/// A store registered before these bounds (here: its row edited to what main accepted, a
/// `keep_for_ms` of 2^63 that wrapped negative) still runs after a restart, within range.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registered_option_out_of_range_runs_clamped_after_a_restart() {
    let d = service::dirs();
    let mut server = Server::start("serve", service::serve_command(&d, "data", None, &[]));
    let mut c = server.client().await;
    let b = base(&d);
    let id = c
        .register(b.register.clone())
        .await
        .expect("Register")
        .into_inner()
        .store_id;
    drop(c);
    server.child.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| server.child.wait_exit(service::DEADLINE));
    assert!(status.success(), "serve exited {status}");

    let pool = sqlx::SqlitePool::connect(&d.sqlite_registry("data"))
        .await
        .expect("open the registry file");
    let updated = sqlx::query("UPDATE stores SET options = $1 WHERE store_id = $2")
        .bind(r#"{"keep_for_ms":9223372036854775808}"#)
        .bind(&id)
        .execute(&pool)
        .await
        .expect("edit the row");
    assert_eq!(updated.rows_affected(), 1);
    pool.close().await;

    let mut server = Server::start("serve again", service::serve_command(&d, "data", None, &[]));
    let mut c = server.client().await;
    // The store is respawned: its health, one record.
    support::served::health_of(&mut c, &id, tonic::Request::new).await;
    // Logged at start: maybe among the lines read while waiting for the listening line.
    let warned = |l: &support::binary::Line| l.text.contains("clamped into range");
    if !server.child.seen().iter().any(warned) {
        tokio::task::block_in_place(|| {
            server.child.wait_for(
                "warn that the option runs clamped",
                service::DEADLINE,
                |l| warned(l).then_some(()),
            )
        });
    }
}

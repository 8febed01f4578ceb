//! The registry: one suite, run against SQLite (a temp file) and PostgreSQL (a fresh database
//! per test on the server `MUSHROOM_TEST_POSTGRES_URL` names; `scripts/test.sh` starts one).
//! Without that variable the PostgreSQL tests print a SKIP line and pass, except under
//! `CI=true`, where they fail.

mod support;

use std::collections::BTreeMap;

use mushroom_backup::health::DrillResult;
use mushroom_backup::registry::{
    AuditEntry, HealthRow, KeptRates, PauseRecord, Registry, RegistryError, StoreRecord,
    hash_token, new_node_token, token_matches,
};
use sqlx::Connection;
use support::registry::{PgDatabase, postgres_server, sqlite_registry};

both_backends!(
    round_trip,
    duplicate_dir,
    duplicate_id,
    audit_newest_first,
    health_upsert_and_cascade,
    a_health_report_is_one_transaction_with_a_heartbeat,
    pauses_upsert_clear_and_cascade,
    drills_upsert_and_cascade,
    one_stores_reads_are_its_rows,
    every_record_carries_its_owner_and_since_when,
    ping_and_location,
);

// ---- records ----------------------------------------------------------------------------

fn record(id: &str, dir: &str, instance: &str, at_ms: i64) -> StoreRecord {
    let token = new_node_token();
    StoreRecord {
        store_id: id.into(),
        store_dir: dir.into(),
        destination: format!("s3://bucket/{id}"),
        labels: BTreeMap::from([
            ("team".to_string(), "storage".to_string()),
            ("tier".to_string(), "gold ☃ \"quoted\"".to_string()),
        ]),
        options: serde_json::json!({
            "snapshot_every": 1000, "compress": true, "nested": {"list": [1, 2.5, null]}
        }),
        node_token_hash: hash_token(&token),
        instance_id: instance.into(),
        registered_at_ms: at_ms,
        owner_since_ms: at_ms,
    }
}

fn audit(at_ms: i64, action: &str, store: Option<&str>, outcome: &str) -> AuditEntry {
    AuditEntry {
        at_ms,
        instance_id: "inst-a".into(),
        action: action.into(),
        store_id: store.map(Into::into),
        store_dir: store.map(|s| format!("/data/{s}")),
        outcome: outcome.into(),
        detail: format!("{action} {store:?}"),
        peer: (outcome == "ok").then(|| "10.0.0.7:51234".to_string()),
    }
}

// ---- the suite --------------------------------------------------------------------------

mod suite {
    use super::*;

    pub async fn round_trip(reg: Registry) {
        let a = record("st-a", "/data/a", "inst-1", 2_000);
        let b = record("st-b", "/data/b", "inst-2", 1_000);
        let c = record("st-c", "/data/c", "inst-1", 2_000);
        let mut empty = record("st-d", "/data/d", "inst-2", 3_000);
        empty.labels.clear();
        empty.options = serde_json::Value::Null;
        for r in [&a, &b, &c, &empty] {
            reg.insert_store(r).await.expect("insert");
        }

        assert_eq!(reg.get_store("st-a").await.unwrap().as_ref(), Some(&a));
        assert_eq!(reg.get_store("st-d").await.unwrap().as_ref(), Some(&empty));
        assert_eq!(reg.get_store("nope").await.unwrap(), None);
        assert_eq!(reg.find_by_dir("/data/c").await.unwrap().as_ref(), Some(&c));
        assert_eq!(reg.find_by_dir("/data/zzz").await.unwrap(), None);

        // Ordered by registration time, then store_id.
        let all = reg.list_stores(None).await.unwrap();
        assert_eq!(all, vec![b.clone(), a.clone(), c.clone(), empty.clone()]);
        let one = reg.list_stores(Some("inst-1")).await.unwrap();
        assert_eq!(one, vec![a.clone(), c.clone()]);
        assert!(reg.list_stores(Some("inst-9")).await.unwrap().is_empty());

        assert!(reg.delete_store("st-a").await.unwrap());
        assert!(
            !reg.delete_store("st-a").await.unwrap(),
            "second delete finds nothing"
        );
        assert_eq!(reg.get_store("st-a").await.unwrap(), None);
        assert_eq!(reg.find_by_dir("/data/a").await.unwrap(), None);
        // The directory is free again.
        let again = record("st-a2", "/data/a", "inst-2", 4_000);
        reg.insert_store(&again)
            .await
            .expect("re-register a freed dir");
        assert_eq!(reg.list_stores(None).await.unwrap().len(), 4);
    }

    pub async fn duplicate_dir(reg: Registry) {
        let first = record("st-1", "/data/same", "inst-1", 1);
        reg.insert_store(&first).await.unwrap();
        let err = reg
            .insert_store(&record("st-2", "/data/same", "inst-2", 2))
            .await
            .unwrap_err();
        match err {
            RegistryError::AlreadyExists { what, value } => {
                assert_eq!((what, value.as_str()), ("store_dir", "/data/same"));
            }
            other => panic!("expected AlreadyExists, got {other:?}"),
        }
        assert_eq!(reg.list_stores(None).await.unwrap(), vec![first]);
    }

    pub async fn duplicate_id(reg: Registry) {
        let first = record("st-1", "/data/one", "inst-1", 1);
        reg.insert_store(&first).await.unwrap();
        let err = reg
            .insert_store(&record("st-1", "/data/other", "inst-1", 2))
            .await
            .unwrap_err();
        match err {
            RegistryError::AlreadyExists { what, value } => {
                assert_eq!((what, value.as_str()), ("store_id", "st-1"));
            }
            other => panic!("expected AlreadyExists, got {other:?}"),
        }
        assert_eq!(reg.list_stores(None).await.unwrap(), vec![first]);
    }

    pub async fn audit_newest_first(reg: Registry) {
        assert!(reg.audit_log(10).await.unwrap().is_empty());
        // Same timestamp twice: order is the order of appending, not of at_ms.
        let entries = [
            audit(100, "register", Some("st-1"), "ok"),
            audit(100, "refused", Some("st-1"), "refused"),
            audit(50, "adopt", None, "error"),
            audit(200, "deregister", Some("st-1"), "ok"),
        ];
        for e in &entries {
            reg.record_audit(e).await.unwrap();
        }
        let newest_first: Vec<AuditEntry> = entries.iter().rev().cloned().collect();
        assert_eq!(reg.audit_log(10).await.unwrap(), newest_first);
        assert_eq!(reg.audit_log(2).await.unwrap(), newest_first[..2]);
        assert!(reg.audit_log(0).await.unwrap().is_empty());
    }

    /// Two stores, `st-1` and `st-2`, owned by `inst-1`.
    async fn two_stores(reg: &Registry) {
        for (id, dir, n) in [("st-1", "/data/1", 1), ("st-2", "/data/2", 2)] {
            reg.insert_store(&record(id, dir, "inst-1", n))
                .await
                .unwrap();
        }
    }

    /// `(store_id, health_json)` pairs as [`Registry::report_health`] takes them.
    fn changed(rows: &[(&str, &str)]) -> Vec<(String, String)> {
        rows.iter()
            .map(|(id, json)| (id.to_string(), json.to_string()))
            .collect()
    }

    pub async fn health_upsert_and_cascade(reg: Registry) {
        two_stores(&reg).await;
        reg.report_health(
            "inst-1",
            10,
            &changed(&[("st-2", r#"{"state":"starting"}"#)]),
        )
        .await
        .unwrap();
        reg.report_health("inst-1", 11, &changed(&[("st-1", r#"{"state":"ok"}"#)]))
            .await
            .unwrap();
        // A later report from another instance replaces the row.
        reg.report_health(
            "inst-2",
            12,
            &changed(&[("st-2", r#"{"state":"ok","lag":3}"#)]),
        )
        .await
        .unwrap();
        let row = |id: &str, inst: &str, at: i64, json: &str| HealthRow {
            store_id: id.into(),
            instance_id: inst.into(),
            reported_at_ms: at,
            health_json: json.into(),
        };
        assert_eq!(
            reg.all_health().await.unwrap(),
            vec![
                row("st-1", "inst-1", 11, r#"{"state":"ok"}"#),
                row("st-2", "inst-2", 12, r#"{"state":"ok","lag":3}"#),
            ]
        );

        // Deleting a store deletes its health.
        assert!(reg.delete_store("st-2").await.unwrap());
        assert_eq!(
            reg.all_health().await.unwrap(),
            vec![row("st-1", "inst-1", 11, r#"{"state":"ok"}"#)]
        );
        // Health for a store that is gone writes no row.
        reg.report_health("inst-2", 13, &changed(&[("st-2", "{}")]))
            .await
            .unwrap();
        assert_eq!(
            reg.all_health().await.unwrap(),
            vec![row("st-1", "inst-1", 11, r#"{"state":"ok"}"#)]
        );
    }

    pub async fn pauses_upsert_clear_and_cascade(reg: Registry) {
        two_stores(&reg).await;
        let pause = |reason: &str, until_ms: i64| PauseRecord {
            reason: reason.into(),
            paused_at_ms: 100,
            until_ms,
        };
        assert!(reg.pauses().await.unwrap().is_empty());
        assert!(
            reg.set_pause("st-1", &pause("disk swap", 200))
                .await
                .unwrap()
        );
        assert!(reg.set_pause("st-2", &pause("upgrade", 300)).await.unwrap());
        // A second pause replaces the first.
        assert!(
            reg.set_pause("st-1", &pause("longer swap", 400))
                .await
                .unwrap()
        );
        let all = reg.pauses().await.unwrap();
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all["st-1"], pause("longer swap", 400));
        assert_eq!(all["st-2"], pause("upgrade", 300));
        // A store that is not registered takes no pause.
        assert!(!reg.set_pause("st-9", &pause("x", 1)).await.unwrap());
        assert!(reg.clear_pause("st-1").await.unwrap());
        assert!(!reg.clear_pause("st-1").await.unwrap(), "cleared twice");
        // One store's read: its row only, as the whole table says.
        assert_eq!(reg.pause("st-1").await.unwrap(), None);
        assert_eq!(
            reg.pause("st-2").await.unwrap(),
            Some(pause("upgrade", 300))
        );
        assert_eq!(reg.pause("st-9").await.unwrap(), None);
        // Deleting a store deletes its pause.
        assert!(reg.delete_store("st-2").await.unwrap());
        assert!(reg.pauses().await.unwrap().is_empty());
        assert_eq!(reg.pause("st-2").await.unwrap(), None);
    }

    pub async fn drills_upsert_and_cascade(reg: Registry) {
        two_stores(&reg).await;
        let drill = |ok: bool, error: &str, at: i64| DrillResult {
            ok,
            commit_seq: u64::MAX,
            manifest_key: "manifests/00000000000000000010.json".into(),
            duration_ms: 1234,
            bytes: 1 << 40,
            error: error.into(),
            finished_at_unix_ms: at,
            last_ok_at_unix_ms: if ok { at } else { 0 },
            predicted_ms: 987,
        };
        assert!(reg.drills().await.unwrap().is_empty());
        assert!(
            reg.set_drill("st-1", &drill(false, "gen/1/x: CRC mismatch ☃", 100))
                .await
                .unwrap()
        );
        assert!(reg.set_drill("st-2", &drill(true, "", 50)).await.unwrap());
        let all = reg.drills().await.unwrap();
        // u64::MAX is stored as i64::MAX: saturated, never wrapped.
        let mut want = drill(false, "gen/1/x: CRC mismatch ☃", 100);
        want.commit_seq = i64::MAX as u64;
        assert_eq!(all["st-1"], want);
        // The next drill replaces the last.
        assert!(reg.set_drill("st-1", &drill(true, "", 200)).await.unwrap());
        let all = reg.drills().await.unwrap();
        assert!(
            all["st-1"].ok && all["st-1"].finished_at_unix_ms == 200,
            "{all:?}"
        );
        assert_eq!(all.len(), 2);
        assert_eq!(
            reg.drill("st-1").await.unwrap().as_ref(),
            Some(&all["st-1"])
        );
        assert_eq!(
            reg.drill("st-2").await.unwrap().as_ref(),
            Some(&all["st-2"])
        );
        assert_eq!(all["st-2"].finished_at_unix_ms, 50);
        assert_eq!(reg.drill("st-9").await.unwrap(), None);
        // An unregistered store takes no drill; a deleted store's drill goes with it.
        assert!(!reg.set_drill("st-9", &drill(true, "", 1)).await.unwrap());
        assert!(reg.delete_store("st-2").await.unwrap());
        assert_eq!(reg.drills().await.unwrap().len(), 1);
    }

    pub async fn a_health_report_is_one_transaction_with_a_heartbeat(reg: Registry) {
        two_stores(&reg).await;
        assert!(reg.heartbeats().await.unwrap().is_empty());
        // A deregistered store in the batch is skipped, not an error that loses the others.
        reg.report_health(
            "inst-1",
            100,
            &changed(&[
                ("st-1", r#"{"a":1}"#),
                ("gone", "{}"),
                ("st-2", r#"{"b":2}"#),
            ]),
        )
        .await
        .unwrap();
        // Nothing changed: only the heartbeat moves.
        reg.report_health("inst-1", 200, &[]).await.unwrap();
        reg.report_health("inst-2", 150, &changed(&[("st-2", r#"{"b":3}"#)]))
            .await
            .unwrap();
        let heartbeats = reg.heartbeats().await.unwrap();
        assert_eq!(
            heartbeats.into_iter().collect::<Vec<_>>(),
            vec![("inst-1".to_string(), 200), ("inst-2".to_string(), 150)]
        );
        let rows: Vec<(String, String, i64, String)> = reg
            .all_health()
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.store_id, h.instance_id, h.reported_at_ms, h.health_json))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("st-1".into(), "inst-1".into(), 100, r#"{"a":1}"#.into()),
                ("st-2".into(), "inst-2".into(), 150, r#"{"b":3}"#.into()),
            ]
        );
    }

    /// `store_report`: one store's row, its last health and its owner's heartbeat, in one read.
    pub async fn one_stores_reads_are_its_rows(reg: Registry) {
        two_stores(&reg).await;
        let st1 = reg.get_store("st-1").await.unwrap().unwrap();
        // Never reported: the row alone.
        let r = reg.store_report("st-1").await.unwrap().expect("registered");
        assert_eq!(
            (r.record, r.health, r.heartbeat_ms),
            (st1.clone(), None, None)
        );
        reg.report_health("inst-1", 100, &changed(&[("st-1", r#"{"a":1}"#)]))
            .await
            .unwrap();
        // Another instance's report of st-2 moves inst-2's heartbeat, not its owner's.
        reg.report_health("inst-2", 150, &changed(&[("st-2", r#"{"b":2}"#)]))
            .await
            .unwrap();
        reg.report_health("inst-1", 200, &[]).await.unwrap();
        let r = reg.store_report("st-1").await.unwrap().unwrap();
        assert_eq!(r.record, st1);
        let h = r.health.expect("reported");
        assert_eq!(
            (
                h.store_id.as_str(),
                h.instance_id.as_str(),
                h.reported_at_ms
            ),
            ("st-1", "inst-1", 100)
        );
        assert_eq!(h.health_json, r#"{"a":1}"#);
        assert_eq!(r.heartbeat_ms, Some(200));
        let r = reg.store_report("st-2").await.unwrap().unwrap();
        assert_eq!(r.health.unwrap().instance_id, "inst-2");
        assert_eq!(r.heartbeat_ms, Some(200), "the owner's (inst-1) heartbeat");
        assert!(reg.store_report("st-9").await.unwrap().is_none());
        assert!(reg.delete_store("st-2").await.unwrap());
        assert!(reg.store_report("st-2").await.unwrap().is_none());
    }

    /// A record says who owns its store and since when (registration, then each change of
    /// owner), in every read of it: one read of the rows serves lists and owners alike.
    pub async fn every_record_carries_its_owner_and_since_when(reg: Registry) {
        two_stores(&reg).await;
        let before = reg.get_store("st-1").await.unwrap().unwrap();
        assert_eq!(
            (before.instance_id.as_str(), before.owner_since_ms),
            ("inst-1", 1)
        );
        let won = reg
            .change_owner("st-1", "inst-1", "inst-2", 50)
            .await
            .unwrap();
        assert_eq!(won, mushroom_backup::registry::Claimed::Won);
        let after = reg.get_store("st-1").await.unwrap().unwrap();
        assert_eq!(
            (after.instance_id.as_str(), after.owner_since_ms),
            ("inst-2", 50)
        );
        assert_eq!(after.registered_at_ms, 1, "the registration stays");
        let listed = reg.list_stores(None).await.unwrap();
        assert_eq!(listed[0], after);
        assert_eq!(
            reg.list_stores(Some("inst-2")).await.unwrap(),
            vec![after.clone()]
        );
        assert_eq!(
            reg.find_by_dir("/data/1").await.unwrap(),
            Some(after.clone())
        );
        let owners = reg.owners().await.unwrap();
        for r in &listed {
            assert_eq!(owners[&r.store_id].instance_id, r.instance_id);
            assert_eq!(owners[&r.store_id].since_ms, r.owner_since_ms);
        }
        // Registered with another since when: kept as given.
        let mut later = record("st-3", "/data/3", "inst-1", 5);
        later.owner_since_ms = 7;
        reg.insert_store(&later).await.unwrap();
        assert_eq!(reg.get_store("st-3").await.unwrap(), Some(later));
    }

    pub async fn ping_and_location(reg: Registry) {
        reg.ping().await.expect("ping");
        let shown = format!("{reg:?}");
        assert!(shown.contains(reg.location()), "{shown}");
        assert!(reg.location().starts_with(reg.kind()), "{}", reg.location());
    }
}

// ---- SQLite only ------------------------------------------------------------------------

/// Two handles on one registry (two instances): the registration check of one sees what the
/// other registered and deregistered, whether it reads every store or the ones it read last.
async fn the_registration_check_sees_every_instances_changes(a: Registry, b: Registry) {
    // Refuses a candidate while any store has directory `dir`, and counts the stores it saw.
    async fn register(reg: &Registry, rec: &StoreRecord, taken: &str) -> Result<usize, usize> {
        let mut seen = 0;
        let verdict = reg
            .insert_store_unless(rec, |stores| {
                seen = stores.len();
                stores.iter().any(|s| s.store_dir == taken).then_some(())
            })
            .await
            .expect("insert_store_unless");
        match verdict {
            Ok(()) => Ok(seen),
            Err(()) => Err(seen),
        }
    }
    assert_eq!(
        register(&a, &record("s1", "/d/1", "a", 1), "/d/x").await,
        Ok(0)
    );
    // `a` again: the check sees the store it just registered (from what it read last).
    assert_eq!(
        register(&a, &record("s2", "/d/2", "a", 2), "/d/x").await,
        Ok(1)
    );
    // `b` registers /d/x: `a`'s next check must see it, not what it read before.
    b.insert_store(&record("s3", "/d/x", "b", 3)).await.unwrap();
    assert_eq!(
        register(&a, &record("s4", "/d/4", "a", 4), "/d/x").await,
        Err(3)
    );
    // Refused again from what it read last, then `b` deregisters it: the check sees that too.
    assert_eq!(
        register(&a, &record("s4", "/d/4", "a", 4), "/d/x").await,
        Err(3)
    );
    assert!(b.delete_store("s3").await.unwrap());
    assert_eq!(
        register(&a, &record("s4", "/d/4", "a", 4), "/d/x").await,
        Ok(2)
    );
    // And a store `a` deregistered itself.
    assert!(a.delete_store("s1").await.unwrap());
    assert_eq!(
        register(&b, &record("s5", "/d/5", "b", 5), "/d/1").await,
        Ok(2)
    );
    assert_eq!(a.list_stores(None).await.unwrap().len(), 3);
}

#[tokio::test]
async fn the_registration_check_sees_every_instances_changes_on_sqlite() {
    let (_dir, url, a) = sqlite_registry().await;
    let b = Registry::open(&url).await.expect("a second handle");
    the_registration_check_sees_every_instances_changes(a, b).await;
}

#[tokio::test]
async fn the_registration_check_sees_every_instances_changes_on_postgres() {
    let Some(server) = postgres_server() else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let a = Registry::open(&db.url).await.expect("open a");
    let b = Registry::open(&db.url).await.expect("open b");
    the_registration_check_sees_every_instances_changes(a.clone(), b.clone()).await;
    a.close().await;
    b.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn sqlite_reopen_keeps_data_and_migrations_are_applied_once() {
    let (_dir, url, reg) = sqlite_registry().await;
    let rec = record("st-1", "/data/1", "inst-1", 1);
    reg.insert_store(&rec).await.unwrap();
    reg.record_audit(&audit(1, "register", Some("st-1"), "ok"))
        .await
        .unwrap();
    reg.report_health("inst-1", 2, &[("st-1".into(), "{}".into())])
        .await
        .unwrap();
    reg.close().await;

    for _ in 0..2 {
        let reg = Registry::open(&url).await.expect("reopen");
        assert_eq!(reg.get_store("st-1").await.unwrap(), Some(rec.clone()));
        assert_eq!(reg.audit_log(10).await.unwrap().len(), 1);
        assert_eq!(reg.all_health().await.unwrap().len(), 1);
        reg.close().await;
    }

    let path = url.trim_start_matches("sqlite://");
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .unwrap();
    let applied: Vec<(i64, bool)> =
        sqlx::query_as("SELECT version, success FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        applied,
        vec![
            (1, true),
            (2, true),
            (3, true),
            (4, true),
            (5, true),
            (6, true),
            (7, true),
            (8, true),
            (9, true),
            (10, true),
            (11, true)
        ]
    );
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    conn.close().await.unwrap();
}

#[tokio::test]
async fn a_row_with_bad_json_is_corrupt_not_a_panic() {
    let (_dir, url, reg) = sqlite_registry().await;
    reg.insert_store(&record("st-1", "/data/1", "inst-1", 1))
        .await
        .unwrap();
    reg.close().await;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("UPDATE stores SET labels = '{\"team\": 7' WHERE store_id = 'st-1'")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let reg = Registry::open(&url).await.unwrap();
    for result in [
        reg.get_store("st-1").await,
        reg.list_stores(None).await.map(|mut v| v.pop()),
    ] {
        match result {
            Err(RegistryError::Corrupt { detail }) => {
                assert!(
                    detail.contains("labels") && detail.contains("st-1"),
                    "{detail}"
                )
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    reg.close().await;
}

#[tokio::test]
async fn sqlite_creates_the_file_and_its_parent_directories() {
    // Relative to the working directory (the crate root under cargo and nextest).
    let dir = tempfile::Builder::new()
        .prefix(".registry-test-")
        .tempdir_in(".")
        .expect("temp dir in cwd");
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let relative = format!("{name}/nested/deeper/registry.db");
    let reg = Registry::open(&format!("sqlite:{relative}"))
        .await
        .expect("open relative");
    reg.insert_store(&record("st-1", "/d", "i", 1))
        .await
        .unwrap();
    reg.close().await;
    assert!(std::path::Path::new(&relative).is_file());

    let abs = tempfile::tempdir().unwrap();
    let file = abs.path().join("a/b/registry.db");
    let reg = Registry::open(&format!("sqlite://{}", file.display()))
        .await
        .expect("open abs");
    reg.close().await;
    assert!(file.is_file());
}

// ---- PostgreSQL only --------------------------------------------------------------------

#[tokio::test]
async fn postgres_instances_share_one_registry() {
    let Some(server) = postgres_server() else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    // Two instances starting at once: the migration is applied once, under its lock.
    let (a, b) = tokio::join!(Registry::open(&db.url), Registry::open(&db.url));
    let (a, b) = (a.expect("open a"), b.expect("open b"));

    let rec = record("st-1", "/data/1", "inst-a", 1);
    a.insert_store(&rec).await.unwrap();
    assert_eq!(b.get_store("st-1").await.unwrap(), Some(rec.clone()));
    assert_eq!(
        b.list_stores(Some("inst-a")).await.unwrap(),
        vec![rec.clone()]
    );

    // The other instance cannot register the same directory.
    match b
        .insert_store(&record("st-2", "/data/1", "inst-b", 2))
        .await
    {
        Err(RegistryError::AlreadyExists {
            what: "store_dir", ..
        }) => {}
        other => panic!("expected AlreadyExists store_dir, got {other:?}"),
    }
    b.record_audit(&audit(3, "refused", Some("st-2"), "refused"))
        .await
        .unwrap();
    a.record_audit(&audit(4, "register", Some("st-1"), "ok"))
        .await
        .unwrap();
    let log = b.audit_log(10).await.unwrap();
    assert_eq!(log.iter().map(|e| e.at_ms).collect::<Vec<_>>(), vec![4, 3]);

    b.report_health("inst-a", 5, &[("st-1".into(), "{}".into())])
        .await
        .unwrap();
    assert_eq!(a.all_health().await.unwrap().len(), 1);
    assert!(b.delete_store("st-1").await.unwrap());
    assert_eq!(a.get_store("st-1").await.unwrap(), None);
    assert!(a.all_health().await.unwrap().is_empty());

    // A third instance, later, finds the schema in place.
    let c = Registry::open(&db.url).await.expect("reopen");
    assert_eq!(c.audit_log(10).await.unwrap().len(), 2);
    for reg in [a, b, c] {
        reg.close().await;
    }
    db.drop_database().await;
}

#[tokio::test]
async fn unreachable_postgres_is_unavailable_and_names_the_host() {
    // A port nothing listens on: bind one, then let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://backup:s3cret-pw@127.0.0.1:{port}/fleet_registry");
    let started = std::time::Instant::now();
    let err = Registry::open(&url).await.unwrap_err();
    eprintln!("{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    let RegistryError::Unavailable { detail } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(detail.contains(&format!("127.0.0.1:{port}")), "{detail}");
    assert!(detail.contains("fleet_registry"), "{detail}");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains("s3cret"), "password leaked: {shown}");
    }
}

#[tokio::test]
async fn missing_postgres_database_is_unavailable_and_named() {
    let Some(server) = postgres_server() else {
        return;
    };
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path("no_such_registry_db");
    let err = Registry::open(url.as_str()).await.unwrap_err();
    eprintln!("{err}");
    let RegistryError::Unavailable { detail } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(detail.contains("no_such_registry_db"), "{detail}");
}

// ---- both, without a server -------------------------------------------------------------

#[tokio::test]
async fn bad_urls_are_refused() {
    let cases = [
        "",
        "registry.db",
        "mysql://u@h/db",
        "sqlite:",
        "sqlite://",
        "sqlite::memory:",
        "sqlite://?mode=memory",
        "sqlite:///tmp/x.db?mode=bogus",
        "postgres://u:hunter2@host:notaport/db",
    ];
    for url in cases {
        match Registry::open(url).await {
            Err(RegistryError::BadUrl { url: shown, reason }) => {
                assert!(!reason.is_empty());
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(!reason.contains("hunter2"), "{reason}");
            }
            other => panic!("{url:?}: expected BadUrl, got {other:?}"),
        }
    }
}

#[test]
fn tokens_hash_and_match() {
    let token = new_node_token();
    assert_eq!(token.len(), 64);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_ne!(token, new_node_token(), "fresh each time");

    let hash = hash_token(&token);
    assert_eq!(hash.len(), 64);
    assert_ne!(hash, token);
    assert_eq!(hash, hash_token(&token), "deterministic");
    // sha256("abc"), a published test vector.
    assert_eq!(
        hash_token("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );

    assert!(token_matches(&token, &hash));
    assert!(!token_matches(&new_node_token(), &hash), "wrong token");
    assert!(!token_matches(&token[..63], &hash), "truncated token");
    assert!(!token_matches(&token, &hash[..63]), "truncated hash");
    assert!(!token_matches(&token, ""), "empty hash");
    assert!(
        !token_matches(&token, &token),
        "the token is not its own hash"
    );
}

#[test]
fn store_record_debug_redacts_the_token_hash() {
    let rec = record("st-1", "/data/1", "inst-1", 1);
    let shown = format!("{rec:?}");
    assert!(!shown.contains(&rec.node_token_hash), "{shown}");
    assert!(shown.contains(&rec.node_token_hash[..8]), "{shown}");
    assert!(shown.contains("/data/1"), "{shown}");
}

/// A registry that another writer holds past the busy timeout answers `Unavailable` (retry
/// later), not a database error that the service would report as its own bug.
#[tokio::test(flavor = "multi_thread")]
async fn a_registry_held_by_another_writer_is_unavailable_not_an_error() {
    let (_dir, url, reg) = sqlite_registry().await;
    let path = url.trim_start_matches("sqlite://");
    let mut other = sqlx::SqliteConnection::connect(&format!("sqlite://{path}"))
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .unwrap();
    let err = reg
        .insert_store(&record("st-1", "/r/a", "i", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::Unavailable { ref detail } if detail.contains("busy")),
        "{err:?}"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    reg.insert_store(&record("st-1", "/r/a", "i", 1))
        .await
        .expect("once the other writer is gone");
}

/// An endpoint's rates keep the recent samples they were fitted to (migration 11), on both
/// backends.
async fn rates_keep_their_recent_samples(reg: &Registry) {
    let kept = KeptRates {
        download_bytes_per_second: 7e8,
        first_byte_seconds: 0.01,
        decode_bytes_per_second: 9e8,
        check_bytes_per_second: 3e9,
        fixed_seconds: 0.05,
        samples: 3,
        updated_at_ms: 1,
        recent: r#"[{"shape":{"objects":4,"stored_bytes":1,"plain_bytes":1,"plain_encoded_bytes":0,"plain_cut_bytes":0},"parallelism":16,"seconds":0.2}]"#.into(),
    };
    reg.set_rates("s3://b@e", &kept).await.unwrap();
    let again = KeptRates {
        samples: 4,
        ..kept.clone()
    };
    reg.set_rates("s3://b@e", &again).await.unwrap();
    let all = reg.all_rates().await.unwrap();
    assert_eq!(all["s3://b@e"], KeptRates { samples: 4, ..kept });
}

#[tokio::test]
async fn rates_keep_their_recent_samples_on_sqlite() {
    let (_dir, _url, reg) = sqlite_registry().await;
    rates_keep_their_recent_samples(&reg).await;
}

#[tokio::test]
async fn rates_keep_their_recent_samples_on_postgres() {
    let Some(server) = postgres_server() else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let reg = Registry::open(&db.url).await.expect("open");
    rates_keep_their_recent_samples(&reg).await;
    reg.close().await;
    db.drop_database().await;
}

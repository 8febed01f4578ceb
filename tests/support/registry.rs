//! Registries for tests: a fresh SQLite file, or a fresh database on the PostgreSQL server
//! `MUSHROOM_TEST_POSTGRES_URL` names (`scripts/test.sh` starts one). Without that variable the
//! PostgreSQL tests print a SKIP line and pass, except under `CI=true`, where they fail.
//! [`both_backends!`](crate::both_backends) makes one test per backend of each suite function.

use std::future::Future;

use mushroom_backup::registry::Registry;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

const POSTGRES_ENV: &str = "MUSHROOM_TEST_POSTGRES_URL";

// ---- backends ---------------------------------------------------------------------------

/// A fresh SQLite registry in a temp dir (removed when the guard drops), and its URL.
pub async fn sqlite_registry() -> (tempfile::TempDir, String, Registry) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/registry.db", dir.path().display());
    let reg = Registry::open(&url).await.expect("open sqlite registry");
    assert_eq!(reg.kind(), "sqlite");
    (dir, url, reg)
}

/// The PostgreSQL server for tests, or `None` after a SKIP line (a panic under `CI=true`).
pub fn postgres_server() -> Option<String> {
    if let Ok(url) = std::env::var(POSTGRES_ENV) {
        return Some(url);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("PostgreSQL tests need a server: run scripts/test.sh (or set {POSTGRES_ENV})");
    }
    eprintln!("SKIP: no PostgreSQL (run scripts/test.sh, or set {POSTGRES_ENV})");
    None
}

/// A database of its own on the test server, so tests can run in parallel.
pub struct PgDatabase {
    server: String,
    name: String,
    pub url: String,
}

impl PgDatabase {
    pub async fn create(server: &str) -> PgDatabase {
        let name = format!("registry_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(server)
            .await
            .expect("connect to test server");
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .expect("create test database");
        admin.close().await.ok();
        let mut url = url::Url::parse(server).expect("test server URL parses");
        url.set_path(&name);
        PgDatabase {
            server: server.to_string(),
            url: url.to_string(),
            name,
        }
    }

    /// Drops the database (after the test closed its registries). Skipped when a test fails,
    /// which leaves the database for a look; the throwaway server goes with the run anyway.
    pub async fn drop_database(self) {
        let mut admin = PgConnection::connect(&self.server).await.expect("connect");
        let sql = format!("DROP DATABASE \"{}\" WITH (FORCE)", self.name);
        sqlx::query(AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("drop test database");
        admin.close().await.ok();
    }
}

/// Runs `suite` against a fresh SQLite registry.
pub async fn on_sqlite<F, Fut>(suite: F)
where
    F: FnOnce(Registry) -> Fut,
    Fut: Future<Output = ()>,
{
    let (_dir, _url, reg) = sqlite_registry().await;
    suite(reg.clone()).await;
    reg.close().await;
}

/// Runs `suite` against a fresh PostgreSQL database, if there is a server.
pub async fn on_postgres<F, Fut>(suite: F)
where
    F: FnOnce(Registry) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(server) = postgres_server() else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let reg = Registry::open(&db.url)
        .await
        .expect("open postgres registry");
    assert_eq!(reg.kind(), "postgres");
    suite(reg.clone()).await;
    reg.close().await;
    db.drop_database().await;
}

/// `name` as two tests, `sqlite::name` and `postgres::name`, each running `suite(registry)`.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                $crate::support::registry::on_sqlite(super::suite::$name).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                $crate::support::registry::on_postgres(super::suite::$name).await;
            })*
        }
    };
}

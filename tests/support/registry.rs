//! Registries for tests: a fresh SQLite file, or a fresh database on the PostgreSQL server
//! `MUSHROOM_TEST_POSTGRES_URL` names (`scripts/test.sh` starts one). Without that variable the
//! PostgreSQL tests print a SKIP line and pass, except under `CI=true`, where they fail.
//! [`both_backends!`](crate::both_backends) makes one test per backend of each suite function.

use std::future::Future;

use mushroom_backup::registry::Registry;

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
pub use super::postgres::server as postgres_server;

/// A database of its own on the test server, so tests can run in parallel.
pub struct PgDatabase;

impl PgDatabase {
    pub async fn create(server: &str) -> super::postgres::Database {
        super::postgres::Database::create(server, "registry_test").await
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

//! The PostgreSQL server of a test run (`MUSHROOM_TEST_POSTGRES_URL`, which `scripts/test.sh`
//! sets), and a fresh database on it per test so tests run in parallel.
//!
//! Without the variable a test prints a SKIP line and passes, except under `CI=true`, where it
//! fails: a missing PostgreSQL must not pass CI.

use sqlx::{AssertSqlSafe, Connection, PgConnection};

pub const POSTGRES_ENV: &str = "MUSHROOM_TEST_POSTGRES_URL";

/// The test server's URL, or `None` after a SKIP line (a panic under `CI=true`).
pub fn server() -> Option<String> {
    if let Ok(url) = std::env::var(POSTGRES_ENV) {
        return Some(url);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("PostgreSQL tests need a server: run scripts/test.sh (or set {POSTGRES_ENV})");
    }
    eprintln!("SKIP: no PostgreSQL (run scripts/test.sh, or set {POSTGRES_ENV})");
    None
}

/// A database of one test's own on the test server.
pub struct Database {
    server: String,
    name: String,
    pub url: String,
}

impl Database {
    /// Creates a database named `<prefix>_<uuid>` on `server`.
    pub async fn create(server: &str, prefix: &str) -> Database {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(server)
            .await
            .expect("connect to the test server");
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        admin.close().await.ok();
        let mut url = url::Url::parse(server).expect("the test server URL parses");
        url.set_path(&name);
        Database {
            server: server.to_string(),
            url: url.to_string(),
            name,
        }
    }

    /// Drops the database (with its connections). Not called when a test fails, which leaves
    /// it for a look; the throwaway server goes with the run anyway.
    pub async fn drop_database(self) {
        let mut admin = PgConnection::connect(&self.server).await.expect("connect");
        let sql = format!("DROP DATABASE \"{}\" WITH (FORCE)", self.name);
        sqlx::query(AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("drop the test database");
        admin.close().await.ok();
    }
}

//! What the soaks share: how many rounds (`SOAK_ROUNDS`), and whether the store is encrypted
//! (`SOAK_KEY=1`: every process of the soak that reads or writes the bucket, `serve`, the
//! standby, `promote` and `restore`, gets one fresh key file through
//! `MUSHROOMDB_BACKUP_ENCRYPTION_KEY_FILE`). The reference node's values are random bytes
//! (incompressible), so `SOAK_KEY=1` is the mode security review 4's finding 1 broke: sealed
//! segments longer than their range.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::binary;

/// The variable every process reads its key file from.
pub const KEY_ENV: &str = "MUSHROOMDB_BACKUP_ENCRYPTION_KEY_FILE";

/// `SOAK_ROUNDS`, or `default`.
pub fn rounds(default: u32) -> u32 {
    std::env::var("SOAK_ROUNDS")
        .ok()
        .map(|r| r.parse().expect("SOAK_ROUNDS: a number"))
        .unwrap_or(default)
}

/// The soak's key file when `SOAK_KEY=1`: made once per test process (`key new`, mode 0600),
/// kept in a directory that lives as long as the process.
pub fn key() -> Option<&'static PathBuf> {
    static KEY: OnceLock<Option<PathBuf>> = OnceLock::new();
    KEY.get_or_init(|| {
        if std::env::var("SOAK_KEY").is_ok_and(|v| v == "1") {
            let dir = tempfile::tempdir().unwrap().keep();
            let path = dir.join("soak.key");
            let mut new = binary::command("http://unused.invalid");
            new.args(["key", "new"]);
            let key = binary::run_ok("key new", new, Duration::from_secs(30));
            std::fs::write(&path, key).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            Some(path)
        } else {
            None
        }
    })
    .as_ref()
}

/// `cmd` with the soak's key file, if it has one.
pub fn keyed(mut cmd: Command) -> Command {
    if let Some(path) = key() {
        cmd.env(KEY_ENV, path);
    }
    cmd
}

/// How the store is kept, for `FIGURE` lines: `encrypted (key file)` or `plain`.
pub fn mode() -> &'static str {
    if key().is_some() {
        "encrypted (key file), incompressible values"
    } else {
        "plain, incompressible values"
    }
}

/// With a key: a restore of `url` without it must fail (the soak really was encrypted).
pub fn assert_encrypted(endpoint: &str, url: &str) {
    if key().is_none() {
        return;
    }
    let into = tempfile::tempdir().unwrap();
    let mut cmd = binary::command(endpoint);
    cmd.env_remove(KEY_ENV)
        .args(["restore", "--from", url, "--json", "--to"])
        .arg(into.path().join("r"));
    let mut child = binary::Running::spawn("restore without the key", cmd);
    let status = child.wait_exit(Duration::from_secs(60));
    assert!(
        !status.success(),
        "a restore without the key succeeded: the soak's store is not encrypted"
    );
}

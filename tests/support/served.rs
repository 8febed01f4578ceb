//! `mushroom-backup serve` as a child of a test ([`super::binary::Running`]), configured by
//! the environment (`super::serve` is its twin configured by flags): on
//! 127.0.0.1:0 with a temp data dir, its SQLite registry and one allowed root, configured
//! only by what the test passes (every `MUSHROOMDB_BACKUP_*` variable of the test run is
//! removed). [`start`] waits for its `{"listening": …}` line; [`refused`] for it to fail.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::binary::{self, Running, Stream};

/// Generous: the machine running the tests may be busy.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The directories of one test's service.
pub struct Dirs {
    _tmp: tempfile::TempDir,
    /// The (canonical) temp directory holding the others.
    pub base: PathBuf,
    pub data: PathBuf,
    /// The allowed root (canonical).
    pub root: PathBuf,
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    let data = base.join("data");
    let root = base.join("stores");
    std::fs::create_dir_all(&root).unwrap();
    Dirs {
        _tmp: tmp,
        base,
        data,
        root,
    }
}

/// `serve --data-dir … --allow-root …` on 127.0.0.1:0 (by its variable: a `--listen` wins).
pub fn command(d: &Dirs) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("MUSHROOMDB_BACKUP_") && name != "MUSHROOMDB_BACKUP_LOG" {
            cmd.env_remove(name);
        }
    }
    cmd.env("MUSHROOMDB_BACKUP_LISTEN", "127.0.0.1:0")
        .args(["serve", "--data-dir"])
        .arg(&d.data)
        .arg("--allow-root")
        .arg(&d.root);
    cmd
}

/// Spawns `cmd` and waits for its listening line: the child and the address it listens on.
pub fn start(name: &str, cmd: Command) -> (Running, SocketAddr) {
    let mut child = Running::spawn(name, cmd);
    let addr = child.wait_for("print its listening line", DEADLINE, |line| {
        if line.stream != Stream::Stdout {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&line.text).ok()?;
        v["listening"].as_str()?.parse().ok()
    });
    (child, addr)
}

/// Spawns `cmd`, which must fail to start: its stderr.
pub fn refused(name: &str, cmd: Command) -> String {
    let mut child = Running::spawn(name, cmd);
    let status = child.wait_exit(DEADLINE);
    if status.success() {
        child.fail("started (or exited 0), but should have refused to start");
    }
    child
        .seen()
        .iter()
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| format!("{}\n", l.text))
        .collect()
}

/// Every line the child printed on stderr so far.
pub fn stderr(child: &Running) -> String {
    child
        .seen()
        .iter()
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| format!("{}\n", l.text))
        .collect()
}

/// Waits until the child has printed a line on stderr containing every one of `words`
/// (checking what it printed already first).
pub fn wait_logged(child: &mut Running, words: &[&str]) {
    let has = |text: &str| words.iter().all(|w| text.contains(w));
    if child
        .seen()
        .iter()
        .any(|l| l.stream == Stream::Stderr && has(&l.text))
    {
        return;
    }
    child.wait_for(&format!("log {words:?}"), DEADLINE, |l| {
        (l.stream == Stream::Stderr && has(&l.text)).then_some(())
    });
}

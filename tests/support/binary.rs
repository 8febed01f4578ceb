//! The `mushroom-backup` binary as a child of a test, for tests that run real processes.
//!
//! [`Running`] spawns a command with both output streams piped; one reader thread per stream
//! feeds every line, as it arrives, into a channel and into a captured log, so a test waits for
//! what a child *says* ([`Running::wait_for`], [`Running::wait_for_health`]) with a deadline,
//! never for a guessed time. Every wait that runs out panics naming what it waited for, with the
//! child's captured output. A `Running` that is dropped while its child lives kills it
//! (SIGKILL) and reaps it, so a failing test leaves no process behind; if the test is panicking
//! it also prints the child's output, so a failure shows every child's side of the story.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mushroom-backup");

/// What the children log unless `MUSHROOMDB_BACKUP_LOG` says otherwise: every step, so a
/// failure's output tells what each process was doing when.
const LOG: &str = "warn,mushroom_backup=debug";

/// How many captured lines a failure message shows (the last ones).
const SHOWN_LINES: usize = 200;

/// A command running the binary against the S3 endpoint `endpoint` (moto, or a proxy in front
/// of it): explicit region and dummy credentials, nothing from the user's AWS configuration;
/// logging as [`LOG`].
pub fn command(endpoint: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_CONFIG_FILE")
        .env_remove("AWS_SHARED_CREDENTIALS_FILE")
        .env(
            "MUSHROOMDB_BACKUP_LOG",
            std::env::var("MUSHROOMDB_BACKUP_LOG").unwrap_or_else(|_| LOG.to_string()),
        );
    cmd
}

/// Makes the child run under `umask` (set between fork and exec), as a shell's `umask 022;
/// exec …` would: what the modes the binary gives its files are measured against.
pub fn with_umask(cmd: &mut Command, umask: libc::mode_t) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: `umask` is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(umask);
            Ok(())
        })
    }
}

/// Which stream of the child a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line a child printed, and when the test read it.
#[derive(Debug, Clone)]
pub struct Line {
    pub stream: Stream,
    pub text: String,
    pub at: Instant,
}

impl Line {
    /// The address a `serve` prints on stdout once it listens: `{"listening": ADDR, …}`.
    pub fn listening(&self) -> Option<String> {
        if self.stream != Stream::Stdout {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&self.text).ok()?;
        v["listening"].as_str().map(str::to_string)
    }

    /// The address a `serve --metrics-listen` logs on stderr once it serves `/metrics`
    /// (`serving Prometheus metrics on /metrics … addr=ADDR`).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        if self.stream != Stream::Stderr
            || !self.text.contains("serving Prometheus metrics on /metrics")
        {
            return None;
        }
        let (_, rest) = self.text.split_once("addr=")?;
        let a: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
            .collect();
        Some(
            a.parse().unwrap_or_else(|e| {
                panic!("a metrics address that does not parse ({e}): {self:?}")
            }),
        )
    }

    /// The health record of a follower's `health {json}` line on stderr.
    pub fn health(&self) -> Option<Health> {
        let json = self.text.strip_prefix("health ")?;
        if self.stream != Stream::Stderr {
            return None;
        }
        Some(
            serde_json::from_str(json)
                .unwrap_or_else(|e| panic!("a health line that does not parse ({e}): {json}")),
        )
    }
}

/// What a follower prints on every change of health (`backup` without `--once`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Health {
    /// `primary` or `replica` (`backup --replica`); empty from a binary that did not say.
    #[serde(default)]
    pub destination: String,
    pub healthy: bool,
    pub reason: String,
    pub lease_holder: String,
    pub lease_held: bool,
    pub durable_commit_seq: u64,
    pub shipped_commit_seq: u64,
    pub restore_point_commit_seq: u64,
    pub objects_shipped: u64,
    pub notes: Vec<String>,
}

/// A running child; see the module docs.
pub struct Running {
    name: String,
    child: Child,
    lines: Receiver<Line>,
    /// Every line read from the channel so far, in order.
    seen: Vec<Line>,
    /// Everything the reader threads read, both streams, as `[stream] line`.
    log: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl Running {
    /// Spawns `cmd` (stdin closed, both output streams read line by line).
    pub fn spawn(name: &str, mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: cannot spawn {cmd:?}: {e}"));
        let (tx, rx) = channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let readers = vec![
            read_lines(stdout, Stream::Stdout, tx.clone(), log.clone()),
            read_lines(stderr, Stream::Stderr, tx, log.clone()),
        ];
        Running {
            name: name.to_string(),
            child,
            lines: rx,
            seen: Vec::new(),
            log,
            readers,
            status: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line, waiting at most until `deadline`; `None` at the deadline, or when both
    /// streams are closed and every line was read.
    pub fn next_line(&mut self, deadline: Instant) -> Option<Line> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => {
                self.seen.push(line.clone());
                Some(line)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Reads lines until `f` returns `Some` for one; panics, naming `what` and showing the
    /// child's output, when `within` passes first or the child closes its streams.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&Line) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + within;
        loop {
            match self.next_line(deadline) {
                Some(line) => {
                    if let Some(t) = f(&line) {
                        return t;
                    }
                }
                None if Instant::now() >= deadline => {
                    self.fail(&format!("did not {what} within {within:?}"))
                }
                None => self.fail(&format!("closed its output before it would {what}")),
            }
        }
    }

    /// [`Running::wait_for`] on health lines: the first for which `f` holds, and when it was
    /// read.
    pub fn wait_for_health(
        &mut self,
        what: &str,
        within: Duration,
        mut f: impl FnMut(&Health) -> bool,
    ) -> (Health, Instant) {
        self.wait_for(what, within, |line| {
            line.health().filter(|h| f(h)).map(|h| (h, line.at))
        })
    }

    /// Reads every line until `deadline`, passing each health record to `check` (which panics
    /// on what must not happen); returns early if the child closes its streams.
    pub fn watch_until(&mut self, deadline: Instant, mut check: impl FnMut(&Health)) {
        while let Some(line) = self.next_line(deadline) {
            if let Some(h) = line.health() {
                check(&h);
            }
        }
    }

    /// Every line read so far.
    pub fn seen(&self) -> &[Line] {
        &self.seen
    }

    /// Every health record read so far.
    pub fn healths(&self) -> Vec<Health> {
        self.seen.iter().filter_map(Line::health).collect()
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the child.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        assert!(
            self.status.is_none(),
            "{}: signalled after it was reaped",
            self.name
        );
        // SAFETY: kill(2) on the pid of our own child, which is not reaped yet (`status` is
        // None until we wait for it), so the pid cannot have been reused.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "{}: kill({pid}, {signal}): {}",
            self.name,
            std::io::Error::last_os_error()
        );
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        self.wait_exit(Duration::from_secs(10))
    }

    /// Waits for the child to exit, then for both streams to be read to their end; panics with
    /// the child's output when `within` passes first.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let deadline = Instant::now() + within;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    // Read meanwhile, so that a chatty child never blocks on a full pipe.
                    self.next_line(Instant::now() + Duration::from_millis(10));
                }
                Ok(None) => self.fail(&format!("did not exit within {within:?}")),
                Err(e) => self.fail(&format!("cannot wait for it: {e}")),
            }
        };
        self.status = Some(status);
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        while self.next_line(Instant::now()).is_some() {}
        status
    }

    /// The exit status once the child has exited (its streams then read to their end), or
    /// `None` while it runs.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() && !matches!(self.child.try_wait(), Ok(Some(_))) {
            self.next_line(Instant::now() + Duration::from_millis(10));
            return None;
        }
        Some(self.wait_exit(Duration::from_secs(10)))
    }

    /// Everything the child printed on stderr, once it has exited.
    pub fn stderr(&self) -> String {
        assert!(self.status.is_some(), "{}: stderr before exit", self.name);
        let mut out = String::new();
        for line in self.seen.iter().filter(|l| l.stream == Stream::Stderr) {
            out.push_str(&line.text);
            out.push('\n');
        }
        out
    }

    /// Everything the child printed on stdout, once it has exited.
    pub fn stdout(&self) -> String {
        assert!(self.status.is_some(), "{}: stdout before exit", self.name);
        let mut out = String::new();
        for line in self.seen.iter().filter(|l| l.stream == Stream::Stdout) {
            out.push_str(&line.text);
            out.push('\n');
        }
        out
    }

    /// The last [`SHOWN_LINES`] lines the child printed.
    pub fn output(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let skip = log.len().saturating_sub(SHOWN_LINES);
        let mut out = if skip > 0 {
            format!("  ... ({skip} earlier lines)\n")
        } else {
            String::new()
        };
        for line in &log[skip..] {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// Panics with `msg` and the child's output.
    pub fn fail(&self, msg: &str) -> ! {
        panic!(
            "{} (pid {}) {msg}; its output:\n{}",
            self.name,
            self.child.id(),
            self.output()
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- {} (pid {}) printed:\n{}",
                self.name,
                self.child.id(),
                self.output()
            );
        }
    }
}

fn read_lines(
    stream: impl Read + Send + 'static,
    kind: Stream,
    tx: Sender<Line>,
    log: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let tag = match kind {
            Stream::Stdout => "out",
            Stream::Stderr => "err",
        };
        for line in BufReader::new(stream).lines() {
            let Ok(text) = line else { return };
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("[{tag}] {text}"));
            // The receiver is gone when the test is over: keep draining the pipe anyway.
            let _ = tx.send(Line {
                stream: kind,
                text,
                at: Instant::now(),
            });
        }
    })
}

/// Runs a command to its end (at most `within`) and returns its stdout; panics, with its
/// output, when it fails or runs out of time.
pub fn run_ok(name: &str, cmd: Command, within: Duration) -> String {
    let mut child = Running::spawn(name, cmd);
    let status = child.wait_exit(within);
    if !status.success() {
        child.fail(&format!("failed ({status})"));
    }
    child.stdout()
}

/// The stdout of the finished run `o` of `args`, which must have exited 0 (else a panic
/// naming `args`, with its stderr).
pub fn succeeded(args: &[&str], o: Output) -> String {
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `backup --store STORE --to URL --once EXTRA…` against the S3 endpoint `endpoint`.
pub fn backup_once(endpoint: &str, store: &Path, to: &str, extra: &[&str]) -> Command {
    let mut cmd = command(endpoint);
    cmd.arg("backup")
        .arg("--store")
        .arg(store)
        .args(["--to", to, "--once"])
        .args(extra);
    cmd
}

/// How a follower is configured (through the environment, as an operator would).
#[derive(Debug, Clone)]
pub struct FollowSettings {
    pub lease_ttl: Duration,
    pub wal_interval: Duration,
    pub restore_point_interval: Duration,
}

/// `backup --store STORE --to URL` without `--once`: follows the store under the bucket lease
/// until SIGINT/SIGTERM.
pub fn follower(endpoint: &str, store: &Path, to: &str, s: &FollowSettings) -> Command {
    let mut cmd = command(endpoint);
    cmd.arg("backup")
        .arg("--store")
        .arg(store)
        .args(["--to", to])
        .env("MUSHROOMDB_BACKUP_LEASE_TTL_MS", ms(s.lease_ttl))
        .env("MUSHROOMDB_BACKUP_WAL_INTERVAL_MS", ms(s.wal_interval))
        .env(
            "MUSHROOMDB_BACKUP_RESTORE_POINT_INTERVAL_MS",
            ms(s.restore_point_interval),
        );
    cmd
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

/// `store write DIR --commits N` (as fast as it can, seed 0), to its end.
pub fn write_store(dir: &Path, commits: u64) {
    let mut cmd = command("http://unused.invalid");
    cmd.args(["store", "write"])
        .arg(dir)
        .args(["--commits", &commits.to_string()]);
    run_ok("store write", cmd, Duration::from_secs(120));
}

/// `store write DIR --commits N --rate R` (seed 0), stopped by SIGTERM before N if need be.
pub fn writer(store: &Path, commits: u64, rate: u32) -> Command {
    let mut cmd = command("http://unused.invalid");
    cmd.args(["store", "write"])
        .arg(store)
        .args(["--commits", &commits.to_string()])
        .args(["--rate", &rate.to_string()]);
    cmd
}

/// A store (`store` in a fresh temp dir) with a first commit, and a writer committing into it
/// at `rate` commits a second until told to stop: the temp dir, the store and the writer.
pub fn store_being_written(rate: u32) -> (tempfile::TempDir, PathBuf, Running) {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let store = tmp.path().join("store");
    run_ok(
        "store write (first commit)",
        writer(&store, 1, 1000),
        Duration::from_secs(30),
    );
    let writer = Running::spawn("writer", writer(&store, 1_000_000, rate));
    (tmp, store, writer)
}

/// `store digest DIR`: `{"commit_seq": N, "digest": "..."}`.
pub fn store_digest(store: &Path) -> serde_json::Value {
    let mut cmd = command("http://unused.invalid");
    cmd.args(["store", "digest"]).arg(store);
    json(&run_ok("store digest", cmd, Duration::from_secs(30)))
}

/// `restore --from URL --to DIR --follow --json` (a standby) with the given poll intervals.
pub fn standby(endpoint: &str, from: &str, dir: &Path, poll_ms: u64, idle_ms: u64) -> Command {
    let mut cmd = command(endpoint);
    cmd.args(["restore", "--from", from, "--follow", "--json", "--to"])
        .arg(dir)
        .args(["--poll-interval-ms", &poll_ms.to_string()])
        .args(["--idle-poll-interval-ms", &idle_ms.to_string()]);
    cmd
}

/// Restores `from` into the empty directory `into` and returns the restored store's digest.
pub fn restore_digest(endpoint: &str, from: &str, into: &Path) -> serde_json::Value {
    let mut cmd = command(endpoint);
    cmd.args(["restore", "--from", from, "--json", "--to"])
        .arg(into);
    run_ok("restore", cmd, Duration::from_secs(60));
    store_digest(into)
}

/// What `verify` found, once it has passed.
#[derive(Debug, Clone)]
pub struct Verified {
    pub manifests: Vec<String>,
    /// The manifest LATEST names, if there is a LATEST.
    pub latest: Option<String>,
}

/// `verify --from URL --json`: panics unless every manifest verifies and LATEST (when there
/// is one) verifies and names one of them.
pub fn verify_ok(endpoint: &str, from: &str, context: &str) -> Verified {
    let mut cmd = command(endpoint);
    cmd.args(["verify", "--from", from, "--json"]);
    let mut child = Running::spawn(&format!("verify ({context})"), cmd);
    let status = child.wait_exit(Duration::from_secs(60));
    let out = child.stdout();
    let report: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| child.fail(&format!("printed no JSON report ({e}): {out}")));
    if !status.success() || report["ok"] != true {
        child.fail(&format!("found problems ({status}): {report:#}"));
    }
    let manifests: Vec<String> = report["manifests"]
        .as_array()
        .unwrap_or_else(|| child.fail(&format!("no manifests array: {report}")))
        .iter()
        .map(|m| {
            assert_eq!(m["ok"], true, "{context}: manifest {m} does not verify");
            m["key"].as_str().expect("a manifest key").to_string()
        })
        .collect();
    let latest = match &report["latest"] {
        serde_json::Value::Null => None,
        l => {
            assert_eq!(l["ok"], true, "{context}: LATEST does not verify: {l}");
            let named = l["manifest"]
                .as_str()
                .unwrap_or_else(|| panic!("{context}: LATEST names no manifest: {l}"));
            assert!(
                manifests.iter().any(|m| m == named),
                "{context}: LATEST names {named}, which is not among the manifests {manifests:?}"
            );
            Some(named.to_string())
        }
    };
    Verified { manifests, latest }
}

/// Parses one JSON line (a command's report).
pub fn json(out: &str) -> serde_json::Value {
    let line = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {out}"))
}

/// Waits (within `within`) until `child`, a backing-up process logging its steps, says it
/// shipped a commit above `commit_seq` (`step outcome=Shipped … shipped_commit_seq: N`).
pub fn wait_shipped_past(child: &mut Running, commit_seq: u64, within: Duration) {
    child.wait_for(&format!("ship a commit above {commit_seq}"), within, |l| {
        let (_, rest) = l.text.split_once("step outcome=Shipped")?;
        let (_, seq) = rest.split_once("shipped_commit_seq: ")?;
        let seq: u64 = seq
            .trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()?;
        (seq > commit_seq).then_some(())
    });
}

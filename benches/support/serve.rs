//! What the `serve` benchmarks share: the release binary's `serve` as a child process, and the
//! server's counters from /proc (CPU ticks, context switches, syscalls, memory), and the
//! reference-engine stores they register.
//!
//! Included by `#[path]` (benches have no library of their own), so not every bench uses every
//! item.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// `name` parsed from the environment, or `default` when it is not set.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

/// The `serve` process; killed when dropped (a benchmark that fails leaves nothing running).
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// Starts `serve` on port 0 (`MUSHROOM_BACKUP_BIN`, else this build's binary) with its
    /// stderr in `log`, and waits for its listening line.
    pub fn start(
        data_dir: &Path,
        root: &Path,
        log: &Path,
        extra_args: &str,
    ) -> anyhow::Result<Server> {
        Self::start_with_env(data_dir, root, log, extra_args, &[])
    }

    /// [`Server::start`] with variables `env` set for the server.
    pub fn start_with_env(
        data_dir: &Path,
        root: &Path,
        log: &Path,
        extra_args: &str,
        env: &[(&'static str, String)],
    ) -> anyhow::Result<Server> {
        let binary = std::env::var_os("MUSHROOM_BACKUP_BIN").map_or_else(
            || env!("CARGO_BIN_EXE_mushroom-backup").into(),
            PathBuf::from,
        );
        let mut child = Command::new(binary)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .arg("--allow-root")
            .arg(root)
            .args(extra_args.split_whitespace())
            .env("MUSHROOMDB_BACKUP_LOG", "warn,mushroom_backup=info")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("start mushroom-backup serve")?;
        // The one JSON line on stdout once it listens; EOF if it exits first.
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let started: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                let _ = child.kill();
                bail!(
                    "serve did not print its listening line; its log:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
        };
        let addr = started["listening"]
            .as_str()
            .context("no listening address")?
            .to_string();
        Ok(Server { child, addr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and waits for the exit: a crash, nothing flushed or released.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM, then waits (every store flushes first): the exit status and how long it
    /// took, or `None` if it is still running after `timeout` (then it is killed on drop).
    pub async fn stop(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<Option<(std::process::ExitStatus, Duration)>> {
        let t = Instant::now();
        // SAFETY: plain kill(2) of our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        while t.elapsed() < timeout {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some((status, t.elapsed())));
            }
            // Async: the runtime must stay free to answer the server's GOAWAY.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(None)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of a log file, for a failure report.
pub fn log_tail(log: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// Counters of one process (or one of its threads) from /proc.
#[derive(Debug, Clone, Default)]
pub struct ProcSample {
    pub cpu_ticks: u64,
    pub ctx_switches: u64,
}

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// CPU between two samples `secs` apart, as % of one core.
pub fn cpu_pct(before: &ProcSample, after: &ProcSample, secs: f64) -> f64 {
    after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / clock_ticks() / secs * 100.0
}

/// utime + stime (fields 14 and 15) of a /proc `stat` file, and its command name.
fn stat_ticks(path: &Path) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (head, rest) = text.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

fn status_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let (_, cpu_ticks) =
        stat_ticks(&PathBuf::from(format!("/proc/{pid}/stat"))).context("read /proc/PID/stat")?;
    let mut ctx_switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else {
            continue;
        };
        ctx_switches += status_field(&status, "voluntary_ctxt_switches:").unwrap_or(0)
            + status_field(&status, "nonvoluntary_ctxt_switches:").unwrap_or(0);
    }
    Ok(ProcSample {
        cpu_ticks,
        ctx_switches,
    })
}

/// CPU ticks by thread name (tokio workers, blocking-pool threads, …).
pub fn ticks_by_thread(pid: u32) -> BTreeMap<String, (usize, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Some((name, ticks)) = stat_ticks(&task.path().join("stat")) {
            let e = out.entry(name).or_insert((0, 0));
            e.0 += 1;
            e.1 += ticks;
        }
    }
    out
}

/// Prints CPU by thread name between two [`ticks_by_thread`] readings `secs` apart.
pub fn print_cpu_by_thread(
    before: &BTreeMap<String, (usize, u64)>,
    after: &BTreeMap<String, (usize, u64)>,
    secs: f64,
) {
    for (name, (count, ticks)) in after {
        let earlier = before.get(name).map_or(0, |t| t.1);
        let pct = ticks.saturating_sub(earlier) as f64 / clock_ticks() / secs * 100.0;
        println!("    {name:<20} x{count:<4} {pct:>6.2} %");
    }
}

/// `syscr` and `syscw` of /proc/PID/io.
pub fn syscalls(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    (
        status_field(&text, "syscr:").unwrap_or(0),
        status_field(&text, "syscw:").unwrap_or(0),
    )
}

/// `VmRSS` and `VmHWM` in MiB, and the thread count.
pub fn memory(pid: u32) -> anyhow::Result<(f64, f64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |k| status_field(&text, k).unwrap_or(0) as f64;
    Ok((
        kib("VmRSS:") / 1024.0,
        kib("VmHWM:") / 1024.0,
        status_field(&text, "Threads:").unwrap_or(0),
    ))
}

pub fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "MISSED" }
}

/// Appends `commits` workload commits to every store in `dirs`, four writers at a time.
pub fn append_commits(dirs: &[PathBuf], commits: u64) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let workers: Vec<_> = dirs
            .chunks(dirs.len().div_ceil(4).max(1))
            .map(|chunk| {
                s.spawn(move || -> anyhow::Result<()> {
                    for (i, dir) in chunk.iter().enumerate() {
                        let opts = mushroom_backup::store::engine::WriteOptions {
                            commits,
                            seed: i as u64,
                            ..Default::default()
                        };
                        mushroom_backup::store::engine::write_commits(dir, &opts)
                            .with_context(|| format!("write {}", dir.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a writer thread panicked"))
    })?;
    Ok(())
}

/// Runs `cmd` to its end; fails with its stderr if it fails. Returns its stdout.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A client of the bench's S3 server (`test`/`test`, path-style): what moto and SeaweedFS take.
pub fn s3_client(endpoint: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "test", "test", None, None, "bench",
        ))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

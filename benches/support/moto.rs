//! The `moto_server` of the crate's `.venv` for benches: started on a free loopback port,
//! its request log in a file (so requests are counted at the server), killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

pub struct Moto {
    pub child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Moto {
    pub fn start(log: &Path) -> anyhow::Result<Moto> {
        let moto = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
        ensure!(
            moto.exists(),
            "{} is missing: run scripts/test.sh once (it creates .venv with moto)",
            moto.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(&moto)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("start {}", moto.display()))?;
        let m = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log: log.to_path_buf(),
        };
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t.elapsed() > Duration::from_secs(60) {
                bail!("moto_server did not answer on port {port}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(m)
    }

    /// The request lines of its log so far (`"PUT /bench/… HTTP/1.1" 200 -`). Its server
    /// colours the lines of statuses other than 200 (a ranged GET's 206, a 404) with ANSI
    /// escapes inside the quotes, so those are stripped first.
    pub fn request_lines(&self) -> Vec<String> {
        request_lines_of(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// The length of its log so far: an offset for [`Moto::request_lines_in`], taken without
    /// reading the log (a moment that must not wait for a read of a long log).
    #[allow(dead_code)] // as the next: not every bench including this file reads by offset
    pub fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// [`Moto::request_lines`] of the log's bytes `range` (offsets from [`Moto::log_len`]).
    #[allow(dead_code)]
    pub fn request_lines_in(&self, range: std::ops::Range<u64>) -> Vec<String> {
        let log = std::fs::read(&self.log).unwrap_or_default();
        let end = usize::try_from(range.end).map_or(log.len(), |e| e.min(log.len()));
        let start = usize::try_from(range.start).map_or(end, |s| s.min(end));
        request_lines_of(&String::from_utf8_lossy(&log[start..end]))
    }
}

/// The request lines of `log`'s text, ANSI escapes stripped.
fn request_lines_of(log: &str) -> Vec<String> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains(" HTTP/1.1\" "))
        .collect()
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `line` without its ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

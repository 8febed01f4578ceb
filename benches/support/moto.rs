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
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(strip_ansi)
            .filter(|l| l.contains(" HTTP/1.1\" "))
            .collect()
    }
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

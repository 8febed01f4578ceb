//! Every printing command of the real binary, with its stdout a pipe whose reader is gone
//! (`mushroom-backup ctl health | head -0`): it exits 141 (128 + SIGPIPE, as a shell shows a
//! process a broken pipe killed; `src/cli/out.rs` says why not 0) with no panic and no error
//! on stderr — `ctl watch-health` without `--count` included, which must end by itself. The
//! read end is closed before the child starts, so its first write meets the broken pipe
//! whatever the timing. And no code in `src/` prints with `println!`/`print!`, which would
//! panic there: everything goes through `out.rs`.

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use support::binary;
use support::served::{self, DEADLINE, client, fast_serve, wait_health};
use support::sources::rust_files;

/// Runs `cmd` with a stdout nobody reads (its reader closed first): its status and stderr.
fn with_closed_stdout(name: &str, mut cmd: Command) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    cmd.stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the binary");
    // The parent's copy of the write end goes with `cmd`.
    drop(cmd);
    let mut stderr = child.stderr.take().expect("piped");
    let reading = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let until = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            let err = reading.join().unwrap_or_default();
            panic!("{name}: still running {DEADLINE:?} after its stdout closed; stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reading.join().expect("stderr reader"))
}

fn assert_quiet(name: &str, cmd: Command) {
    let (status, stderr) = with_closed_stdout(name, cmd);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{name}: {status}, stderr:\n{stderr}"
    );
    assert!(
        !stderr.lines().any(|l| l.starts_with("error:")),
        "{name}: an error on stderr for a closed stdout ({status}):\n{stderr}"
    );
    assert_eq!(
        status.code(),
        Some(141),
        "{name}: exits 141 when its stdout closes; stderr:\n{stderr}"
    );
}

fn mb(args: &[&str]) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(args);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_printing_command_exits_quietly_when_its_stdout_closes() {
    let d = served::dirs();
    let dir = d.root.join("piped");
    let bucket = d.base.join("bucket");
    support::store::write(&dir, 10, 0, 0);
    let (_server, addr) = served::start("serve", fast_serve(&d, &[]));
    let c = client(addr).await;
    let id = served::register(&c, support::register_req(&dir, &support::file_url(&bucket))).await;
    wait_health(&c, &id, "10 commits in a restore point", |h| {
        h.healthy && h.restore_point_commit_seq == 10
    })
    .await;

    let server = format!("http://{addr}");
    let id = id.as_str();
    let ctl = |args: &[&str]| {
        let mut all = vec!["ctl", "--server", server.as_str()];
        all.extend(args);
        mb(&all)
    };
    for args in [
        &["list-stores"][..],
        &["--json", "list-stores"],
        &["health"],
        &["health", id],
        &["--json", "health", id],
        &["list-restore-points", id],
        &["watch-health", id, "--count", "1"],
        // Without a count it watches forever: the closed stdout must end it.
        &["watch-health", id],
        &["cost"],
        &["pause", id, "--reason", "piped", "--for", "1h"],
        &["resume", id],
    ] {
        assert_quiet(&format!("ctl {}", args.join(" ")), ctl(args));
    }

    let url = support::file_url(&bucket);
    let url = url.as_str();
    let restored = d.base.join("restored");
    let restored = restored.to_str().unwrap();
    for args in [
        &["ls", "--from", url][..],
        &["ls", "--from", url, "--json"],
        &["verify", "--from", url],
        &["verify", "--from", url, "--json"],
        &["retention", "--from", url, "--dry-run"],
        &["retention", "--from", url, "--dry-run", "--json"],
        &["restore", "--from", url, "--to", restored],
        &["key", "new"],
        &["key", "new", "--age"],
        &["store", "digest", dir.to_str().unwrap()],
    ] {
        assert_quiet(&args.join(" "), mb(args));
    }
}

#[test]
fn nothing_in_src_prints_past_out_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            let bare = |mac: &str| {
                t.match_indices(mac)
                    .any(|(at, _)| at == 0 || !t.as_bytes()[at - 1].is_ascii_alphanumeric())
            };
            if bare("println!(") || bare("print!(") {
                found.push(format!("{}:{}: {t}", file.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "prints that panic on a closed stdout (use src/cli/out.rs):\n{}",
        found.join("\n")
    );
}

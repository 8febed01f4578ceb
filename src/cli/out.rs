//! Standard output for every command: the one place the CLI writes to stdout.
//!
//! A reader that goes away (`mushroom-backup ctl health | head -1`, a pager quit early) closes
//! the pipe; `println!` would then panic ("failed printing to stdout: Broken pipe"). Here the
//! write returns [`StdoutClosed`] instead, the command stops at once (a `watch-*` stream
//! included), and `main` exits with status **141** (128 + SIGPIPE, what a shell shows for a
//! process a broken pipe killed) and nothing on stderr.
//!
//! Why 141 and not 0: the output was cut short, so a caller checking the status
//! (`set -o pipefail`) sees what it sees of `seq 1 1000000 | head -1`, and a failing command
//! (a `verify` that found problems, whose verdict comes after its report) never reads as
//! success because its reader left. Why a write helper rather than resetting SIGPIPE to its
//! default at start: a default SIGPIPE kills the process on any write to a closed pipe *or
//! socket* made without `MSG_NOSIGNAL` — `serve` talks to S3, PostgreSQL, peers and webhooks
//! through libraries that do not all promise that — and a death by signal skips every
//! cleanup (the bucket lease's release, the last flush, telemetry's flush), and it needs
//! `unsafe` libc. An error keeps the exit an ordinary, tested path.
//!
//! Every write is flushed before it returns, so a closed pipe is seen by the write that
//! met it, not at exit (where the standard library would drop the error silently).

use std::fmt::Display;
use std::io::{ErrorKind, Write};

/// The exit status of a command whose stdout was closed (see the module docs).
pub const STDOUT_CLOSED_EXIT: u8 = 141;

/// The reader of stdout went away: the command stops, quietly.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed (broken pipe)")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether `e` (or anything in its chain) is [`StdoutClosed`].
pub fn is_stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

/// Prints `s` and a newline.
pub fn line(s: impl Display) -> anyhow::Result<()> {
    write(format!("{s}\n").as_bytes())
}

/// Prints `s` as it is (no newline added).
pub fn text(s: &str) -> anyhow::Result<()> {
    write(s.as_bytes())
}

fn write(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::anyhow!("writing to stdout: {e}")),
    }
}

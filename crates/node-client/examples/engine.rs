//! An engine embedding the node client: the smallest database node that backs up through
//! `mushroom-backup serve`.
//!
//! ```text
//! MUSHROOM_NODE_TOKEN=<node token> cargo run -p mushroom-node-client --example engine -- \
//!     <server, http://host:port> <store id> <store dir> [commits]
//! ```
//!
//! The store id and node token are what `Register` returned for the store directory (which must
//! exist). The token comes from the environment, never the command line (`ps` shows that).
//!
//! The engine is a log: each commit is one frame appended to `wal.bin` in the store format of
//! `mushroom-format` (DESIGN.md section 2), fsynced, and only then reported to the client. It
//! commits `commits` records (10 by default), flushes, then keeps the store open (holding
//! `store.lock`, as a live engine does) until SIGTERM or Ctrl-C, when it closes the client and
//! exits. It prints `committed <seq>` per commit, `flushed <seq>` and `closed <seq>` on stdout,
//! and what happens to the backup connection on stderr.
//!
//! What it shows an engine author:
//! - the commit path calls [`NodeClient::report`] after every fsync, from a plain thread: it
//!   never blocks and never fails, whether or not the service is reachable;
//! - losing the stream is the client's business (it reconnects with backoff and sends the
//!   newest position first); the engine only watches [`NodeClient::state`] to tell its operator,
//!   and keeps committing even when the service refused the node for good;
//! - a `Refresh` from the service is answered by reporting the position again;
//! - [`NodeClient::wait_durable`] says when a commit is in the bucket (it prints `durable
//!   <seq>` once the last commit is), the wait an engine in `durability = sync` holds a
//!   commit's acknowledgement on;
//! - shutting down is [`NodeClient::close`], which sends the newest position and waits until the
//!   service has read it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mushroom_format::store::{
    FRAME_HEADER_LEN, WAL_HEADER_LEN, WalHeader, WalPosition, encode_frame, scan_wal,
};
use mushroom_format::units;
use mushroom_node_client::{ConnectionState, NodeClient, NodeClientConfig};
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [server, store_id, dir, rest @ ..] = args.as_slice() else {
        return Err("usage: engine <server> <store id> <store dir> [commits]".into());
    };
    let commits: u64 = rest.first().map_or(Ok(10), |n| n.parse())?;
    let token = std::env::var("MUSHROOM_NODE_TOKEN")
        .map_err(|_| "MUSHROOM_NODE_TOKEN must hold the node token")?;

    // The client needs a Tokio runtime for its one background task; the engine itself is not
    // async (its commit path below is a plain thread).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut wal = Wal::open(Path::new(dir))?;
    let (client, mut stop) = {
        let _inside = runtime.enter();
        let client = Arc::new(NodeClient::connect(NodeClientConfig::new(
            server.as_str(),
            store_id.as_str(),
            token,
        ))?);
        // Listening from the start: a signal at any point below (even mid-commit, where it
        // waits for the commits) is a clean shutdown, never the process killed mid-write.
        (client, Stop::listen()?)
    };
    // Tell the service where the store stands before the first commit.
    client.report(wal.position());
    runtime.spawn(watch_backup(client.clone()));

    // The commit path: append, fsync, report.
    for n in 0..commits {
        let position = wal.commit(format!("record {n}").as_bytes())?;
        client.report(position);
        println!("committed {}", position.commit_seq);
    }

    runtime.block_on(async {
        // WAIT_DURABLE: an engine in `durability = sync` holds each commit's acknowledgement
        // until `wait_durable` returns; here, once for the last commit. A wait never succeeds
        // on a stream that broke meanwhile: it fails with the reason instead.
        tokio::select! {
            flushed = client.flush(Duration::from_secs(30)) => {
                match flushed {
                    Ok(()) => println!("flushed {}", wal.position().commit_seq),
                    Err(e) => eprintln!("not flushed: {e}"),
                }
                let last = wal.position().commit_seq;
                tokio::select! {
                    durable = client.wait_durable(last, Duration::from_secs(30)) => match durable {
                        Ok(ack) => println!("durable {}", ack.commit_seq),
                        Err(e) => eprintln!("not durable: {e}"),
                    },
                    () = stop.wait() => {
                        client.close().await;
                        return;
                    }
                }
                stop.wait().await;
            }
            () = stop.wait() => {}
        }
        client.close().await;
    });
    println!("closed {}", wal.position().commit_seq);
    Ok(())
}

/// Tells the operator what happens to the backup stream, and answers the service's `Refresh`
/// by reporting the newest position again. Ends when the client is closed.
async fn watch_backup(client: Arc<NodeClient>) {
    let mut refresh = client.refresh_requests();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last = None;
    loop {
        tokio::select! {
            request = refresh.recv() => {
                if let Ok(request) = request {
                    eprintln!("refresh asked: {}", request.reason);
                    if let Some(position) = client.newest() {
                        client.report(position);
                    }
                }
            }
            _ = tick.tick() => {
                let state = client.state();
                if last == Some(state) {
                    continue;
                }
                last = Some(state);
                match state {
                    ConnectionState::Connected => eprintln!("backup stream: connected"),
                    ConnectionState::Connecting => eprintln!("backup stream: connecting"),
                    ConnectionState::Backoff { attempt, delay } => eprintln!(
                        "backup stream: lost ({}), retry {attempt} in {delay:?}",
                        client.last_error().map(|e| e.to_string()).unwrap_or_default()
                    ),
                    // The engine keeps committing: a backup that stopped is an alert for its
                    // operator, not a reason to refuse writes.
                    ConnectionState::Failed => eprintln!(
                        "backup stream: refused for good: {}",
                        client.last_error().map(|e| e.to_string()).unwrap_or_default()
                    ),
                    ConnectionState::Closed => return,
                }
            }
        }
    }
}

/// SIGTERM or SIGINT (Ctrl-C), listened for from the start.
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    /// Must be called inside the runtime.
    fn listen() -> std::io::Result<Stop> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Stop {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next signal (at once if one came since the last).
    async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The engine's WAL: `wal.bin` under an exclusive `store.lock`, appended a frame per commit.
struct Wal {
    file: File,
    path: PathBuf,
    header: WalHeader,
    /// Bytes of `wal.bin` that are fsynced.
    len: u64,
    /// Commits in total (the last frame's seq).
    seq: u64,
    /// Held for as long as the engine runs: the service reads a locked store as a live one.
    _lock: File,
}

impl Wal {
    /// Opens the store at `dir`, creating `wal.bin` if there is none; a torn tail of an earlier
    /// run is cut off (everything before it counts, nothing after it).
    fn open(dir: &Path) -> Result<Wal, Error> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("store.lock"))?;
        lock.try_lock()
            .map_err(|e| format!("{}: another engine has the store open ({e})", dir.display()))?;
        let path = dir.join("wal.bin");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (header, len, seq) = if bytes.is_empty() {
            let header = WalHeader {
                wal_id: Uuid::new_v4(),
                number: 1,
                floor: 0,
            };
            file.write_all(&header.encode())?;
            file.sync_all()?;
            File::open(dir)?.sync_all()?;
            (header, units::u64_len(WAL_HEADER_LEN), 0)
        } else {
            let scan = scan_wal(&bytes)?;
            file.set_len(scan.valid_len)?;
            file.sync_all()?;
            (scan.header, scan.valid_len, scan.last_seq)
        };
        Ok(Wal {
            file,
            path,
            header,
            len,
            seq,
            _lock: lock,
        })
    }

    /// Appends one commit and fsyncs it; returns the position that is now durable.
    fn commit(&mut self, payload: &[u8]) -> Result<WalPosition, Error> {
        let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
        encode_frame(self.seq + 1, payload, &mut frame);
        self.file
            .write_all(&frame)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        self.seq += 1;
        self.len += units::u64_len(frame.len());
        Ok(self.position())
    }

    /// Where the store stands: only fsynced bytes, at a frame boundary.
    fn position(&self) -> WalPosition {
        WalPosition {
            snapshot_id: None,
            wal_id: self.header.wal_id,
            wal_number: self.header.number,
            durable_len: self.len,
            commit_seq: self.seq,
        }
    }
}

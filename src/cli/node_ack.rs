//! `node --durability sync`: the reference node's acknowledgements. The writer hands every
//! synced commit `(commit_seq, commit_unix_ms)` over in commit order; the acker waits until
//! the service says the oldest pending one is in the bucket ([`NodeClient::wait_durable`]),
//! takes every pending commit that acknowledgement covers (group commit: one PUT acknowledges
//! many), appends one line per commit to the acked log, `commit_seq commit_unix_ms
//! ack_unix_ms`, and fsyncs the file before it acknowledges anything more.
//!
//! A wait that fails (the stream broke, the service lost durability, the timeout) leaves that
//! commit unacknowledged — no line, counted in `unacknowledged` — and the acker goes on with
//! the next one, whose wait starts on whatever stream is up by then. So a SIGKILL at any point
//! leaves only lines for commits the service vouched for; a torn last line (the kill during
//! the write, before its fsync) is one that was not acknowledged yet.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc::UnboundedReceiver;

use mushroom_backup::node_client::NodeClient;

/// What the acker did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Acked {
    pub acknowledged: u64,
    pub unacknowledged: u64,
}

/// Waits for acknowledgements and logs them; see the module docs.
pub struct Acker {
    client: Arc<NodeClient>,
    log: Option<std::fs::File>,
    timeout: Duration,
}

impl Acker {
    /// Opens (creating, appending to) the acked log, if any.
    pub fn open(
        client: Arc<NodeClient>,
        log: Option<&Path>,
        timeout: Duration,
    ) -> anyhow::Result<Acker> {
        let log = log
            .map(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("open the acked log {}", p.display()))
            })
            .transpose()?;
        Ok(Acker {
            client,
            log,
            timeout,
        })
    }

    /// Runs until the writer is done and every commit's wait has ended.
    pub async fn run(
        mut self,
        mut commits: UnboundedReceiver<(u64, i64)>,
    ) -> anyhow::Result<Acked> {
        let mut acked = Acked::default();
        let mut pending = std::collections::VecDeque::new();
        loop {
            if pending.is_empty() {
                match commits.recv().await {
                    Some(c) => pending.push_back(c),
                    None => return Ok(acked),
                }
            }
            let (seq, _) = *pending.front().expect("not empty");
            let waited = self.client.wait_durable(seq, self.timeout).await;
            while let Ok(c) = commits.try_recv() {
                pending.push_back(c);
            }
            match waited {
                Ok(ack) => {
                    let now = mushroom_backup::units::unix_now_ms();
                    let mut lines = String::new();
                    while let Some(&(seq, at)) = pending.front() {
                        if seq > ack.commit_seq {
                            break;
                        }
                        pending.pop_front();
                        lines.push_str(&format!("{seq} {at} {now}\n"));
                        acked.acknowledged += 1;
                    }
                    self.append(lines).await?;
                }
                Err(e) => {
                    tracing::warn!(commit_seq = seq, error = %e, "a commit was not acknowledged");
                    pending.pop_front();
                    acked.unacknowledged += 1;
                }
            }
        }
    }

    /// Appends `lines` and fsyncs them before returning.
    async fn append(&mut self, lines: String) -> anyhow::Result<()> {
        let Some(file) = self.log.take() else {
            return Ok(());
        };
        let file = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            let mut f = file;
            f.write_all(lines.as_bytes())?;
            f.sync_data()?;
            Ok(f)
        })
        .await
        .context("the acked log's writer failed")?
        .context("append to the acked log")?;
        self.log = Some(file);
        Ok(())
    }
}

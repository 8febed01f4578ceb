//! [`StreamedSource`]: the durable position database nodes stream (`ReportPosition`), for the
//! service's workers, counted only as far as the store's files bear it out.
//!
//! # What counts
//!
//! Each attached stream keeps its own newest report. The position the worker gets is the
//! **mark**: the highest reported position the files on disk confirmed (`proof.rs`), from a
//! stream attached at the time. Reports are checked when the position is read (the worker
//! reads it right after its look at the directory, the supervisor when the worker did not),
//! only those that would raise the mark, highest first, each once:
//!
//! - a report the files **contradict** (more commits than the WAL files on disk hold, a length
//!   past `wal.bin`, off its frames) is dropped, logged, counted, and flags its stream: while a
//!   flagged stream stays attached, [`WalSource::problem`] says so and health is unhealthy with
//!   that reason. It never raises the mark, so one lying or broken stream cannot hold shipping
//!   back for the others, nor make health show commits that are not there. A later report of
//!   that stream which the files confirm clears the flag.
//! - a **stale** report (it names files the store has moved past) never raises the mark;
//! - a **confirmed** report raises it. A report below the mark (a late report on an old stream
//!   of a node that reconnected) never lowers it: durable commits never go away, and taking it
//!   would make the store look rewound. An equal count naming other files (a snapshot was
//!   taken) is checked like a higher one.
//!
//! A stream's reports stop counting when it ends (its report leaves with it); the mark, once
//! confirmed, stays while any stream is attached. With no stream attached (the node is down or
//! not yet connected) the mark is forgotten and the position comes from the [`LocalSource`]:
//! the file source while a process holds `store.lock`, the offline source when nobody does.
//! Streams attached but with nothing confirmed yet give their newest stale report (the worker
//! then asks for a refresh and waits), else the local source too.
//!
//! What this cannot catch: a report of frames that are written but not yet fsynced. The node is
//! trusted for that (docs/threat-model.md); the files only bound what a report can claim.
//!
//! [`StreamedSource::close`] (the store was deregistered) ends every stream: attachments see
//! [`StreamAttachment::closed`], and no new stream attaches.
//!
//! # What a lying stream costs, and whom
//!
//! A contradicting report costs its own stream, not the store's other streams (security review
//! 4, Low 4: 40 streams each sending a fresh lie every 20 ms held an honest node's
//! acknowledgements back from 2 ms to 822 ms, as each lie was scanned from `wal.bin`'s header
//! under the store's one check lock):
//! - at most [`StreamedSource::max_streams`] streams attach to one store (16 unless the service
//!   sets its `max_streams_per_store`); one more is refused with [`AttachError::Full`], naming
//!   the cap;
//! - a report that would raise the mark but that the mark's own frame boundary already
//!   contradicts (below its length with as many commits or more, the lie of the review) is
//!   dropped without reading a frame (`proof.rs`); any other report is scanned from the mark
//!   when it lies in the mark's file, never from the header. [`StreamedSource::scanned_bytes`]
//!   counts what the checks read.
//!
//! So while an honest stream keeps the mark, a lie costs a header read and a log line; the
//! bytes a lie can make the checks read are those past the mark, which the honest node's next
//! report needs read anyway. Until a report in the current `wal.bin` is confirmed (a new
//! store, a rotation) there is no boundary to read from: each stream's newest report may then
//! be read from the header once per look, at most [`StreamedSource::max_streams`] of them.

use std::collections::BTreeMap;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::proof::{self, Confirmed, Verdict};
use super::{LocalSource, SourceError, WalSource, blocking};
use crate::store::dir::StoreDir;
use crate::store::format::WalPosition;

/// The position a database node streams, checked against the store's files.
pub struct StreamedSource {
    dir: StoreDir,
    local: LocalSource,
    state: Mutex<State>,
    /// Held while reports are checked, so two readers (the worker and the supervisor) never
    /// check, log and count the same report twice.
    checking: tokio::sync::Mutex<()>,
    refresh: tokio::sync::broadcast::Sender<String>,
    closed: CancellationToken,
    /// Reports the files contradicted, since this source was made.
    contradicted: AtomicU64,
    /// Bytes of `wal.bin`'s frames the checks read, since this source was made.
    scanned: AtomicU64,
    /// Streams that may be attached at once.
    max_streams: usize,
}

/// Streams one store takes unless the service says otherwise (`max_streams_per_store`): a node
/// needs one, a few while it reconnects.
pub const DEFAULT_MAX_STREAMS: usize = 16;

#[derive(Default)]
struct State {
    next_stream: u64,
    /// Counts reports, so a check can tell whether the report it checked is still the newest.
    next_serial: u64,
    streams: BTreeMap<u64, Stream>,
    mark: Option<Confirmed>,
}

struct Stream {
    /// Who is on the other end, for logs and health.
    peer: String,
    latest: Option<Report>,
    /// Why this stream's last dropped report was dropped, until one is confirmed.
    contradicted: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Report {
    position: WalPosition,
    serial: u64,
    /// Checked and found stale: not checked again.
    stale: bool,
}

/// Whether `pos` would raise the mark: more commits, or as many in other files.
fn raises(pos: &WalPosition, mark: Option<&Confirmed>) -> bool {
    mark.is_none_or(|m| {
        let m = &m.position;
        pos.commit_seq > m.commit_seq
            || (pos.commit_seq == m.commit_seq
                && (pos.wal_id, pos.snapshot_id) != (m.wal_id, m.snapshot_id))
    })
}

/// One attached stream; detaches when dropped, and its reports stop counting.
pub struct StreamAttachment {
    source: Arc<StreamedSource>,
    id: u64,
    /// `Refresh` requests for this stream's node.
    pub refresh: tokio::sync::broadcast::Receiver<String>,
}

/// Why a stream was not attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// The store's source was closed (it was deregistered): no stream attaches any more.
    #[error("the position source is closed")]
    Closed,
    /// The store has as many streams attached as it takes.
    #[error(
        "the store already has {cap} position streams attached, as many as it takes \
         (max_streams_per_store); end one first"
    )]
    Full { cap: usize },
}

impl Drop for StreamAttachment {
    fn drop(&mut self) {
        let mut s = self.source.state.lock().expect("not poisoned");
        s.streams.remove(&self.id);
        if s.streams.is_empty() {
            s.mark = None;
        }
    }
}

impl StreamAttachment {
    /// Records this stream's newest report. It counts once the files confirm it (when the
    /// position is next read), and only while it would raise the mark.
    pub fn report(&self, pos: WalPosition) {
        let mut s = self.source.state.lock().expect("not poisoned");
        s.next_serial += 1;
        let serial = s.next_serial;
        if let Some(stream) = s.streams.get_mut(&self.id) {
            stream.latest = Some(Report {
                position: pos,
                serial,
                stale: false,
            });
        }
    }

    /// Resolves when the source is closed (the store was deregistered). Owns what it waits
    /// on, so it can be polled beside `refresh`.
    pub fn closed(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.source.closed.clone().cancelled_owned()
    }
}

impl StreamedSource {
    /// A source of `dir` that takes [`DEFAULT_MAX_STREAMS`] streams.
    pub fn new(dir: impl Into<StoreDir>) -> Arc<Self> {
        Self::with_max_streams(dir, DEFAULT_MAX_STREAMS)
    }

    /// A source of `dir` that takes at most `max_streams` streams at once (at least one).
    pub fn with_max_streams(dir: impl Into<StoreDir>, max_streams: usize) -> Arc<Self> {
        let dir: StoreDir = dir.into();
        Arc::new(Self {
            local: LocalSource::new(dir.clone()),
            dir,
            state: Mutex::new(State::default()),
            checking: tokio::sync::Mutex::new(()),
            refresh: tokio::sync::broadcast::channel(16).0,
            closed: CancellationToken::new(),
            contradicted: AtomicU64::new(0),
            scanned: AtomicU64::new(0),
            max_streams: max_streams.max(1),
        })
    }

    /// Streams that may be attached at once.
    pub fn max_streams(&self) -> usize {
        self.max_streams
    }

    /// Attaches a node's stream; `peer` names the other end in logs and health. Refused once
    /// the source is closed, and while [`Self::max_streams`] streams are attached.
    pub fn attach(
        self: &Arc<Self>,
        peer: impl Into<String>,
    ) -> Result<StreamAttachment, AttachError> {
        let mut s = self.state.lock().expect("not poisoned");
        // Under the lock, so a stream attaching while `close` runs is either ended by it or
        // refused here.
        if self.closed.is_cancelled() {
            return Err(AttachError::Closed);
        }
        if s.streams.len() >= self.max_streams {
            return Err(AttachError::Full {
                cap: self.max_streams,
            });
        }
        let id = s.next_stream;
        s.next_stream += 1;
        s.streams.insert(
            id,
            Stream {
                peer: peer.into(),
                latest: None,
                contradicted: None,
            },
        );
        Ok(StreamAttachment {
            source: self.clone(),
            id,
            refresh: self.refresh.subscribe(),
        })
    }

    /// Ends every stream and refuses new ones (the store was deregistered).
    pub fn close(&self) {
        let _s = self.state.lock().expect("not poisoned");
        self.closed.cancel();
    }

    /// Whether any stream is attached now.
    fn attached(&self) -> bool {
        !self.state.lock().expect("not poisoned").streams.is_empty()
    }

    /// Reports the files contradicted (and that were dropped), since this source was made.
    pub fn contradicted_reports(&self) -> u64 {
        self.contradicted.load(Ordering::Relaxed)
    }

    /// Bytes of `wal.bin`'s frames read to check reports, since this source was made.
    pub fn scanned_bytes(&self) -> u64 {
        self.scanned.load(Ordering::Relaxed)
    }

    /// The reports that would raise the mark and are not known stale, highest first.
    fn unchecked(s: &State) -> Vec<(u64, Report)> {
        let mut todo: Vec<(u64, Report)> = s
            .streams
            .iter()
            .filter_map(|(&id, st)| st.latest.map(|r| (id, r)))
            .filter(|(_, r)| !r.stale && raises(&r.position, s.mark.as_ref()))
            .collect();
        todo.sort_by(|a, b| {
            (b.1.position.commit_seq, b.1.serial).cmp(&(a.1.position.commit_seq, a.1.serial))
        });
        todo
    }

    /// Checks the reports that would raise the mark against the files, highest first, until
    /// one is confirmed; records what each check found.
    async fn check_reports(&self) -> Result<(), SourceError> {
        let _checking = self.checking.lock().await;
        let (todo, known) = {
            let s = self.state.lock().expect("not poisoned");
            (Self::unchecked(&s), s.mark)
        };
        if todo.is_empty() {
            return Ok(());
        }
        let dir = self.dir.clone();
        let (verdicts, scanned) = blocking(move || {
            let (mut out, mut scanned) = (Vec::new(), 0u64);
            for (id, report) in todo {
                let checked = proof::check(&dir, &report.position, known.as_ref())?;
                scanned += checked.scanned;
                let confirmed = matches!(checked.verdict, Verdict::Confirmed { .. });
                out.push((id, report, checked.verdict));
                if confirmed {
                    break;
                }
            }
            Ok((out, scanned))
        })
        .await?;
        self.scanned.fetch_add(scanned, Ordering::Relaxed);
        let mut s = self.state.lock().expect("not poisoned");
        for (id, report, verdict) in verdicts {
            self.record(&mut s, id, report, verdict);
        }
        Ok(())
    }

    fn record(&self, s: &mut State, id: u64, report: Report, verdict: Verdict) {
        let mark = s.mark;
        let Some(stream) = s.streams.get_mut(&id) else {
            return; // it ended meanwhile: its reports no longer count
        };
        let current = stream.latest.is_some_and(|r| r.serial == report.serial);
        match verdict {
            Verdict::Confirmed { inode } => {
                stream.contradicted = None;
                if raises(&report.position, mark.as_ref()) {
                    s.mark = Some(Confirmed {
                        position: report.position,
                        inode,
                    });
                }
            }
            Verdict::Stale => {
                if current && let Some(r) = stream.latest.as_mut() {
                    r.stale = true;
                }
            }
            Verdict::Contradicted(why) => {
                let n = self.contradicted.fetch_add(1, Ordering::Relaxed) + 1;
                let p = report.position;
                tracing::warn!(
                    store = %self.dir.path().display(),
                    peer = %stream.peer,
                    commit_seq = p.commit_seq,
                    durable_len = p.durable_len,
                    wal_id = %p.wal_id,
                    dropped = n,
                    "dropped a position report the store's files contradict: {why}"
                );
                stream.contradicted = Some(format!(
                    "a position report from {} was dropped: the store's files contradict it ({why})",
                    stream.peer
                ));
                if current {
                    stream.latest = None;
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl WalSource for StreamedSource {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        if self.attached() {
            let checked = self.check_reports().await;
            let s = self.state.lock().expect("not poisoned");
            if let Some(m) = s.mark {
                return Ok(m.position);
            }
            // Nothing confirmed (yet): a check that could not read the files says why.
            checked?;
            let stale = s
                .streams
                .values()
                .filter_map(|st| st.latest.filter(|r| r.stale))
                .max_by_key(|r| (r.position.commit_seq, r.serial));
            if let Some(r) = stale {
                return Ok(r.position);
            }
        }
        self.local.durable_wal_position().await
    }

    fn request_refresh(&self) {
        let _ = self
            .refresh
            .send("the store's files show a snapshot or WAL you have not reported".into());
    }

    fn problem(&self) -> Option<String> {
        let s = self.state.lock().expect("not poisoned");
        let mut flagged = s.streams.values().filter_map(|st| st.contradicted.as_ref());
        let first = flagged.next()?;
        let others = flagged.count();
        let dropped = self.contradicted.load(Ordering::Relaxed);
        Some(if others == 0 {
            format!("{first}; {dropped} report(s) dropped so far")
        } else {
            format!("{first} (and on {others} more stream(s)); {dropped} report(s) dropped so far")
        })
    }
}

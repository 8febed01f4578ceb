//! The format's check of a file fetched by ranges, run behind the download ([`Sequenced`]):
//! the ranges' buffers, once written, are handed to the format's reader in order, on a
//! blocking thread of their own, so that the file is checked as it arrives rather than read
//! back from disk once complete.
//!
//! # Why
//! A 256 MiB archive is 16 ranged GETs, which complete in any order; the format's reader needs
//! its bytes in order. Before this, such a file was read back from the page cache once all its
//! ranges were written: a second copy and CRC of every byte of every large file, about a sixth
//! of a restore's CPU on this 2-core machine (perf, a 4 GiB restore), where the server and the
//! restore share the cores.
//!
//! # Memory
//! A range that completes before the ones ahead of it keeps its buffers, and its share of the
//! restore's budget (`BYTES_IN_FLIGHT`), until they are handed on: the budget bounds them as it
//! bounds responses in flight. Ranges take their budget in the order they are issued (a fair
//! semaphore), so the earliest range not yet complete always holds its share: the ranges
//! waiting behind it never starve it. A range handed to the reader keeps its share until the
//! reader has passed it.
//!
//! # What it answers
//! Exactly what the read-back from disk answers (`super::super::readback::check_read`, the same
//! function `check_file` reads the disk with): the file's [`FileCheck`], or its complaint, which
//! fails the restore as the read-back's would.
//!
//! # What a crash leaves
//! Nothing of its own: memory and a thread.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc;

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use super::super::readback::{FileCheck, check_read};

/// A range's buffers and the budget they hold.
pub(super) type Held = (Vec<Bytes>, Option<OwnedSemaphorePermit>);

/// One file's check running behind its ranges.
pub(super) struct Sequenced {
    /// The next range to hand to the reader.
    next: usize,
    /// Ranges complete before their turn.
    early: BTreeMap<usize, Held>,
    /// To the reader; dropped once every range was handed on.
    to_reader: Option<mpsc::Sender<Held>>,
    reader: tokio::task::JoinHandle<Result<FileCheck, String>>,
    ranges: usize,
}

impl Sequenced {
    /// Starts the check of the file at `rel` (relative to the store), fetched as `ranges`
    /// ranges.
    pub(super) fn start(rel: PathBuf, ranges: usize) -> Sequenced {
        let (tx, rx) = mpsc::channel::<Held>();
        let reader = tokio::task::spawn_blocking(move || {
            let source = format!("{} (as downloaded)", rel.display());
            check_read(&rel, InOrder::new(rx), &source)
        });
        Sequenced {
            next: 0,
            early: BTreeMap::new(),
            to_reader: Some(tx),
            reader,
            ranges,
        }
    }

    /// Range `index` is written: hands it, and every range after it already complete, to the
    /// reader in order. True once the last one was handed on.
    pub(super) fn written(&mut self, index: usize, held: Held) -> bool {
        self.early.insert(index, held);
        while let Some(held) = self.early.remove(&self.next) {
            if let Some(tx) = &self.to_reader {
                // The reader stops early only on a complaint, which `finish` reports.
                let _ = tx.send(held);
            }
            self.next += 1;
        }
        if self.next == self.ranges {
            self.to_reader = None;
        }
        self.next == self.ranges
    }

    /// The reader's answer, once every range was handed on.
    pub(super) async fn finish(self) -> Result<FileCheck, String> {
        drop(self.to_reader);
        self.reader
            .await
            .map_err(|e| format!("the check of a downloaded file failed: {e}"))?
    }
}

/// The bytes of the ranges handed on, in order, as a [`Read`]; each range's budget is given
/// back once read past.
struct InOrder {
    rx: mpsc::Receiver<Held>,
    bufs: std::vec::IntoIter<Bytes>,
    current: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

impl InOrder {
    fn new(rx: mpsc::Receiver<Held>) -> InOrder {
        InOrder {
            rx,
            bufs: Vec::new().into_iter(),
            current: Bytes::new(),
            _held: None,
        }
    }
}

impl Read for InOrder {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.bufs.next() {
                Some(b) => self.current = b,
                None => match self.rx.recv() {
                    Ok((bufs, permit)) => {
                        self.bufs = bufs.into_iter();
                        self._held = permit;
                    }
                    // Every range handed on (or the restore gave up): the end of the file.
                    Err(_) => return Ok(0),
                },
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ranges_out_of_order_are_read_in_order() {
        // A side file's reader reads nothing; an archive's reads its bytes in order.
        let mut s = Sequenced::start(PathBuf::from("archive/00000000000000000001.wal"), 3);
        assert!(!s.written(2, (vec![Bytes::from_static(b"c")], None)));
        assert!(!s.written(0, (vec![Bytes::from_static(b"a")], None)));
        assert!(s.written(1, (vec![Bytes::from_static(b"b")], None)));
        let err = s.finish().await.unwrap_err();
        // Three bytes are no WAL header: the reader's complaint, naming the file.
        assert!(err.contains("archive/00000000000000000001.wal"), "{err}");
    }

    #[test]
    fn the_reader_sees_every_byte_in_order() {
        let (tx, rx) = mpsc::channel::<Held>();
        tx.send((vec![Bytes::from_static(b"ab"), Bytes::new()], None))
            .unwrap();
        tx.send((vec![Bytes::from_static(b"cde")], None)).unwrap();
        drop(tx);
        let mut all = Vec::new();
        InOrder::new(rx).read_to_end(&mut all).unwrap();
        assert_eq!(all, b"abcde");
    }
}

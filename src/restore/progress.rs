//! How far a running restore is: counters the download advances and anyone holding a clone
//! reads ([`Progress`]), and the one line a reader makes of them ([`ProgressLine`]): the
//! terminal bar, `restore --progress json` (one JSON line a second on stderr), and a drill's
//! activity in the store's health all read the same counters.
//!
//! # The ETA
//! The rate is this run's fetched bytes over the seconds since its download began (resumed
//! bytes, kept from an earlier run, took no time now and are left out of it), and the ETA is
//! the bytes left at that rate. Before a tenth of the bytes to fetch has arrived, and before
//! two seconds of download, the rate says little (first-byte latency, TCP slow start): the
//! ETA then falls back to the prediction made before the restore began
//! ([`super::predict`]), less the time spent, when there is one, else is `None`.
//!
//! # What a crash leaves
//! Nothing: the counters live in memory only.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde::Serialize;

/// Where a restore is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Choosing the restore point (listing, reading manifests).
    Plan,
    /// Fetching objects, checking and fsyncing each file as it completes.
    Download,
    /// The `--at` cut, the chain check, the directories' fsync and the rename.
    Finish,
    /// Restored.
    Done,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Plan,
            1 => Phase::Download,
            2 => Phase::Finish,
            _ => Phase::Done,
        }
    }
}

/// Shared counters of one restore; clones read and advance the same ones.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    phase: AtomicU8,
    bytes_total: AtomicU64,
    objects_total: AtomicU64,
    /// Bytes and objects kept from an earlier, interrupted run.
    resumed_bytes: AtomicU64,
    resumed_objects: AtomicU64,
    /// Bytes fetched by this run, and objects complete.
    fetched_bytes: AtomicU64,
    objects_done: AtomicU64,
    /// The prediction made before the restore began, in milliseconds (0: none).
    predicted_ms: AtomicU64,
    started: OnceLock<Instant>,
    download_started: OnceLock<Instant>,
}

impl PartialEq for Progress {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Progress {}

/// One reading of a restore's [`Progress`]: what `--progress json` prints, one line a second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgressLine {
    pub phase: Phase,
    /// Bytes in place: kept from an earlier run plus fetched by this one.
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub objects_done: u64,
    pub objects_total: u64,
    /// Of `bytes_done`, kept from an earlier, interrupted run.
    pub resumed_bytes: u64,
    /// Of `bytes_done`, fetched by this run.
    pub fetched_bytes: u64,
    /// Seconds since the restore began.
    pub elapsed_seconds: f64,
    /// This run's download rate (see the module docs).
    pub rate_bytes_per_second: f64,
    /// Seconds to the end, when it can be said (see the module docs).
    pub eta_seconds: Option<f64>,
}

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }

    /// The restore began (its planning); the first call counts.
    pub fn start(&self, predicted_seconds: Option<f64>) {
        let _ = self.0.started.set(Instant::now());
        let ms = predicted_seconds
            .and_then(|p| std::time::Duration::try_from_secs_f64(p).ok())
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        if let Some(ms) = ms {
            self.0.predicted_ms.store(ms, Ordering::Relaxed);
        }
    }

    /// The download begins: what it holds in all, and what an earlier run left complete.
    pub fn download(&self, bytes_total: u64, objects_total: u64, resumed: (u64, u64)) {
        let i = &self.0;
        i.bytes_total.store(bytes_total, Ordering::Relaxed);
        i.objects_total.store(objects_total, Ordering::Relaxed);
        i.resumed_bytes.store(resumed.0, Ordering::Relaxed);
        i.resumed_objects.store(resumed.1, Ordering::Relaxed);
        let _ = i.download_started.set(Instant::now());
        i.phase.store(1, Ordering::Relaxed);
    }

    /// `n` more bytes fetched by this run.
    pub fn fetched(&self, n: u64) {
        self.0.fetched_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// One more object complete and checked.
    pub fn object_done(&self) {
        self.0.objects_done.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_phase(&self, phase: Phase) {
        let v = match phase {
            Phase::Plan => 0,
            Phase::Download => 1,
            Phase::Finish => 2,
            Phase::Done => 3,
        };
        self.0.phase.store(v, Ordering::Relaxed);
    }

    /// The prediction made before the restore began, once made.
    pub fn predicted_seconds(&self) -> Option<f64> {
        let ms = self.0.predicted_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| ms as f64 / 1000.0)
    }

    /// The counters now.
    pub fn line(&self) -> ProgressLine {
        let i = &self.0;
        let phase = Phase::from_u8(i.phase.load(Ordering::Relaxed));
        let bytes_total = i.bytes_total.load(Ordering::Relaxed);
        let resumed_bytes = i.resumed_bytes.load(Ordering::Relaxed);
        let fetched_bytes = i.fetched_bytes.load(Ordering::Relaxed);
        let bytes_done = (resumed_bytes + fetched_bytes).min(bytes_total.max(resumed_bytes));
        let elapsed = i.started.get().map_or(0.0, |s| s.elapsed().as_secs_f64());
        let downloading = i
            .download_started
            .get()
            .map_or(0.0, |s| s.elapsed().as_secs_f64());
        let rate = match downloading > 0.0 {
            true => fetched_bytes as f64 / downloading,
            false => 0.0,
        };
        let to_fetch = bytes_total.saturating_sub(resumed_bytes);
        let left = bytes_total.saturating_sub(bytes_done);
        let measured = downloading >= 2.0 && fetched_bytes.saturating_mul(10) >= to_fetch;
        let predicted = i.predicted_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let eta_seconds = match phase {
            Phase::Done => Some(0.0),
            _ if measured && rate > 0.0 => Some(left as f64 / rate),
            _ if predicted > 0.0 => Some((predicted - elapsed).max(0.0)),
            _ => None,
        };
        ProgressLine {
            phase,
            bytes_done,
            bytes_total,
            objects_done: i.objects_done.load(Ordering::Relaxed)
                + i.resumed_objects.load(Ordering::Relaxed),
            objects_total: i.objects_total.load(Ordering::Relaxed),
            resumed_bytes,
            fetched_bytes,
            elapsed_seconds: elapsed,
            rate_bytes_per_second: rate,
            eta_seconds,
        }
    }
}

/// Runs `work`, drawing the terminal bar of `tracker` five times a second meanwhile when
/// there is one (the caller decides: stderr a terminal and a bar wanted); the bar is cleared
/// when `work` ends.
pub async fn drawing<T>(
    work: impl std::future::Future<Output = T>,
    tracker: Option<&Progress>,
) -> T {
    let Some(tracker) = tracker else {
        return work.await;
    };
    let style = indicatif::ProgressStyle::with_template(
        "restoring [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    let line = tracker.line();
    let bar = indicatif::ProgressBar::new(line.bytes_total).with_style(style.progress_chars("=> "));
    bar.set_position(line.resumed_bytes);
    bar.reset_eta();
    let draw = async {
        loop {
            bar.set_position(tracker.line().bytes_done);
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    let out = tokio::select! {
        out = work => out,
        never = draw => never,
    };
    bar.finish_and_clear();
    out
}

/// Runs `work`, printing a line of `tracker` (`line(&ProgressLine)`) every second meanwhile
/// and once more at its end: `restore --progress json`.
pub async fn every_second<T>(
    work: impl std::future::Future<Output = T>,
    tracker: &Progress,
    line: impl Fn(&ProgressLine),
) -> T {
    let tick = async {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            every.tick().await;
            line(&tracker.line());
        }
    };
    let out = tokio::select! {
        out = work => out,
        never = tick => never,
    };
    line(&tracker.line());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_progress_has_no_eta_and_done_has_zero() {
        let p = Progress::new();
        p.start(None);
        p.download(1000, 4, (0, 0));
        let l = p.line();
        assert_eq!(l.phase, Phase::Download);
        assert_eq!(l.eta_seconds, None);
        assert_eq!((l.bytes_done, l.bytes_total), (0, 1000));
        p.set_phase(Phase::Done);
        assert_eq!(p.line().eta_seconds, Some(0.0));
    }

    #[test]
    fn before_a_measured_rate_the_eta_is_the_prediction_less_the_time_spent() {
        let p = Progress::new();
        p.start(Some(100.0));
        p.download(1000, 4, (400, 1));
        let l = p.line();
        assert_eq!(l.bytes_done, 400);
        assert_eq!(l.resumed_bytes, 400);
        assert_eq!(l.objects_done, 1);
        let eta = l.eta_seconds.expect("an eta from the prediction");
        assert!(eta > 99.0 && eta <= 100.0, "{eta}");
    }
}

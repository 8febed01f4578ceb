//! How long a restore will take, said before it begins: a restore's [`Shape`] (known from its
//! manifests alone, without a request) and the [`Rates`] this machine and this endpoint have
//! shown, turned into seconds ([`predict`]).
//!
//! # The model
//! A restore fetches its objects `parallelism` at a time, writing and checking each file as it
//! arrives and decoding the encoded ones on the way in; the stages overlap, so the slowest
//! sets the pace:
//!
//! ```text
//! seconds = fixed + waves × first_byte + max(stored / download, plain_encoded / decode,
//!                                            plain / check) + plain_cut / check
//! waves   = ceil(objects / parallelism)
//! ```
//!
//! `fixed` is the planning (LIST, LATEST, the manifest) and the finish (directories' fsync,
//! chain check, rename); `plain_cut` is the WAL an `--at` cut reads again. Before a restore
//! or drill has measured them, [`Rates::default`] holds stated defaults and
//! `calibrated: false`.
//!
//! # Calibration
//! A finished restore (a drill, an adopting restore) is a measurement of the same model:
//! [`Rates::sample`] solves it for the rates its timings imply, and [`Rates::blend`] moves
//! the rates kept for its endpoint a share ([`SMOOTHING`]) toward them, so one outlier (a
//! slow minute of the endpoint, a busy disk) moves a prediction half of the way, not all of
//! it. One run's download phase cannot tell the stages apart: the stage the current rates say
//! binds takes the measured time, and every other stage is at least as fast as that time
//! shows. The first-byte latency is not learnt: one run cannot tell it from the transfer, and
//! learning it from small restores (an earlier version did) let one noisy small drill shrink
//! the transfer it leaves to almost nothing, so every rate shown jumped tenfold and the
//! predictions of `benches/rto.rs` swung from −44 % to +48 %; it stays at its stated value.
//! [`Shape::of_manifest`] gives a restore point's shape from its manifest alone (what
//! health predicts from, without a request).
//!
//! # What a crash leaves
//! Nothing: pure arithmetic.

use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, ObjectEntry, SegmentEntry};

/// The share of the way a measurement moves the kept rates ([`Rates::blend`]).
pub const SMOOTHING: f64 = 0.5;

/// What a restore has to move, known from its manifests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Objects to fetch, and their bytes as stored.
    pub objects: u64,
    pub stored_bytes: u64,
    /// Bytes written to the store directory (decoded).
    pub plain_bytes: u64,
    /// Of `plain_bytes`, those decoded from compressed or sealed objects.
    pub plain_encoded_bytes: u64,
    /// WAL bytes an `--at` cut reads again after the download (0 without a cut).
    pub plain_cut_bytes: u64,
}

impl Shape {
    /// What restoring the restore point of `manifest`, extended by `extension` (segments of
    /// its generation shipped after it), moves; `cut`: whether an `--at` cut reads the WAL
    /// again. As `Layout::shape` counts it, from the entries alone.
    pub fn of_manifest(manifest: &Manifest, extension: &[SegmentEntry], cut: bool) -> Shape {
        let mut s = Shape::default();
        let wal = manifest
            .archives
            .iter()
            .map(|a| &a.object)
            .chain(manifest.segments.iter().map(|e| &e.object))
            .chain(extension.iter().map(|e| &e.object));
        for o in wal {
            s.add(o);
            if cut {
                s.plain_cut_bytes = s.plain_cut_bytes.saturating_add(o.plain_len());
            }
        }
        let others = manifest.snapshot.iter().map(|e| &e.object);
        for o in others.chain(manifest.side_files.iter().map(|e| &e.object)) {
            s.add(o);
        }
        s
    }

    fn add(&mut self, o: &ObjectEntry) {
        self.objects += 1;
        self.stored_bytes = self.stored_bytes.saturating_add(o.len);
        self.plain_bytes = self.plain_bytes.saturating_add(o.plain_len());
        if o.is_encoded() {
            self.plain_encoded_bytes = self.plain_encoded_bytes.saturating_add(o.plain_len());
        }
    }

    /// The larger restore to wait for: more to fetch and replay (predicted at `rates`).
    pub fn heavier(self, other: Shape, rates: &Rates, parallelism: usize) -> Shape {
        match predict(&other, rates, parallelism) > predict(&self, rates, parallelism) {
            true => other,
            false => self,
        }
    }
}

/// What one finished restore measured, as [`Rates::sample`] reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub shape: Shape,
    pub parallelism: usize,
    pub plan_seconds: f64,
    pub download_seconds: f64,
    pub finish_seconds: f64,
    /// Bytes kept from an earlier run (a resumed restore is no measurement of the whole).
    pub resumed_bytes: u64,
}

impl Measured {
    /// From a restore's report and the shape it restored.
    pub fn of(report: &super::RestoreReport, shape: Shape, parallelism: usize) -> Measured {
        Measured {
            shape,
            parallelism,
            plan_seconds: report.plan_seconds,
            download_seconds: report.download_seconds,
            finish_seconds: report.finish_seconds,
            resumed_bytes: report.resumed_bytes,
        }
    }
}

/// Rates a restore runs at on this machine against one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Bytes a second the endpoint delivers to `parallelism` GETs.
    pub download_bytes_per_second: f64,
    /// Seconds from a GET to its first byte.
    pub first_byte_seconds: f64,
    /// Plain bytes a second the decoders (decompression, decryption) produce.
    pub decode_bytes_per_second: f64,
    /// Plain bytes a second written, read back by the format's reader and fsynced.
    pub check_bytes_per_second: f64,
    /// Planning and finishing, whatever the size.
    pub fixed_seconds: f64,
    /// Whether any of these were measured here (false: the defaults).
    pub calibrated: bool,
}

impl Default for Rates {
    /// Stated defaults: 100 MB/s from the endpoint with 50 ms to a first byte (S3 Standard in
    /// the same region, a modest instance), 200 MB/s of decoding, 400 MB/s of local writes and
    /// checks, and half a second of planning and finishing.
    fn default() -> Rates {
        Rates {
            download_bytes_per_second: 100e6,
            first_byte_seconds: 0.05,
            decode_bytes_per_second: 200e6,
            check_bytes_per_second: 400e6,
            fixed_seconds: 0.5,
            calibrated: false,
        }
    }
}

/// The fewest seconds a stage is taken to have lasted (a timer's grain, not a rate).
const MIN_STAGE_SECONDS: f64 = 1e-3;

impl Rates {
    /// The rates `m` implies, starting from `self` for what it cannot tell (see the module
    /// docs); `None` when it measures nothing (a resumed run, nothing fetched, timings that
    /// are not finite).
    pub fn sample(&self, m: &Measured) -> Option<Rates> {
        let s = &m.shape;
        let timings = [m.plan_seconds, m.download_seconds, m.finish_seconds];
        if m.resumed_bytes > 0 || s.stored_bytes == 0 || timings.iter().any(|t| !t.is_finite()) {
            return None;
        }
        let mut r = Rates {
            calibrated: true,
            ..*self
        };
        let waves = s.objects.div_ceil(m.parallelism.max(1) as u64).max(1) as f64;
        let download = m.download_seconds.max(MIN_STAGE_SECONDS);
        let transfer = (download - waves * r.first_byte_seconds).max(MIN_STAGE_SECONDS);
        let stages = [
            (s.stored_bytes, self.download_bytes_per_second),
            (s.plain_encoded_bytes, self.decode_bytes_per_second),
            (s.plain_bytes, self.check_bytes_per_second),
        ];
        let binding = stages
            .iter()
            .enumerate()
            .filter(|(_, (bytes, _))| *bytes > 0)
            .max_by(|a, b| {
                let t = |(bytes, rate): &(u64, f64)| *bytes as f64 / rate.max(1.0);
                t(a.1).total_cmp(&t(b.1))
            })
            .map_or(0, |(i, _)| i);
        let mut rates = stages.map(|(_, rate)| rate);
        for (i, (bytes, rate)) in stages.iter().enumerate() {
            let shown = *bytes as f64 / transfer;
            rates[i] = match i == binding {
                true => shown,
                // Not binding: at least as fast as the phase shows, never slower than kept.
                false if *bytes > 0 => rate.max(shown),
                false => *rate,
            };
        }
        [
            r.download_bytes_per_second,
            r.decode_bytes_per_second,
            r.check_bytes_per_second,
        ] = rates;
        let cut = match s.plain_cut_bytes {
            0 => 0.0,
            b => b as f64 / r.check_bytes_per_second.max(1.0),
        };
        r.fixed_seconds = (m.plan_seconds + m.finish_seconds - cut).max(0.0);
        Some(r)
    }

    /// `self` moved [`SMOOTHING`] of the way toward `sample` (all of it while `self` holds
    /// the uncalibrated defaults: the first measurement replaces them).
    pub fn blend(&self, sample: &Rates) -> Rates {
        let w = match self.calibrated {
            true => SMOOTHING,
            false => 1.0,
        };
        let mix = |a: f64, b: f64| match b.is_finite() && b >= 0.0 {
            true => a + w * (b - a),
            false => a,
        };
        Rates {
            download_bytes_per_second: mix(
                self.download_bytes_per_second,
                sample.download_bytes_per_second,
            ),
            first_byte_seconds: mix(self.first_byte_seconds, sample.first_byte_seconds),
            decode_bytes_per_second: mix(
                self.decode_bytes_per_second,
                sample.decode_bytes_per_second,
            ),
            check_bytes_per_second: mix(self.check_bytes_per_second, sample.check_bytes_per_second),
            fixed_seconds: mix(self.fixed_seconds, sample.fixed_seconds),
            calibrated: self.calibrated || sample.calibrated,
        }
    }
}

/// The seconds a restore of `shape` is predicted to take at `rates` with `parallelism` GETs
/// in flight (see the module docs).
pub fn predict(shape: &Shape, rates: &Rates, parallelism: usize) -> f64 {
    let per = |bytes: u64, rate: f64| match rate > 0.0 {
        true => bytes as f64 / rate,
        false => 0.0,
    };
    let waves = shape.objects.div_ceil(parallelism.max(1) as u64) as f64;
    let download = per(shape.stored_bytes, rates.download_bytes_per_second);
    let decode = per(shape.plain_encoded_bytes, rates.decode_bytes_per_second);
    let check = per(shape.plain_bytes, rates.check_bytes_per_second);
    rates.fixed_seconds
        + waves * rates.first_byte_seconds
        + download.max(decode).max(check)
        + per(shape.plain_cut_bytes, rates.check_bytes_per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_stage_sets_the_pace() {
        let rates = Rates::default();
        let shape = Shape {
            objects: 16,
            stored_bytes: 1_000_000_000,
            plain_bytes: 1_000_000_000,
            ..Shape::default()
        };
        // 0.5 fixed + 1 wave × 0.05 + 10 s of download.
        assert!((predict(&shape, &rates, 16) - 10.55).abs() < 1e-9);
        let slow_disk = Rates {
            check_bytes_per_second: 50e6,
            ..rates
        };
        assert!((predict(&shape, &slow_disk, 16) - 20.55).abs() < 1e-9);
    }

    fn measured(shape: Shape, download_seconds: f64) -> Measured {
        Measured {
            shape,
            parallelism: 16,
            plan_seconds: 0.1,
            download_seconds,
            finish_seconds: 0.1,
            resumed_bytes: 0,
        }
    }

    #[test]
    fn a_sample_reproduces_its_own_measurement_and_blending_moves_toward_it() {
        let shape = Shape {
            objects: 40,
            stored_bytes: 2_000_000_000,
            plain_bytes: 2_000_000_000,
            ..Shape::default()
        };
        let rates = Rates::default();
        let m = measured(shape, 8.0);
        let sample = rates.sample(&m).expect("a measurement");
        assert!(sample.calibrated);
        let again = predict(&shape, &sample, 16);
        assert!((again - 8.2).abs() < 0.01, "{again}");
        // The first measurement replaces the defaults; the next moves a quarter of the way.
        let kept = rates.blend(&sample);
        assert_eq!(kept, sample);
        let slow = sample
            .sample(&measured(shape, 16.0))
            .expect("a measurement");
        let moved = predict(&shape, &kept.blend(&slow), 16);
        assert!(moved > 8.2 && moved < 12.0, "{moved}");
    }

    #[test]
    fn the_first_byte_is_not_learnt_and_resumed_runs_teach_nothing() {
        let shape = Shape {
            objects: 64,
            stored_bytes: 64_000,
            plain_bytes: 64_000,
            ..Shape::default()
        };
        // 4 waves in 0.8 s: the latency stays as stated, the rest is transfer.
        let sample = Rates::default().sample(&measured(shape, 0.8)).unwrap();
        assert_eq!(
            sample.first_byte_seconds,
            Rates::default().first_byte_seconds
        );
        let resumed = Measured {
            resumed_bytes: 1,
            ..measured(shape, 0.8)
        };
        assert_eq!(Rates::default().sample(&resumed), None);
        let nan = measured(shape, f64::NAN);
        assert_eq!(Rates::default().sample(&nan), None);
    }

    #[test]
    fn zero_rates_and_parallelism_do_not_divide_by_zero() {
        let rates = Rates {
            download_bytes_per_second: 0.0,
            ..Rates::default()
        };
        let p = predict(&Shape::default(), &rates, 0);
        assert!(p.is_finite());
    }
}

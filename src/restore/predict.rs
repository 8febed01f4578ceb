//! How long a restore will take, said before it begins: a restore's [`Shape`] (known from its
//! manifests alone, without a request) and the [`Rates`] this machine and this endpoint have
//! shown, turned into seconds ([`predict`]).
//!
//! # The model
//! A restore fetches its objects `parallelism` at a time, writing and checking each file as it
//! arrives and decoding the encoded ones on the way in. Each stage costs its bytes at its own
//! rate, and the costs add up:
//!
//! ```text
//! seconds = fixed + waves × first_byte + stored / download + plain_encoded / decode
//!         + (plain + plain_cut) / check + past_writeback / writeback
//! waves          = ceil(objects / parallelism)
//! past_writeback = max(0, plain − WRITEBACK_AFTER)
//! ```
//!
//! The stages overlap in a restore, so a rate here is not the stage's own rate but what it
//! adds to the whole, as this machine's restores showed it ([`super::calibrate`] fits them).
//! An earlier model took the slowest stage alone (a `max`), learning one stage per drill: it
//! could not tell a 100 MB drill's fixed costs from its transfer, nor see that the bytes past
//! the first GiB of a restore go slower (the page cache holds the first ones; the rest wait
//! for the disk), and predicted 78 % of 41 drills within ±20 %. `fixed` is the planning (LIST,
//! LATEST, the manifest) and the finish (directories' fsync, chain check, rename);
//! `plain_cut` is the WAL an `--at` cut reads again. Before a restore or drill has measured
//! them, [`Rates::default`] holds stated defaults and `calibrated: false`.
//! [`Shape::of_manifest`] gives a restore point's shape from its manifest alone (what health
//! predicts from, without a request).
//!
//! # What a crash leaves
//! Nothing: pure arithmetic.

use serde::{Deserialize, Serialize};

use crate::manifest::{Manifest, ObjectEntry, SegmentEntry};

/// Plain bytes a restore writes before the disk, not the page cache, sets their pace (the
/// model's `past_writeback`; see the module docs).
pub const WRITEBACK_AFTER: u64 = 1 << 30;

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

/// What one finished restore measured ([`super::calibrate::Sample::of`] reads it).
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
    /// Plain bytes a second past the first [`WRITEBACK_AFTER`] of a restore: the disk's pace.
    #[serde(default = "default_writeback")]
    pub writeback_bytes_per_second: f64,
    /// Planning and finishing, whatever the size.
    pub fixed_seconds: f64,
    /// Whether any of these were measured here (false: the defaults).
    pub calibrated: bool,
}

impl Default for Rates {
    /// Stated defaults: 100 MB/s from the endpoint with 50 ms to a first byte (S3 Standard in
    /// the same region, a modest instance), 200 MB/s of decoding, 400 MB/s of local writes and
    /// checks, 200 MB/s more for the bytes past the first GiB, and half a second of planning
    /// and finishing.
    fn default() -> Rates {
        Rates {
            download_bytes_per_second: 100e6,
            first_byte_seconds: 0.05,
            decode_bytes_per_second: 200e6,
            check_bytes_per_second: 400e6,
            writeback_bytes_per_second: default_writeback(),
            fixed_seconds: 0.5,
            calibrated: false,
        }
    }
}

fn default_writeback() -> f64 {
    200e6
}

/// The seconds a restore of `shape` is predicted to take at `rates` with `parallelism` GETs
/// in flight (see the module docs).
pub fn predict(shape: &Shape, rates: &Rates, parallelism: usize) -> f64 {
    stages(shape, parallelism)
        .iter()
        .zip(rates.seconds_per_unit())
        .map(|(units, cost)| units * cost)
        .sum()
}

/// What a restore of `shape` has of each stage of the model, in the stage's unit (a restore,
/// a wave of first bytes, bytes): the order of [`Rates::seconds_per_unit`].
pub(super) fn stages(shape: &Shape, parallelism: usize) -> [f64; STAGES] {
    let waves = shape.objects.div_ceil(parallelism.max(1) as u64) as f64;
    [
        1.0,
        waves,
        shape.stored_bytes as f64,
        shape.plain_encoded_bytes as f64,
        shape.plain_bytes.saturating_add(shape.plain_cut_bytes) as f64,
        shape.plain_bytes.saturating_sub(WRITEBACK_AFTER) as f64,
    ]
}

/// The stages of the model ([`stages`]).
pub(super) const STAGES: usize = 6;

impl Rates {
    /// What one unit of each stage costs, in seconds (a rate of 0 or less costs nothing).
    pub(super) fn seconds_per_unit(&self) -> [f64; STAGES] {
        let per_byte = |rate: f64| match rate > 0.0 {
            true => 1.0 / rate,
            false => 0.0,
        };
        [
            self.fixed_seconds,
            self.first_byte_seconds,
            per_byte(self.download_bytes_per_second),
            per_byte(self.decode_bytes_per_second),
            per_byte(self.check_bytes_per_second),
            per_byte(self.writeback_bytes_per_second),
        ]
    }

    /// The rates whose costs per unit are `costs` (the inverse of [`Rates::seconds_per_unit`];
    /// a cost of 0 is a stage that costs nothing).
    pub(super) fn of_costs(costs: [f64; STAGES], calibrated: bool) -> Rates {
        let rate = |cost: f64| match cost > 0.0 {
            true => 1.0 / cost,
            false => 0.0,
        };
        Rates {
            fixed_seconds: costs[0],
            first_byte_seconds: costs[1],
            download_bytes_per_second: rate(costs[2]),
            decode_bytes_per_second: rate(costs[3]),
            check_bytes_per_second: rate(costs[4]),
            writeback_bytes_per_second: rate(costs[5]),
            calibrated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_adds_its_cost() {
        let rates = Rates::default();
        let shape = Shape {
            objects: 16,
            stored_bytes: 1_000_000_000,
            plain_bytes: 1_000_000_000,
            ..Shape::default()
        };
        // 0.5 fixed + 1 wave × 0.05 + 10 s of download + 2.5 s of checks.
        assert!((predict(&shape, &rates, 16) - 13.05).abs() < 1e-9);
        let slow_disk = Rates {
            check_bytes_per_second: 50e6,
            ..rates
        };
        assert!((predict(&shape, &slow_disk, 16) - 30.55).abs() < 1e-9);
        // Past the first GiB the disk's pace is added.
        let big = Shape {
            plain_bytes: (1 << 30) + 200_000_000,
            ..shape
        };
        let more = predict(&big, &rates, 16) - predict(&shape, &rates, 16);
        let checks = ((1u64 << 30) + 200_000_000 - 1_000_000_000) as f64 / 400e6;
        assert!((more - checks - 1.0).abs() < 1e-9, "{more}");
    }

    #[test]
    fn costs_and_rates_are_each_others_inverse() {
        let r = Rates::default();
        let back = Rates::of_costs(r.seconds_per_unit(), false).seconds_per_unit();
        for (a, b) in back.iter().zip(r.seconds_per_unit()) {
            assert!((a - b).abs() <= 1e-12 * b.abs(), "{a} {b}");
        }
        // A stage that costs nothing is a rate of 0, which costs nothing again.
        let free = Rates::of_costs([0.0; STAGES], true);
        assert_eq!(free.seconds_per_unit(), [0.0; STAGES]);
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

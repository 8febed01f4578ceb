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
//! # What a crash leaves
//! Nothing: pure arithmetic.

use serde::{Deserialize, Serialize};

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

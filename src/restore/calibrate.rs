//! Calibration: the [`Rates`] an endpoint's recent restores imply ([`Calibration::rates`]),
//! fitted to the last [`WINDOW`] of them ([`Sample`]s: each one's shape and its measured
//! seconds).
//!
//! # The fit
//! Every sample is one equation of the model in [`super::predict`]: its stages' units times
//! their costs add up to its seconds. The costs are found by least squares over the window,
//! each sample weighted by `1 / seconds²` (the error that matters is relative: a 0.2 s drill
//! 0.1 s off is as wrong as a 20 s one 10 s off) and by [`DECAY`] per newer sample after it
//! (the endpoint and the machine drift; the newest restores say most). No cost is negative.
//! The costs are solved for as factors of the stated defaults' costs, and those factors are
//! pulled toward each other ([`SPREAD`]), never toward the defaults: a single drill scales
//! every default cost by what it measured, and the stages come apart only as far as drills of
//! different shapes (sizes, codecs, encryption) show them apart.
//!
//! One drill's phases cannot be told apart (they overlap), so a sample is the whole restore's
//! seconds (planning, download, finish). A resumed restore (bytes kept from an earlier run),
//! one that fetched nothing, or one whose timings are not finite and positive is no sample.
//!
//! Measured on `benches/rto.rs` (41 drills after the first, 100 MB to 8 GB, plain, zstd,
//! sealed and both, SeaweedFS on this 2-core machine): 38 of 41 within ±20 % with the
//! constants here, against 32 of 41 (78 %) for the earlier model, which moved the one stage
//! it took as binding half of the way toward each drill.
//!
//! # What a crash leaves
//! Nothing of its own: the caller keeps the window (the registry's `restore_rates.recent`).

use serde::{Deserialize, Serialize};

use super::predict::{Measured, Rates, STAGES, Shape, stages};

/// The newest samples kept per endpoint.
pub const WINDOW: usize = 32;
/// The weight of a sample for each newer one after it.
pub const DECAY: f64 = 0.95;
/// How strongly the stages' factors are pulled toward one another (see the module docs).
pub const SPREAD: f64 = 0.1;
/// The seconds a sample may state: a millisecond (a timer's grain; less would weigh a sample
/// 10^6 times another) to a year.
pub const SECONDS: std::ops::RangeInclusive<f64> = 1e-3..=3.2e7;
/// Rounds of the solver (coordinate descent; six unknowns settle in far fewer).
const ROUNDS: usize = 400;

/// One finished restore: what it moved and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub shape: Shape,
    pub parallelism: usize,
    pub seconds: f64,
}

impl Sample {
    /// The sample `m` is, if it is one (see the module docs).
    pub fn of(m: &Measured) -> Option<Sample> {
        let seconds = m.plan_seconds + m.download_seconds + m.finish_seconds;
        let timings = [m.plan_seconds, m.download_seconds, m.finish_seconds];
        let usable = m.resumed_bytes == 0
            && m.shape.stored_bytes > 0
            && timings.iter().all(|t| t.is_finite() && *t >= 0.0)
            && seconds > 0.0;
        usable.then_some(Sample {
            shape: m.shape,
            parallelism: m.parallelism.max(1),
            seconds,
        })
    }

    /// Its stages in units of the stated defaults' seconds.
    fn units(&self, defaults: &[f64; STAGES]) -> [f64; STAGES] {
        let mut x = stages(&self.shape, self.parallelism);
        for (u, d) in x.iter_mut().zip(defaults) {
            *u *= d;
        }
        x
    }
}

/// An endpoint's recent samples, oldest first (at most [`WINDOW`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    samples: Vec<Sample>,
}

impl Calibration {
    /// The window of `samples` (the newest [`WINDOW`] of them, unusable ones dropped: a
    /// registry row is read back, and may hold anything).
    pub fn of(samples: Vec<Sample>) -> Calibration {
        let mut c = Calibration::default();
        samples.into_iter().for_each(|s| c.push(s));
        c
    }

    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Adds `sample` (unless its seconds are out of [`SECONDS`]), forgetting the oldest past
    /// [`WINDOW`].
    pub fn push(&mut self, sample: Sample) {
        if !SECONDS.contains(&sample.seconds) {
            return;
        }
        self.samples.push(sample);
        let extra = self.samples.len().saturating_sub(WINDOW);
        self.samples.drain(..extra);
    }

    /// The rates the window implies; the stated defaults while it is empty.
    pub fn rates(&self) -> Rates {
        if self.samples.is_empty() {
            return Rates::default();
        }
        let defaults = Rates::default().seconds_per_unit();
        let factors = self.factors(&defaults);
        let mut costs = defaults;
        for (c, f) in costs.iter_mut().zip(factors) {
            *c *= f;
        }
        Rates::of_costs(costs, true)
    }

    /// The factors of the defaults' costs that fit the window best (see the module docs):
    /// weighted least squares with the spread penalty, each factor at least 0.
    fn factors(&self, defaults: &[f64; STAGES]) -> [f64; STAGES] {
        let n = STAGES;
        let mut a = [[0.0f64; STAGES]; STAGES];
        let mut b = [0.0f64; STAGES];
        let mut weight = 1.0;
        for s in self.samples.iter().rev() {
            let x = s.units(defaults);
            let w = weight / (s.seconds * s.seconds);
            for i in 0..n {
                b[i] += w * x[i] * s.seconds;
                for j in 0..n {
                    a[i][j] += w * x[i] * x[j];
                }
            }
            weight *= DECAY;
        }
        // The spread penalty: SPREAD × Σ (f_i − mean f)², and a whisker toward 1 so that a
        // stage no sample has (no encoded bytes, none past the first GiB) keeps its default.
        for (i, row) in a.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                let identity = if i == j { 1.0 } else { 0.0 };
                *v += SPREAD * (identity - 1.0 / n as f64);
            }
            row[i] += 1e-9;
            b[i] += 1e-9;
        }
        let mut f = [1.0f64; STAGES];
        for _ in 0..ROUNDS {
            for j in 0..n {
                let rest: f64 = (0..n).filter(|&k| k != j).map(|k| a[j][k] * f[k]).sum();
                let next = (b[j] - rest) / a[j][j];
                f[j] = if next.is_finite() {
                    next.max(0.0)
                } else {
                    f[j]
                };
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::super::predict::predict;
    use super::*;

    fn shape(mb: u64, encoded: bool) -> Shape {
        let bytes = mb * 1_000_000;
        Shape {
            objects: bytes.div_ceil(64 << 20),
            stored_bytes: if encoded { bytes / 3 } else { bytes },
            plain_bytes: bytes,
            plain_encoded_bytes: if encoded { bytes } else { 0 },
            plain_cut_bytes: 0,
        }
    }

    fn sample(shape: Shape, seconds: f64) -> Sample {
        Sample {
            shape,
            parallelism: 16,
            seconds,
        }
    }

    /// A machine the model describes exactly.
    fn truth() -> Rates {
        Rates {
            download_bytes_per_second: 700e6,
            first_byte_seconds: 0.01,
            decode_bytes_per_second: 900e6,
            check_bytes_per_second: 3e9,
            writeback_bytes_per_second: 1.5e9,
            fixed_seconds: 0.05,
            calibrated: true,
        }
    }

    #[test]
    fn drills_of_several_shapes_recover_the_machine() {
        let truth = truth();
        let mut c = Calibration::default();
        for mb in [100, 400, 1000, 4000, 8000, 300, 2000] {
            for encoded in [false, true] {
                let s = shape(mb, encoded);
                c.push(sample(s, predict(&s, &truth, 16)));
            }
        }
        let fitted = c.rates();
        assert!(fitted.calibrated);
        for mb in [150, 600, 3000, 6000] {
            for encoded in [false, true] {
                let s = shape(mb, encoded);
                let (want, got) = (predict(&s, &truth, 16), predict(&s, &fitted, 16));
                assert!(
                    (got - want).abs() / want < 0.05,
                    "{mb} MB: {got} s for {want} s"
                );
            }
        }
    }

    #[test]
    fn one_drill_scales_every_default_and_reproduces_itself() {
        let s = shape(1000, false);
        let c = Calibration::of(vec![sample(s, 2.0)]);
        let fitted = c.rates();
        let again = predict(&s, &fitted, 16);
        assert!((again - 2.0).abs() < 0.02, "{again}");
        // Scaled alike: the download still costs four times the checks, as the defaults say.
        let d = Rates::default();
        let ratio = |r: &Rates| r.check_bytes_per_second / r.download_bytes_per_second;
        assert!((ratio(&fitted) - ratio(&d)).abs() / ratio(&d) < 0.05);
    }

    #[test]
    fn the_window_keeps_the_newest_and_the_newest_count_most() {
        let s = shape(1000, false);
        let mut c = Calibration::default();
        for _ in 0..WINDOW {
            c.push(sample(s, 10.0));
        }
        for _ in 0..8 {
            c.push(sample(s, 5.0));
        }
        assert_eq!(c.samples().len(), WINDOW);
        let now = predict(&s, &c.rates(), 16);
        // 8 of 32 samples say 5 s, but they are the newest: nearer 5 than a plain mean (8.75).
        assert!(now < 8.0 && now > 5.0, "{now}");
    }

    #[test]
    fn resumed_empty_and_broken_measurements_are_no_samples() {
        let m = Measured {
            shape: shape(100, false),
            parallelism: 16,
            plan_seconds: 0.1,
            download_seconds: 1.0,
            finish_seconds: 0.1,
            resumed_bytes: 0,
        };
        assert!(Sample::of(&m).is_some());
        for bad in [
            Measured {
                resumed_bytes: 1,
                ..m
            },
            Measured {
                download_seconds: f64::NAN,
                ..m
            },
            Measured {
                download_seconds: -5.0,
                ..m
            },
            Measured {
                shape: Shape::default(),
                ..m
            },
        ] {
            assert_eq!(Sample::of(&bad), None, "{bad:?}");
        }
        // A hostile window (read back from a registry row) loses what is not a sample.
        for seconds in [f64::INFINITY, f64::NAN, 0.0, -1.0, 1e-300, 1e30] {
            let c = Calibration::of(vec![sample(shape(100, false), seconds)]);
            assert_eq!(c.rates(), Rates::default(), "{seconds}");
        }
    }
}

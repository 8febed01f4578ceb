//! Predicted restore times (issue 42, part 4): the rates this instance's drills and restores
//! measured, per destination endpoint ([`endpoint_of`]), kept in memory and in the registry
//! (`restore_rates`, `crate::registry::KeptRates`), and the drills running now, whose
//! progress health shows ([`Rto::drilling`]).
//!
//! # Invariants
//! - Rates are learnt only from a finished, whole restore (a drill that succeeded, an
//!   adopting restore): its [`Sample`] joins the endpoint's recent ones
//!   ([`Calibration`], kept in the registry's row as `recent`), and the rates are fitted to
//!   them again. A failed or resumed restore teaches nothing. No request is sent for any of it: the shape comes from a manifest the drill's
//!   check read, or the restored directory.
//! - An endpoint never measured predicts at the stated defaults, and says so
//!   (`calibrated: false`).
//! - Health predicts from the shapes the store's worker publishes
//!   (`crate::restore::predict::KnownShapes`) and these rates: arithmetic, no request.
//!
//! # What a crash leaves
//! The registry's row as the last measurement wrote it (a crash between the memory and the
//! registry loses that one measurement); a drill's progress is memory only.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::registry::{KeptRates, Registry};
use crate::restore::calibrate::{Calibration, Sample};
use crate::restore::predict::{self, Measured, Rates, Shape};
use crate::restore::progress::{Progress, ProgressLine};
use crate::worker::{KnownPoints, PointSize};

/// GETs in flight in a drill's or adopting restore's download (`RestoreOptions` default).
pub const PARALLELISM: usize = 16;

/// The endpoint a destination's restores are measured against: `file://` for a directory
/// bucket; for S3, the endpoint (or the region's AWS endpoint) and the bucket. The prefix is
/// left out: every prefix of a bucket downloads at the bucket's rate.
pub fn endpoint_of(destination: &str) -> String {
    match crate::bucket::url::parse(destination) {
        Ok(crate::bucket::url::DestinationUrl::File(_)) => "file://".into(),
        Ok(crate::bucket::url::DestinationUrl::S3 {
            bucket, settings, ..
        }) => {
            let host = match (&settings.endpoint, &settings.region) {
                (Some(e), _) => e.clone(),
                (None, Some(r)) => format!("aws:{r}"),
                (None, None) => "aws".into(),
            };
            format!("s3://{bucket}@{host}")
        }
        // Not a destination a store could have registered: measured apart from the others.
        Err(_) => crate::bucket::url::without_query(destination).to_string(),
    }
}

/// A store's predicted restore times (`StoreHealth.predicted_rto_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Predicted {
    /// The newest restore point, with the segments shipped after it; 0 when none is known.
    pub latest: f64,
    /// The retained restore point with the most to fetch and replay.
    pub worst: f64,
    pub calibrated: bool,
}

impl Predicted {
    /// The health note when a prediction is over `target` seconds.
    pub fn note(&self, target: Option<u64>) -> Option<String> {
        let target = target.filter(|t| *t > 0)? as f64;
        let (which, secs) = match (self.latest > target, self.worst > target) {
            (true, _) => ("the newest restore point", self.latest),
            (false, true) => ("the worst retained restore point", self.worst),
            (false, false) => return None,
        };
        let how = match self.calibrated {
            true => "at the rates this instance's drills measured",
            false => "at the stated default rates (no drill has calibrated them yet)",
        };
        Some(format!(
            "a restore of {which} is predicted to take {secs:.1} s, over the store's \
             rto_target_seconds of {target:.0} s ({how})"
        ))
    }
}

/// The rates kept per endpoint and the drills under way (see the module docs).
#[derive(Debug, Default)]
pub struct Rto {
    kept: Mutex<HashMap<String, Kept>>,
    drilling: Mutex<HashMap<String, Progress>>,
}

impl Rto {
    /// The rates the registry holds (none, with a warning, when it cannot be read).
    pub async fn load(registry: &Registry) -> Rto {
        let kept = match registry.all_rates().await {
            Ok(all) => all
                .into_iter()
                .map(|(e, k)| (e, Kept::of_row(&k)))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the restore rates from the registry: predictions use the defaults until a drill measures them");
                HashMap::new()
            }
        };
        Rto {
            kept: Mutex::new(kept),
            drilling: Mutex::default(),
        }
    }

    /// The rates a restore from `destination` is predicted at.
    pub fn rates(&self, destination: &str) -> Rates {
        let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(&endpoint_of(destination))
            .map_or_else(Rates::default, |k| k.rates)
    }

    /// Learns from a finished restore from `destination` (see the module docs); the rates
    /// kept after it, when it measured anything.
    pub async fn learn(
        &self,
        registry: &Registry,
        destination: &str,
        measured: &Measured,
    ) -> Option<Rates> {
        let endpoint = endpoint_of(destination);
        let sample = Sample::of(measured)?;
        let kept = {
            let mut all = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            let mut kept = all.get(&endpoint).cloned().unwrap_or_default();
            kept.recent.push(sample);
            kept.rates = kept.recent.rates();
            kept.samples = kept.samples.saturating_add(1);
            all.insert(endpoint.clone(), kept.clone());
            kept
        };
        tracing::info!(endpoint, rates = ?kept.rates, samples = kept.samples, "restore rates calibrated");
        if let Err(e) = registry.set_rates(&endpoint, &kept.row()).await {
            tracing::warn!(endpoint, error = %e, "cannot keep the restore rates in the registry; they hold until this process stops");
        }
        Some(kept.rates)
    }

    /// Learns from an adopting restore (its shape is the one its report says it moved).
    pub async fn learn_restore(
        &self,
        registry: &Registry,
        destination: &str,
        report: &crate::restore::RestoreReport,
        opts: &crate::restore::RestoreOptions,
    ) {
        let measured = Measured::of(report, report.shape, opts.parallelism);
        self.learn(registry, destination, &measured).await;
    }

    /// A store's predicted restore times from the shapes its worker knows.
    pub fn predict(&self, destination: &str, known: &KnownPoints) -> Predicted {
        let rates = self.rates(destination);
        let at = |p: &PointSize| predict::predict(&shape_of(p), &rates, PARALLELISM);
        let latest = known.latest.as_ref().map_or(0.0, at);
        let worst = known.points.values().map(at).fold(latest, f64::max);
        Predicted {
            latest,
            worst,
            calibrated: rates.calibrated,
        }
    }

    /// Shows the drill of `store_id` that `progress` counts, until the guard is dropped.
    pub fn watch_drill(&self, store_id: &str, progress: Progress) -> DrillWatch<'_> {
        let mut d = self.drilling.lock().unwrap_or_else(|p| p.into_inner());
        d.insert(store_id.to_string(), progress);
        DrillWatch {
            rto: self,
            store_id: store_id.to_string(),
        }
    }

    /// How far the drill of `store_id` running now is, if one is, and the prediction made
    /// before it began.
    pub fn drilling(&self, store_id: &str) -> Option<(ProgressLine, Option<f64>)> {
        let d = self.drilling.lock().unwrap_or_else(|p| p.into_inner());
        d.get(store_id).map(|p| (p.line(), p.predicted_seconds()))
    }
}

/// A restore point's size as the worker counts it, as a shape to predict (no `--at` cut:
/// a restore of the point itself).
pub fn shape_of(p: &PointSize) -> Shape {
    Shape {
        objects: p.objects,
        stored_bytes: p.stored_bytes,
        plain_bytes: p.plain_bytes,
        plain_encoded_bytes: p.plain_encoded_bytes,
        plain_cut_bytes: 0,
    }
}

/// One endpoint's rates, the recent samples they were fitted to, and how many measurements
/// it has had.
#[derive(Debug, Clone, Default)]
struct Kept {
    rates: Rates,
    recent: Calibration,
    samples: u64,
}

impl Kept {
    /// From a registry row: the rates refitted from its recent samples, or, for a row written
    /// before samples were kept (or whose samples do not parse), its rates as they are.
    fn of_row(k: &KeptRates) -> Kept {
        let recent = serde_json::from_str::<Vec<Sample>>(&k.recent)
            .map(Calibration::of)
            .unwrap_or_default();
        let rates = match recent.samples().is_empty() {
            false => recent.rates(),
            true => Rates {
                download_bytes_per_second: k.download_bytes_per_second,
                first_byte_seconds: k.first_byte_seconds,
                decode_bytes_per_second: k.decode_bytes_per_second,
                check_bytes_per_second: k.check_bytes_per_second,
                fixed_seconds: k.fixed_seconds,
                calibrated: true,
                ..Rates::default()
            },
        };
        Kept {
            rates,
            recent,
            samples: k.samples,
        }
    }

    fn row(&self) -> KeptRates {
        let r = &self.rates;
        KeptRates {
            download_bytes_per_second: r.download_bytes_per_second,
            first_byte_seconds: r.first_byte_seconds,
            decode_bytes_per_second: r.decode_bytes_per_second,
            check_bytes_per_second: r.check_bytes_per_second,
            fixed_seconds: r.fixed_seconds,
            samples: self.samples,
            updated_at_ms: crate::units::unix_now_ms(),
            recent: serde_json::to_string(self.recent.samples()).unwrap_or_else(|_| "[]".into()),
        }
    }
}

/// A drill shown in health while it lives ([`Rto::watch_drill`]).
pub struct DrillWatch<'a> {
    rto: &'a Rto,
    store_id: String,
}

impl Drop for DrillWatch<'_> {
    fn drop(&mut self) {
        let mut d = self.rto.drilling.lock().unwrap_or_else(|p| p.into_inner());
        d.remove(&self.store_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_the_bucket_and_endpoint_not_the_prefix() {
        assert_eq!(endpoint_of("file:///backups/a"), "file://");
        assert_eq!(
            endpoint_of("s3://b/p1?endpoint=http://127.0.0.1:9000"),
            endpoint_of("s3://b/p2?endpoint=http://127.0.0.1:9000")
        );
        assert_ne!(endpoint_of("s3://b/p"), endpoint_of("s3://c/p"));
    }

    #[test]
    fn a_note_only_over_the_target() {
        let p = Predicted {
            latest: 10.0,
            worst: 30.0,
            calibrated: true,
        };
        assert_eq!(p.note(None), None);
        assert_eq!(p.note(Some(60)), None);
        assert!(p.note(Some(20)).unwrap().contains("worst retained"));
        assert!(p.note(Some(5)).unwrap().contains("newest restore point"));
    }

    #[test]
    fn a_row_is_refitted_from_its_samples_and_an_old_or_broken_one_keeps_its_rates() {
        let sample = Sample {
            shape: Shape {
                objects: 16,
                stored_bytes: 1_000_000_000,
                plain_bytes: 1_000_000_000,
                ..Shape::default()
            },
            parallelism: PARALLELISM,
            seconds: 2.0,
        };
        let with = Kept {
            rates: Rates::default(),
            recent: Calibration::of(vec![sample]),
            samples: 1,
        }
        .row();
        let back = Kept::of_row(&with);
        assert_eq!(back.rates, Calibration::of(vec![sample]).rates());
        assert_eq!(back.recent.samples(), &[sample]);
        for recent in ["[]", "not json", r#"[{"seconds": -1}]"#] {
            let old = KeptRates {
                download_bytes_per_second: 5e8,
                recent: recent.into(),
                ..with.clone()
            };
            let kept = Kept::of_row(&old);
            assert_eq!(kept.rates.download_bytes_per_second, 5e8, "{recent}");
            assert!(kept.rates.calibrated);
        }
    }
}

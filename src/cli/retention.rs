//! `mushroom-backup retention --from URL --dry-run [--keep-… flags]`: which restore points a
//! retention pass with these settings would delete, and which rule keeps or drops each.
//!
//! The decision is the worker's (`worker::retention`, `worker::tiers`), per lineage: with a
//! tier set, `keep_for` and the tiers; otherwise `keep_for` and `keep_generations`. The
//! manifest LATEST names and each lineage's newest restore point are always kept (the worker
//! keeps its newest; this command does not know which lineage is the running one, so it keeps
//! every lineage's). An unreadable manifest is kept and named. Objects are not listed: what a
//! dropped restore point alone names goes with it, as in a pass.
//!
//! Only `--dry-run` is built: deleting from here (under the bucket lease) is not, and is
//! refused with a message saying so; a running backup applies the same settings itself.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use mushroom_backup::bucket::{self, BucketError};
use mushroom_backup::manifest::{self, Latest, Manifest};
use mushroom_backup::worker::tiers::{self, Tiers};

#[derive(Args)]
pub struct RetentionArgs {
    /// The destination.
    #[arg(long)]
    from: String,
    /// Only list what would be deleted and why (required for now).
    #[arg(long)]
    dry_run: bool,
    /// Keep every restore point younger than this many ms [default: 7 days].
    #[arg(long, default_value_t = 7 * 24 * 3_600_000)]
    keep_for_ms: u64,
    /// Without tiers: keep every restore point of this many newest generations.
    #[arg(long, default_value_t = 2)]
    keep_generations: u64,
    #[arg(long, default_value_t = 0)]
    keep_daily: u64,
    #[arg(long, default_value_t = 0)]
    keep_weekly: u64,
    #[arg(long, default_value_t = 0)]
    keep_monthly: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// One restore point and what a pass does with it.
struct Decision {
    key: String,
    manifest: Option<Manifest>,
    keep: bool,
    why: String,
}

pub async fn run(a: RetentionArgs) -> anyhow::Result<ExitCode> {
    if !a.dry_run {
        anyhow::bail!(
            "retention without --dry-run is not built yet: run with --dry-run to see what a pass \
             would delete; a running backup (serve or backup with --keep-daily/--keep-weekly/\
             --keep-monthly) applies the same rules itself, under its lease"
        );
    }
    // The same ranges `backup` and `serve` hold these to: a dry run shows only a plan a real
    // pass could run.
    use mushroom_backup::worker::limits;
    let checks = [
        limits::KEEP_FOR_MS.check("--keep-for-ms", a.keep_for_ms),
        limits::KEEP_GENERATIONS.check("--keep-generations", a.keep_generations),
        limits::KEEP_TIER.check("--keep-daily", a.keep_daily),
        limits::KEEP_TIER.check("--keep-weekly", a.keep_weekly),
        limits::KEEP_TIER.check("--keep-monthly", a.keep_monthly),
    ];
    for c in checks {
        c.map_err(anyhow::Error::msg)?;
    }
    let bucket = bucket::open_read_only(&a.from).await?;
    let latest = match bucket.get(manifest::LATEST_KEY).await {
        Ok(o) => Latest::decode(&o.data).ok(),
        Err(BucketError::NotFound { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let mut manifests: BTreeMap<String, Option<Manifest>> = BTreeMap::new();
    for o in bucket::list_all(bucket.as_ref(), manifest::MANIFESTS_PREFIX).await? {
        if manifest::parse_manifest_key(&o.key).is_none() {
            continue;
        }
        let m = match bucket.get(&o.key).await {
            Ok(got) => Manifest::decode(&o.key, &got.data).ok(),
            Err(BucketError::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        manifests.insert(o.key, m);
    }
    let now_ms = mushroom_backup::units::unix_now_ms();
    let decisions = decide(&a, &manifests, latest.as_ref(), now_ms);
    let dropped = decisions.iter().filter(|d| !d.keep).count();
    if a.json {
        let points: Vec<_> = decisions
            .iter()
            .map(|d| {
                json!({
                    "manifest_key": d.key,
                    "commit_seq": d.manifest.as_ref().map(|m| m.commit_seq),
                    "created_at": d.manifest.as_ref().map(|m| m.created_at.clone()),
                    "lineage": d.manifest.as_ref().map(|m| m.lineage.to_string()),
                    "generation": d.manifest.as_ref().map(|m| m.generation),
                    "keep": d.keep,
                    "why": d.why,
                })
            })
            .collect();
        println!(
            "{}",
            json!({"dry_run": true, "restore_points": points, "deleted": dropped})
        );
    } else {
        for d in &decisions {
            let (seq, at) = d
                .manifest
                .as_ref()
                .map_or(("?".to_string(), "?".to_string()), |m| {
                    (m.commit_seq.to_string(), m.created_at.clone())
                });
            println!(
                "{:<6} {:>12}  {:<24}  {}",
                if d.keep { "keep" } else { "delete" },
                seq,
                at,
                d.why
            );
        }
        println!(
            "dry run: {dropped} of {} restore points would be deleted",
            decisions.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn decide(
    a: &RetentionArgs,
    manifests: &BTreeMap<String, Option<Manifest>>,
    latest: Option<&Latest>,
    now_ms: i64,
) -> Vec<Decision> {
    let keep_for = Duration::from_millis(a.keep_for_ms);
    let t = Tiers {
        keep_daily: a.keep_daily,
        keep_weekly: a.keep_weekly,
        keep_monthly: a.keep_monthly,
    };
    // Per lineage: its manifests' times, its newest, its newest generations.
    let mut lineages: BTreeMap<uuid::Uuid, BTreeMap<&String, Option<i64>>> = BTreeMap::new();
    for (k, m) in manifests {
        if let Some(m) = m {
            lineages
                .entry(m.lineage)
                .or_default()
                .insert(k, manifest::parse_time_ms(&m.created_at));
        }
    }
    let mut reason: BTreeMap<&String, String> = BTreeMap::new();
    for points in lineages.values() {
        let of = |k: &String| manifests[k].as_ref().expect("decoded");
        if let Some(newest) = points.keys().max_by_key(|k| of(k).commit_seq) {
            reason.insert(newest, "the lineage's newest restore point".into());
        }
        if t.enabled() {
            for (k, r) in tiers::keep(points, now_ms, keep_for, &t) {
                reason
                    .entry(k)
                    .or_insert_with(|| format!("kept: {}", r.name()));
            }
        } else {
            let mut generations: Vec<u64> = points.keys().map(|k| of(k).generation).collect();
            generations.sort_unstable();
            generations.dedup();
            let newest: Vec<u64> = generations
                .iter()
                .rev()
                .take(mushroom_backup::units::usize_of(a.keep_generations))
                .copied()
                .collect();
            for (k, at) in points {
                let young = at.is_none_or(|t| {
                    now_ms.saturating_sub(t) < mushroom_backup::units::i64_of(a.keep_for_ms)
                });
                if young {
                    reason.entry(k).or_insert_with(|| "kept: keep_for".into());
                } else if newest.contains(&of(k).generation) {
                    reason
                        .entry(k)
                        .or_insert_with(|| "kept: keep_generations".into());
                }
            }
        }
    }
    manifests
        .iter()
        .map(|(k, m)| {
            let why = if latest.is_some_and(|l| &l.manifest == k) {
                Some("named by LATEST".to_string())
            } else if m.is_none() {
                Some("unreadable manifest: never deleted on a guess".to_string())
            } else {
                reason.get(k).cloned()
            };
            Decision {
                key: k.clone(),
                manifest: m.clone(),
                keep: why.is_some(),
                why: why.unwrap_or_else(|| "dropped: no rule keeps it".into()),
            }
        })
        .collect()
}

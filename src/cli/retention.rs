//! `mushroom-backup retention --from URL --dry-run [--keep-… flags]`: which restore points a
//! retention pass with these settings would delete, and which rule keeps or drops each.
//!
//! The decision is the worker's own function (`worker::retention::keep`, which a pass calls),
//! per lineage: with a tier set, `keep_for` and the tiers; otherwise `keep_for` and
//! `keep_generations`. The
//! manifest LATEST names and each lineage's newest restore point are always kept (the worker
//! keeps its newest; this command does not know which lineage is the running one, so it keeps
//! every lineage's). An unreadable manifest is kept and named. Objects are not listed: what a
//! dropped restore point alone names goes with it, as in a pass.
//!
//! Without `--dry-run` it runs the pass (`worker::retention_pass`): it takes the prefix's
//! bucket lease as a worker does (refused, naming the holder, while another holder is live),
//! runs the worker's retention for every lineage under it, and releases it. Exactly what a
//! worker's pass deletes, in its order, so a crash at any request leaves every manifest whole
//! and only unnamed objects behind (the next pass deletes them). `orphan_grace` is the
//! worker's default (1 hour).

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use mushroom_backup::bucket;
use mushroom_backup::manifest::{Latest, Manifest};
use mushroom_backup::worker::retention::{self, Kept, RetentionPolicy};
use mushroom_backup::worker::retention_pass;
use mushroom_backup::worker::tiers::Tiers;

#[derive(Args)]
pub struct RetentionArgs {
    /// The destination.
    #[arg(long)]
    from: String,
    /// Only list what would be deleted and why (without it: delete, under the bucket lease).
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
    if !a.dry_run {
        return pass(&a).await;
    }
    let bucket = bucket::Open::read_only(&a.from, &super::bucket_token())
        .open()
        .await?;
    let latest = mushroom_backup::latest::read(bucket.as_ref())
        .await?
        .and_then(|f| f.latest.ok());
    let manifests: BTreeMap<String, Option<Manifest>> = retention_pass::read_manifests(&bucket)
        .await?
        .into_iter()
        .collect();
    let now_ms = mushroom_backup::units::unix_now_ms();
    let mut decisions = decide(&a, &manifests, latest.as_ref(), now_ms);
    let dropped = decisions.iter().filter(|d| !d.keep).count();
    let pins = mushroom_backup::pins::read(
        bucket.as_ref(),
        now_ms,
        policy(&a).orphan_grace,
        &mut Default::default(),
    )
    .await?;
    name_pinned(&mut decisions, &pins);
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
        let pins: Vec<_> = pins
            .held
            .iter()
            .map(|h| {
                json!({"branch": h.pin.branch, "lineage": h.pin.lineage.to_string(),
                    "commit_seq": h.pin.commit_seq, "objects": h.pin.keys.len(), "keep": true})
            })
            .chain(
                pins.reclaimable
                    .iter()
                    .map(|r| json!({"lineage": r.branch.to_string(), "keep": false, "why": r.why})),
            )
            .collect();
        super::out::line(
            json!({"dry_run": true, "restore_points": points, "deleted": dropped,
            "pins": pins}),
        )?;
    } else {
        for d in &decisions {
            let (seq, at) = d
                .manifest
                .as_ref()
                .map_or(("?".to_string(), "?".to_string()), |m| {
                    (m.commit_seq.to_string(), m.created_at.clone())
                });
            super::out::line(format!(
                "{:<6} {:>12}  {:<24}  {}",
                if d.keep { "keep" } else { "delete" },
                seq,
                at,
                d.why
            ))?;
        }
        for h in &pins.held {
            super::out::line(format!(
                "pinned {:>12}  {} objects kept for branch {} (lineage {})",
                h.pin.commit_seq,
                h.pin.keys.len(),
                h.pin.branch,
                h.pin.lineage
            ))?;
        }
        for r in &pins.reclaimable {
            super::out::line(format!("unpin  branch {}: {}", r.branch, r.why))?;
        }
        super::out::line(format!(
            "dry run: {dropped} of {} restore points would be deleted",
            decisions.len()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Adds to each dropped restore point the branches that keep some of its objects (`why`).
fn name_pinned(decisions: &mut [Decision], pins: &mushroom_backup::pins::Pins) {
    for d in decisions.iter_mut().filter(|d| !d.keep) {
        let Some(m) = &d.manifest else { continue };
        for h in &pins.held {
            let n = m.objects().filter(|o| h.pin.keys.contains(&o.key)).count();
            if n == 0 {
                continue;
            }
            let branch = &h.pin.branch;
            d.why.push_str(&format!(
                "; {n} of its objects stay, pinned by branch {branch}"
            ));
        }
    }
}

/// The worker's policy for these flags (`orphan_grace` its default, 1 hour).
fn policy(a: &RetentionArgs) -> RetentionPolicy {
    RetentionPolicy {
        keep_for: Duration::from_millis(a.keep_for_ms),
        keep_generations: a.keep_generations,
        tiers: Tiers {
            keep_daily: a.keep_daily,
            keep_weekly: a.keep_weekly,
            keep_monthly: a.keep_monthly,
        },
        ..RetentionPolicy::default()
    }
}

/// The pass: under the bucket lease, taken as a worker takes it, or refused naming its holder
/// (`super::lease`).
async fn pass(a: &RetentionArgs) -> anyhow::Result<ExitCode> {
    use mushroom_backup::lease::LeaseConfig;
    let bucket = super::open_existing(&a.from).await?;
    let config = LeaseConfig::from_env(format!("retention of {}", a.from))?;
    let held = super::lease::take(
        bucket.clone(),
        config,
        &format!("retention of {}", a.from),
        "its own retention applies its settings, or run this once it has stopped",
    )
    .await?;
    let ran = held
        .lease()
        .guard(retention_pass::pass(&bucket, &policy(a)))
        .await;
    held.release().await;
    let report = ran
        .map_err(|e| anyhow::anyhow!("retention of {}: {e}", a.from))?
        .map_err(|e| anyhow::anyhow!("retention of {}: {e}", a.from))?;
    if a.json {
        super::out::line(json!({
            "dry_run": false,
            "lineages": report.lineages,
            "deleted": report.deleted,
            "branch_charges": report.branch_charges,
        }))?;
    } else {
        super::out::line(format!(
            "deleted {} objects over {} lineages",
            report.deleted, report.lineages
        ))?;
        for c in &report.branch_charges {
            super::out::line(format!(
                "branch {} (lineage {}) keeps {} bytes in {} objects alive only through its pin \
                 (charged to it)",
                c.branch, c.lineage, c.bytes, c.objects
            ))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Each restore point and what a pass does with it: per lineage, the worker's own selection
/// (`worker::retention::keep`), with LATEST's manifest and the lineage's newest protected.
fn decide(
    a: &RetentionArgs,
    manifests: &BTreeMap<String, Option<Manifest>>,
    latest: Option<&Latest>,
    now_ms: i64,
) -> Vec<Decision> {
    let policy = policy(a);
    let mut lineages: BTreeMap<uuid::Uuid, BTreeMap<&String, &Manifest>> = BTreeMap::new();
    for (k, m) in manifests {
        if let Some(m) = m {
            lineages.entry(m.lineage).or_default().insert(k, m);
        }
    }
    let mut reason: BTreeMap<&String, String> = BTreeMap::new();
    for own in lineages.values() {
        let mut protected: HashSet<String> =
            latest.map(|l| l.manifest.clone()).into_iter().collect();
        let newest = own
            .iter()
            .max_by_key(|(_, m)| m.commit_seq)
            .map(|(k, _)| *k);
        protected.extend(newest.cloned());
        for (k, kept) in retention::keep(own, &protected, &policy, now_ms) {
            let why = match kept {
                Kept::Protected if Some(k) == newest => {
                    "the lineage's newest restore point".to_string()
                }
                // LATEST's manifest: named below.
                Kept::Protected => continue,
                other => format!("kept: {}", other.name()),
            };
            reason.insert(k, why);
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

//! `restore`, `verify` and `ls`: straight against a bucket, no service needed.
//!
//! `ls` and `verify` of a prefix that holds nothing of a backup (a typo, a path a level too
//! high) fail, naming what the prefix holds ([`listing::holds_a_backup`]); a prefix with a
//! generation or a lease but no restore point yet lists as "no restore points yet", exit 0.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::verify::{self, VerifyOptions};
use mushroom_backup::{bucket, listing};

#[derive(Args)]
pub struct RestoreArgs {
    /// The destination to restore from: file:///path or s3://bucket/prefix.
    #[arg(long)]
    from: String,
    /// An empty or missing directory to restore into (with --follow, also a standby's directory
    /// to take up where it stands).
    #[arg(long)]
    to: PathBuf,
    /// Read the bucket as it was at this instant, from S3 object versions (delete markers and
    /// versions written after it are ignored): RFC 3339 with a UTC offset, e.g.
    /// 2026-12-02T10:00:00Z. For a prefix an attacker overwrote or deleted into.
    #[arg(long)]
    bucket_as_of: Option<String>,
    /// Restore exactly to this commit.
    #[arg(long, conflicts_with = "at_time")]
    at: Option<u64>,
    /// Restore the newest commit shipped at or before this instant, by the bucket's clock:
    /// RFC 3339 with a UTC offset, e.g. 2026-12-02T10:00:00Z.
    #[arg(long)]
    at_time: Option<String>,
    /// Stop at the newest restore point (do not extend it by segments shipped after it).
    #[arg(long)]
    restore_point_only: bool,
    /// Boot restore: give the store a new lineage and a parent record, so its backup adopts
    /// the prefix it came from.
    #[arg(long)]
    adopt: bool,
    /// Downloads in flight at once.
    #[arg(long, default_value_t = RestoreOptions::default().parallelism)]
    parallelism: usize,
    /// Also read a reference-engine store with the engine (every commit decoded) before it is
    /// put in place; the format's own checks run always.
    #[arg(long)]
    engine_check: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// How to show progress on stderr: `bar` (on a terminal only; the default), `json` (one
    /// JSON line a second: phase, bytes_done, bytes_total, objects, rate, eta_seconds; and a
    /// last one at the end), or `none`.
    #[arg(long, value_enum, default_value_t = ProgressMode::Bar)]
    progress: ProgressMode,
    /// Discard what an interrupted run of this restore left beside the target and start over
    /// (without it, a run of the same restore continues it, keeping every object it completed
    /// and checked).
    #[arg(long)]
    fresh: bool,
    /// Restore even when segments listed past what the chain of segments reaches were left out
    /// (another chain, a promotion's claim, a bad object: the report's `left_out` names each
    /// and why). Without it such a restore is refused before downloading, with exit status 3.
    #[arg(long)]
    allow_partial: bool,
    /// Hold the restore's downloads to this many bytes a second, 1 to 100000000000 (paced as
    /// each response is read, every request with its retries) [default: no limit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000_000))]
    limit_bytes_per_second: Option<u64>,
    #[command(flatten)]
    encryption: super::encryption::EncryptionArgs,
    #[command(flatten)]
    standby: super::standby::FollowArgs,
}

/// How `restore` shows its progress.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    Bar,
    Json,
    None,
}

/// The exit status of a restore refused because it would leave out listed data that may hold
/// later commits (without `--allow-partial`).
pub const PARTIAL_EXIT: u8 = 3;

#[derive(Args)]
pub struct VerifyArgs {
    /// The destination to check.
    #[arg(long)]
    from: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Read the bucket as it was at this instant, from S3 object versions (delete markers and
    /// versions written after it are ignored): RFC 3339 with a UTC offset, e.g.
    /// 2026-12-02T10:00:00Z. For a prefix an attacker overwrote or deleted into.
    #[arg(long)]
    bucket_as_of: Option<String>,
    /// Also check that every object a kept restore point names is locked (S3 Object Lock)
    /// at least until that restore point must be kept, naming each that is not.
    #[arg(long)]
    immutable: bool,
    #[command(flatten)]
    encryption: super::encryption::EncryptionArgs,
}

#[derive(Args)]
pub struct LsArgs {
    /// The destination to list.
    #[arg(long)]
    from: String,
    /// Read the bucket as it was at this instant, from S3 object versions (delete markers and
    /// versions written after it are ignored): RFC 3339 with a UTC offset, e.g.
    /// 2026-12-02T10:00:00Z. For a prefix an attacker overwrote or deleted into.
    #[arg(long)]
    bucket_as_of: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `--bucket-as-of`'s instant, unix ms.
fn as_of(t: Option<&str>) -> anyhow::Result<Option<i64>> {
    t.map(|t| {
        restore::at_time::parse_instant(t, mushroom_backup::units::unix_now_ms()).map_err(|e| {
            match e {
                restore::RestoreError::BadTime { given, detail } => {
                    anyhow::anyhow!("--bucket-as-of {given:?} {detail}")
                }
                e => anyhow::anyhow!("--bucket-as-of {t:?}: {e}"),
            }
        })
    })
    .transpose()
}

pub async fn restore(a: RestoreArgs) -> anyhow::Result<ExitCode> {
    if a.parallelism == 0 {
        anyhow::bail!("--parallelism must be at least 1");
    }
    let keys = a.encryption.load_for_reading()?;
    let keys = restore::keys::RestoreKeys::new(keys.map(|k| k.unwrap).unwrap_or_default());
    if a.standby.follow {
        return super::standby::follow(&a.standby, &a.from, &a.to, a.parallelism, keys, a.json)
            .await;
    }
    let at_time_ms = a
        .at_time
        .as_deref()
        .map(|t| restore::at_time::parse_instant(t, mushroom_backup::units::unix_now_ms()))
        .transpose()?;
    let bucket = bucket::Open::read_only(&a.from, &super::bucket_token())
        .as_of(as_of(a.bucket_as_of.as_deref())?)
        .lane(restore_lane(a.limit_bytes_per_second))
        .open()
        .await?;
    let opts = RestoreOptions {
        keys,
        at: a.at,
        at_time_ms,
        restore_point_only: a.restore_point_only,
        adopt: a.adopt,
        parallelism: a.parallelism,
        progress: a.progress == ProgressMode::Bar && std::io::stderr().is_terminal(),
        resumable: true,
        fresh: a.fresh,
        engine_check: a.engine_check,
        allow_partial: a.allow_partial,
        ..RestoreOptions::default()
    };
    let restoring = restore::restore(bucket.as_ref(), &a.to, &opts);
    let restored = match a.progress {
        ProgressMode::Json => {
            restore::progress::every_second(restoring, &opts.tracker, json_line).await
        }
        _ => restoring.await,
    };
    let report = match restored {
        Err(restore::RestoreError::Partial {
            commit_seq,
            left_out,
        }) => return refuse_partial(&a, commit_seq, &left_out),
        r => r.with_context(|| format!("restore from {} into {}", a.from, a.to.display()))?,
    };
    if a.json {
        super::out::line(serde_json::to_string(&report)?)?;
    } else {
        super::out::line(&report)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The lane of a standalone restore: the `restore` class, held to `limit` bytes a second when
/// given (`bucket::throttle`).
fn restore_lane(limit: Option<u64>) -> bucket::throttle::Lane {
    use bucket::throttle::{ClassLimit, LimitSet, Throttle, TrafficClass};
    let limits = LimitSet::none().with(&[ClassLimit {
        class: TrafficClass::Restore,
        bytes_per_second: limit.unwrap_or(0),
        requests_per_second: None,
    }]);
    bucket::throttle::Lane::new(&Throttle::new(limits), None, None).classed(TrafficClass::Restore)
}

/// One line of `--progress json` on stderr.
fn json_line(line: &restore::progress::ProgressLine) {
    if let Ok(line) = serde_json::to_string(line) {
        eprintln!("{line}");
    }
}

/// A restore refused for what it would leave out: each object and why on stderr (and with
/// `--json` a report on stdout: `refused`, `commit_seq`, `left_out`), exit [`PARTIAL_EXIT`].
fn refuse_partial(
    a: &RestoreArgs,
    commit_seq: u64,
    left_out: &[mushroom_backup::at_rest::chain::LeftOut],
) -> anyhow::Result<ExitCode> {
    if a.json {
        let v = serde_json::json!({
            "refused": "partial",
            "commit_seq": commit_seq,
            "left_out": left_out,
        });
        super::out::line(v.to_string())?;
    }
    eprintln!(
        "error: restore from {} into {}: the segments past the restore point reach commit \
         {commit_seq}, but {} listed past them were left out and may hold later commits:",
        a.from,
        a.to.display(),
        left_out.len()
    );
    for l in left_out {
        eprintln!("  {l}");
    }
    eprintln!(
        "nothing was restored; investigate them (damage, a second writer, a promotion's claim), \
         or restore commit {commit_seq} anyway with --allow-partial"
    );
    Ok(ExitCode::from(PARTIAL_EXIT))
}

pub async fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let keys = a.encryption.load_for_reading()?;
    let bucket = bucket::Open::read_only(&a.from, &super::bucket_token())
        .as_of(as_of(a.bucket_as_of.as_deref())?)
        .open()
        .await?;
    let opts = VerifyOptions {
        keys: restore::keys::RestoreKeys::new(keys.map(|k| k.unwrap).unwrap_or_default()),
        ..VerifyOptions::default()
    };
    let report = verify::verify(bucket.as_ref(), &opts).await?;
    if report.manifests.is_empty() && report.latest.is_none() {
        listing::holds_a_backup(bucket.as_ref()).await?;
    }
    let immutable = match a.immutable {
        true => Some(
            verify::immutable::check_immutable(
                bucket.as_ref(),
                mushroom_backup::units::unix_now_ms(),
                opts.parallelism,
            )
            .await?,
        ),
        false => None,
    };
    match (&immutable, a.json) {
        (None, true) => super::out::line(serde_json::to_string(&report)?)?,
        (None, false) => super::out::line(&report)?,
        (Some(i), true) => super::out::line(serde_json::to_string(
            &serde_json::json!({"verify": &report, "immutable": i}),
        )?)?,
        (Some(i), false) => {
            super::out::line(&report)?;
            super::out::line(i)?;
        }
    }
    if report.ok && immutable.as_ref().is_none_or(|i| i.ok) {
        Ok(ExitCode::SUCCESS)
    } else {
        if !a.json {
            eprintln!("error: verify of {} found problems (above)", a.from);
        }
        Ok(ExitCode::FAILURE)
    }
}

pub async fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let bucket = bucket::Open::read_only(&a.from, &super::bucket_token())
        .as_of(as_of(a.bucket_as_of.as_deref())?)
        .open()
        .await?;
    let points = verify::list_restore_points(bucket.as_ref()).await?;
    if points.is_empty() {
        listing::holds_a_backup(bucket.as_ref()).await?;
    }
    if a.json {
        super::out::line(serde_json::to_string(&points)?)?;
    } else {
        super::out::text(&verify::restore_points_text(&points))?;
    }
    Ok(ExitCode::SUCCESS)
}

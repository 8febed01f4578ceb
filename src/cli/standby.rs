//! `restore --follow`: a standalone standby, and `promote`, which makes one the primary.
//!
//! `restore --follow`: a standalone standby (`mushroom_backup::standby`). It restores into the
//! directory (or resumes the store there), then applies what the prefix ships until SIGINT or
//! SIGTERM, and exits 0. One line per apply on stdout (JSON with `--json`), and a last one with
//! where it stopped and the requests it sent, by kind.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use mushroom_backup::bucket;
use mushroom_backup::restore::keys::RestoreKeys;
use mushroom_backup::standby::{self, ApplyReport, ApplyStep, StandbyOptions};

/// The range of both poll intervals, in ms (`standby::POLL_INTERVAL_MIN..=MAX`).
const INTERVAL_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

#[derive(Args)]
pub struct FollowArgs {
    /// Keep the directory current from the destination until SIGINT/SIGTERM: a standby. An
    /// empty directory is restored first; a standby's directory is taken up where it stands.
    #[arg(
        long,
        conflicts_with_all = ["at", "at_time", "restore_point_only", "adopt", "bucket_as_of", "engine_check"]
    )]
    pub follow: bool,
    /// With --follow: ms between polls while there is news (100 to 3600000).
    #[arg(long, requires = "follow", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(INTERVAL_MS))]
    pub poll_interval_ms: u64,
    /// With --follow: the longest ms between polls of a quiet prefix (100 to 3600000, at
    /// least --poll-interval-ms); one LIST each.
    #[arg(long, requires = "follow", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(INTERVAL_MS))]
    pub idle_poll_interval_ms: u64,
    /// For tests: exit (status 86) at this numbered apply step (1 to 7).
    #[arg(long, requires = "follow", hide = true,
          value_parser = clap::value_parser!(u8).range(1..=7))]
    pub crash_at_step: Option<u8>,
}

pub async fn follow(
    a: &FollowArgs,
    from: &str,
    to: &Path,
    parallelism: usize,
    keys: RestoreKeys,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let opts = StandbyOptions {
        poll_interval: Duration::from_millis(a.poll_interval_ms),
        idle_poll_interval: Duration::from_millis(a.idle_poll_interval_ms),
        parallelism,
        keys,
        crash_at: a.crash_at_step.and_then(ApplyStep::from_number),
    };
    if opts.idle_poll_interval < opts.poll_interval {
        anyhow::bail!(
            "--idle-poll-interval-ms {} is below --poll-interval-ms {}",
            a.idle_poll_interval_ms,
            a.poll_interval_ms
        );
    }
    let cancel = super::shutdown_token();
    let opened = bucket::Open::read_only(from, &super::bucket_token())
        .open()
        .await?;
    // Counted, so the last line can say what following cost.
    let bucket = bucket::counting::CountingBucket::new(opened);
    let mut failed = None;
    let print = |r: &ApplyReport| {
        let line = match json {
            true => serde_json::to_string(r).map_err(anyhow::Error::from),
            false => Ok(format!(
                "{:?}: commit {} (lineage {}, generation {}, wal.bin {} bytes{})",
                r.applied,
                r.at.commit_seq,
                r.at.lineage,
                r.at.generation,
                r.at.wal_end,
                match r.segments {
                    0 => String::new(),
                    n => format!(", {n} segments"),
                }
            )),
        };
        if let Err(e) = line.and_then(super::out::line) {
            failed.get_or_insert(e);
        }
    };
    let at = match standby::follow(&bucket, to, &opts, &cancel, print).await {
        Ok(at) => at,
        Err(standby::StandbyError::Cancelled) => {
            tracing::info!("standby of {from} stopped before it was in place");
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => {
            return Err(e).with_context(|| format!("standby of {from} in {}", to.display()));
        }
    };
    if let Some(e) = failed {
        return Err(e);
    }
    let requests = bucket.counts().snapshot();
    let stopped = serde_json::json!({"stopped": at, "requests": requests});
    match json {
        true => super::out::line(stopped.to_string())?,
        false => super::out::line(format!(
            "standby stopped at commit {} (generation {}); requests sent: {requests:?}",
            at.commit_seq, at.generation
        ))?,
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct PromoteArgs {
    /// The standby's directory (stop its `restore --follow` first).
    #[arg(long)]
    dir: PathBuf,
    /// The destination it follows, which it takes over: s3://bucket/prefix or file:///path.
    #[arg(long)]
    from: String,
    /// Where the old writer cannot be proven fenced through its bucket lease (an async store
    /// held under a `serve`'s instance lease, which promises no acknowledgement window, or a
    /// bucket that gives no clock), wait until that lease is stale (at most its TTL after its
    /// last renewal, plus a poll) instead of refusing.
    #[arg(long)]
    wait_for_lease: bool,
    #[command(flatten)]
    settings: super::settings::WorkerSettings,
    /// The prefix's keys: the catch-up opens its encrypted generations with them, and the
    /// promoted store's backup wraps its new generations' keys with them (an encrypted prefix
    /// refuses a writer without).
    #[command(flatten)]
    encryption: super::encryption::EncryptionArgs,
}

/// `promote`: fence the old writer through the bucket lease (taken over at once, conditional on
/// the version read, then the old holder's acknowledgement window, or its deadline by the
/// bucket's clock, waited out: `lease::TakeOver`, `standby::promote`), apply everything durable, adopt the prefix (a new `backup.lineage`, a `backup.parent` naming the restore point LATEST
/// names; `standby::promote`), print that as one JSON line, then back the directory up under
/// the same lease until SIGINT/SIGTERM, as `backup --store DIR --to URL` does: a node may open
/// the directory and commit, and its commits ship under the new lineage. The lease passes from
/// the promotion to the worker without a gap (the worker has the same holder id, so the lease
/// is its own), so the old writer cannot take it back in between.
pub async fn promote(a: PromoteArgs) -> anyhow::Result<ExitCode> {
    use mushroom_backup::lease::LeaseConfig;
    use mushroom_backup::standby::promotion::{Promotion, PromotionError, promote_fenced};
    use mushroom_backup::standby::takeover::TakeoverError;
    use mushroom_backup::wal_source::LocalSource;
    use mushroom_backup::worker::BackupWorker;

    // Fail closed: a key that cannot be had stops here, before the bucket is touched.
    let encryption = a.encryption.load_for_writing("promote")?;
    let mut config = a.settings.config()?;
    let keys = RestoreKeys::new(
        encryption
            .as_ref()
            .map(|e| e.unwrap.clone())
            .unwrap_or_default(),
    );
    config.encryption.keys = encryption;
    let cancel = super::shutdown_token();
    let bucket = super::open_existing(&a.from).await?;
    let what = format!("promotion of {} for {}", a.dir.display(), a.from);
    let lease = LeaseConfig::from_env(a.dir.display().to_string())?;
    // Refuse a prefix promoted already, take the lease over and wait out the old holder's
    // window or deadline (or with --wait-for-lease until its lease is stale), catch up, adopt
    // and claim: the sequence the service's Promote runs too (`standby::promotion`).
    let opts = StandbyOptions {
        keys,
        ..StandbyOptions::default()
    };
    let promoted = promote_fenced(
        bucket.clone(),
        &a.dir,
        lease.clone(),
        a.wait_for_lease,
        &opts,
        &cancel,
    )
    .await;
    let Promotion { adopted, fenced } = promoted.map_err(|e| match e {
        PromotionError::AlreadyPromoted(c) => anyhow::anyhow!(
            "{what}: refused, nothing changed: the prefix was promoted already: LATEST gives {} \
             to lineage {}; back that store up (`backup --store DIR`), or restore anew from \
             the prefix",
            c.manifest,
            c.adopter
        ),
        PromotionError::Takeover(e @ (TakeoverError::Lease(_) | TakeoverError::Interrupted)) => {
            anyhow::anyhow!("{what}: {e}")
        }
        PromotionError::Takeover(refused) => {
            anyhow::anyhow!("{what}: refused, nothing changed: {refused}")
        }
        e => anyhow::Error::new(e).context(what.clone()),
    })?;
    super::out::line(serde_json::json!({ "promoted": adopted }).to_string())?;
    fenced.hand_over().await;
    let source = Arc::new(LocalSource::new(a.dir.clone()));
    let worker = BackupWorker::new(a.dir.clone(), bucket, source, config);
    let primary = super::backup::Destination {
        role: "primary",
        url: &a.from,
        worker,
        lease,
    };
    super::backup::run_until(vec![primary], cancel).await
}

//! `restore --follow`: a standalone standby (`mushroom_backup::standby`). It restores into the
//! directory (or resumes the store there), then applies what the prefix ships until SIGINT or
//! SIGTERM, and exits 0. One line per apply on stdout (JSON with `--json`), and a last one with
//! where it stopped and the requests it sent, by kind.

use std::path::Path;
use std::process::ExitCode;
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
    let at = standby::follow(&bucket, to, &opts, &cancel, print)
        .await
        .with_context(|| format!("standby of {from} in {}", to.display()))?;
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

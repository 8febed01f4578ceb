//! `mushroom-backup branch --from URL (--at N | --at-time T) --to URL` and
//! `mushroom-backup branch delete --at URL`: straight against the bucket (`crate::branch`).

use std::process::ExitCode;

use clap::{Args, Subcommand};

use mushroom_backup::branch::{self, ForkAt};
use mushroom_backup::restore::{self, RestoreOptions};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BranchArgs {
    #[command(subcommand)]
    command: Option<BranchCommand>,
    /// The parent prefix (its bucket holds the branch too).
    #[arg(long, required = true)]
    from: Option<String>,
    /// The fork commit: the branch restores to exactly the parent's state at it.
    #[arg(long, conflicts_with = "at_time", required_unless_present = "at_time")]
    at: Option<u64>,
    /// The fork instant (RFC 3339 with a UTC offset, e.g. 2026-12-07T09:50:00Z): the newest
    /// commit shipped at or before it, as `restore --at-time` chooses it.
    #[arg(long)]
    at_time: Option<String>,
    /// The branch prefix: empty, in the parent's bucket, outside the parent's prefix.
    #[arg(long, required = true)]
    to: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    encryption: super::encryption::EncryptionArgs,
    #[command(flatten)]
    lock: LockArgs,
}

/// A branch of a write-once parent (`backup --object-lock`) is write-once: its pin, manifest,
/// pointer and release are created under Object Lock, nothing is overwritten or deleted, and
/// the parent's objects it names are held until it must be kept.
#[derive(Args)]
struct LockArgs {
    /// The parent's Object Lock mode (`governance` or `compliance`): the branch writes the
    /// write-once layout, locked in this mode.
    #[arg(long, value_name = "MODE")]
    object_lock: Option<mushroom_backup::bucket::write_once::LockMode>,
    /// How long each object the branch creates or holds is locked, in days (1 to 36500; the
    /// default is what a backup with the default retention locks: 7 days kept plus a day).
    #[arg(long, value_name = "DAYS", requires = "object_lock",
          value_parser = clap::value_parser!(u64).range(1..=36_500))]
    lock_days: Option<u64>,
}

impl LockArgs {
    fn lock(&self) -> Option<mushroom_backup::bucket::write_once::ObjectLock> {
        let period = match self.lock_days {
            Some(days) => std::time::Duration::from_secs(days * 24 * 3600),
            None => mushroom_backup::worker::retention::lock_period(
                &mushroom_backup::worker::RetentionPolicy::default(),
            ),
        };
        self.object_lock
            .map(|mode| mushroom_backup::bucket::write_once::ObjectLock { mode, period })
    }
}

#[derive(Subcommand)]
enum BranchCommand {
    /// Give a branch up: release its pin (the parent's next retention reclaims what only the
    /// branch named) and delete its fork manifest; restore points of its own stay.
    Delete(DeleteArgs),
}

#[derive(Args)]
struct DeleteArgs {
    /// The branch prefix.
    #[arg(long)]
    at: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// A write-once branch: its release is created under Object Lock and its fork manifest
    /// stays (a write-once writer deletes nothing).
    #[command(flatten)]
    lock: LockArgs,
}

pub async fn run(a: BranchArgs) -> anyhow::Result<ExitCode> {
    if let Some(BranchCommand::Delete(d)) = a.command {
        let bucket = super::open_existing(&d.at).await?;
        let report = branch::delete::delete(bucket, &d.at, d.lock.lock()).await?;
        print(&report, d.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(from), Some(to)) = (a.from, a.to) else {
        anyhow::bail!("branch needs --from and --to");
    };
    let at = match (a.at, a.at_time.as_deref()) {
        (Some(n), None) => ForkAt::Commit(n),
        (None, Some(t)) => ForkAt::Time(restore::at_time::parse_instant(
            t,
            mushroom_backup::units::unix_now_ms(),
        )?),
        _ => anyhow::bail!("branch needs one of --at N and --at-time T"),
    };
    if let Some(mode) = a.lock.object_lock
        && !from.starts_with("s3://")
    {
        anyhow::bail!(
            "--object-lock {} needs an s3:// parent in a bucket with Object Lock enabled; {} \
             cannot lock objects",
            mode.name(),
            strip(&from)
        );
    }
    let keys = a.encryption.load_for_reading()?;
    let opts = RestoreOptions {
        keys: restore::keys::RestoreKeys::new(keys.map(|k| k.unwrap).unwrap_or_default()),
        ..RestoreOptions::default()
    };
    let parent = super::open_existing_unprobed(&from).await?;
    let report = branch::create(parent, &from, &to, at, &opts, a.lock.lock())
        .await
        .map_err(|e| anyhow::anyhow!("branch of {} into {}: {e}", strip(&from), strip(&to)))?;
    print(&report, a.json)?;
    Ok(ExitCode::SUCCESS)
}

fn strip(url: &str) -> &str {
    mushroom_backup::bucket::url::without_query(url)
}

fn print<T: serde::Serialize + std::fmt::Display>(report: &T, json: bool) -> anyhow::Result<()> {
    if json {
        super::out::line(serde_json::to_string(report)?)
    } else {
        super::out::line(report)
    }
}

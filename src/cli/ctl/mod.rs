//! `ctl`: every `BackupControl` call for operators. Plain text by default, one JSON document
//! per answer with `--json` (one per line for `watch-health`). A failed call exits non-zero
//! with one line naming the call and its gRPC code: `error: Register: PERMISSION_DENIED: …`.
//!
//! Exit codes, which scripts and monitors rely on: 0 the call succeeded; 1 it failed (the
//! service could not be reached, or answered an error); 2 bad flags (clap's); 3 `health`
//! answered, and a store it shows is unhealthy (the answer is printed all the same).
//!
//! `pause --for DURATION` turns the duration into a deadline by this machine's clock (the
//! server checks it against its own: in the future, within its maximum pause).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};

mod calls;
mod client;
mod cost;
mod drill;
mod events;
mod limits;
mod moves;
mod standby;
mod view;

use calls::*;
use client::{Ctl, StoreFlags, failed, print};
use view::{health_json, health_text, restore_point_json, store_json};

#[derive(Args)]
pub struct CtlArgs {
    /// The service: http://host:port or https://host:port.
    #[arg(long, env = "MUSHROOMDB_BACKUP_SERVER")]
    server: String,
    /// The admin token, when the server has one.
    #[arg(long, env = "MUSHROOMDB_BACKUP_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: super::client_tls::ClientTlsArgs,
    /// Print JSON (for scripts) instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// How long one call may take, in ms (watch-health: how long connecting may take).
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    #[command(subcommand)]
    call: Call,
}

#[derive(Subcommand)]
enum Call {
    /// Register a store directory and start its worker; prints the store id and node token.
    Register {
        /// Absolute store directory under one of the server's allowed roots.
        #[arg(long)]
        dir: String,
        /// file:///path or s3://bucket/prefix.
        #[arg(long)]
        destination: String,
        #[command(flatten)]
        store: StoreFlags,
    },
    /// Stop a store's worker and forget the store.
    Deregister {
        store_id: String,
        /// Ship what is durable and write a last restore point first.
        #[arg(long)]
        flush: bool,
    },
    /// Ask a store's worker to ship, write a restore point or run retention now.
    Trigger { store_id: String, kind: Kind },
    /// Pause a store's uploads until `resume`: it uploads nothing (no segment, archive,
    /// manifest, LATEST or retention delete) and keeps its bucket lease, so no standby takes
    /// over. The pause survives a restart of the service. Past its deadline the store is
    /// unhealthy ("paused past its deadline") and stays paused until `resume`. Pausing a paused
    /// store replaces its reason and deadline.
    Pause {
        store_id: String,
        /// Why, shown in health (at most 512 bytes, one line).
        #[arg(long)]
        reason: String,
        /// For how long: e.g. 45m, 2h, 1h30m, 90s, 1d [default: the server's default pause, 1 h
        /// unless its --pause-default-ms says otherwise].
        #[arg(long = "for", value_parser = parse_duration, conflicts_with = "until")]
        for_: Option<Duration>,
        /// Until this instant, RFC 3339 with its UTC offset (2026-12-03T06:00:00Z).
        #[arg(long, value_parser = parse_instant)]
        until: Option<i64>,
    },
    /// End a store's pause: it ships everything durable since (OK if it was not paused).
    Resume { store_id: String },
    /// The health of one store, or of every store; exits 3 when a store shown is unhealthy.
    Health { store_id: Option<String> },
    /// Health as it changes, until interrupted (or `--count` answers).
    WatchHealth {
        store_id: Option<String>,
        /// Stop after this many answers.
        #[arg(long)]
        count: Option<u64>,
    },
    /// Events as they happen (paused, restore point written, lease lost, …), one a line.
    WatchEvents(events::WatchEventsArgs),
    #[command(flatten)]
    Moves(moves::MoveCall),
    #[command(flatten)]
    Standbys(standby::StandbyCall),
    /// Every store of the instance.
    ListStores,
    /// Requests, bytes and the estimated monthly cost of one store, or of every store.
    Cost(cost::CostArgs),
    /// Traffic limits by class (bulk, restore, check, housekeeping; the wal is never
    /// limited): `limits show [STORE_ID]`, `limits set [--store ID] CLASS=BYTES_PER_SECOND`.
    Limits(limits::LimitsArgs),
    /// A store's restore points, newest first.
    ListRestorePoints {
        store_id: String,
        /// Restore points per page (0: the server's default).
        #[arg(long, default_value_t = 0)]
        page_size: u32,
        /// Start at this page (a previous answer's next page token).
        #[arg(long)]
        page_token: Option<String>,
        /// Follow the pages to the end.
        #[arg(long)]
        all: bool,
    },
    /// A restore drill: restore the newest restore point (or the one reaching --at) into the
    /// service's scratch space, check it against its manifest, record it; exits 1 if it failed.
    Drill {
        store_id: String,
        #[arg(long)]
        at: Option<u64>,
    },
    /// Boot restore: restore a destination into an empty directory and register it.
    Adopt {
        #[arg(long)]
        dir: String,
        #[arg(long)]
        destination: String,
        /// Restore to this commit (default: the restore point LATEST names).
        #[arg(long)]
        at: Option<u64>,
        #[command(flatten)]
        store: StoreFlags,
    },
    /// Cut a branch of a store's prefix at a commit or an instant into a new prefix of the
    /// same bucket (nothing copied); with --dir, restore it there and register it as a store.
    Branch {
        store_id: String,
        /// The fork commit.
        #[arg(long, conflicts_with = "at_time", required_unless_present = "at_time")]
        at: Option<u64>,
        /// The fork instant (RFC 3339): the newest commit shipped at or before it.
        #[arg(long)]
        at_time: Option<String>,
        /// The branch prefix: empty, in the parent's bucket, outside the parent's prefix.
        #[arg(long)]
        destination: String,
        /// Restore the branch into this empty directory and register it as a store.
        #[arg(long)]
        dir: Option<String>,
        #[command(flatten)]
        store: StoreFlags,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    Ship,
    RestorePoint,
    Retention,
}

/// `45m`, `2h`, `1h30m`, `90s`, `500ms`, `1d`: numbers each with a unit, longer than zero.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration such as 45m, 2h, 1h30m, 90s or 1d");
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms = match &rest[..unit] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        rest = &rest[unit..];
        total = total
            .checked_add(Duration::from_millis(n.checked_mul(ms).ok_or_else(bad)?))
            .ok_or_else(bad)?;
    }
    if total.is_zero() {
        return Err(format!("{s:?}: a pause must last longer than zero"));
    }
    Ok(total)
}

/// An RFC 3339 instant with its offset, as milliseconds since the epoch.
fn parse_instant(s: &str) -> Result<i64, String> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            format!("{s:?} is not an RFC 3339 instant with its offset (2026-12-03T06:00:00Z): {e}")
        })?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| format!("{s:?} is out of range"))
}

/// The largest answer `ctl` takes.
const CTL_MESSAGE_MAX: usize = 64 << 20;

async fn connect(a: &CtlArgs) -> anyhow::Result<Ctl> {
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut ep = Endpoint::from_shared(a.server.clone())
        .with_context(|| format!("--server {:?}", a.server))?
        .connect_timeout(timeout);
    if a.server.starts_with("https://") {
        let pem = a.tls.read()?;
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = pem.ca {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = pem.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        ep = ep.tls_config(tls).context("TLS")?;
    } else if a.tls.wants_identity() {
        anyhow::bail!("--client-cert needs an https:// server, not {:?}", a.server);
    } else if !a.server.starts_with("http://") {
        anyhow::bail!(
            "--server {:?}: must start with http:// or https://",
            a.server
        );
    }
    let channel = ep.connect().await.map_err(|e| {
        let s = mushroom_backup::units::error_chain(&e);
        anyhow::anyhow!("connecting to {}: UNAVAILABLE: {s}", a.server)
    })?;
    let token = match a.token.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(t) => Some(
            format!("Bearer {t}")
                .parse()
                .map_err(|_| anyhow::anyhow!("the admin token must be printable ASCII"))?,
        ),
    };
    Ok(Ctl {
        // tonic's default 4 MiB would refuse a `ListStores` of a 10,000-store fleet (about
        // 400 bytes a store); the answer is the service's own, so the bound only guards
        // against a stream gone wrong.
        client: BackupControlClient::new(channel).max_decoding_message_size(CTL_MESSAGE_MAX),
        token,
        timeout,
    })
}

pub async fn run(a: CtlArgs) -> anyhow::Result<ExitCode> {
    let mut ctl = connect(&a).await?;
    let j = a.json;
    match a.call {
        Call::Register {
            dir,
            destination,
            store,
        } => register(&mut ctl, j, dir, destination, store, false).await?,
        Call::Deregister { store_id, flush } => deregister(&mut ctl, j, store_id, flush).await?,
        Call::Trigger { store_id, kind } => trigger(&mut ctl, j, store_id, kind).await?,
        Call::Pause {
            store_id,
            reason,
            for_,
            until,
        } => {
            let until = match (for_, until) {
                (Some(d), _) => mushroom_backup::units::unix_now_ms()
                    .saturating_add(mushroom_backup::units::millis_i64(d)),
                (None, Some(t)) => t,
                (None, None) => 0,
            };
            pause(&mut ctl, j, store_id, reason, until).await?
        }
        Call::Resume { store_id } => resume(&mut ctl, j, store_id).await?,
        Call::Health { store_id } => {
            if !health(&mut ctl, j, store_id).await? {
                return Ok(ExitCode::from(UNHEALTHY));
            }
        }
        Call::WatchHealth { store_id, count } => watch_health(&mut ctl, j, store_id, count).await?,
        Call::WatchEvents(e) => events::watch_events(&mut ctl, j, e).await?,
        Call::Moves(m) => return moves::run(&mut ctl, j, m).await,
        Call::Standbys(c) => standby::run(&mut ctl, j, c).await?,
        Call::ListStores => list_stores(&mut ctl, j).await?,
        Call::Cost(c) => cost::cost(&mut ctl, j, c).await?,
        Call::Limits(l) => limits::run(&mut ctl, j, l).await?,
        Call::ListRestorePoints {
            store_id,
            page_size,
            page_token,
            all,
        } => list_restore_points(&mut ctl, j, store_id, page_size, page_token, all).await?,
        Call::Drill { store_id, at } => {
            if !drill::drill(&mut ctl, j, store_id, at).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Call::Adopt {
            dir,
            destination,
            at,
            store,
        } => adopt(&mut ctl, j, dir, destination, at, store).await?,
        Call::Branch {
            store_id,
            at,
            at_time,
            destination,
            dir,
            store,
        } => {
            let fork = (at, at_time);
            calls::branch(&mut ctl, j, store_id, fork, destination, dir, store).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}

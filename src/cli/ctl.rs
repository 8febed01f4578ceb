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

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use mushroom_backup::health::rfc3339_ms;
use mushroom_backup::node_client::code_name;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};

#[path = "ctl_calls.rs"]
mod ctl_calls;
#[path = "ctl_events.rs"]
mod ctl_events;
use ctl_calls::*;
#[path = "ctl_view.rs"]
mod ctl_view;
use ctl_view::{health_json, health_text, restore_point_json, store_json};

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
    WatchEvents(ctl_events::WatchEventsArgs),
    #[command(flatten)]
    Moves(super::ctl_move::MoveCall),
    #[command(flatten)]
    Standbys(super::ctl_standby::StandbyCall),
    /// Every store of the instance.
    ListStores,
    /// Requests, bytes and the estimated monthly cost of one store, or of every store.
    Cost(super::ctl_cost::CostArgs),
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
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    Ship,
    RestorePoint,
    Retention,
}

/// Labels and per-store options of Register and Adopt.
#[derive(Args)]
pub(super) struct StoreFlags {
    /// A label, key=value (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    #[arg(long)]
    wal_interval_ms: Option<u64>,
    #[arg(long)]
    restore_point_interval_ms: Option<u64>,
    #[arg(long)]
    retention_interval_ms: Option<u64>,
    #[arg(long)]
    keep_for_ms: Option<u64>,
    #[arg(long)]
    keep_generations: Option<u64>,
    /// Scheduled restore drills every this many ms (60000 to 2592000000; 0: none).
    #[arg(long)]
    drill_interval_ms: Option<u64>,
    /// Requests a month; a projection over it is a health note.
    #[arg(long)]
    monthly_request_budget: Option<u64>,
    /// Retention tiers: the newest restore point of each of N newest days, weeks, months.
    #[arg(long)]
    keep_daily: Option<u64>,
    #[arg(long)]
    keep_weekly: Option<u64>,
    #[arg(long)]
    keep_monthly: Option<u64>,
    /// A write-once prefix under S3 Object Lock: `governance` or `compliance`.
    #[arg(long, value_parser = ["governance", "compliance"])]
    object_lock: Option<String>,
    /// `sync`: ship as soon as the node reports, and tell it when each commit is in the
    /// bucket; `async`: every wal_interval [default: the service's].
    #[arg(long, value_parser = ["async", "sync"])]
    durability: Option<String>,
    /// The most WAL PUTs a second the store may cost, 1 to 1000 [default: the service's, 10].
    #[arg(long)]
    wal_puts_per_second: Option<u32>,
    /// A second destination with a worker, lease and health of its own:
    /// s3://bucket/prefix[?endpoint=URL&region=R&profile=P] or file:///path.
    #[arg(long, value_name = "URL")]
    replica: Option<String>,
}

impl StoreFlags {
    fn labels(&self) -> HashMap<String, String> {
        self.labels.iter().cloned().collect()
    }

    fn options(&self) -> Option<proto::StoreOptions> {
        Some(proto::StoreOptions {
            wal_interval_ms: self.wal_interval_ms.unwrap_or(0),
            restore_point_interval_ms: self.restore_point_interval_ms.unwrap_or(0),
            retention_interval_ms: self.retention_interval_ms.unwrap_or(0),
            keep_for_ms: self.keep_for_ms.unwrap_or(0),
            keep_generations: self.keep_generations.unwrap_or(0),
            drill_interval_ms: self.drill_interval_ms.unwrap_or(0),
            monthly_request_budget: self.monthly_request_budget.unwrap_or(0),
            keep_daily: self.keep_daily.unwrap_or(0),
            keep_weekly: self.keep_weekly.unwrap_or(0),
            keep_monthly: self.keep_monthly.unwrap_or(0),
            object_lock: match self.object_lock.as_deref() {
                Some("governance") => proto::ObjectLockMode::Governance as i32,
                Some("compliance") => proto::ObjectLockMode::Compliance as i32,
                _ => proto::ObjectLockMode::Unspecified as i32,
            },
            durability: match self.durability.as_deref() {
                Some("sync") => proto::Durability::Sync as i32,
                Some("async") => proto::Durability::Async as i32,
                _ => proto::Durability::Unspecified as i32,
            },
            wal_puts_per_second: self.wal_puts_per_second.unwrap_or(0),
            replica: self.replica.clone().unwrap_or_default(),
            ..Default::default()
        })
    }
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

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("label {s:?} is not key=value"))
}

/// The connection and the admin token.
pub(super) struct Ctl {
    pub(super) client: BackupControlClient<Channel>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    timeout: Duration,
}

impl Ctl {
    pub(super) fn request<T>(&self, msg: T, deadline: bool) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", t.clone());
        }
        if deadline {
            r.set_timeout(self.timeout);
        }
        r
    }

    /// `Health` of one store (`None`: every store), `fresh` (asked of its owner) or not.
    pub(super) async fn health(
        &mut self,
        store_id: Option<String>,
        fresh: bool,
    ) -> anyhow::Result<proto::HealthResponse> {
        let req = proto::HealthRequest {
            store_id: store_id.unwrap_or_default(),
            fresh,
        };
        let req = self.request(req, true);
        let r = self.client.health(req).await;
        Ok(r.map_err(|s| failed("Health", s))?.into_inner())
    }
}

/// `Call: CODE: message`, on one line.
pub(super) fn failed(call: &str, s: tonic::Status) -> anyhow::Error {
    let msg = s.message().replace('\n', " ");
    anyhow::anyhow!("{call}: {}: {msg}", code_name(s.code()))
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

/// Prints one answer; a closed stdout ends the command (`out.rs`).
pub(super) fn print(json_mode: bool, value: Value, text: String) -> anyhow::Result<()> {
    if json_mode {
        super::out::line(value)
    } else if !text.is_empty() {
        super::out::line(text.trim_end())
    } else {
        Ok(())
    }
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
        Call::WatchEvents(e) => ctl_events::watch_events(&mut ctl, j, e).await?,
        Call::Moves(m) => return super::ctl_move::run(&mut ctl, j, m).await,
        Call::Standbys(c) => super::ctl_standby::run(&mut ctl, j, c).await?,
        Call::ListStores => list_stores(&mut ctl, j).await?,
        Call::Cost(c) => super::ctl_cost::cost(&mut ctl, j, c).await?,
        Call::ListRestorePoints {
            store_id,
            page_size,
            page_token,
            all,
        } => list_restore_points(&mut ctl, j, store_id, page_size, page_token, all).await?,
        Call::Drill { store_id, at } => {
            if !super::ctl_drill::drill(&mut ctl, j, store_id, at).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Call::Adopt {
            dir,
            destination,
            at,
            store,
        } => adopt(&mut ctl, j, dir, destination, at, store).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `ctl register`, and `ctl standby` (`standby`: a standby of the destination).
pub(super) async fn register(
    ctl: &mut Ctl,
    j: bool,
    dir: String,
    destination: String,
    store: StoreFlags,
    standby: bool,
) -> anyhow::Result<()> {
    let mut options = store.options();
    if let Some(o) = options.as_mut() {
        o.standby = standby;
    }
    let req = proto::RegisterRequest {
        store_dir: dir,
        destination,
        labels: store.labels(),
        options,
        instance_id: String::new(),
    };
    let r = ctl
        .client
        .register(ctl.request(req, true))
        .await
        .map_err(|s| failed("Register", s))?
        .into_inner();
    print(
        j,
        json!({"store_id": r.store_id, "node_token": r.node_token}),
        format!(
            "registered {}store {}\nnode token (shown once): {}",
            if standby { "standby " } else { "" },
            r.store_id,
            r.node_token
        ),
    )?;
    Ok(())
}

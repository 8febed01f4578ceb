//! What every `ctl` call uses, and nothing else: the connection with its admin token and
//! deadline ([`Ctl`]), the one line a failed call prints ([`failed`]), the one way an answer
//! is printed ([`print`]: text, or one JSON document with `--json`), and the store flags of
//! Register, Adopt and Standby ([`StoreFlags`], sent through the service's one options
//! mapping). Every call module imports this leaf; it imports none of them.

use std::collections::HashMap;
use std::time::Duration;

use clap::Args;
use serde_json::Value;
use tonic::transport::Channel;

use mushroom_backup::bucket::write_once::LockMode;
use mushroom_backup::node_client::code_name;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use mushroom_backup::service::{StoreOptions, store_options_proto};
use mushroom_backup::worker::DurabilityMode;
use mushroom_backup::worker::overrides::WorkerOverrides;

/// Labels and per-store options of Register and Adopt.
#[derive(Args)]
pub(in crate::cli) struct StoreFlags {
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
    /// The restore time the store must stay under, seconds (1 to 2592000; 0: none): a
    /// predicted restore time over it is a health note and a metric.
    #[arg(long)]
    rto_target_seconds: Option<u64>,
    /// Retention tiers: the newest restore point of each of N newest days, weeks, months.
    #[arg(long)]
    keep_daily: Option<u64>,
    #[arg(long)]
    keep_weekly: Option<u64>,
    #[arg(long)]
    keep_monthly: Option<u64>,
    /// A write-once prefix under S3 Object Lock: `governance` or `compliance`.
    #[arg(long, value_enum)]
    object_lock: Option<LockMode>,
    /// `sync`: ship as soon as the node reports, and tell it when each commit is in the
    /// bucket; `async`: every wal_interval [default: the service's].
    #[arg(long, value_enum)]
    durability: Option<DurabilityMode>,
    /// The most WAL PUTs a second the store may cost, 1 to 1000 [default: the service's, 10].
    #[arg(long)]
    wal_puts_per_second: Option<u64>,
    /// Retention leaves unnamed objects of a claimed generation alone this long, ms.
    #[arg(long)]
    orphan_grace_ms: Option<u64>,
    /// A second destination with a worker, lease and health of its own:
    /// s3://bucket/prefix[?endpoint=URL&region=R&profile=P] or file:///path.
    #[arg(long, value_name = "URL")]
    replica: Option<String>,
    /// The store's own traffic limit, CLASS=BYTES_PER_SECOND[,requests=N] (repeatable; see
    /// `ctl limits set --store`, which changes them live).
    #[arg(long = "limit", value_name = "CLASS=BYTES_PER_SECOND[,requests=N]")]
    limits: Vec<String>,
}

impl StoreFlags {
    pub(super) fn labels(&self) -> HashMap<String, String> {
        self.labels.iter().cloned().collect()
    }

    /// The options as the service takes them (`StoreOptions`, through its one proto
    /// mapping): 0 and unset are the service's default.
    pub(super) fn options(&self) -> Option<proto::StoreOptions> {
        let options = StoreOptions {
            worker: WorkerOverrides {
                wal_interval_ms: self.wal_interval_ms,
                restore_point_interval_ms: self.restore_point_interval_ms,
                retention_interval_ms: self.retention_interval_ms,
                keep_for_ms: self.keep_for_ms,
                keep_generations: self.keep_generations,
                keep_daily: self.keep_daily,
                keep_weekly: self.keep_weekly,
                keep_monthly: self.keep_monthly,
                object_lock: self.object_lock,
                durability: self.durability,
                wal_puts_per_second: self.wal_puts_per_second,
                orphan_grace_ms: self.orphan_grace_ms,
                ..WorkerOverrides::default()
            },
            drill_interval_ms: self.drill_interval_ms,
            monthly_request_budget: self.monthly_request_budget,
            rto_target_seconds: self.rto_target_seconds,
            replica: self.replica.clone(),
            standby: None,
            limits: self.limits.clone(),
        };
        Some(store_options_proto::to_proto(&options))
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("label {s:?} is not key=value"))
}

/// The connection and the admin token.
pub(in crate::cli) struct Ctl {
    pub(super) client: BackupControlClient<Channel>,
    pub(super) token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    pub(super) timeout: Duration,
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
pub(in crate::cli) fn failed(call: &str, s: tonic::Status) -> anyhow::Error {
    let msg = s.message().replace('\n', " ");
    anyhow::anyhow!("{call}: {}: {msg}", code_name(s.code()))
}

/// Prints one answer; a closed stdout ends the command (`out.rs`).
pub(in crate::cli) fn print(json_mode: bool, value: Value, text: String) -> anyhow::Result<()> {
    if json_mode {
        crate::cli::out::line(value)
    } else if !text.is_empty() {
        crate::cli::out::line(text.trim_end())
    } else {
        Ok(())
    }
}

//! `serve`: the gRPC control plane. Every setting is a flag, a `MUSHROOMDB_BACKUP_*` variable
//! and a key of the TOML file given by `--config`; a flag or variable wins over the file, the
//! file over the default. Unknown keys in the file are an error naming the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use mushroom_backup::crypto::secret_file::{self, SecretFileError};
use mushroom_backup::events::signature::WebhookSecret;
use mushroom_backup::events::webhook::WebhookConfig;
use mushroom_backup::service::{self, ServiceConfig, TlsFiles};
use mushroom_backup::worker::limits;

use super::serve_limits::{LimitSettings, LimitsToml};
use super::settings::{WorkerSettings, WorkerToml};

#[derive(Args)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below.
    #[arg(long, env = "MUSHROOMDB_BACKUP_CONFIG")]
    config: Option<PathBuf>,
    /// The address to listen on [default: 127.0.0.1:50051].
    #[arg(long, env = "MUSHROOMDB_BACKUP_LISTEN")]
    listen: Option<SocketAddr>,
    /// Where the service keeps its registry and stores by default [default: ./mushroom-data].
    #[arg(long, env = "MUSHROOMDB_BACKUP_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The only directories under which stores may be registered (repeatable)
    /// [default: <data-dir>/stores].
    #[arg(
        long = "allow-root",
        env = "MUSHROOMDB_BACKUP_ALLOW_ROOTS",
        value_delimiter = ','
    )]
    allow_roots: Vec<PathBuf>,
    /// The only directories under which file:// destinations may be (repeatable) [default:
    /// anywhere but an allowed root or the data dir]. A destination's path is placed with its
    /// links resolved; no link inside a destination is ever followed.
    #[arg(
        long = "allow-destination-root",
        env = "MUSHROOMDB_BACKUP_ALLOW_DESTINATION_ROOTS",
        value_delimiter = ','
    )]
    allow_destination_roots: Vec<PathBuf>,
    /// An S3 endpoint (http(s)://host[:port]) that a destination given over the API may name
    /// with `?endpoint=` (repeatable) [default: only the service's own, AWS_ENDPOINT_URL].
    /// Any other is refused at Register, Adopt and Standby: the service would send requests
    /// signed with its credentials to whatever host a client names.
    #[arg(
        long = "allow-endpoint",
        env = "MUSHROOMDB_BACKUP_ALLOW_ENDPOINTS",
        value_delimiter = ','
    )]
    allow_endpoints: Vec<String>,
    /// The registry: sqlite:///path/registry.db or postgres://… [default: SQLite at
    /// <data-dir>/registry.db].
    #[arg(long, env = "MUSHROOMDB_BACKUP_REGISTRY")]
    registry: Option<String>,
    /// PEM certificate chain for TLS.
    #[arg(long, env = "MUSHROOMDB_BACKUP_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long, env = "MUSHROOMDB_BACKUP_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// PEM CA whose client certificates are required (mutual TLS).
    #[arg(long, env = "MUSHROOMDB_BACKUP_TLS_CLIENT_CA")]
    tls_client_ca: Option<PathBuf>,
    /// Listen on a non-loopback address without TLS (an admin token is still required there).
    #[arg(long, env = "MUSHROOMDB_BACKUP_INSECURE")]
    insecure: bool,
    /// A file holding the admin token operator calls must present (MUSHROOMDB_BACKUP_ADMIN_TOKEN,
    /// the token itself, wins over it; both win over the config's admin_token_file).
    #[arg(long, env = "MUSHROOMDB_BACKUP_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Operator calls need no admin token, even on a non-loopback listener: anyone who can
    /// connect may register, deregister and adopt stores.
    #[arg(long, env = "MUSHROOMDB_BACKUP_NO_OPERATOR_AUTH")]
    no_operator_auth: bool,
    /// This instance's id in a shared registry and in its buckets' instance leases [default:
    /// `<host name>-<8 random hex digits>`, made once and kept in `<data dir>/instance-id`].
    #[arg(long, env = "MUSHROOMDB_BACKUP_INSTANCE_ID")]
    instance_id: Option<String>,
    /// The bucket lease's TTL in milliseconds [default: 30000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_LEASE_TTL_MS")]
    lease_ttl_ms: Option<u64>,
    /// Serve Prometheus metrics on GET /metrics at this address (off when unset).
    #[arg(long, env = "MUSHROOMDB_BACKUP_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Log lines as `text` or `json` (with the trace id) [default: text].
    #[arg(long, env = "MUSHROOMDB_BACKUP_LOG_FORMAT", value_parser = ["text", "json"])]
    log_format: Option<String>,
    /// How often this instance persists its stores' health to the registry, ms [default: 3000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_HEALTH_REPORT_INTERVAL_MS")]
    health_report_interval_ms: Option<u64>,
    /// A store whose owner has not reported for this long shows unhealthy; a claim on an
    /// instance id not renewed for this long is taken over by the next process, ms
    /// [default: 15000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_OWNER_SILENT_AFTER_MS")]
    owner_silent_after_ms: Option<u64>,
    /// A Pause without a deadline is due after this long; past its deadline a paused store is
    /// unhealthy (and stays paused until Resume), ms [default: 3600000, 1 hour].
    #[arg(long, env = "MUSHROOMDB_BACKUP_PAUSE_DEFAULT_MS")]
    pause_default_ms: Option<u64>,
    /// The furthest deadline a Pause may set, ms [default: 86400000, 24 hours].
    #[arg(long, env = "MUSHROOMDB_BACKUP_PAUSE_MAX_MS")]
    pause_max_ms: Option<u64>,
    /// HOST:PORT where the other instances sharing the registry reach this one, to forward
    /// calls for its stores [default: the listen address, unless it is a wildcard].
    #[arg(long, env = "MUSHROOMDB_BACKUP_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,
    /// The failover group of this instance: instances that see the same store directories.
    #[arg(long, env = "MUSHROOMDB_BACKUP_FAILOVER_GROUP")]
    failover_group: Option<String>,
    /// PEM CA that signed the other instances' TLS certificates, for calls between instances
    /// [default: --tls-client-ca].
    #[arg(long, env = "MUSHROOMDB_BACKUP_PEER_CA")]
    peer_ca: Option<PathBuf>,
    /// A file holding the token the instances sharing the registry present to each other
    /// (forwarded calls, moves); never the admin token. Without it an instance with an admin
    /// token forwards no call.
    #[arg(long, env = "MUSHROOMDB_BACKUP_PEER_TOKEN_FILE")]
    peer_token_file: Option<PathBuf>,
    /// How long a store's owner read from the registry is used to forward calls for it; an
    /// owner that disowns the store is read again at once; 0: read it for every call, ms
    /// [default: 1000, at most 60000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_OWNER_CACHE_MS")]
    owner_cache_ms: Option<u64>,
    /// Scheduled restore drills skip a store whose newest restore point restores more bytes
    /// (plain, as written into scratch) than this (with a health note); 0: no budget
    /// [default: 10737418240, 10 GiB].
    #[arg(long, env = "MUSHROOMDB_BACKUP_DRILL_MAX_BYTES")]
    drill_max_bytes: Option<u64>,
    /// POST every event as a CloudEvent (application/cloudevents+json) to this http(s) URL
    /// (repeatable; in the variable, separated by spaces). A `kinds` query parameter filters
    /// and is not sent: `https://h/x?kinds=paused,drill_finished`. Kinds: health_changed,
    /// paused, resumed, restore_point_written, drill_finished, lease_acquired, lease_lost,
    /// lease_taken_over, generation_started, retention_deleted, registered, deregistered,
    /// budget_exceeded.
    // Parsed by `resolve`, not by clap, whose error would echo the value: its query may hold
    // a token.
    #[arg(
        long = "webhook-url",
        env = "MUSHROOMDB_BACKUP_WEBHOOK_URLS",
        value_delimiter = ' ',
        hide_env_values = true
    )]
    webhook_urls: Vec<String>,
    /// A file holding the secret every webhook delivery is signed with (Standard Webhooks:
    /// headers webhook-id, webhook-timestamp, webhook-signature), `whsec_` and base64 of 24 to
    /// 64 random bytes; read as key files are.
    #[arg(long, env = "MUSHROOMDB_BACKUP_WEBHOOK_SECRET_FILE")]
    webhook_secret_file: Option<PathBuf>,
    /// Keep the fleet's event log (what WatchEvents replays and webhooks deliver from) this
    /// many days, 1 to 3650 [default: 7].
    #[arg(long, env = "MUSHROOMDB_BACKUP_EVENTS_KEEP_DAYS")]
    events_keep_days: Option<u64>,
    /// Keep at most this many events in the log, 1000 to 100000000 [default: 1000000].
    #[arg(long, env = "MUSHROOMDB_BACKUP_EVENTS_KEEP")]
    events_keep: Option<u64>,
    #[command(flatten)]
    worker: WorkerSettings,
    #[command(flatten)]
    limits: LimitSettings,
    #[command(flatten)]
    encryption: super::encryption::EncryptionArgs,
}

/// The TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeToml {
    listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    log_format: Option<String>,
    data_dir: Option<PathBuf>,
    allow_roots: Option<Vec<PathBuf>>,
    allow_destination_roots: Option<Vec<PathBuf>>,
    allow_endpoints: Option<Vec<String>>,
    registry: Option<String>,
    instance_id: Option<String>,
    advertise_address: Option<String>,
    failover_group: Option<String>,
    peer_ca: Option<PathBuf>,
    /// A file holding the peers' token (the token itself never goes in the config).
    peer_token_file: Option<PathBuf>,
    owner_cache_ms: Option<u64>,
    pause_default_ms: Option<u64>,
    pause_max_ms: Option<u64>,
    drill_max_bytes: Option<u64>,
    webhook_urls: Option<Vec<String>>,
    webhook_secret_file: Option<PathBuf>,
    events_keep_days: Option<u64>,
    events_keep: Option<u64>,
    insecure: Option<bool>,
    /// A file holding the admin token (the token itself never goes in the config).
    admin_token_file: Option<PathBuf>,
    no_operator_auth: Option<bool>,
    tls: Option<TlsToml>,
    worker: Option<WorkerToml>,
    limits: Option<LimitsToml>,
    /// The price table of the cost estimates (`mushroom_backup::cost::Prices`).
    prices: Option<mushroom_backup::cost::Prices>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsToml {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()
            .context("the current directory")?
            .join(p))
    }
}

/// Each root made absolute, created when missing, and resolved through links.
fn resolve_roots(roots: Vec<PathBuf>, what: &str) -> anyhow::Result<Vec<PathBuf>> {
    roots
        .into_iter()
        .map(|r| {
            let r = absolute(&r)?;
            std::fs::create_dir_all(&r).with_context(|| format!("{what} {}", r.display()))?;
            std::fs::canonicalize(&r).with_context(|| format!("{what} {}", r.display()))
        })
        .collect()
}

/// What telemetry needs, resolved like everything else.
struct Telemetry {
    metrics_listen: Option<SocketAddr>,
    log_format: mushroom_backup::telemetry::LogFormat,
    /// Warnings of the secret files read (one others may read): logged once logging is set
    /// up, which is after the settings are resolved.
    warnings: Vec<String>,
}

/// The service's configuration: each setting from its flag (or variable), else the TOML
/// file, else its default; checked and named as it was given.
fn resolve(a: ServeArgs) -> anyhow::Result<(ServiceConfig, Telemetry)> {
    let file = read_config_file(a.config.as_deref())?;
    let data_dir = absolute(
        &a.data_dir
            .clone()
            .or(file.data_dir.clone())
            .unwrap_or_else(|| PathBuf::from("mushroom-data")),
    )?;
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("data dir {}", data_dir.display()))?;
    let places = Places::resolve(&a, &file, &data_dir)?;
    let registry = a
        .registry
        .clone()
        .or(file.registry.clone())
        .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("registry.db").display()));
    let tls = tls_files(&a, &file)?;
    let mut warnings = Vec::new();
    let admin_token = admin_token(
        a.admin_token_file.as_deref(),
        file.admin_token_file.as_deref(),
        &mut warnings,
    )?;
    let mut telemetry = telemetry(&a, &file)?;
    let worker_file = file.worker.clone().unwrap_or_default();
    let worker = a.worker.config_with(&worker_file)?;
    let lease_ttl = limits::LEASE_TTL_MS
        .check_ms(
            "--lease-ttl-ms",
            a.lease_ttl_ms
                .or(worker_file.lease_ttl_ms)
                .unwrap_or(30_000),
        )
        .map_err(anyhow::Error::msg)?;
    let period = |flag: &str, v: Option<u64>, default: u64| {
        limits::SERVICE_PERIOD_MS
            .check_ms(flag, v.unwrap_or(default))
            .map_err(anyhow::Error::msg)
    };
    let health_report_interval = period(
        "--health-report-interval-ms",
        a.health_report_interval_ms,
        3000,
    )?;
    let owner_silent_after = period("--owner-silent-after-ms", a.owner_silent_after_ms, 15_000)?;
    let pause = pause_limits(&a, &file)?;
    let webhooks = webhooks(&a, &file, &mut warnings)?;
    let peers = peers(&a, &file, &mut warnings)?;
    // Given, or this data directory's own: `<host>-<random>`, kept in it (`instance_id.rs`),
    // so two `serve`s of one host never share an instance lease by default.
    let instance_id = match a.instance_id.clone().or(file.instance_id.clone()) {
        Some(id) => id,
        None => mushroom_backup::instance_id::default_for(
            &data_dir,
            &mushroom_backup::lease::host_name(),
        )?,
    };
    let limits_file = file.limits.clone().unwrap_or_default();
    let config = ServiceConfig {
        listen: a
            .listen
            .or(file.listen)
            .unwrap_or_else(|| "127.0.0.1:50051".parse().expect("valid")),
        data_dir,
        allow_roots: places.roots,
        allow_destination_roots: places.destination_roots,
        allow_endpoints: places.endpoints,
        registry_url: registry,
        tls,
        admin_token,
        insecure: a.insecure || file.insecure.unwrap_or(false),
        no_operator_auth: a.no_operator_auth || file.no_operator_auth.unwrap_or(false),
        instance_id,
        worker,
        lease_ttl,
        health_report_interval,
        owner_silent_after,
        limits: a.limits.limits_with(&limits_file),
        throttle: a
            .limits
            .throttle_with(&limits_file)
            .map_err(|e| anyhow::anyhow!("limits: {e}"))?,
        pause,
        peers,
        drill: service::DrillLimits {
            max_bytes: a
                .drill_max_bytes
                .or(file.drill_max_bytes)
                .unwrap_or(service::DrillLimits::default().max_bytes),
        },
        webhooks,
        event_retention: service::EventRetention::new(
            a.events_keep_days.or(file.events_keep_days).unwrap_or(7),
            a.events_keep.or(file.events_keep).unwrap_or(1_000_000),
        )
        .map_err(anyhow::Error::msg)?,
        prices: file.prices.unwrap_or_default(),
    };
    telemetry.warnings = warnings;
    Ok((config, telemetry))
}

/// The TOML file `--config` names, if any.
fn read_config_file(path: Option<&Path>) -> anyhow::Result<ServeToml> {
    let Some(p) = path else {
        return Ok(ServeToml::default());
    };
    let text = std::fs::read_to_string(p).with_context(|| format!("config {}", p.display()))?;
    toml::from_str(&text).with_context(|| format!("config {}", p.display()))
}

/// Where stores, `file://` destinations and S3 endpoints may be.
struct Places {
    roots: Vec<PathBuf>,
    destination_roots: Vec<PathBuf>,
    /// The endpoints allowed (`--allow-endpoint`, and the service's own `AWS_ENDPOINT_URL`),
    /// each in its normal form.
    endpoints: Vec<String>,
}

impl Places {
    fn resolve(a: &ServeArgs, file: &ServeToml, data_dir: &Path) -> anyhow::Result<Places> {
        let flag_or_file = |flag: &Vec<PathBuf>, key: &Option<Vec<PathBuf>>| match flag.is_empty() {
            true => key.clone(),
            false => Some(flag.clone()),
        };
        let roots = flag_or_file(&a.allow_roots, &file.allow_roots)
            .unwrap_or_else(|| vec![data_dir.join("stores")]);
        let destination_roots =
            flag_or_file(&a.allow_destination_roots, &file.allow_destination_roots)
                .unwrap_or_default();
        let given = match a.allow_endpoints.is_empty() {
            true => file.allow_endpoints.clone().unwrap_or_default(),
            false => a.allow_endpoints.clone(),
        };
        let own = std::env::var("AWS_ENDPOINT_URL")
            .ok()
            .filter(|e| !e.trim().is_empty());
        let mut endpoints = Vec::new();
        for (given, what) in given
            .iter()
            .map(|e| (e.as_str(), "--allow-endpoint"))
            .chain(own.as_deref().map(|e| (e, "AWS_ENDPOINT_URL")))
        {
            let e = mushroom_backup::bucket::url::normal_endpoint(given.trim())
                .map_err(|why| anyhow::anyhow!("{what}: {why}"))?;
            if !endpoints.contains(&e) {
                endpoints.push(e);
            }
        }
        Ok(Places {
            roots: resolve_roots(roots, "allowed root")?,
            destination_roots: resolve_roots(destination_roots, "allowed destination root")?,
            endpoints,
        })
    }
}

/// The server's TLS files: both flags, or the file's table.
fn tls_files(a: &ServeArgs, file: &ServeToml) -> anyhow::Result<Option<TlsFiles>> {
    Ok(match (&a.tls_cert, &a.tls_key, &file.tls) {
        (Some(cert), Some(key), _) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: a.tls_client_ca.clone(),
        }),
        (None, None, Some(t)) => Some(TlsFiles {
            cert: t.cert.clone(),
            key: t.key.clone(),
            client_ca: a.tls_client_ca.clone().or(t.client_ca.clone()),
        }),
        (None, None, None) => None,
        _ => anyhow::bail!("--tls-cert and --tls-key go together"),
    })
}

fn telemetry(a: &ServeArgs, file: &ServeToml) -> anyhow::Result<Telemetry> {
    Ok(Telemetry {
        warnings: Vec::new(),
        metrics_listen: a.metrics_listen.or(file.metrics_listen),
        log_format: match a
            .log_format
            .as_deref()
            .or(file.log_format.as_deref())
            .unwrap_or("text")
        {
            "text" => mushroom_backup::telemetry::LogFormat::Text,
            "json" => mushroom_backup::telemetry::LogFormat::Json,
            other => anyhow::bail!("log_format = {other:?}: must be \"text\" or \"json\""),
        },
    })
}

fn pause_limits(a: &ServeArgs, file: &ServeToml) -> anyhow::Result<service::PauseLimits> {
    let pause_ms = |flag: &str, v: Option<u64>, default: u64| {
        limits::PAUSE_MS
            .check_ms(flag, v.unwrap_or(default))
            .map_err(anyhow::Error::msg)
    };
    Ok(service::PauseLimits {
        default: pause_ms(
            "--pause-default-ms",
            a.pause_default_ms.or(file.pause_default_ms),
            3_600_000,
        )?,
        max: pause_ms(
            "--pause-max-ms",
            a.pause_max_ms.or(file.pause_max_ms),
            86_400_000,
        )?,
    })
}

/// The webhooks, each with the one signing secret (its file's warnings to `warnings`).
fn webhooks(
    a: &ServeArgs,
    file: &ServeToml,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Vec<WebhookConfig>> {
    let urls = match a.webhook_urls.is_empty() {
        true => file.webhook_urls.clone().unwrap_or_default(),
        false => a.webhook_urls.clone(),
    };
    let secret = match (&a.webhook_secret_file, &file.webhook_secret_file) {
        (Some(p), _) => Some(webhook_secret(p, "--webhook-secret-file", warnings)?),
        (None, Some(p)) => Some(webhook_secret(p, "webhook_secret_file", warnings)?),
        (None, None) => None,
    };
    urls.iter()
        .map(|u| {
            let mut w = WebhookConfig::parse(u).map_err(anyhow::Error::msg)?;
            w.secret = secret.clone();
            Ok(w)
        })
        .collect()
}

/// How this instance meets the others (its peer token file's warnings to `warnings`).
fn peers(
    a: &ServeArgs,
    file: &ServeToml,
    warnings: &mut Vec<String>,
) -> anyhow::Result<service::PeerSettings> {
    Ok(service::PeerSettings {
        advertise_address: a
            .advertise_address
            .clone()
            .or(file.advertise_address.clone()),
        failover_group: a.failover_group.clone().or(file.failover_group.clone()),
        peer_ca: a.peer_ca.clone().or(file.peer_ca.clone()),
        token: match (&a.peer_token_file, &file.peer_token_file) {
            (Some(p), _) => Some(service::PeerToken::read(p, "--peer-token-file", warnings)?),
            (None, Some(p)) => Some(service::PeerToken::read(p, "peer_token_file", warnings)?),
            (None, None) => None,
        },
        owner_cache: a
            .owner_cache_ms
            .or(file.owner_cache_ms)
            .map(std::time::Duration::from_millis),
    })
}

/// The webhooks' signing secret, from the file `path` given by `key` (read as key files are;
/// its warnings pushed to `warnings`).
fn webhook_secret(
    path: &Path,
    key: &str,
    warnings: &mut Vec<String>,
) -> anyhow::Result<WebhookSecret> {
    let file = secret_file::read(path, WEBHOOK_SECRET_FILE_MAX).map_err(|e| match e {
        SecretFileError::TooLarge { len, max, .. } => anyhow::anyhow!(
            "{key} {}: {len} bytes or more; a webhook secret file holds at most {max}",
            path.display()
        ),
        e => anyhow::anyhow!("{key}: {e}"),
    })?;
    warnings.extend(file.warnings.iter().map(|w| format!("{key}: {w}")));
    WebhookSecret::parse(&file.bytes).map_err(|e| anyhow::anyhow!("{key} {}: {e}", path.display()))
}

/// The largest webhook secret file read (a secret is one line of under 100 characters).
const WEBHOOK_SECRET_FILE_MAX: u64 = 4096;

/// The largest admin token file read: a token is a line of printable ASCII.
const ADMIN_TOKEN_FILE_MAX: u64 = 4096;

/// The admin token: MUSHROOMDB_BACKUP_ADMIN_TOKEN, else `--admin-token-file`, else the config's
/// `admin_token_file`. Every source that is set is read and checked, so a blank one (a
/// whitespace-only file, an empty variable) is an error naming it even when another wins. A
/// file's warnings are pushed to `warnings`.
fn admin_token(
    flag_file: Option<&Path>,
    config_file: Option<&Path>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Option<String>> {
    const VAR: &str = "MUSHROOMDB_BACKUP_ADMIN_TOKEN";
    let check = |token: &str, source: &str| -> anyhow::Result<String> {
        let token = token.trim();
        if token.is_empty() {
            anyhow::bail!(
                "the admin token from {source} is blank: it would let every operator call pass; \
                 put a token there or remove the setting"
            );
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            anyhow::bail!(
                "the admin token from {source} has a space or a character that is not printable \
                 ASCII: no client could send it"
            );
        }
        Ok(token.to_string())
    };
    // The capped secret-file reader: a FIFO does not hang the start, a directory, a device or
    // a huge file is refused at once, naming the setting and the file.
    let mut read = |p: &Path, key: &str| -> anyhow::Result<String> {
        let source = format!("{key} {}", p.display());
        let file = secret_file::read(p, ADMIN_TOKEN_FILE_MAX).map_err(|e| match e {
            SecretFileError::TooLarge { len, max, .. } => anyhow::anyhow!(
                "{source}: {len} bytes or more; an admin token file holds at most {max}"
            ),
            e => anyhow::anyhow!("{key}: {e}"),
        })?;
        warnings.extend(file.warnings.iter().map(|w| format!("{key}: {w}")));
        let text = std::str::from_utf8(&file.bytes)
            .map_err(|_| anyhow::anyhow!("{source}: not UTF-8 text"))?;
        check(text, &source)
    };
    let env = match std::env::var(VAR) {
        Ok(t) => Some(check(&t, VAR)?),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!("{VAR} is not UTF-8"),
    };
    let flag = flag_file
        .map(|p| read(p, "--admin-token-file"))
        .transpose()?;
    let config = config_file
        .map(|p| read(p, "admin_token_file"))
        .transpose()?;
    Ok(env.or(flag).or(config))
}

pub async fn run(a: ServeArgs) -> anyhow::Result<ExitCode> {
    // Fail closed: a key that cannot be had stops here, before anything is served.
    let encryption = a.encryption.load_for_writing("serve")?;
    // Checked at start, not at the first `file://` store's registration.
    mushroom_backup::bucket::fs::FileModes::from_env().map_err(anyhow::Error::msg)?;
    let (mut config, telemetry) = resolve(a)?;
    config.worker.encryption.keys = encryption;
    let guard = mushroom_backup::telemetry::init(&mushroom_backup::telemetry::TelemetryConfig {
        log_format: telemetry.log_format,
        metrics_listen: telemetry.metrics_listen,
        ..Default::default()
    })?;
    for w in &telemetry.warnings {
        tracing::warn!("{w}");
    }
    if let Some(addr) = guard.metrics_addr() {
        tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    }
    let shutdown = super::shutdown_token();
    let (tx, rx) = tokio::sync::oneshot::channel::<service::Started>();
    let instance = config.instance_id.clone();
    let announce = async move {
        if let Ok(s) = rx.await {
            // One line on stdout once listening, for scripts and tests (port 0 picks a port).
            // Nobody reading it is no reason to stop serving (`out.rs`).
            let line =
                serde_json::json!({"listening": s.addr.to_string(), "instance_id": instance});
            if let Err(e) = super::out::line(line) {
                tracing::warn!(error = %e, "could not print the listening line");
            }
        }
    };
    // Beside the service, not a task of its own: done when the service is listening (or
    // stopped before it could).
    let (result, ()) = tokio::join!(service::run(config, shutdown, Some(tx)), announce);
    guard.shutdown().await;
    result?;
    Ok(ExitCode::SUCCESS)
}

//! The deployment files in `deploy/` are checked as their consumers would read them, and the
//! example config starts the real service.
//!
//! - `tests/deploy/validate.py` (run with the project's `.venv`, which `scripts/test.sh` fills):
//!   Kubernetes schemas, PromQL, Grafana, the collector config, the TOML keys, the systemd
//!   unit (`systemd-analyze verify` where it exists). Without `.venv` or its packages the test
//!   skips, except under `CI=true`, where it fails.
//! - `serve --config <config.example.toml moved to a temp dir>` listens, answers
//!   `grpc.health.v1` as the Kubernetes probes ask it, and exits 0 on SIGTERM.
//! - Two replicas from the multi-replica fleet's ConfigMap (`deploy/kubernetes/multi/`, its
//!   paths moved to a temp dir, a test CA's certificates, the registry from the environment as
//!   the pods get it, on the test PostgreSQL) answer over TLS, and a call for one's store made
//!   at the other is forwarded to it over TLS trusting `peer_ca`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// validate.py's exit status for a missing Python package.
const MISSING_DEPENDENCY: i32 = 77;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Fails under `CI=true`, else says why the test is skipped. Returns only outside CI.
fn skip_unless_ci(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}: run scripts/test.sh, which installs it into .venv");
    }
    eprintln!("SKIP: {why} (run scripts/test.sh, which installs it into .venv)");
}

#[test]
fn every_deploy_file_passes_the_validator() {
    let python = root().join(".venv/bin/python");
    if !python.exists() {
        return skip_unless_ci("no .venv/bin/python for tests/deploy/validate.py");
    }
    let out = std::process::Command::new(&python)
        .arg(root().join("tests/deploy/validate.py"))
        .current_dir(root())
        // systemd-analyze verify wants ExecStart's binary to exist: the one just built.
        .env("MB_BIN", env!("CARGO_BIN_EXE_mushroom-backup"))
        .output()
        .expect("run validate.py");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{report}");
    match out.status.code() {
        Some(0) => {}
        Some(MISSING_DEPENDENCY) => skip_unless_ci(report.trim()),
        _ => panic!(
            "tests/deploy/validate.py failed ({}):\n{report}",
            out.status
        ),
    }
}

/// Every string of the config that is a path (or a SQLite URL).
fn paths_in(value: &toml::Value, out: &mut Vec<String>) {
    match value {
        toml::Value::String(s) if s.starts_with('/') || s.starts_with("sqlite://") => {
            out.push(s.clone())
        }
        toml::Value::Array(items) => items.iter().for_each(|v| paths_in(v, out)),
        toml::Value::Table(t) => t.values().for_each(|v| paths_in(v, out)),
        _ => {}
    }
}

/// deploy/config.example.toml with its paths moved under `dir`.
fn example_config_in(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(root().join("deploy/config.example.toml")).unwrap();
    let mut conf: toml::Table = text.parse().expect("config.example.toml parses");
    let data = dir.join("data");
    let set = |conf: &mut toml::Table, key: &str, value: toml::Value| {
        assert!(
            conf.insert(key.into(), value).is_some(),
            "config.example.toml no longer sets {key}: update this test"
        );
    };
    set(&mut conf, "data_dir", data.display().to_string().into());
    set(
        &mut conf,
        "allow_roots",
        vec![toml::Value::from(dir.join("stores").display().to_string())].into(),
    );
    set(
        &mut conf,
        "registry",
        format!("sqlite://{}", data.join("registry.db").display()).into(),
    );
    let mut paths = Vec::new();
    paths_in(&toml::Value::Table(conf.clone()), &mut paths);
    let inside = format!("{}", dir.display());
    for p in paths {
        assert!(
            p.trim_start_matches("sqlite://").starts_with(&inside),
            "config.example.toml sets {p}, which this test does not move to a temp dir: update it"
        );
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(&conf).unwrap()).unwrap();
    path
}

/// Starts `cmd` (a `serve`) and waits for its `{"listening": ADDR}` line.
async fn listening(mut cmd: tokio::process::Command) -> (tokio::process::Child, String) {
    cmd.stdout(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn().expect("start mushroom-backup serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
        .await
        .expect("no {\"listening\": ...} line within 60 s")
        .unwrap()
        .expect("serve exited before listening");
    let started: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
    let addr = started["listening"]
        .as_str()
        .unwrap_or_else(|| panic!("no \"listening\" address: {line}"))
        .to_string();
    (child, addr)
}

async fn serving(addr: &str, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the gRPC port");
    let mut client = HealthClient::new(channel);
    let status = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap_or_else(|e| panic!("Health/Check {service:?}: {e}"))
        .into_inner()
        .status;
    ServingStatus::try_from(status).expect("a known serving status")
}

#[tokio::test]
async fn serve_starts_from_the_example_config_answers_the_probes_and_exits_0_on_sigterm() {
    let t = tempfile::tempdir().unwrap();
    let config = example_config_in(t.path());
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mushroom-backup"));
    cmd.arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    // Only the file may configure it: no setting from the environment of the test run.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MUSHROOMDB_BACKUP_") {
            cmd.env_remove(name);
        }
    }
    let (mut child, addr) = listening(cmd).await;
    assert!(
        t.path().join("data/registry.db").exists(),
        "the registry is not where the config put it"
    );

    // What the Kubernetes probes ask (deploy/kubernetes/statefulset.yaml): liveness and startup
    // the server as a whole, readiness the control service.
    assert_eq!(serving(&addr, "").await, ServingStatus::Serving);
    assert_eq!(
        serving(&addr, "mushroom.backup.v1.BackupControl").await,
        ServingStatus::Serving
    );

    let pid = i32::try_from(child.id().expect("still running")).unwrap();
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("serve did not exit within 60 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "serve exited with {status} after SIGTERM");
}

/// The `config.toml` of the multi-replica fleet's ConfigMap (the block under `config.toml: |`).
fn fleet_config_text() -> String {
    let yaml = std::fs::read_to_string(root().join("deploy/kubernetes/multi/configmap.yaml"))
        .expect("deploy/kubernetes/multi/configmap.yaml");
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "config.toml: |");
    assert!(
        lines.next().is_some(),
        "configmap.yaml has no config.toml block"
    );
    lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect()
}

/// A CA, and a server certificate for localhost and 127.0.0.1 signed by it (PEM files in
/// `dir`): ca.crt, tls.crt, tls.key, as the mushroom-backup-tls Secret holds them.
fn test_pki(dir: &Path) {
    use support::pki::{Ca, Usage};
    let ca = Ca::new(dir, "ca.crt", "mushroom-backup fleet test CA");
    // One certificate for both replicas (as the example's Secret), naming each instance id as
    // its peers check it (`service::peer_auth`).
    let ids = ["mushroom-backup-0", "mushroom-backup-1"]
        .map(|id| format!("{id}.mushroom-instance.invalid"));
    ca.leaf(
        ("tls.crt", "tls.key"),
        &["localhost", "127.0.0.1", &ids[0], &ids[1]],
        "mushroom-backup replica",
        &[Usage::ServerAuth, Usage::ClientAuth],
    );
}

/// The fleet's config with every path it sets moved under `dir` (the certificates in
/// `dir/tls`, the stores in `dir/stores`, the data dir per replica).
fn fleet_config_in(dir: &Path, replica: &str) -> PathBuf {
    let mut conf: toml::Table = fleet_config_text()
        .parse()
        .expect("the fleet's config.toml parses");
    let moved = |p: &str| -> toml::Value {
        let rest = p
            .strip_prefix("/etc/mushroom-backup/tls/")
            .map(|f| dir.join("tls").join(f))
            .or_else(|| (p == "/var/lib/mushroomdb").then(|| dir.join("stores")))
            .or_else(|| (p == "/var/lib/mushroom-backup").then(|| dir.join(replica)))
            .unwrap_or_else(|| panic!("the fleet's config sets {p}: move it in this test"));
        rest.display().to_string().into()
    };
    let get = |conf: &toml::Table, key: &str| conf[key].as_str().unwrap().to_string();
    conf.insert("data_dir".into(), moved(&get(&conf, "data_dir")));
    conf.insert("peer_ca".into(), moved(&get(&conf, "peer_ca")));
    let roots: Vec<toml::Value> = conf["allow_roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| moved(r.as_str().unwrap()))
        .collect();
    conf.insert("allow_roots".into(), roots.into());
    let tls = conf["tls"].as_table_mut().unwrap();
    for key in ["cert", "key"] {
        let p = tls[key].as_str().unwrap().to_string();
        tls.insert(key.into(), moved(&p));
    }
    let mut paths = Vec::new();
    paths_in(&toml::Value::Table(conf.clone()), &mut paths);
    let inside = dir.display().to_string();
    assert!(
        paths.iter().all(|p| p.starts_with(&inside)),
        "the fleet's config sets a path this test does not move: {paths:?}"
    );
    let path = dir.join(format!("{replica}.toml"));
    std::fs::write(&path, toml::to_string(&conf).unwrap()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_from_the_fleet_config_forward_to_each_other_over_tls() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "deploy_fleet").await;
    let t = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(t.path()).unwrap();
    test_pki(&dir.join("tls"));
    let store = dir.join("stores/s1");
    support::binary::write_store(&store, 5);
    let bucket = dir.join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    const TOKEN: &str = "fleet-test-admin-token";
    // The Secret's peer-token key, mounted as a file (statefulset.yaml).
    let peer_token = dir.join("peer-token");
    std::fs::write(&peer_token, "fleet-test-peer-token-0123456789").unwrap();

    let mut replicas = Vec::new();
    for name in ["mushroom-backup-0", "mushroom-backup-1"] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mushroom-backup"));
        cmd.arg("serve")
            .arg("--config")
            .arg(fleet_config_in(&dir, name))
            // The pod's other args; its advertised name is the listen address here (the
            // certificate names 127.0.0.1), which the default advertises.
            .args([
                "--listen",
                "127.0.0.1:0",
                "--owner-silent-after-ms",
                "20000",
            ])
            .stderr(Stdio::inherit());
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("MUSHROOMDB_BACKUP_") {
                cmd.env_remove(var);
            }
        }
        // What the pod's environment sets (statefulset.yaml).
        cmd.env("MUSHROOMDB_BACKUP_INSTANCE_ID", name)
            .env("MUSHROOMDB_BACKUP_REGISTRY", &db.url)
            .env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", TOKEN)
            .env("MUSHROOMDB_BACKUP_PEER_TOKEN_FILE", &peer_token);
        replicas.push(listening(cmd).await);
    }
    let ca =
        tonic::transport::Certificate::from_pem(std::fs::read(dir.join("tls/ca.crt")).unwrap());
    let client = |addr: &str| {
        let port = addr.rsplit_once(':').unwrap().1.to_string();
        let ca = ca.clone();
        async move {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("https://localhost:{port}"))
                    .unwrap()
                    .tls_config(tonic::transport::ClientTlsConfig::new().ca_certificate(ca))
                    .unwrap()
                    .connect()
                    .await
                    .expect("connect over TLS");
            let token: tonic::metadata::MetadataValue<_> =
                format!("Bearer {TOKEN}").parse().unwrap();
            mushroom_backup::service::proto::backup_control_client::BackupControlClient::with_interceptor(
                channel,
                move |mut r: tonic::Request<()>| {
                    r.metadata_mut().insert("authorization", token.clone());
                    Ok(r)
                },
            )
        }
    };
    let mut c0 = client(&replicas[0].1).await;
    let mut c1 = client(&replicas[1].1).await;
    let id = c0
        .register(support::register_req(&store, &support::file_url(&bucket)))
        .await
        .expect("Register on replica 0")
        .into_inner()
        .store_id;
    // Fresh Health through replica 1 is replica 0's own answer, over TLS between them.
    let h = c1
        .health(mushroom_backup::service::proto::HealthRequest {
            store_id: id,
            fresh: true,
        })
        .await
        .expect("fresh Health through replica 1, forwarded to replica 0")
        .into_inner();
    assert_eq!(h.stores[0].instance_id, "mushroom-backup-0", "{h:?}");
    drop(replicas);
    db.drop_database().await;
}

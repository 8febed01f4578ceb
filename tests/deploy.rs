//! The deployment files in `deploy/` are checked as their consumers would read them, and the
//! example config starts the real service.
//!
//! - `tests/deploy/validate.py` (run with the project's `.venv`, which `scripts/test.sh` fills):
//!   Kubernetes schemas, PromQL, Grafana, the collector config, the TOML keys, the systemd
//!   unit (`systemd-analyze verify` where it exists). Without `.venv` or its packages the test
//!   skips, except under `CI=true`, where it fails.
//! - `serve --config <config.example.toml moved to a temp dir>` listens, answers
//!   `grpc.health.v1` as the Kubernetes probes ask it, and exits 0 on SIGTERM.

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

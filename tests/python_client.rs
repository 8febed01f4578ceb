//! The control plane end to end from a Python client generated from `proto/`
//! (`tests/python/test_control_plane.py`): runs that pytest file with the project's `.venv`
//! against this build's `mushroom-backup` binary, and fails with pytest's output when it fails.
//!
//! `scripts/test.sh` installs grpcio, grpcio-tools and pytest into `.venv`. Without them the test
//! is skipped with a line saying so — except under `CI=true`, where it fails.

use std::path::Path;
use std::process::Command;

/// What the pytest file needs from `.venv`.
const NEEDED: &str = "import grpc, grpc_tools, grpc_health.v1, grpc_reflection.v1alpha, pytest";

#[test]
fn the_python_client_drives_the_control_plane() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = repo.join(".venv/bin/python");
    let has_deps = Command::new(&python)
        .args(["-c", NEEDED])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_deps {
        let why = format!(
            "{} lacks grpcio, grpcio-tools or pytest: run scripts/test.sh (it installs them)",
            python.display()
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{why}");
        }
        eprintln!("SKIP the_python_client_drives_the_control_plane: {why}");
        return;
    }

    let out = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            // No .pytest_cache in the work tree.
            "-p",
            "no:cacheprovider",
            "tests/python/test_control_plane.py",
        ])
        .current_dir(repo)
        .env("MUSHROOM_BACKUP_BIN", env!("CARGO_BIN_EXE_mushroom-backup"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run pytest");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "pytest tests/python/test_control_plane.py failed ({}):\n{report}",
        out.status
    );
    // Passing output too, so a run shows what was checked.
    println!("{report}");
}

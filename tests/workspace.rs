//! The workspace's promise to an engine author (docs/layout.md): adding the node client
//! (`mushroom-node-client`) brings a small dependency tree, and none of the service's: no
//! database driver, no S3 SDK, no OTLP exporter, no gRPC server or router.
//!
//! Read from `cargo tree` on the workspace's own `Cargo.lock` (offline: it resolves nothing).

use std::collections::BTreeSet;
use std::process::Command;

/// The most packages (name and version) the node client may bring, itself included.
const MOST_PACKAGES: usize = 120;

/// Packages (by name prefix) of the service side that must not reach an engine.
const SERVICE_ONLY: &[&str] = &[
    "sqlx",
    "aws-sdk-",
    "aws-config",
    "opentelemetry-otlp",
    "axum",
    "mushroom-backup",
];

/// `cargo tree -p mushroom-node-client` with `args`, one line per entry, no indentation.
fn tree(args: &[&str]) -> String {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "mushroom-node-client",
        ])
        .args(["--prefix", "none"])
        .args(args)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 from cargo tree")
}

#[test]
fn the_node_client_brings_a_small_tree_without_the_service() {
    let text = tree(&["-e", "normal"]);
    // `name v1.2.3 (path)? (*)?`: a package is its name and version.
    let packages: BTreeSet<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect();
    assert!(
        packages.iter().any(|(n, _)| n == "tonic") && packages.iter().any(|(n, _)| n == "tokio"),
        "the tree lacks the client's own dependencies: {packages:?}"
    );
    assert!(
        packages.len() <= MOST_PACKAGES,
        "the node client brings {} packages (at most {MOST_PACKAGES}):\n{}",
        packages.len(),
        text
    );
    let service: Vec<_> = packages
        .iter()
        .filter(|(n, _)| SERVICE_ONLY.iter().any(|s| n.starts_with(s)))
        .collect();
    assert!(
        service.is_empty(),
        "the node client brings the service's packages: {service:?}"
    );
}

#[test]
fn the_node_client_builds_no_grpc_server() {
    let text = tree(&["-e", "normal,features", "-i", "tonic"]);
    assert!(
        text.contains("tonic feature \"channel\""),
        "no client channel in:\n{text}"
    );
    for server in ["server", "router", "transport"] {
        assert!(
            !text.contains(&format!("tonic feature \"{server}\"")),
            "tonic's `{server}` feature reaches the node client:\n{text}"
        );
    }
}

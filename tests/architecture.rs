//! The house's two structural rules, checked on the code itself (README, Layout):
//!
//! - **Floors stay floors**: a module imports only the modules on the floors below it, so
//!   telemetry and the bucket know nothing of workers, health or the service.
//! - **Every long-lived task is spawned through a `TaskTracker`**, so that a shutdown can
//!   wait for all of them: outside test modules, `src/` spawns no task with a bare
//!   `tokio::spawn` but the one signal listener, which lives as long as the process and is
//!   what starts a shutdown. The behaviour is tested where the trackers are: `tests/spawn.rs`
//!   (a worker's runner, supervisor and lease renewal all end at shutdown) and the serve tests
//!   (the service exits only after `Fleet::stop_tasks`).

#[path = "support/sources.rs"]
mod sources;

use std::path::Path;

use sources::rust_files;

/// The places allowed a bare spawn: `(file, the function it is in)`.
const ALLOWED: &[(&str, &str)] = &[("src/cli/mod.rs", "fn on_signal")];

/// Each module of the library and what it may use (`crate::X` in code; doc links do not
/// count). Bottom floor first.
const FLOORS: &[(&str, &[&str])] = &[
    ("units", &[]),
    ("pacing", &[]),
    ("backoff", &[]),
    ("telemetry", &[]),
    ("manifest", &[]),
    ("instance_lock", &[]),
    ("nofollow", &[]),
    ("bucket", &["units", "backoff", "telemetry", "nofollow"]),
    ("cost", &["units", "bucket"]),
    ("store", &["units", "nofollow"]),
    ("crypto", &["units", "bucket", "manifest"]),
    ("at_rest", &["units", "bucket", "manifest", "crypto"]),
    (
        "lease",
        &["units", "pacing", "backoff", "bucket", "manifest"],
    ),
    ("wal_source", &["units", "store"]),
    ("events", &["units", "backoff", "telemetry"]),
    ("health", &["units", "lease", "store", "wal_source"]),
    (
        "worker",
        &[
            "units",
            "pacing",
            "backoff",
            "bucket",
            "manifest",
            "store",
            "lease",
            "wal_source",
            "health",
            "at_rest",
            "events",
            "crypto",
        ],
    ),
    (
        "restore",
        &["units", "bucket", "manifest", "store", "at_rest", "crypto"],
    ),
    (
        "drill",
        &["units", "bucket", "manifest", "store", "restore"],
    ),
    (
        "verify",
        &[
            "units", "bucket", "manifest", "store", "restore", "at_rest", "crypto",
        ],
    ),
    ("listing", &["units", "bucket", "manifest"]),
    ("registry", &["units", "lease", "instance_lock"]),
];

/// The `crate::X` modules a file's code (not its comments) names.
fn uses(text: &str) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

/// The floors that are crates of their own (`crates/`, re-exported by the library under these
/// names): Cargo keeps them from naming the library at all, so there are no files to read here.
const IN_CRATES: &[&str] = &["units", "backoff", "manifest"];

#[test]
fn every_module_imports_only_the_floors_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for (module, allowed) in FLOORS {
        if IN_CRATES.contains(module) {
            continue;
        }
        let mut files = Vec::new();
        let dir = root.join(module);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        } else {
            files.push(root.join(format!("{module}.rs")));
        }
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for used in uses(&text) {
                if used != *module && !allowed.contains(&used.as_str()) {
                    wrong.push(format!("{}: crate::{used}", file.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a floor imports from above it:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_long_lived_task_is_spawned_outside_a_tracker() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(
        files.len() > 50,
        "found only {} files under src/",
        files.len()
    );
    let mut bare = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        // Test modules stand at the end of a file, after `#[cfg(test)]`; a file of tests alone
        // (`tests.rs`) is all test code.
        if rel.ends_with("/tests.rs") {
            continue;
        }
        let code = text.split("#[cfg(test)]").next().unwrap();
        let mut function = "";
        for (n, line) in code.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            if let Some(at) = t.find("fn ") {
                let name = &t[at..];
                function = &name[..name.find('(').unwrap_or(name.len())];
            }
            if (t.contains("tokio::spawn(") || t.contains("tokio::task::spawn("))
                && !ALLOWED.contains(&(rel.as_str(), function))
            {
                bare.push(format!("{rel}:{}: {t}", n + 1));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "bare spawns (spawn through a TaskTracker instead):\n{}",
        bare.join("\n")
    );
}

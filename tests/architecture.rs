//! The house's structural rules, checked on the code itself (docs/layout.md; the inner
//! ones, circles inside a room, the fleet's floors and the length of functions, are in
//! `architecture/rooms.rs`):
//!
//! - **Floors stay floors**: a module imports only the modules on the floors below it, so
//!   telemetry and the bucket know nothing of workers, health or the service.
//! - **The service's rooms import downward only** (`src/service/mod.rs`): the gRPC edge, the
//!   cluster, the operations, the fleet, its configuration, each naming only the rooms below
//!   it (`crate::service::ROOM`), so the domain never imports the edge and no two rooms import
//!   each other. Every file of the service but its top (`mod.rs`) and the protocol
//!   (`proto.rs`, `codec.rs`) lives in a room. Both tables may name only what stands below,
//!   so a new circle fails here whichever way it is written.
//! - **No file of `src/` or of a crate's `src/` passes 700 lines**, and **the workspace's crates
//!   depend only on the crates below them** (`CRATES`: the node client never reaches the library).
//! - **Every long-lived task is spawned through a `TaskTracker`**, so that a shutdown can
//!   wait for all of them: outside test modules, `src/` spawns no task with a bare
//!   `tokio::spawn` but the one signal listener, which lives as long as the process and is
//!   what starts a shutdown. The behaviour is tested where the trackers are: `tests/spawn.rs`
//!   (a worker's runner, supervisor and lease renewal all end at shutdown) and the serve tests
//!   (the service exits only after `Fleet::stop_tasks`).

#[path = "support/sources.rs"]
mod sources;

// The inner rules: no circle inside a room, the fleet's floors, no function over 120 lines.
#[path = "architecture/rooms.rs"]
mod rooms;

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
    ("instance_id", &[]),
    ("instance_lock", &[]),
    ("nofollow", &[]),
    ("bucket", &["units", "backoff", "telemetry", "nofollow"]),
    ("cost", &["units", "bucket"]),
    ("latest", &["bucket", "manifest"]),
    ("pins", &["units", "bucket", "manifest"]),
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
            "latest",
            "pins",
        ],
    ),
    (
        "restore",
        &[
            "units", "bucket", "manifest", "store", "at_rest", "crypto", "latest",
        ],
    ),
    (
        "drill",
        &["units", "bucket", "manifest", "store", "restore", "latest"],
    ),
    (
        "verify",
        &[
            "units", "bucket", "manifest", "store", "restore", "at_rest", "crypto", "latest",
        ],
    ),
    ("listing", &["units", "bucket", "manifest", "latest"]),
    (
        "branch",
        &[
            "units", "bucket", "manifest", "crypto", "restore", "latest", "pins",
        ],
    ),
    ("registry", &["units", "lease", "instance_lock", "health"]),
];

/// The service's rooms and the rooms each may use (`crate::service::X`), bottom floor first
/// (`src/service/mod.rs` says what each holds). A room is `src/service/X.rs`, `src/service/X/`
/// or both.
const ROOMS: &[(&str, &[&str])] = &[
    ("config", &[]),
    ("fleet", &["config"]),
    ("ops", &["fleet", "config"]),
    ("cluster", &["ops", "fleet", "config"]),
    ("edge", &["cluster", "ops", "fleet", "config"]),
];

/// The files of `src/service/` outside every room: its top, which starts the rooms, and the
/// protocol, which every room may use.
const SERVICE_TOP: &[&str] = &["mod.rs", "proto.rs", "codec.rs"];

/// The lines a file of `src/` may have.
const MAX_LINES: usize = 700;

/// The `crate::X` modules a file's code (not its comments) names.
fn uses(text: &str) -> std::collections::BTreeSet<String> {
    uses_under(text, "crate::")
}

/// The modules a file's code (not its comments) names after `prefix`.
fn uses_under(text: &str, prefix: &str) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
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

/// Each table names only what stands on a floor below the one naming it: no table can be
/// edited into a circle.
#[test]
fn the_floor_tables_have_no_circle() {
    for (table, rows) in [("FLOORS", FLOORS), ("ROOMS", ROOMS)] {
        for (at, (module, allowed)) in rows.iter().enumerate() {
            let below: Vec<&str> = rows[..at].iter().map(|(m, _)| *m).collect();
            for used in *allowed {
                assert!(
                    below.contains(used),
                    "{table}: {module} may use {used}, which is not on a floor below it"
                );
            }
        }
    }
}

#[test]
fn every_service_room_imports_only_the_rooms_below_it() {
    let service = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/service");
    let rooms: Vec<&str> = ROOMS.iter().map(|(r, _)| *r).collect();
    // Every file of the service is in a room, or at its top.
    let mut outside = Vec::new();
    for entry in std::fs::read_dir(&service).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let room = name.strip_suffix(".rs").unwrap_or(&name);
        if !rooms.contains(&room) && !SERVICE_TOP.contains(&name.as_str()) {
            outside.push(path.display().to_string());
        }
    }
    assert!(
        outside.is_empty(),
        "files of src/service/ in no room (ROOMS):\n{}",
        outside.join("\n")
    );
    let mut wrong = Vec::new();
    let mut found = 0;
    for (room, allowed) in ROOMS {
        let mut files = Vec::new();
        let dir = service.join(room);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
        let file = service.join(format!("{room}.rs"));
        if file.is_file() {
            files.push(file);
        }
        assert!(!files.is_empty(), "room {room} has no file");
        found += files.len();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for used in uses_under(&text, "crate::service::") {
                if rooms.contains(&used.as_str())
                    && used != *room
                    && !allowed.contains(&used.as_str())
                {
                    wrong.push(format!("{}: crate::service::{used}", file.display()));
                }
            }
            // A room is named by its absolute path, never reached by climbing out of one.
            for used in uses_under(&text, "super::super::") {
                if rooms.contains(&used.as_str()) {
                    wrong.push(format!("{}: super::super::{used}", file.display()));
                }
            }
        }
    }
    assert!(
        found > 30,
        "found only {found} files in the service's rooms"
    );
    assert!(
        wrong.is_empty(),
        "a service room imports from a room above it, or beside it:\n{}",
        wrong.join("\n")
    );
}

/// The workspace's crates, bottom first, and the crates of this workspace each may depend on
/// (`[dependencies]` and `[dev-dependencies]` of its `Cargo.toml`; `[workspace.dependencies]`
/// of the root are not a crate's own).
const CRATES: &[(&str, &str, &[&str])] = &[
    ("mushroom-format", "crates/format", &[]),
    ("mushroom-backoff", "crates/backoff", &[]),
    ("mushroom-proto", "crates/proto", &[]),
    (
        "mushroom-node-client",
        "crates/node-client",
        &["mushroom-format", "mushroom-backoff", "mushroom-proto"],
    ),
    (
        "mushroom-backup",
        ".",
        &[
            "mushroom-format",
            "mushroom-backoff",
            "mushroom-proto",
            "mushroom-node-client",
        ],
    ),
];

/// The workspace's crates depend only on the crates below them: the node client an engine
/// embeds never reaches the library (and through it sqlx and the S3 SDK), and no crate is
/// missing from the table.
#[test]
fn every_crate_depends_only_on_the_crates_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut listed: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| format!("crates/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    listed.sort();
    let mut tabled: Vec<String> = CRATES
        .iter()
        .filter(|(_, dir, _)| *dir != ".")
        .map(|(_, dir, _)| dir.to_string())
        .collect();
    tabled.sort();
    assert_eq!(listed, tabled, "every folder of crates/ is a row of CRATES");
    let mut wrong = Vec::new();
    for (at, (name, dir, allowed)) in CRATES.iter().enumerate() {
        let below: Vec<&str> = CRATES[..at].iter().map(|(n, _, _)| *n).collect();
        for used in *allowed {
            assert!(
                below.contains(used),
                "CRATES: {name} may use {used}, not below it"
            );
        }
        let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
        let mut section = String::new();
        for line in manifest.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                section = line.to_string();
                continue;
            }
            let own = section == "[dependencies]"
                || section == "[dev-dependencies]"
                || section == "[build-dependencies]";
            if !own {
                continue;
            }
            let dep: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if dep.starts_with("mushroom") && !allowed.contains(&dep.as_str()) {
                wrong.push(format!("{dir}/Cargo.toml {section}: {dep}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a crate depends on a crate above it or beside it:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_file_passes_700_lines() {
    let mut files = Vec::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    rust_files(&root.join("src"), &mut files);
    for (_, dir, _) in CRATES.iter().filter(|(_, dir, _)| *dir != ".") {
        rust_files(&root.join(dir).join("src"), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > MAX_LINES).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them by concept):\n{}",
        long.join("\n")
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

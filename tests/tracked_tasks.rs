//! Every long-lived task is spawned through a `TaskTracker`, so that a shutdown can wait for
//! all of them (issue 12). What this checks is the code itself: outside test modules, `src/`
//! spawns no task with a bare `tokio::spawn` but the one signal listener, which lives as long
//! as the process and is what starts a shutdown. The behaviour is tested where the trackers
//! are: `tests/spawn.rs` (a worker's runner, supervisor and lease renewal all end at shutdown)
//! and the serve tests (the service exits only after `Fleet::stop_tasks`).

use std::path::Path;

/// The places allowed a bare spawn: `(file, the function it is in)`.
const ALLOWED: &[(&str, &str)] = &[("src/cli/mod.rs", "fn on_signal")];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
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

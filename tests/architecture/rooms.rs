//! The house's inner rules, checked on the code itself:
//!
//! - **No circle of imports inside a room**: the modules of one folder (its files and its
//!   sub-folders, the folder's own `mod.rs` aside, since it declares them) import each other
//!   in one direction only, so each can be read, and moved, after the ones it uses.
//! - **The fleet's inner floors** (`FLEET_FLOORS`): admission and the options record know
//!   nothing of the hosted stores; the builder of a worker knows the options, not the map.
//! - **No function over [`MAX_FUNCTION_LINES`] lines** but the ones in
//!   [`LONG_FUNCTIONS`], each with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::sources::rust_files;

/// The lines a function may have, from its `fn` line to its closing brace.
pub const MAX_FUNCTION_LINES: usize = 120;

/// The functions allowed past [`MAX_FUNCTION_LINES`]: `(file, function, why)`.
pub const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// The fleet's modules, bottom floor first, and the fleet modules each may use
/// (`super::X`, `crate::service::fleet::X`): a module not listed here fails the test, so a
/// new file takes its floor when it is written.
pub const FLEET_FLOORS: &[(&str, &[&str])] = &[
    // What a request may hold: fields, directories, destinations, conflicts.
    ("admission", &[]),
    // The typed options record, its registry row, its checks and its proto form.
    ("options", &["admission"]),
    // The one builder of a worker.
    ("start", &["options"]),
    // The one map of hosted stores, keyed by role.
    ("hosted", &[]),
    // Parts of the fleet that know no other part of it.
    ("store_metrics", &[]),
    ("event_log", &[]),
    ("remote", &[]),
    ("shared_id", &[]),
    ("claim_renewal", &[]),
    ("record", &[]),
    ("rto", &[]),
    // The instance's throttle, its base limits and schedule.
    ("traffic", &[]),
    // The roles a hosted store has beside its primary worker, and the promotion between them.
    ("replica", &["start", "options"]),
    ("standby", &["admission", "hosted", "options"]),
    (
        "promote",
        &["admission", "hosted", "options", "standby", "start"],
    ),
    // Starting, stopping and deregistering hosted stores, and what the fleet answers.
    ("hosting", &["hosted", "options", "store_metrics"]),
    ("deregister", &["admission", "hosted"]),
    ("error", &["admission", "promote"]),
    // A branch of a registered store (locked as its options lock it), restored and registered
    // as Adopt does; what branches are charged.
    ("branch", &["admission", "options"]),
];

/// A folder's modules (file stems and sub-folder names, `mod` aside) and, for each, the
/// sibling modules its files name.
fn sibling_uses(dir: &Path, module_path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            modules.entry(name).or_default().extend(files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            modules.entry(name).or_default().push(path);
        }
    }
    // `x.rs` beside `x/` is the folder's own module: it stands for the folder.
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut uses = BTreeMap::new();
    for (name, files) in &modules {
        let mut named = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            // From a file directly in the folder `super::` is the folder; from a file of a
            // sub-folder the folder is always named by its whole path.
            // (A sub-folder's `mod.rs` is the sub-folder's module: its `super::` is the folder.)
            let direct = match file.ends_with("mod.rs") {
                false => file.parent() == Some(dir),
                true => file.parent().and_then(Path::parent) == Some(dir),
            };
            for m in module_names(code, &format!("{module_path}::")) {
                named.insert(m);
            }
            if direct {
                for m in module_names(code, "super::") {
                    named.insert(m);
                }
            }
        }
        named.retain(|m| m != name && names.contains(m));
        uses.insert(name.clone(), named);
    }
    uses
}

/// The first names after each `prefix` in code (comments cut), groups `prefix{a, b::c}`
/// giving each of their first names.
fn module_names(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.insert(ident(group[start..i].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(group[start..i].trim()));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.remove("");
    found
}

/// A circle in `uses`, as the names along it, if there is one.
fn a_circle(uses: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        uses: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut circle = path[i..].to_vec();
            circle.push(at.to_string());
            return Some(circle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        for next in uses.get(at).into_iter().flatten() {
            if let Some(c) = visit(next, uses, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = BTreeSet::new();
    uses.keys()
        .find_map(|m| visit(m, uses, &mut Vec::new(), &mut done))
}

/// Every folder of `src/` and of the crates' `src/`, with its module path.
fn rooms(root: &Path) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, module_path: &str, out: &mut Vec<(PathBuf, String)>) {
        out.push((dir.to_path_buf(), module_path.to_string()));
        let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect();
        subs.sort();
        for sub in subs {
            let name = sub.file_name().unwrap().to_string_lossy().into_owned();
            walk(&sub, &format!("{module_path}::{name}"), out);
        }
    }
    let mut out = Vec::new();
    walk(&root.join("src"), "crate", &mut out);
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            walk(&src, "crate", &mut out);
        }
    }
    out
}

#[test]
fn no_room_has_a_circle_of_imports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut circles = Vec::new();
    let all = rooms(root);
    assert!(all.len() > 20, "found only {} folders", all.len());
    for (dir, module_path) in all {
        if let Some(circle) = a_circle(&sibling_uses(&dir, &module_path)) {
            let rel = dir.strip_prefix(root).unwrap().display().to_string();
            circles.push(format!("{rel}: {}", circle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "modules of one folder that import each other in a circle (move what both need into a \
         module of its own, below both):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_fleets_modules_import_only_the_floors_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("src/service/fleet");
    let uses = sibling_uses(&dir, "crate::service::fleet");
    let mut wrong = Vec::new();
    for (module, named) in &uses {
        let Some(at) = FLEET_FLOORS.iter().position(|(m, _)| m == module) else {
            wrong.push(format!("{module}: not in FLEET_FLOORS (give it its floor)"));
            continue;
        };
        for n in named {
            if !FLEET_FLOORS[at].1.contains(&n.as_str()) {
                wrong.push(format!(
                    "{module} uses {n}, which FLEET_FLOORS does not allow it"
                ));
            }
        }
        for allowed in FLEET_FLOORS[at].1 {
            let below = FLEET_FLOORS[..at].iter().any(|(m, _)| m == allowed);
            if !below {
                wrong.push(format!(
                    "FLEET_FLOORS: {module} may use {allowed}, not below it"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the fleet's floors:\n{}",
        wrong.join("\n")
    );
}

/// Every function of `text` longer than `max` lines: `(line, name, lines)`.
fn long_functions(text: &str, max: usize) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    let strip = |l: &str| -> String {
        // Strings and character literals hold braces that are not code.
        let mut out = String::new();
        let mut chars = l.chars().peekable();
        let mut in_str = false;
        while let Some(c) = chars.next() {
            match (in_str, c) {
                (false, '/') if chars.peek() == Some(&'/') => break,
                (false, '"') => in_str = true,
                (true, '\\') => {
                    chars.next();
                }
                (true, '"') => in_str = false,
                (false, '\'') => {
                    // '{' or '}' as a char literal.
                    let rest: String = chars.clone().take(2).collect();
                    if rest.len() == 2 && rest.ends_with('\'') {
                        chars.next();
                        chars.next();
                    } else {
                        out.push(c);
                    }
                }
                (false, c) => out.push(c),
                (true, _) => {}
            }
        }
        out
    };
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let head = t
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("const ")
            .trim_start_matches("async ")
            .trim_start_matches("unsafe ");
        let head = match head.strip_prefix("pub(in ") {
            Some(rest) => rest.split_once(") ").map_or(rest, |(_, r)| r),
            None => head,
        };
        let Some(rest) = head.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let mut depth = 0i64;
        let mut started = false;
        for (j, l) in lines.iter().enumerate().skip(i) {
            let code = strip(l);
            for c in code.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if !started && code.trim_end().ends_with(';') {
                break;
            }
            if started && depth <= 0 {
                let n = j - i + 1;
                if n > max {
                    long.push((i + 1, name.clone(), n));
                }
                break;
            }
        }
    }
    long
}

#[test]
fn no_function_passes_120_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut long = Vec::new();
    let mut excepted = BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(file).unwrap();
        for (line, name, n) in long_functions(&text, MAX_FUNCTION_LINES) {
            match LONG_FUNCTIONS
                .iter()
                .find(|(f, fname, _)| *f == rel && *fname == name)
            {
                Some(_) => {
                    excepted.insert((rel.clone(), name));
                }
                None => long.push(format!("{rel}:{line}: fn {name}, {n} lines")),
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them into named steps, or list one in \
         LONG_FUNCTIONS with its reason):\n{}",
        long.join("\n")
    );
    let stale: Vec<_> = LONG_FUNCTIONS
        .iter()
        .filter(|(f, n, _)| !excepted.contains(&(f.to_string(), n.to_string())))
        .collect();
    assert!(
        stale.is_empty(),
        "LONG_FUNCTIONS lists functions no longer long: {stale:?}"
    );
}

#[test]
fn the_scans_see_what_they_look_for() {
    let text = "fn a() {\n    let s = \"{\";\n    let c = '}';\n}\n";
    assert!(
        long_functions(text, 3)
            .iter()
            .any(|(_, n, l)| n == "a" && *l == 4)
    );
    assert!(long_functions(text, 4).is_empty());
    let names = module_names(
        "use super::{a, b::C};\nuse super::d::E; // super::zz\n",
        "super::",
    );
    assert_eq!(names, ["a", "b", "d"].map(String::from).into());
    let mut uses = BTreeMap::new();
    uses.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    uses.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert!(a_circle(&uses).is_some());
    uses.insert("b".to_string(), BTreeSet::new());
    assert!(a_circle(&uses).is_none());
}

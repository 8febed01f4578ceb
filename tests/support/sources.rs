//! The crate's own source files, for the tests that read them: the floors test
//! (`tests/architecture.rs`, which takes this file alone by `#[path]`) and the check that
//! nothing prints past `out.rs` (`tests/broken_pipe.rs`).

use std::path::{Path, PathBuf};

/// Appends every `.rs` file under `dir` (recursively) to `out`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

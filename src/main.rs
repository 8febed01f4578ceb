//! The `mushroom-backup` binary: clap commands over the library; no logic of its own.

// As in lib.rs: no cast that wraps or truncates (see `mushroom_backup::units`).
#![deny(
    clippy::cast_possible_wrap,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

//! The `mushroom-backup` binary: clap commands over the library; no logic of its own.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}

//! `restore`, `verify` and `ls` (filled in with the restore module).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

#[derive(Args)]
pub struct RestoreArgs {
    #[arg(long)]
    from: String,
    #[arg(long)]
    to: PathBuf,
}

#[derive(Args)]
pub struct VerifyArgs {
    #[arg(long)]
    from: String,
}

#[derive(Args)]
pub struct LsArgs {
    #[arg(long)]
    from: String,
}

pub async fn restore(_a: RestoreArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("restore: not built yet")
}

pub async fn verify(_a: VerifyArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("verify: not built yet")
}

pub async fn ls(_a: LsArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("ls: not built yet")
}

//! Command-line commands. Each parses its arguments, calls the library and prints (through
//! `out.rs`, never `println!`); every failure exits non-zero with a one-line reason on stderr,
//! but for a closed stdout, which exits 141 quietly (`out.rs` says why).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod backup;
mod branch;
mod client_tls;
mod ctl;
mod encryption;
mod inspect;
mod lease;
mod node;
mod node_ack;
mod out;
mod retention;
mod serve;
mod serve_limits;
mod settings;
mod standby;
mod store;

/// Continuous, crash-safe backup of database stores to S3 or a local directory.
#[derive(Parser)]
#[command(name = "mushroom-backup", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The reference engine: write and digest stores (tests, demos, restore checks).
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Back up a store directory to a destination, once or following it.
    Backup(backup::BackupArgs),
    /// Restore a store from a destination into an empty directory.
    Restore(inspect::RestoreArgs),
    /// Make a standby (`restore --follow`, stopped) the primary of the prefix it follows:
    /// fence the old writer through the bucket lease, apply everything, adopt the prefix.
    Promote(standby::PromoteArgs),
    /// Check every restore point of a destination.
    Verify(inspect::VerifyArgs),
    /// A writable copy of a prefix at a commit: a new prefix naming the parent's objects
    /// (none copied), pinned against the parent's retention; `branch delete` gives one up.
    Branch(branch::BranchArgs),
    /// List the restore points of a destination.
    Ls(inspect::LsArgs),
    /// Which restore points a retention pass would delete, and why (`--dry-run`).
    Retention(retention::RetentionArgs),
    /// Run the gRPC control plane: one backup worker per registered store.
    Serve(Box<serve::ServeArgs>),
    /// A demo database node: the reference engine, reporting its positions to the service.
    Node(node::NodeArgs),
    /// Operator calls to the service (register, health, restore points, adopt, ...).
    Ctl(ctl::CtlArgs),
    /// Key files and age identities: make one, show its recipient or key id.
    #[command(subcommand)]
    Key(encryption::KeyCommand),
    /// Re-wrap every generation's data key for new keys, then remove the old wrappers (no
    /// data object is touched).
    Rekey(encryption::RekeyArgs),
}

pub fn main() -> ExitCode {
    cap_malloc_arenas();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // `serve` sets telemetry up itself (its settings may come from its config file); every
    // other command logs to stderr, and exports traces when OTEL_EXPORTER_OTLP_ENDPOINT is set.
    let _guard = if matches!(cli.command, Command::Serve(_)) {
        None
    } else {
        let _enter = runtime.enter();
        match mushroom_backup::telemetry::init(
            &mushroom_backup::telemetry::TelemetryConfig::default(),
        ) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Store(cmd) => store::run(cmd).await,
            Command::Backup(args) => backup::run(args).await,
            Command::Restore(args) => inspect::restore(args).await,
            Command::Verify(args) => inspect::verify(args).await,
            Command::Promote(args) => standby::promote(args).await,
            Command::Ls(args) => inspect::ls(args).await,
            Command::Branch(args) => branch::run(args).await,
            Command::Retention(args) => retention::run(args).await,
            Command::Serve(args) => serve::run(*args).await,
            Command::Node(args) => node::run(args).await,
            Command::Ctl(args) => ctl::run(args).await,
            Command::Key(cmd) => encryption::key(cmd),
            Command::Rekey(args) => encryption::rekey(args).await,
        }
    });
    match result {
        Ok(code) => code,
        // The reader of stdout left (`… | head -1`): quiet, 141 (see `out.rs`).
        Err(e) if out::is_stdout_closed(&e) => ExitCode::from(out::STDOUT_CLOSED_EXIT),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A cancellation token cancelled by the first SIGINT or SIGTERM.
pub fn shutdown_token() -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let t = token.clone();
    on_signal(move || t.cancel());
    token
}

/// The token a command opens its destination with (`bucket::Open`): nothing cancels its
/// requests early. A signal ends a read-only command's process outright (a restore cut short
/// has renamed nothing into place), and `backup`, `retention` and `rekey` stop on their own
/// [`shutdown_token`] between steps, flushing or finishing the object in hand, which a bucket
/// cancelled by the same signal would break.
pub fn bucket_token() -> tokio_util::sync::CancellationToken {
    tokio_util::sync::CancellationToken::new()
}

/// Opens for writing a destination a command works on rather than creates (`rekey`,
/// `retention`): a read-only open proves it exists before anything (a lease) creates it.
pub async fn open_existing(url: &str) -> anyhow::Result<mushroom_backup::bucket::DynBucket> {
    use mushroom_backup::bucket::{Open, s3::Clients};
    // One S3 client for both opens: the AWS configuration is loaded once.
    let (clients, token) = (Clients::default(), bucket_token());
    Open::read_only(url, &token)
        .clients(&clients)
        .open()
        .await?;
    Ok(Open::read_write(url, &token)
        .clients(&clients)
        .open()
        .await?)
}

/// [`open_existing`] without its probe on S3, for a command whose own first request is a
/// read that fails as clearly (`branch`, which must cost a handful of requests): a `file://`
/// directory must exist (checked on the disk, no request), an `s3://` prefix is opened
/// without a LIST of its own.
pub async fn open_existing_unprobed(
    url: &str,
) -> anyhow::Result<mushroom_backup::bucket::DynBucket> {
    use mushroom_backup::bucket::{Open, s3::Clients};
    if !url.starts_with("s3://") {
        return open_existing(url).await;
    }
    Ok(Open::read_write(url, &bucket_token())
        .clients(&Clients::default())
        .open()
        .await?)
}

/// A flag set by the first SIGINT or SIGTERM, for a writer on the blocking pool to poll.
pub fn shutdown_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = flag.clone();
    on_signal(move || f.store(true, std::sync::atomic::Ordering::SeqCst));
    flag
}

/// Runs `f` at the first SIGINT or SIGTERM. The one task not spawned through a
/// [`TaskTracker`](tokio_util::task::TaskTracker): it lives as long as the process, holds
/// nothing, and no shutdown can wait for it (it is what starts one).
fn on_signal(f: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        f();
    });
}

/// At most this many glibc malloc arenas (unless `MALLOC_ARENA_MAX` says otherwise).
const MALLOC_ARENAS: i32 = 1;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`], before any thread starts. By default glibc
/// gives threads up to 8 arenas per core, each keeping the memory freed into it; the runtime's
/// workers and blocking threads then hold several half-empty heaps. Measured with the `fleet`
/// bench (10,000 idle stores, one watcher, docs/testing.md): the default arenas 559.1 MiB resident at
/// 3.13 % of a core; capped at two 511.7 MiB at 2.70 %; capped at one (this) 487.6 MiB at 4.10 %
/// (483.3 MiB, 4.20 % with `MALLOC_ARENA_MAX=1`). One arena trades about 1.4 % of a core of lock
/// waits among the threads for 24 MiB, which keeps both targets (< 5 %, < 512 MiB) with room.
/// Large buffers (segments, restore pieces) are mapped on their own above glibc's mmap
/// threshold and share no arena. An operator's `MALLOC_ARENA_MAX` wins: glibc read it at
/// start, and it is left alone.
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a parameter of the allocator; called before any thread
        // of ours exists. Its failure (0) leaves glibc's default, which only costs memory.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

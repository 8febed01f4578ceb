//! What a cell is set up with before any process starts: its buckets (a `file://` directory,
//! or a prefix of its own in a bucket on moto or SeaweedFS, with Object Lock for a write-once
//! cell) and its keys (a key file, or an age identity whose recipient the writer gets).
//!
//! The S3 buckets are shared by the cells of a run, one per server, layout and role (primary
//! or replica), each cell in a prefix of its own: `weed mini` has volumes for about 30
//! buckets (a bucket is a collection, each with volumes of its own; then "No writable volumes
//! and no free volumes left"), and the full matrix has 400 S3 cells. Cells run one after the
//! other and give their `serve`s instance ids of their own, so the shared lease root
//! (`.mushroom-backup/`) holds only dead instances' leases while a cell runs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::cells::{Cell, Encryption, Layout, Server};
use crate::support::binary;
use crate::support::dest::NO_S3;
use crate::support::s3_servers::S3Server;

/// One bucket of a cell, and the prefix `p` in it the store backs up to.
pub enum Bucket {
    /// `dir` is the bucket; the destination is `dir/p`, so the lease root
    /// (`dir/.mushroom-backup`) is inside what [`Bucket::listing`] reads.
    File(PathBuf),
    S3 {
        server: S3Server,
        name: String,
        /// The cell's own prefix in the shared bucket.
        cell: String,
    },
}

/// An object's identity as listed: its bytes (`file://`), or size, ETag and Last-Modified
/// (S3: a rewrite with the same bytes still changes Last-Modified).
pub type Listing = BTreeMap<String, String>;

impl Bucket {
    /// The bucket of `cell` in the role `role` (`primary` or `replica`): a fresh directory,
    /// or the prefix `tag` of the run's shared bucket of that server, layout and role.
    pub async fn of(
        cell: &Cell,
        server: Option<&S3Server>,
        base: &Path,
        role: &'static str,
        tag: &str,
    ) -> Bucket {
        match cell.server {
            Server::File => {
                let dir = base.join(format!("bucket-{role}"));
                std::fs::create_dir_all(&dir).unwrap();
                Bucket::File(dir)
            }
            Server::Moto | Server::SeaweedFs => {
                let server = server.expect("the cell's S3 server").clone();
                let locked = cell.layout == Layout::WriteOnce;
                let name = shared_bucket(&server, locked, role).await;
                Bucket::S3 {
                    server,
                    name,
                    cell: tag.to_string(),
                }
            }
        }
    }

    /// The destination URL of the store's prefix.
    pub fn url(&self) -> String {
        match self {
            Bucket::File(dir) => format!("file://{}/p", dir.display()),
            Bucket::S3 { name, cell, .. } => format!("s3://{name}/{cell}/p"),
        }
    }

    /// The S3 endpoint a process reaching this bucket is given.
    pub fn endpoint(&self) -> &str {
        match self {
            Bucket::File(_) => NO_S3,
            Bucket::S3 { server, .. } => &server.endpoint,
        }
    }

    /// Every object of the cell: of its directory (lease root included), or of its prefix
    /// and the shared bucket's lease root.
    pub async fn listing(&self) -> Listing {
        let mut out = Listing::new();
        match self {
            Bucket::File(dir) => {
                let mut files = Vec::new();
                crate::support::dest::files(dir, dir, &mut files);
                for (k, bytes) in files {
                    out.insert(k, format!("{bytes:?}"));
                }
            }
            Bucket::S3 { server, name, cell } => {
                for prefix in [format!("{cell}/"), ".mushroom-backup/".to_string()] {
                    list_into(server, name, &prefix, &mut out).await;
                }
            }
        }
        out
    }
}

/// Every object of `bucket` under `prefix` into `out`.
async fn list_into(server: &S3Server, name: &str, prefix: &str, out: &mut Listing) {
    let client = server.client();
    let mut token = None;
    loop {
        let page = client
            .list_objects_v2()
            .bucket(name)
            .prefix(prefix)
            .set_continuation_token(token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("list {name}: {e:?}"));
        for o in page.contents() {
            out.insert(
                o.key().unwrap_or_default().to_string(),
                format!(
                    "{:?} {:?} {:?}",
                    o.size(),
                    o.e_tag(),
                    o.last_modified().map(|t| t.to_string())
                ),
            );
        }
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
}

/// The run's bucket on `server` for `role`, with Object Lock when `locked`: created by the
/// first cell that asks.
async fn shared_bucket(server: &S3Server, locked: bool, role: &'static str) -> String {
    type Shared = HashMap<(String, bool, &'static str), String>;
    static SHARED: OnceLock<tokio::sync::Mutex<Shared>> = OnceLock::new();
    let mut shared = SHARED.get_or_init(Default::default).lock().await;
    let key = (server.endpoint.clone(), locked, role);
    if let Some(name) = shared.get(&key) {
        return name.clone();
    }
    let name = if locked {
        crate::support::s3::create_locked_bucket(&server.client(), &format!("wo-{role}")).await
    } else {
        server.create_bucket(&format!("matrix-{role}")).await
    };
    shared.insert(key, name.clone());
    name
}

/// A cell's keys, as each process is given them.
pub struct Keys {
    /// For the primary `serve` and any other writer: a key file, or the age recipient alone.
    pub writer: Vec<String>,
    /// For the standby's `serve`, which reads the prefix and, once promoted, writes it.
    pub standby: Vec<String>,
    /// For `restore` and `verify`.
    pub reader: Vec<String>,
}

impl Keys {
    /// New keys for `enc` in `dir`.
    pub fn new(enc: Encryption, dir: &Path) -> Keys {
        match enc {
            Encryption::Plain => Keys {
                writer: vec![],
                standby: vec![],
                reader: vec![],
            },
            Encryption::KeyFile => {
                let path = secret(dir, "k.key", &["key", "new"]);
                let flag = vec!["--encryption-key-file".to_string(), path];
                Keys {
                    writer: flag.clone(),
                    standby: flag.clone(),
                    reader: flag,
                }
            }
            Encryption::Age => {
                let identity = secret(dir, "id.age", &["key", "new", "--age"]);
                let mut cmd = binary::command(NO_S3);
                cmd.args(["key", "recipient", "--identity-file", &identity]);
                let recipient = binary::run_ok("key recipient", cmd, DEADLINE)
                    .trim()
                    .to_string();
                let to = vec!["--encryption-recipient".to_string(), recipient];
                let id = vec!["--encryption-identity-file".to_string(), identity];
                Keys {
                    writer: to.clone(),
                    standby: [to, id.clone()].concat(),
                    reader: id,
                }
            }
        }
    }
}

const DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// What `args` prints, written 0600 into `dir/name`: its path.
fn secret(dir: &Path, name: &str, args: &[&str]) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let mut cmd: Command = binary::command(NO_S3);
    cmd.args(args);
    let out = binary::run_ok(name, cmd, DEADLINE);
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

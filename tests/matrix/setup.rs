//! What a cell is set up with before any process starts: its buckets (a `file://` directory,
//! or a fresh bucket on moto or SeaweedFS, with Object Lock for a write-once cell) and its
//! keys (a key file, or an age identity whose recipient the writer gets).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    },
}

/// An object's identity as listed: its bytes (`file://`), or size, ETag and Last-Modified
/// (S3: a rewrite with the same bytes still changes Last-Modified).
pub type Listing = BTreeMap<String, String>;

impl Bucket {
    /// A fresh bucket for `cell` (`hint` tells its buckets apart).
    pub async fn fresh(cell: &Cell, server: Option<&S3Server>, base: &Path, hint: &str) -> Bucket {
        match cell.server {
            Server::File => {
                let dir = base.join(format!("bucket-{hint}"));
                std::fs::create_dir_all(&dir).unwrap();
                Bucket::File(dir)
            }
            Server::Moto | Server::SeaweedFs => {
                let server = server.expect("the cell's S3 server").clone();
                let name = if cell.layout == Layout::WriteOnce {
                    locked_bucket(&server, hint).await
                } else {
                    server.create_bucket(&format!("matrix-{hint}")).await
                };
                Bucket::S3 { server, name }
            }
        }
    }

    /// The destination URL of the store's prefix.
    pub fn url(&self) -> String {
        match self {
            Bucket::File(dir) => format!("file://{}/p", dir.display()),
            Bucket::S3 { name, .. } => format!("s3://{name}/p"),
        }
    }

    /// The S3 endpoint a process reaching this bucket is given.
    pub fn endpoint(&self) -> &str {
        match self {
            Bucket::File(_) => NO_S3,
            Bucket::S3 { server, .. } => &server.endpoint,
        }
    }

    /// Every object of the whole bucket (lease root included).
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
            Bucket::S3 { server, name } => {
                let client = server.client();
                let mut token = None;
                loop {
                    let page = client
                        .list_objects_v2()
                        .bucket(name)
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
        }
        out
    }
}

/// A fresh bucket with Object Lock enabled (and so versioning); its name.
async fn locked_bucket(server: &S3Server, hint: &str) -> String {
    let name = format!(
        "t-wo-{hint}-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    server
        .client()
        .create_bucket()
        .bucket(&name)
        .object_lock_enabled_for_bucket(true)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {name} with Object Lock: {e:?}"));
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

//! Where an end-to-end test's backups go: a `file://` directory, and a fresh bucket on the
//! test S3 endpoint (moto) when there is one; and what each destination holds, read back
//! without the binary under test.

use std::path::{Path, PathBuf};

use aws_sdk_s3::types::Object;

/// The endpoint of a command that needs no S3.
pub const NO_S3: &str = "http://unused.invalid";

/// One destination of a test's backups.
pub enum Dest {
    File(PathBuf),
    S3 { endpoint: String, bucket: String },
}

impl Dest {
    /// The `--to`/`--from` URL (an S3 destination's prefix is `p`).
    pub fn url(&self) -> String {
        match self {
            Dest::File(p) => format!("file://{}", p.display()),
            Dest::S3 { bucket, .. } => format!("s3://{bucket}/p"),
        }
    }

    /// The S3 endpoint a command writing or reading the destination is given.
    pub fn endpoint(&self) -> &str {
        match self {
            Dest::File(_) => NO_S3,
            Dest::S3 { endpoint, .. } => endpoint,
        }
    }

    /// Every object's key and bytes.
    pub fn objects(&self) -> Vec<(String, Vec<u8>)> {
        match self {
            Dest::File(p) => {
                let mut out = Vec::new();
                if p.exists() {
                    files(p, p, &mut out);
                }
                out
            }
            Dest::S3 { endpoint, bucket } => {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async {
                    let client = super::s3::client(endpoint);
                    let mut out = Vec::new();
                    for o in listed(&client, bucket).await {
                        let key = o.key().unwrap().to_string();
                        let got = client.get_object().bucket(bucket).key(&key).send();
                        let body = got.await.unwrap().body.collect().await.unwrap();
                        out.push((key, body.into_bytes().to_vec()));
                    }
                    out
                })
            }
        }
    }

    /// Bytes of every object.
    pub fn bytes(&self) -> u64 {
        match self {
            Dest::File(p) => {
                let mut out = Vec::new();
                files(p, p, &mut out);
                out.iter().map(|(_, b)| b.len() as u64).sum()
            }
            Dest::S3 { endpoint, bucket } => {
                let rt = tokio::runtime::Runtime::new().unwrap();
                let client = super::s3::client(endpoint);
                let objects = rt.block_on(listed(&client, bucket));
                objects.iter().map(|o| o.size().unwrap_or(0) as u64).sum()
            }
        }
    }
}

/// Every object of `bucket`, page after page.
async fn listed(client: &aws_sdk_s3::Client, bucket: &str) -> Vec<Object> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = client
            .list_objects_v2()
            .bucket(bucket)
            .set_continuation_token(token)
            .send()
            .await
            .unwrap();
        out.extend(page.contents().iter().cloned());
        token = page.next_continuation_token().map(str::to_string);
        if token.is_none() {
            return out;
        }
    }
}

/// Every file under `dir` (recursively): its path relative to `root`, and its bytes.
pub fn files(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(root, &p, out);
        } else {
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            out.push((rel, std::fs::read(&p).unwrap()));
        }
    }
}

/// The test's destinations: `t/<name>-bucket`, and a fresh S3 bucket named after `name` when
/// there is an S3 endpoint (see [`super::s3::endpoint`]).
pub fn destinations(t: &Path, name: &str) -> Vec<Dest> {
    let mut d = vec![Dest::File(t.join(format!("{name}-bucket")))];
    if let Some(endpoint) = super::s3::endpoint() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let bucket = rt.block_on(super::s3::create_bucket(&endpoint, name));
        d.push(Dest::S3 { endpoint, bucket });
    }
    d
}

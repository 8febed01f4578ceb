//! What only a strict S3 server can show, run on SeaweedFS (named `…_seaweedfs_only`: moto, as
//! the tests run it, stores a body whose CRC is wrong and accepts any credentials, so each of
//! these would fail there):
//! - a file body corrupted on the wire, after our own CRC check of the file passed, is refused
//!   by the server's check of `x-amz-checksum-crc32` (`400 BadDigest`), leaves no object, and
//!   is reported as a permanent failure naming the key;
//! - a wrong access key or secret is answered `403` and reported as
//!   [`BucketError::AccessDenied`], by the library and in the binary's one error line.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::{Body, Bucket, BucketError, PutCondition};
use support::s3_servers::S3Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The byte of the first `PUT`'s body, counted from the body's start, that [`CorruptingProxy`]
/// flips.
const FLIPPED_AT: usize = 100_000;

/// A TCP proxy in front of an S3 endpoint that flips one bit of the body of the first `PUT`
/// it forwards (byte [`FLIPPED_AT`]) and passes every other byte as it is: a corruption on the
/// wire, which only the server's check of the request's checksum can catch.
struct CorruptingProxy {
    url: String,
    flipped: Arc<AtomicUsize>,
}

impl CorruptingProxy {
    async fn start(upstream: &str) -> CorruptingProxy {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let flipped = Arc::new(AtomicUsize::new(0));
        let count = flipped.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.unwrap();
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                });
                let count = count.clone();
                tokio::spawn(async move {
                    // Bytes seen of this connection's first request, until the flip is done.
                    let mut seen: Vec<u8> = Vec::new();
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match client_rx.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let chunk = &mut buf[..n];
                        if count.load(Ordering::SeqCst) == 0 {
                            let start = seen.len();
                            seen.extend_from_slice(chunk);
                            if seen.starts_with(b"PUT ")
                                && let Some(head) = seen.windows(4).position(|w| w == b"\r\n\r\n")
                            {
                                let at = head + 4 + FLIPPED_AT;
                                if (start..start + n).contains(&at) {
                                    chunk[at - start] ^= 0x01;
                                    count.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                        }
                        if server_tx.write_all(chunk).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        CorruptingProxy { url, flipped }
    }
}

/// A body that is the whole of a fresh temp file of `len` bytes, given with its CRC-32.
fn checked_file_body(len: usize) -> (Body, Vec<u8>) {
    let content: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31)).collect();
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(&content).unwrap();
    let body = Body::File {
        file: Arc::new(file),
        offset: 0,
        len: len as u64,
        crc32: Some(crc32fast::hash(&content)),
    };
    (body, content)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_corrupted_on_the_wire_is_refused_by_the_servers_crc_check_seaweedfs_only() {
    let Some(server) = S3Server::seaweedfs() else {
        return;
    };
    let name = server.create_bucket("crc").await;
    let proxy = CorruptingProxy::start(&server.endpoint).await;
    let through_proxy = S3Bucket::new(
        support::s3::client(&proxy.url),
        &name,
        "root",
        S3Options::default(),
    )
    .endpoint_named(&proxy.url);
    let direct = S3Bucket::new(server.client(), &name, "root", S3Options::default())
        .endpoint_named(&server.endpoint);

    let (body, content) = checked_file_body(300_000);
    let refused = through_proxy
        .put("corrupted", body.clone(), PutCondition::IfNoneMatch)
        .await;
    assert_eq!(
        proxy.flipped.load(Ordering::SeqCst),
        1,
        "no bit was flipped"
    );
    match &refused {
        Err(BucketError::Permanent { key, message, .. }) => {
            assert_eq!(key, "corrupted");
            assert!(message.contains("BadDigest"), "{message}");
            assert!(message.contains("HTTP 400"), "{message}");
        }
        other => panic!("a corrupted body was not refused as such: {other:?}"),
    }
    assert!(
        direct.head("corrupted").await.unwrap().is_none(),
        "the corrupted body was stored"
    );

    // The same body, uncorrupted (the proxy flips only once), is stored as it is.
    through_proxy
        .put("corrupted", body, PutCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(proxy.flipped.load(Ordering::SeqCst), 1);
    assert!(direct.get("corrupted").await.unwrap().data[..] == content[..]);
}

/// A client of `endpoint` signing with the given key and secret.
fn client_with(endpoint: &str, key: &str, secret: &str) -> aws_sdk_s3::Client {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, secret, None, None, "tests"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_answered_403_and_reported_as_access_denied_seaweedfs_only() {
    let Some(server) = S3Server::seaweedfs() else {
        return;
    };
    let name = server.create_bucket("creds").await;
    for (key, secret, code) in [
        ("wrong", "test", "InvalidAccessKeyId"),
        ("test", "wrong", "SignatureDoesNotMatch"),
    ] {
        let b = S3Bucket::new(
            client_with(&server.endpoint, key, secret),
            &name,
            "root",
            S3Options::default(),
        )
        .endpoint_named(&server.endpoint);
        for (op, r) in [
            ("head", b.head("k").await.map(|_| ())),
            ("get", b.get("k").await.map(|_| ())),
            (
                "put",
                b.put("k", Body::from(b"x".to_vec()), PutCondition::None)
                    .await
                    .map(|_| ()),
            ),
            (
                "list",
                b.list(mushroom_backup::bucket::ListQuery::new("", None, 10))
                    .await
                    .map(|_| ()),
            ),
        ] {
            let e = match r {
                Err(e @ BucketError::AccessDenied { .. }) => e,
                other => panic!("{op} with key {key:?}, secret {secret:?}: {other:?}"),
            };
            let said = e.to_string();
            assert!(
                said.starts_with(&format!(
                    "access denied to s3://{name}/root (check the credentials for {})",
                    server.endpoint
                )),
                "{op}: {said}"
            );
            // A HEAD's 403 has no body, so no code: the status says it.
            assert!(said.contains("HTTP 403"), "{op}: {said}");
            if op != "head" {
                assert!(said.contains(code), "{op}: {said}");
            }
        }
    }

    // The binary says it in one error line, with the server's code.
    let o = support::binary::command(&server.endpoint)
        .args(["ls", "--from", &format!("s3://{name}/p")])
        .env("AWS_ACCESS_KEY_ID", "wrong")
        .output()
        .expect("run mushroom-backup");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains(&format!(
            "access denied to s3://{name}/p (check the credentials for {})",
            server.endpoint
        )) && errors[0].contains("InvalidAccessKeyId"),
        "{err}"
    );
}

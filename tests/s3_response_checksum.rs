//! `Bucket::get_buffers` on S3 turns the SDK's response checksum validation off for its own
//! request only: restore checks those bytes against the manifest's CRC itself, but every other
//! GET of the same client must still have the SDK validate what S3 sends.
//!
//! Real moto behind a small HTTP proxy that flips one byte of every GET response body for one
//! object (the `x-amz-checksum-crc32` header moto sends with it is left as it is): a validated
//! GET of that object must fail, `get_buffers` must hand the flipped bytes over as they came,
//! and a `get` after it must fail again.

mod support;

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::{Body, Bucket, GET_MAX, Part, PutCondition};
use support::fault_proxy::{self, BoxError};
use tokio::net::TcpListener;

/// The object whose GET responses the proxy corrupts.
const FLIPPED: &str = "flipped.bin";

/// Forwards one request to `upstream`; flips the middle byte of a GET response of [`FLIPPED`].
async fn forward(
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let corrupt = parts.method == Method::GET && parts.uri.path().ends_with(FLIPPED);
    let answer = fault_proxy::forward(upstream, parts, body).await?;
    let (parts, body) = answer.into_parts();
    let mut body = body.collect().await?.to_bytes().to_vec();
    if corrupt && !body.is_empty() {
        let mid = body.len() / 2;
        body[mid] ^= 0x01;
    }
    Ok(Response::from_parts(parts, Full::new(Bytes::from(body))))
}

/// Starts the proxy on the test's runtime; returns its URL.
async fn start_proxy(upstream: &str) -> String {
    let upstream: SocketAddr = url::Url::parse(upstream)
        .unwrap()
        .socket_addrs(|| Some(80))
        .unwrap()[0];
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = service_fn(move |req| forward(upstream, req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn get_buffers_skips_the_sdk_checksum_for_its_own_request_only() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let name = support::s3::create_bucket(&endpoint, "response-checksum").await;
    let proxy = start_proxy(&endpoint).await;
    let b = S3Bucket::new(
        support::s3::client(&proxy),
        &name,
        "root",
        S3Options::default(),
    )
    .endpoint_named(&proxy);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    b.put(
        FLIPPED,
        Body::from(Bytes::from(data.clone())),
        PutCondition::IfNoneMatch,
    )
    .await
    .unwrap();

    let first = b.get(FLIPPED).await;
    assert!(
        first.is_err(),
        "a validated GET took a corrupted response (moto sent no checksum, or the SDK did not \
         check it): the test cannot tell anything"
    );

    let bufs = b
        .get_buffers(FLIPPED, Part::Whole { at_most: GET_MAX })
        .await
        .unwrap();
    let got: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(got.len(), data.len());
    let differ: Vec<usize> = (0..data.len()).filter(|&i| got[i] != data[i]).collect();
    assert_eq!(
        differ,
        vec![data.len() / 2],
        "get_buffers hands the bytes over as they came, unvalidated"
    );

    let again = b.get(FLIPPED).await;
    assert!(
        again.is_err(),
        "a GET after get_buffers on the same client took a corrupted response: the override \
         leaked into the client"
    );
    // An object the proxy leaves alone still reads back whole through the same client.
    b.put(
        "intact.bin",
        Body::from(Bytes::from(data.clone())),
        PutCondition::IfNoneMatch,
    )
    .await
    .unwrap();
    assert_eq!(b.get("intact.bin").await.unwrap().data, Bytes::from(data));
}

//! Request bodies paced as they are sent ([`crate::bucket::throttle`]): [`Paced`] holds each
//! piece of the body it wraps until the request's [`Pacer`] lets it go, so a limit holds inside
//! one large object (a `PutObject`, each `UploadPart`), at the socket, whichever task (an HTTP
//! connection's) polls the body. [`Pieces`] is bytes in memory cut into pieces to pace.
//!
//! Nothing is held but the piece waiting; a request dropped drops its wait.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder;
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::bucket::throttle::Pacer;

/// Bytes cut at a time from a body in memory: as a file body reads them.
const PIECE: usize = 256 << 10;

/// `data` as a request body: paced as it is sent when the request is limited, longer than a
/// piece, and may carry its CRC-32 as its checksum (a streamed body is unsigned: the checksum
/// is what protects it, as for a file body); else in one buffer, paced when the request ends.
pub(super) fn byte_stream(data: Bytes, pacer: Option<Pacer>, checksums: bool) -> ByteStream {
    match pacer.filter(|p| checksums && data.len() > PIECE && p.limited()) {
        Some(p) => ByteStream::new(SdkBody::retryable(move || {
            SdkBody::from_body_1_x(Paced::new(Pieces(data.clone()), p.clone()))
        })),
        None => ByteStream::from(data),
    }
}

/// A `PutObject` of `data` ([`byte_stream`]), with its length and CRC-32 when it is streamed.
pub(super) fn body(
    req: PutObjectFluentBuilder,
    data: Bytes,
    pacer: Option<Pacer>,
    checksums: bool,
) -> PutObjectFluentBuilder {
    let streamed = checksums && data.len() > PIECE && pacer.as_ref().is_some_and(Pacer::limited);
    if !streamed {
        return req.body(ByteStream::from(data));
    }
    let crc = crc32fast::hash(&data);
    req.content_length(crate::units::i64_of(data.len() as u64))
        .checksum_crc32(aws_smithy_types::base64::encode(crc.to_be_bytes()))
        .body(byte_stream(data, pacer, checksums))
}

/// The timeouts of a request moving `len` bytes when `pacer` limits it: the client's own
/// (`options`) with the pacer's patience added to the read and the attempt timeouts, so that a
/// request slowed by its limit is not cut as a stalled one. `None`: the client's, unchanged.
pub(super) fn timeouts(
    options: &super::S3Options,
    pacer: Option<&Pacer>,
    len: u64,
) -> Option<aws_sdk_s3::config::Builder> {
    let more = pacer?.patience(len)?;
    let t = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
        .connect_timeout(options.connect_timeout)
        .read_timeout(options.read_timeout + more)
        .operation_attempt_timeout(options.attempt_timeout + more)
        .build();
    Some(aws_sdk_s3::config::Builder::default().timeout_config(t))
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// `inner`, each data frame sent once the pacer let it go.
pub(super) struct Paced<B> {
    inner: B,
    pacer: Pacer,
    waiting: Option<(Bytes, Wait)>,
}

impl<B> Paced<B> {
    pub(super) fn new(inner: B, pacer: Pacer) -> Paced<B> {
        Paced {
            inner,
            pacer,
            waiting: None,
        }
    }
}

impl<B> http_body::Body for Paced<B>
where
    B: http_body::Body<Data = Bytes, Error = io::Error> + Unpin,
{
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some((_, wait)) = &mut this.waiting {
                ready!(wait.as_mut().poll(cx));
                let (piece, _) = this.waiting.take().expect("waiting above");
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(piece) => {
                        let pacer = this.pacer.clone();
                        let n = piece.len() as u64;
                        this.waiting = Some((piece, Box::pin(async move { pacer.bytes(n).await })));
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.waiting.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.waiting.as_ref().map_or(0, |(p, _)| p.len() as u64);
        let inner = self.inner.size_hint();
        match inner.exact() {
            Some(n) => SizeHint::with_exact(n + held),
            None => {
                let mut h = SizeHint::new();
                h.set_lower(inner.lower() + held);
                h
            }
        }
    }
}

/// Bytes in memory as a body of [`PIECE`]-sized frames.
pub(super) struct Pieces(pub(super) Bytes);

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if this.0.is_empty() {
            return Poll::Ready(None);
        }
        let n = PIECE.min(this.0.len());
        Poll::Ready(Some(Ok(Frame::data(this.0.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.len() as u64)
    }
}

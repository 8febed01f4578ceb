//! The protobuf codec of the service: tonic's prost codec, except that a request that does not
//! decode (a string field that is not UTF-8, a truncated message) is `INVALID_ARGUMENT` — the
//! client sent bad input — rather than tonic's default `INTERNAL` (the status is built in
//! `error.rs`, [`malformed_request`](crate::service::edge::error::malformed_request)).

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with decode errors as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct StrictCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder {
            inner: self.inner.decoder(),
        }
    }
}

/// Decodes like [`ProstDecoder`], answering `INVALID_ARGUMENT` for bytes that do not decode.
#[derive(Debug, Clone, Default)]
pub struct StrictDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: prost::Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner
            .decode(buf)
            .map_err(|s| crate::service::edge::error::malformed_request(&s))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

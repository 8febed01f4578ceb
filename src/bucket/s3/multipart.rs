//! Multipart uploads: how a body larger than a part goes up, still all or nothing.
//!
//! `CreateMultipartUpload`, then the parts (each read from the [`Body`] when its turn comes,
//! at most [`S3Options::upload_concurrency`](super::S3Options) in flight), then
//! `CompleteMultipartUpload` carrying the write's condition. Only the completion makes an object
//! visible, so only its failure is indeterminate; any failure aborts the upload, and so does
//! dropping the future (the abort is then spawned). A process that dies mid-upload leaves an
//! incomplete upload: invisible, billed until the bucket's lifecycle rule aborts it.
//!
//! A condition that already fails is refused before any part goes up (a HEAD first).
//!
//! With checksums on (the default), the upload is created with CRC32, every part carries its
//! CRC32, and the completion lists them, as S3 requires of uploads created with a checksum.
//! The parts' CRCs are computed here, as each part is read, and sent as the parts' checksums
//! (so the SDK does not hash them again). A body given with its CRC-32 ([`Body`]'s `crc32`) is
//! completed only if the parts' CRCs, combined in order, are that CRC: a file that changed after
//! its check is aborted, never visible.
//!
//! A part sent with its CRC-32 is sent with an unsigned payload (`UNSIGNED-PAYLOAD`): the CRC
//! header is signed and the store refuses a body that does not match it, as for a file body
//! of one `PutObject` (streamed, so never hashed by the SDK) and for every part under a
//! throttle limit (streamed too). The SHA-256 of every byte was over a third of a backup's CPU
//! (perf, 1 GiB to SeaweedFS). Against an on-path attacker the payload hash never was the
//! protection: over plain HTTP the responses a restore reads are not signed at all, so the
//! answer is TLS (and a sealed store's AEAD, which authenticates every object). With checksums
//! sent only when required, nothing else covers the body and the payload stays signed.

use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use futures::{StreamExt, TryStreamExt};

use super::{S3Bucket, etag_of, map_error, map_put_error};
use crate::bucket::body::{check_crc32, with_key};
use crate::bucket::{Body, Bucket, BucketError, PutCondition};

/// S3's limit on the parts of one upload.
const MAX_PARTS: u64 = 10_000;

/// Writes `body` to `key` under `cond` as a multipart upload; returns the object's ETag.
pub(super) async fn put(
    b: &S3Bucket,
    key: &str,
    body: &Body,
    cond: &PutCondition,
    retain: Option<crate::bucket::write_once::Retention>,
) -> Result<String, BucketError> {
    let part_size = b.options.part_size;
    let parts = body.len().div_ceil(part_size);
    if parts > MAX_PARTS {
        return Err(BucketError::Permanent {
            op: "put",
            key: key.to_string(),
            message: format!(
                "{} bytes need more than {MAX_PARTS} parts of {part_size}",
                body.len()
            ),
        });
    }
    check_early(b, key, cond).await?;
    let full_key = b.full_key(key);
    let checksums = !b.options.checksums_when_required;
    let mut create = b
        .client
        .create_multipart_upload()
        .bucket(&b.bucket)
        .key(&full_key);
    if checksums {
        create = create.checksum_algorithm(ChecksumAlgorithm::Crc32);
    }
    if let Some(r) = retain {
        let (mode, until) = super::lock_fields(r);
        create = create
            .object_lock_mode(mode)
            .object_lock_retain_until_date(until);
    }
    // An upload that is never completed is never visible: a failure here is determinate.
    let created = create
        .send()
        .await
        .map_err(|e| map_error(b, "S3 CreateMultipartUpload", key, false, e))?;
    let upload_id = created
        .upload_id()
        .ok_or_else(|| BucketError::Permanent {
            op: "put",
            key: key.to_string(),
            message: "CreateMultipartUpload answered without an upload id".into(),
        })?
        .to_string();
    let mut upload = Upload {
        s3: b.clone(),
        full_key,
        upload_id: Some(upload_id),
    };
    let result = upload.run(b, key, body, cond, parts, checksums).await;
    match result {
        Ok(etag) => {
            upload.upload_id = None;
            Ok(etag)
        }
        Err(e) => {
            upload.abort().await;
            Err(e)
        }
    }
}

/// Fails before any part is uploaded when the condition already fails (a large body is not
/// sent in vain). The completion still carries the condition: that is the atomic check. (moto
/// 5.2.5 ignores `If-Match` on `CompleteMultipartUpload`, so there only this check holds.)
async fn check_early(b: &S3Bucket, key: &str, cond: &PutCondition) -> Result<(), BucketError> {
    let holds = match cond {
        PutCondition::None => return Ok(()),
        PutCondition::IfNoneMatch => b.head(key).await?.is_none(),
        PutCondition::IfMatch(etag) => b.head(key).await?.is_some_and(|m| m.etag == *etag),
    };
    match holds {
        true => Ok(()),
        false => Err(BucketError::PreconditionFailed {
            key: key.to_string(),
        }),
    }
}

/// A multipart upload in progress; aborted when dropped unless completed.
struct Upload {
    s3: S3Bucket,
    full_key: String,
    /// `None` once completed or aborted.
    upload_id: Option<String>,
}

impl Upload {
    fn id(&self) -> &str {
        self.upload_id.as_deref().unwrap_or_default()
    }

    async fn run(
        &self,
        b: &S3Bucket,
        key: &str,
        body: &Body,
        cond: &PutCondition,
        parts: u64,
        checksums: bool,
    ) -> Result<String, BucketError> {
        let part_size = b.options.part_size;
        let pacer = crate::bucket::throttle::Pacer::current();
        let pacer = &pacer;
        let sent: Vec<(CompletedPart, crc32fast::Hasher)> = futures::stream::iter(0..parts)
            .map(|i| async move {
                let at = i * part_size;
                let data = body
                    .read(at, part_size.min(body.len() - at))
                    .await
                    .map_err(|e| with_key(e, key))?;
                let mut crc = crc32fast::Hasher::new();
                crc.update(&data);
                // S3 refuses a part number past 10,000 itself; no number wraps on the way there.
                let number = i32::try_from(i + 1).unwrap_or(i32::MAX);
                let mut req = self
                    .s3
                    .client
                    .upload_part()
                    .bucket(&self.s3.bucket)
                    .key(&self.full_key)
                    .upload_id(self.id())
                    .part_number(number);
                if checksums {
                    let value =
                        aws_smithy_types::base64::encode(crc.clone().finalize().to_be_bytes());
                    req = req
                        .checksum_algorithm(ChecksumAlgorithm::Crc32)
                        .checksum_crc32(value);
                }
                let longer = super::paced::timeouts(&b.options, pacer.as_ref(), data.len() as u64);
                let mut req = req
                    .body(super::paced::byte_stream(data, pacer.clone(), checksums))
                    .customize();
                if checksums {
                    // The part's CRC-32 is in a signed header and the store checks the body
                    // against it: the payload is not hashed again (see the module docs).
                    req = req.disable_payload_signing();
                }
                let sent = match longer {
                    Some(longer) => req.config_override(longer).send().await,
                    None => req.send().await,
                };
                let out = sent.map_err(|e| map_error(b, "S3 UploadPart", key, false, e))?;
                let part = CompletedPart::builder()
                    .part_number(number)
                    .e_tag(etag_of(out.e_tag(), "put", key)?)
                    .set_checksum_crc32(out.checksum_crc32().map(str::to_string))
                    .build();
                Ok::<_, BucketError>((part, crc))
            })
            .buffered(b.options.upload_concurrency)
            .try_collect()
            .await?;
        let mut whole = crc32fast::Hasher::new();
        let mut completed = Vec::with_capacity(sent.len());
        for (part, crc) in sent {
            whole.combine(&crc);
            completed.push(part);
        }
        if let Some(stated) = body.stated_crc32() {
            check_crc32(stated, whole.finalize()).map_err(|why| BucketError::Permanent {
                op: "put",
                key: key.to_string(),
                message: format!("reading the body: {why}"),
            })?;
        }
        let mut complete = self
            .s3
            .client
            .complete_multipart_upload()
            .bucket(&self.s3.bucket)
            .key(&self.full_key)
            .upload_id(self.id())
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(completed))
                    .build(),
            );
        complete = match cond {
            PutCondition::None => complete,
            PutCondition::IfNoneMatch => complete.if_none_match("*"),
            PutCondition::IfMatch(etag) => complete.if_match(etag),
        };
        let out = complete
            .send()
            .await
            .map_err(|e| map_put_error(b, "S3 CompleteMultipartUpload", key, cond, e))?;
        etag_of(out.e_tag(), "put", key)
    }

    /// Aborts the upload (best effort: the lifecycle rule is the backstop).
    async fn abort(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        abort(&self.s3, &self.full_key, &upload_id).await;
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        let Some(upload_id) = self.upload_id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (s3, full_key) = (self.s3.clone(), self.full_key.clone());
        runtime.spawn(async move { abort(&s3, &full_key, &upload_id).await });
    }
}

async fn abort(s3: &S3Bucket, full_key: &str, upload_id: &str) {
    let sent = s3
        .client
        .abort_multipart_upload()
        .bucket(&s3.bucket)
        .key(full_key)
        .upload_id(upload_id)
        .send()
        .await;
    if let Err(e) = sent {
        let e = map_error(s3, "S3 AbortMultipartUpload", full_key, true, e);
        tracing::warn!(
            bucket = s3.bucket,
            key = full_key,
            "cannot abort a multipart upload (the lifecycle rule will): {e}"
        );
    }
}

//! Writing one object's bytes: a new temp file (created, not followed, with the bucket's file
//! mode), fsynced, its ETag cached; then renamed into place by the caller.

#[allow(unused_imports)]
use super::*;

/// Why writing a temp file failed: the body could not be read, or the temp file not written.
pub(super) enum WriteError {
    Body(io::Error),
    Temp(io::Error),
}

/// Writes `body` to the new file `tmp` (created, not followed, with the file mode), fsyncs it
/// and caches its ETag; returns the ETag.
pub(super) fn write_file(tmp: &Temp, body: &Body, modes: &FileModes) -> Result<String, WriteError> {
    let mut file = File::from(
        rustix::fs::openat(
            &tmp.dir,
            tmp.name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(modes.file),
        )
        .map_err(|e| WriteError::Temp(e.into()))?,
    );
    modes.set_file(&file).map_err(WriteError::Temp)?;
    let mut hasher = Sha256::new();
    match body {
        Body::Bytes(bytes) => {
            hasher.update(bytes);
            file.write_all(bytes).map_err(WriteError::Temp)?;
        }
        Body::File {
            file: source,
            offset,
            len,
            crc32,
        } => {
            let mut buf = vec![0u8; crate::units::usize_of(CHUNK.min(*len))];
            let mut crc = crc32fast::Hasher::new();
            let mut done = 0;
            while done < *len {
                let n = crate::units::usize_of(CHUNK.min(len - done));
                source
                    .read_exact_at(&mut buf[..n], offset + done)
                    .map_err(WriteError::Body)?;
                hasher.update(&buf[..n]);
                if crc32.is_some() {
                    crc.update(&buf[..n]);
                }
                file.write_all(&buf[..n]).map_err(WriteError::Temp)?;
                done += n as u64;
            }
            // Checked before the fsync and the rename: a changed file leaves no object.
            if let Some(stated) = crc32 {
                check_crc32(*stated, crc.finalize())
                    .map_err(|m| WriteError::Body(io::Error::new(io::ErrorKind::InvalidData, m)))?;
            }
        }
    }
    file.sync_all().map_err(WriteError::Temp)?;
    let etag = etag_of_digest(hasher.finalize().into());
    cache_etag(&file, body.len(), &etag);
    Ok(etag)
}

//! The download of a restore's layout into its temporary directory: every object fetched
//! (length and CRC checked), each file read back with the format's reader and fsynced as soon
//! as its last piece is written.

#[allow(unused_imports)]
use super::*;

/// What [`download`] leaves: every file written and fsynced, and what the format's reader
/// found in each, in the order of [`Layout::files`].
pub(crate) struct Downloaded {
    pub(super) checks: Vec<FileCheck>,
}

/// Downloads every piece of `layout` into `dir` with at most `parallelism` requests in flight,
/// checking each object's length and CRC. Each file is read back with the format's reader
/// ([`check_file`]) and fsynced as soon as its last piece is written, on the blocking pool
/// while the other downloads go on (at most [`FSYNCS_IN_FLIGHT`] fsyncs at once); a file that
/// does not read back, or cannot be fsynced, fails the restore at once.
pub(crate) async fn download(
    bucket: &dyn Bucket,
    dir: &Path,
    layout: &Layout,
    cached: &HashMap<String, Bytes>,
    parallelism: usize,
    progress: &ProgressBar,
) -> Result<Downloaded, RestoreError> {
    let root = dir.to_path_buf();
    let rels = layout.files.clone();
    let has_archives = layout.has_archives;
    let files: Vec<Arc<File>> = blocking(move || {
        if has_archives {
            create_private_dir(&root.join(ARCHIVE_DIR))?;
        }
        rels.iter()
            .map(|rel| {
                let p = root.join(rel);
                // Readable too: a decoding that runs ahead of its reader reads back what
                // it wrote (`super::decode`, "Memory").
                create_private_file(&p).map(Arc::new).map_err(io(&p))
            })
            .collect()
    })
    .await?;

    let mut chunks = Vec::new();
    for (p, piece) in layout.pieces.iter().enumerate() {
        // One job for an encoded piece (ranges fetched and decoded in order: `decode_piece`),
        // and for one held in memory already.
        if piece.encoded.is_some() || cached.contains_key(&piece.key) {
            chunks.push(Chunk {
                piece: p,
                index: 0,
                range: 0..piece.len,
                whole: true,
            });
            continue;
        }
        let rs = ranges(piece.len);
        let whole = rs.len() == 1;
        for range in rs {
            chunks.push(Chunk {
                piece: p,
                index: 0,
                range,
                whole,
            });
        }
    }
    // Chunk indexes within their piece, and how many each piece has.
    let mut remaining = vec![0usize; layout.pieces.len()];
    for c in &mut chunks {
        c.index = remaining[c.piece];
        remaining[c.piece] += 1;
    }
    let mut hashers: Vec<Vec<Option<crc32fast::Hasher>>> =
        remaining.iter().map(|n| vec![None; *n]).collect();
    // Pieces of each file not yet complete.
    let mut file_left = vec![0usize; layout.files.len()];
    for piece in &layout.pieces {
        file_left[piece.file] += 1;
    }
    // The files that are one whole object: read by the format's reader as they are written
    // (`super::fetch` for a raw object, `super::decode` for an encoded one fetched by one
    // GET), not read back from disk.
    let whole_file: Vec<bool> = layout
        .pieces
        .iter()
        .zip(&remaining)
        .map(|(piece, n)| *n == 1 && file_left[piece.file] == 1 && piece.offset == 0)
        .collect();
    let mut checks: Vec<Option<FileCheck>> = vec![None; layout.files.len()];
    let mut reading = FuturesUnordered::new();
    let fsyncs = Arc::new(Semaphore::new(FSYNCS_IN_FLIGHT));
    let budget = Arc::new(Semaphore::new(budget_permits(BYTES_IN_FLIGHT) as usize));

    let mut fetches = futures::stream::iter(chunks)
        .map(|c| {
            let piece = &layout.pieces[c.piece];
            let file = files[piece.file].clone();
            let cached = cached.get(&piece.key).cloned();
            let budget = budget.clone();
            let rel = whole_file[c.piece].then(|| layout.files[piece.file].clone());
            async move {
                // Bounds the memory of responses in flight; never closed, so this only waits.
                // An encoded piece holds its one GET, or its DECODE_AHEAD largest ranges.
                let held = match &piece.encoded {
                    Some(_) => held_bytes(piece.len),
                    None => c.range.end - c.range.start,
                };
                let _permit = budget.acquire_many_owned(budget_permits(held)).await.ok();
                let fetched = match &piece.encoded {
                    Some(entry) => {
                        let key = layout.keys.get(entry.generation);
                        let check =
                            decode_piece(bucket, piece, entry, key, cached, file, rel).await?;
                        // Checked by its decoder: no CRC left to combine.
                        (None, check)
                    }
                    None => {
                        let f = fetch_chunk(bucket, piece, &c, cached, file, rel).await?;
                        (Some(f.hasher), f.check)
                    }
                };
                Ok::<_, RestoreError>((c, fetched))
            }
        })
        .buffer_unordered(parallelism.max(1));
    loop {
        tokio::select! {
            done = fetches.next() => {
                let Some(done) = done else { break };
                let (c, (hasher, check)) = done?;
                progress.inc(c.range.end - c.range.start);
                let decoded = hasher.is_none();
                hashers[c.piece][c.index] = hasher;
                if check.is_some() {
                    checks[layout.pieces[c.piece].file] = check;
                }
                remaining[c.piece] -= 1;
                if remaining[c.piece] > 0 {
                    continue;
                }
                let mut whole = crc32fast::Hasher::new();
                for h in hashers[c.piece].drain(..).flatten() {
                    whole.combine(&h);
                }
                let piece = &layout.pieces[c.piece];
                let got = whole.finalize();
                // A decoded piece was checked by its decoder.
                if !decoded && got != piece.crc {
                    return Err(RestoreError::CrcMismatch {
                        key: piece.key.clone(),
                        expected: piece.crc,
                        got,
                    });
                }
                file_left[piece.file] -= 1;
                if file_left[piece.file] == 0 {
                    let file = files[piece.file].clone();
                    let rel = &layout.files[piece.file];
                    let known = checks[piece.file].take();
                    reading.push(read_back_and_sync(dir, rel, piece.file, file, known, fsyncs.clone()));
                }
            }
            Some(read) = reading.next(), if !reading.is_empty() => {
                let (i, check) = read?;
                checks[i] = Some(check);
            }
        }
    }
    drop(fetches);
    while let Some(read) = reading.next().await {
        let (i, check) = read?;
        checks[i] = Some(check);
    }
    let checks = checks
        .into_iter()
        .zip(&layout.files)
        .map(|(c, rel)| {
            c.ok_or_else(|| RestoreError::ReadBack {
                dir: dir.to_path_buf(),
                detail: format!("{} was not read back", rel.display()),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Downloaded { checks })
}

/// Reads the complete file `rel` (index `i` of the layout's files, open as `file`) back with
/// the format's reader, unless that reader already ran over its bytes as they were written
/// (`known`, see [`super::fetch`]), and, beside it, fsyncs it once a permit of `fsyncs` is
/// free; both on the blocking pool. Done when both are.
pub(super) async fn read_back_and_sync(
    dir: &Path,
    rel: &Path,
    i: usize,
    file: Arc<File>,
    known: Option<FileCheck>,
    fsyncs: Arc<Semaphore>,
) -> Result<(usize, FileCheck), RestoreError> {
    let (dir, rel) = (dir.to_path_buf(), rel.to_path_buf());
    let path = dir.join(&rel);
    let read = async move {
        match known {
            Some(check) => Ok((i, check)),
            None => {
                blocking(move || {
                    check_file(&dir, &rel)
                        .map(|c| (i, c))
                        .map_err(|detail| RestoreError::ReadBack { dir, detail })
                })
                .await
            }
        }
    };
    let sync = async move {
        // The semaphore is never closed, so this only waits.
        let permit = fsyncs.acquire_owned().await.ok();
        blocking(move || {
            let synced = file.sync_all().map_err(io(&path));
            drop(permit);
            synced
        })
        .await
    };
    let (read, ()) = tokio::try_join!(read, sync)?;
    Ok(read)
}

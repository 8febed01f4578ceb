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
    let files = create_files(dir, layout).await?;
    let chunks = chunks_of(layout, cached);
    let mut tally = Tally::new(layout, &chunks);
    let whole_file = tally.whole_file(layout);
    let mut reading = FuturesUnordered::new();
    let fsyncs = Arc::new(Semaphore::new(FSYNCS_IN_FLIGHT));
    let budget = Arc::new(Semaphore::new(budget_permits(BYTES_IN_FLIGHT) as usize));

    let mut fetches = futures::stream::iter(chunks)
        .map(|c| {
            let piece = &layout.pieces[c.piece];
            let target = Target {
                file: files[piece.file].clone(),
                cached: cached.get(&piece.key).cloned(),
                rel: whole_file[c.piece].then(|| layout.files[piece.file].clone()),
            };
            fetch_one(bucket, layout, c, target, budget.clone())
        })
        .buffer_unordered(parallelism.max(1));
    loop {
        tokio::select! {
            done = fetches.next() => {
                let Some(done) = done else { break };
                let (c, (hasher, check)) = done?;
                progress.inc(c.range.end - c.range.start);
                if let Some(f) = tally.chunk_done(layout, &c, hasher, check)? {
                    let known = tally.checks[f].take();
                    let rel = &layout.files[f];
                    reading.push(read_back_and_sync(dir, rel, f, files[f].clone(), known, fsyncs.clone()));
                }
            }
            Some(read) = reading.next(), if !reading.is_empty() => {
                let (i, check) = read?;
                tally.checks[i] = Some(check);
            }
        }
    }
    drop(fetches);
    while let Some(read) = reading.next().await {
        let (i, check) = read?;
        tally.checks[i] = Some(check);
    }
    let checks = tally
        .checks
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

/// Creates every file of the layout in `dir` (and the archive directory, when there are
/// archives), private, on the blocking pool.
async fn create_files(dir: &Path, layout: &Layout) -> Result<Vec<Arc<File>>, RestoreError> {
    let root = dir.to_path_buf();
    let rels = layout.files.clone();
    let has_archives = layout.has_archives;
    blocking(move || {
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
    .await
}

/// The chunks the pieces are fetched in, each numbered within its piece: one for an encoded
/// piece (ranges fetched and decoded in order: `decode_piece`) and for one held in memory
/// already, else one per range.
fn chunks_of(layout: &Layout, cached: &HashMap<String, Bytes>) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    for (p, piece) in layout.pieces.iter().enumerate() {
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
        for (index, range) in rs.into_iter().enumerate() {
            chunks.push(Chunk {
                piece: p,
                index,
                range,
                whole,
            });
        }
    }
    chunks
}

/// What one chunk's fetch leaves: the CRC state of its bytes (`None` for a decoded piece),
/// and the file's read-back when the format's reader ran over it as it was written.
type ChunkFetched = (Option<crc32fast::Hasher>, Option<FileCheck>);

/// Where one chunk's bytes go: the open file, the object's bytes if held already, and the
/// file's path when the chunk is the whole file (read by the format's reader as written).
struct Target {
    file: Arc<File>,
    cached: Option<Bytes>,
    rel: Option<PathBuf>,
}

/// Fetches chunk `c` into its file, holding its share of the memory budget: an encoded
/// piece decoded (checked by its decoder: no CRC state left to combine), a raw chunk with the
/// CRC state of its bytes.
async fn fetch_one(
    bucket: &dyn Bucket,
    layout: &Layout,
    c: Chunk,
    target: Target,
    budget: Arc<Semaphore>,
) -> Result<(Chunk, ChunkFetched), RestoreError> {
    let piece = &layout.pieces[c.piece];
    let Target { file, cached, rel } = target;
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
            let check = decode_piece(bucket, piece, entry, key, cached, file, rel).await?;
            (None, check)
        }
        None => {
            let f = fetch_chunk(bucket, piece, &c, cached, file, rel).await?;
            (Some(f.hasher), f.check)
        }
    };
    Ok((c, fetched))
}

/// What is left of the download: chunks per piece, their CRC states, pieces per file, and
/// each file's read-back once known.
struct Tally {
    remaining: Vec<usize>,
    hashers: Vec<Vec<Option<crc32fast::Hasher>>>,
    /// Pieces of each file not yet complete.
    file_left: Vec<usize>,
    checks: Vec<Option<FileCheck>>,
}

impl Tally {
    /// Nothing fetched yet of `chunks`.
    fn new(layout: &Layout, chunks: &[Chunk]) -> Tally {
        let mut remaining = vec![0usize; layout.pieces.len()];
        for c in chunks {
            remaining[c.piece] += 1;
        }
        let mut file_left = vec![0usize; layout.files.len()];
        for piece in &layout.pieces {
            file_left[piece.file] += 1;
        }
        Tally {
            hashers: remaining.iter().map(|n| vec![None; *n]).collect(),
            remaining,
            file_left,
            checks: vec![None; layout.files.len()],
        }
    }

    /// Which pieces are the one chunk of a file that is one whole object: read by the
    /// format's reader as they are written (`super::fetch` for a raw object, `super::decode`
    /// for an encoded one fetched by one GET), not read back from disk.
    fn whole_file(&self, layout: &Layout) -> Vec<bool> {
        layout
            .pieces
            .iter()
            .zip(&self.remaining)
            .map(|(piece, n)| *n == 1 && self.file_left[piece.file] == 1 && piece.offset == 0)
            .collect()
    }

    /// Records chunk `c` fetched. Its piece complete, checks the piece's CRC (a decoded piece
    /// was checked by its decoder); returns its file's index when that was the file's last
    /// piece.
    fn chunk_done(
        &mut self,
        layout: &Layout,
        c: &Chunk,
        hasher: Option<crc32fast::Hasher>,
        check: Option<FileCheck>,
    ) -> Result<Option<usize>, RestoreError> {
        let decoded = hasher.is_none();
        self.hashers[c.piece][c.index] = hasher;
        if check.is_some() {
            self.checks[layout.pieces[c.piece].file] = check;
        }
        self.remaining[c.piece] -= 1;
        if self.remaining[c.piece] > 0 {
            return Ok(None);
        }
        let mut whole = crc32fast::Hasher::new();
        for h in self.hashers[c.piece].drain(..).flatten() {
            whole.combine(&h);
        }
        let piece = &layout.pieces[c.piece];
        let got = whole.finalize();
        if !decoded && got != piece.crc {
            return Err(RestoreError::CrcMismatch {
                key: piece.key.clone(),
                expected: piece.crc,
                got,
            });
        }
        self.file_left[piece.file] -= 1;
        Ok((self.file_left[piece.file] == 0).then_some(piece.file))
    }
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

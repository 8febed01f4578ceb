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

/// Bytes of complete objects of files still incomplete that wait for one fsync and one line
/// in the staging record together (`super::super::resume`): at most this much, or what a
/// second of download brings, is fetched again after a crash.
pub const RECORD_BATCH: u64 = 64 << 20;

/// Where a download goes and what it keeps: the temporary directory, the objects an earlier
/// run left complete in it, and the staging record to append to (a resumable restore).
pub(crate) struct Into<'a> {
    pub dir: &'a Path,
    pub kept: &'a Kept,
    pub record: Option<Arc<std::sync::Mutex<Record>>>,
}

/// Downloads every piece of `layout` not kept into `into.dir` with at most `parallelism`
/// requests in flight, checking each object's length and CRC. Each file is read back with the
/// format's reader ([`check_file`]) and fsynced as soon as its last piece is written, on the
/// blocking pool while the other downloads go on (at most [`FSYNCS_IN_FLIGHT`] fsyncs at
/// once); a file that does not read back, or cannot be fsynced, fails the restore at once.
/// A file whose pieces were all kept is read back from disk. With a record, each object is
/// recorded once its bytes are fsynced: with its file, or in batches of [`RECORD_BATCH`].
pub(crate) async fn download(
    bucket: &dyn Bucket,
    into: Into<'_>,
    layout: &Layout,
    cached: &HashMap<String, Bytes>,
    parallelism: usize,
    progress: &super::super::progress::Progress,
) -> Result<Downloaded, RestoreError> {
    let dir = into.dir;
    let files = create_files(dir, layout).await?;
    // One turn at a time per file for the ranges written into it (`fetch_chunk`'s docs).
    let turns: Vec<Arc<std::sync::Mutex<()>>> = files.iter().map(|_| Arc::default()).collect();
    let chunks = chunks_of(layout, cached, into.kept);
    let mut tally = Tally::new(layout, &chunks, into.kept);
    let whole_file = tally.whole_file(layout);
    let mut reading = FuturesUnordered::new();
    let mut recording = FuturesUnordered::new();
    let fsyncs = Arc::new(Semaphore::new(FSYNCS_IN_FLIGHT));
    let budget = Arc::new(Semaphore::new(budget_permits(BYTES_IN_FLIGHT) as usize));
    // Files every piece of which an earlier run left: read back from disk.
    for (f, left) in tally.file_left.iter().enumerate() {
        if *left == 0 {
            let rel = &layout.files[f];
            reading.push(read_back_and_sync(
                dir,
                rel,
                f,
                files[f].clone(),
                None,
                fsyncs.clone(),
            ));
        }
    }
    let mut pending = Pending::default();

    let mut fetches = futures::stream::iter(chunks)
        .map(|c| {
            let piece = &layout.pieces[c.piece];
            let target = Target {
                file: files[piece.file].clone(),
                turn: turns[piece.file].clone(),
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
                progress.fetched(c.range.end - c.range.start);
                let Some(piece) = tally.chunk_done(layout, &c, hasher, check)? else { continue };
                progress.object_done();
                let f = layout.pieces[piece].file;
                if tally.file_left[f] == 0 {
                    let known = tally.checks[f].take();
                    let rel = &layout.files[f];
                    reading.push(read_back_and_sync(dir, rel, f, files[f].clone(), known, fsyncs.clone()));
                } else if let Some(record) = &into.record {
                    pending.add(piece, layout.pieces[piece].len);
                    if pending.bytes >= RECORD_BATCH || pending.since.elapsed().as_secs() >= 1 {
                        let batch = std::mem::take(&mut pending).pieces;
                        recording.push(record_pieces(layout, batch, &files, record.clone()));
                    }
                }
            }
            Some(read) = reading.next(), if !reading.is_empty() => {
                let (i, check) = read?;
                tally.checks[i] = Some(check);
                if let Some(record) = &into.record {
                    let pieces = layout.pieces.iter().enumerate().filter(|(_, p)| p.file == i);
                    let batch = pieces.map(|(n, _)| n).collect();
                    recording.push(record_pieces(layout, batch, &[], record.clone()));
                }
            }
            Some(recorded) = recording.next(), if !recording.is_empty() => recorded?,
        }
    }
    drop(fetches);
    while let Some(read) = reading.next().await {
        let (i, check) = read?;
        tally.checks[i] = Some(check);
    }
    while let Some(recorded) = recording.next().await {
        recorded?;
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

/// Complete objects of incomplete files not yet in the staging record.
struct Pending {
    pieces: Vec<usize>,
    bytes: u64,
    since: std::time::Instant,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            pieces: Vec::new(),
            bytes: 0,
            since: std::time::Instant::now(),
        }
    }
}

impl Pending {
    fn add(&mut self, piece: usize, len: u64) {
        if self.pieces.is_empty() {
            self.since = std::time::Instant::now();
        }
        self.pieces.push(piece);
        self.bytes += len;
    }
}

/// Fsyncs the files of `pieces` (when `files` is given: a file complete was fsynced by its
/// read-back already) and then records the pieces, on the blocking pool.
async fn record_pieces(
    layout: &Layout,
    pieces: Vec<usize>,
    files: &[Arc<File>],
    record: Arc<std::sync::Mutex<Record>>,
) -> Result<(), RestoreError> {
    let mut to_sync: Vec<(Arc<File>, PathBuf)> = Vec::new();
    if !files.is_empty() {
        let mut seen = HashSet::new();
        for p in &pieces {
            let f = layout.pieces[*p].file;
            if seen.insert(f) {
                to_sync.push((files[f].clone(), layout.files[f].clone()));
            }
        }
    }
    let lines: Vec<(usize, String)> = pieces
        .into_iter()
        .map(|p| (p, layout.pieces[p].key.clone()))
        .collect();
    blocking(move || {
        for (file, rel) in &to_sync {
            file.sync_data().map_err(io(rel))?;
        }
        record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(lines)
    })
    .await
}

/// Creates (or, resumed, opens) every file of the layout in `dir` (and the archive directory,
/// when there are archives), private, on the blocking pool.
async fn create_files(dir: &Path, layout: &Layout) -> Result<Vec<Arc<File>>, RestoreError> {
    let root = dir.to_path_buf();
    let rels = layout.files.clone();
    let has_archives = layout.has_archives;
    blocking(move || {
        let archives = root.join(ARCHIVE_DIR);
        if has_archives && !archives.is_dir() {
            create_private_dir(&archives)?;
        }
        rels.iter()
            .map(|rel| {
                let p = root.join(rel);
                // Readable too: a decoding that runs ahead of its reader reads back what
                // it wrote (`super::decode`, "Memory"). Not truncated: a resumed restore
                // keeps the objects an earlier run completed in it.
                open_private_file(&p).map(Arc::new).map_err(io(&p))
            })
            .collect()
    })
    .await
}

/// The chunks the pieces are fetched in, each numbered within its piece: one for an encoded
/// piece (ranges fetched and decoded in order: `decode_piece`) and for one held in memory
/// already, else one per range.
fn chunks_of(layout: &Layout, cached: &HashMap<String, Bytes>, kept: &Kept) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    for (p, piece) in layout.pieces.iter().enumerate() {
        if kept.pieces[p] {
            continue;
        }
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

/// Where one chunk's bytes go: the open file and its writers' turn, the object's bytes if
/// held already, and the file's path when the chunk is the whole file (read by the format's
/// reader as written).
struct Target {
    file: Arc<File>,
    turn: Arc<std::sync::Mutex<()>>,
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
    let Target {
        file,
        turn,
        cached,
        rel,
    } = target;
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
            let f = fetch_chunk(bucket, piece, &c, cached, (file, turn), rel).await?;
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
    /// Pieces of each file in all.
    file_pieces: Vec<usize>,
    checks: Vec<Option<FileCheck>>,
}

impl Tally {
    /// Nothing fetched yet of `chunks`; the pieces `kept` complete already.
    fn new(layout: &Layout, chunks: &[Chunk], kept: &Kept) -> Tally {
        let mut remaining = vec![0usize; layout.pieces.len()];
        for c in chunks {
            remaining[c.piece] += 1;
        }
        let mut file_left = vec![0usize; layout.files.len()];
        let mut file_pieces = vec![0usize; layout.files.len()];
        for (p, piece) in layout.pieces.iter().enumerate() {
            file_pieces[piece.file] += 1;
            if !kept.pieces[p] {
                file_left[piece.file] += 1;
            }
        }
        Tally {
            hashers: remaining.iter().map(|n| vec![None; *n]).collect(),
            remaining,
            file_left,
            file_pieces,
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
            .map(|(piece, n)| *n == 1 && self.file_pieces[piece.file] == 1 && piece.offset == 0)
            .collect()
    }

    /// Records chunk `c` fetched. Its piece complete, checks the piece's CRC (a decoded piece
    /// was checked by its decoder) and returns the piece's index (`file_left` then says
    /// whether it was its file's last).
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
        Ok(Some(c.piece))
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

//! Throughput of the sealed stream (`crypto::stream`): seal, open, and seal then open, of one
//! large object pushed through in 1 MiB writes, on one core. Prints MB/s per direction
//! (median of 5 runs); no assertions. `cargo bench --bench seal` (SEAL_BENCH_MB sets the size).

use std::io::Write;
use std::time::Instant;

use mushroom_backup::crypto::{DataKey, OpenWriter, SealWriter};

/// Counts what it is given and keeps nothing.
struct Sink(u64);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mb: usize = std::env::var("SEAL_BENCH_MB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let key = DataKey::generate();
    let obj = "gen/0000000001/snapshot.bin";
    let piece: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    // One sealed MiB-multiple object, to open.
    let mut sealed = SealWriter::new(Vec::new(), &key, obj).unwrap();
    for _ in 0..mb {
        sealed.write_all(&piece).unwrap();
    }
    let sealed = sealed.finish().unwrap();
    let bytes = (mb << 20) as f64;
    let rate = |secs: f64| bytes / secs / 1e6;
    let (mut seal, mut open, mut both) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let mut w = SealWriter::new(Sink(0), &key, obj).unwrap();
        for _ in 0..mb {
            w.write_all(&piece).unwrap();
        }
        w.finish().unwrap();
        seal.push(rate(t.elapsed().as_secs_f64()));

        let t = Instant::now();
        let mut w = OpenWriter::new(Sink(0), &key, obj);
        for c in sealed.chunks(1 << 20) {
            w.write_all(c).unwrap();
        }
        assert_eq!(w.finish().unwrap().0, (mb << 20) as u64);
        open.push(rate(t.elapsed().as_secs_f64()));

        let t = Instant::now();
        let mut w = SealWriter::new(OpenWriter::new(Sink(0), &key, obj), &key, obj).unwrap();
        for _ in 0..mb {
            w.write_all(&piece).unwrap();
        }
        w.finish().unwrap().finish().unwrap();
        both.push(rate(t.elapsed().as_secs_f64()));
    }
    println!(
        "{}",
        serde_json::json!({
            "object_mb": mb,
            "seal_mb_per_s": median(seal).round(),
            "open_mb_per_s": median(open).round(),
            "seal_then_open_mb_per_s": median(both).round(),
        })
    );
}

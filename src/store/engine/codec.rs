//! The reference engine's payloads: a commit's batch of operations (one WAL frame) and the
//! serialized map (one snapshot).
//!
//! Both start with a version byte so a later engine can change them; both decoders treat
//! their input as hostile and return a [`FormatError`], never panic, on junk. The frame and
//! snapshot CRCs already reject torn data; these checks catch a payload that was valid for a
//! different encoder.
//!
//! Batch (version 1): `1u8`, `count: u32`, then `count` ops, each `tag: u8` (1 put, 2
//! delete), `key_len: u32`, key, and for a put `value_len: u32`, value. No trailing bytes.
//!
//! Map (version 1): `1u8`, `count: u64`, then `count` entries `key_len: u32`, key,
//! `value_len: u32`, value, keys strictly ascending. No trailing bytes.

use std::collections::BTreeMap;

use crate::store::format::FormatError;

/// The engine's state: a map from key to value.
pub type KvMap = BTreeMap<Vec<u8>, Vec<u8>>;

/// Version byte of the batch encoding.
pub const BATCH_VERSION: u8 = 1;
/// Version byte of the map encoding.
pub const MAP_VERSION: u8 = 1;

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const BATCH: &str = "commit payload";
const MAP: &str = "snapshot payload";

/// One operation of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    Put { key: Vec<u8>, value: Vec<u8> },
    Delete { key: Vec<u8> },
}

impl Op {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Op::Delete { key: key.into() }
    }
}

/// Applies `ops` to `map` in order.
pub fn apply_ops(map: &mut KvMap, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Put { key, value } => {
                map.insert(key.clone(), value.clone());
            }
            Op::Delete { key } => {
                map.remove(key);
            }
        }
    }
}

/// Bytes [`encode_batch`] produces for `ops`, without encoding them.
pub fn batch_len(ops: &[Op]) -> usize {
    1 + 4
        + ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value } => 1 + 4 + key.len() + 4 + value.len(),
                Op::Delete { key } => 1 + 4 + key.len(),
            })
            .sum::<usize>()
}

/// Encodes a commit's operations. Every key and value must be under 4 GiB (the caller checks
/// the whole payload against the frame limit, which is far smaller).
pub fn encode_batch(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::with_capacity(batch_len(ops));
    out.push(BATCH_VERSION);
    put_len(&mut out, ops.len());
    for op in ops {
        match op {
            Op::Put { key, value } => {
                out.push(TAG_PUT);
                put_bytes(&mut out, key);
                put_bytes(&mut out, value);
            }
            Op::Delete { key } => {
                out.push(TAG_DELETE);
                put_bytes(&mut out, key);
            }
        }
    }
    out
}

/// Decodes a commit's operations.
pub fn decode_batch(b: &[u8]) -> Result<Vec<Op>, FormatError> {
    let mut r = Reader::new(BATCH, b);
    r.version(BATCH_VERSION)?;
    let count = r.u32()? as usize;
    // Every op takes at least 5 bytes: refuse a count the input cannot hold before
    // allocating for it.
    if count > r.remaining() / 5 {
        return Err(r.invalid(format!("{count} ops cannot fit in {} bytes", r.remaining())));
    }
    let mut ops = Vec::with_capacity(count);
    for i in 0..count {
        let tag = r.u8()?;
        let key = r.bytes()?.to_vec();
        ops.push(match tag {
            TAG_PUT => Op::Put {
                key,
                value: r.bytes()?.to_vec(),
            },
            TAG_DELETE => Op::Delete { key },
            other => return Err(r.invalid(format!("op {i}: unknown tag {other}"))),
        });
    }
    r.finish()?;
    Ok(ops)
}

/// Encodes the whole map (a snapshot's payload).
pub fn encode_map(map: &KvMap) -> Vec<u8> {
    let size: usize = map.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    let mut out = Vec::with_capacity(1 + 8 + size);
    out.push(MAP_VERSION);
    out.extend_from_slice(&(map.len() as u64).to_le_bytes());
    for (k, v) in map {
        put_bytes(&mut out, k);
        put_bytes(&mut out, v);
    }
    out
}

/// Decodes a map encoded by [`encode_map`].
pub fn decode_map(b: &[u8]) -> Result<KvMap, FormatError> {
    let mut r = Reader::new(MAP, b);
    r.version(MAP_VERSION)?;
    let count = r.u64()?;
    if count > (r.remaining() / 8) as u64 {
        return Err(r.invalid(format!(
            "{count} entries cannot fit in {} bytes",
            r.remaining()
        )));
    }
    let mut map = KvMap::new();
    let mut prev: Option<&[u8]> = None;
    for i in 0..count {
        let key = r.bytes()?;
        let value = r.bytes()?;
        if prev.is_some_and(|p| p >= key) {
            return Err(r.invalid(format!("entry {i}: keys not strictly ascending")));
        }
        prev = Some(key);
        map.insert(key.to_vec(), value.to_vec());
    }
    r.finish()?;
    Ok(map)
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).expect("length under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

/// A bounds-checked cursor over a payload.
struct Reader<'a> {
    what: &'static str,
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(what: &'static str, b: &'a [u8]) -> Self {
        Self { what, b, at: 0 }
    }

    fn remaining(&self) -> usize {
        self.b.len() - self.at
    }

    fn invalid(&self, detail: String) -> FormatError {
        FormatError::Invalid {
            what: self.what,
            detail,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if self.remaining() < n {
            return Err(FormatError::Truncated {
                what: self.what,
                have: self.b.len(),
                need: self.at.saturating_add(n),
            });
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FormatError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn version(&mut self, want: u8) -> Result<(), FormatError> {
        match self.u8()? {
            v if v == want => Ok(()),
            v => Err(self.invalid(format!("unknown version {v}, expected {want}"))),
        }
    }

    fn finish(&self) -> Result<(), FormatError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.invalid(format!("{n} trailing bytes"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips_and_rejects_junk() {
        let ops = vec![Op::put("a", "1"), Op::delete("b"), Op::put("", "")];
        let b = encode_batch(&ops);
        assert_eq!(b.len(), batch_len(&ops));
        assert_eq!(decode_batch(&b).unwrap(), ops);
        assert!(decode_batch(&b[..b.len() - 1]).is_err());
        let mut trailing = b.clone();
        trailing.push(0);
        assert!(decode_batch(&trailing).is_err());
        let mut bad_tag = b.clone();
        bad_tag[5] = 9;
        assert!(decode_batch(&bad_tag).is_err());
        assert!(decode_batch(&[2, 0, 0, 0, 0]).is_err());
        assert!(decode_batch(&[1, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert_eq!(decode_batch(&encode_batch(&[])).unwrap(), vec![]);
    }

    #[test]
    fn map_round_trips_and_rejects_unsorted() {
        let mut map = KvMap::new();
        map.insert(b"k1".to_vec(), b"v1".to_vec());
        map.insert(b"k2".to_vec(), vec![0; 300]);
        let b = encode_map(&map);
        assert_eq!(decode_map(&b).unwrap(), map);
        // Swap the two entries' keys: k2 then k1 is not ascending.
        let mut swapped = b.clone();
        let first = 1 + 8 + 4;
        swapped[first + 1] = b'2';
        assert!(decode_map(&swapped).is_err());
        assert!(decode_map(&b[..b.len() - 1]).is_err());
        assert!(decode_map(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
    }
}

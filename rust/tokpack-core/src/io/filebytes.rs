//! The byte level under the readers and the writer: opening a file, byte ranges and their
//! xxh3-128 checksums (the manifest's notation), and checked byte ranges standing in for a
//! file. It imports no other `io` module, so every one of them may import it.

use crate::error::{Context, CoreError, Location, Result};
use bytes::{Buf, Bytes};
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::Path;
use twox_hash::XxHash3_128;

/// The read size of hashing (and the part size of fingerprints, `super::fingerprint::PART`).
pub const READ_BYTES: u64 = 1 << 26;

/// A byte range of a shard file and the checksum of its bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    pub offset: u64,
    pub length: u64,
    /// `xxh3_128:<hex>` of the range's bytes.
    pub checksum: String,
}

/// `path` opened for reading; a directory is refused here (it opens on Unix, and only its
/// reads would fail).
pub(crate) fn open_file(path: &Path) -> Result<File> {
    let file = File::open(path).map_err(|e| CoreError::unreadable(path, e))?;
    match file.metadata() {
        Ok(m) if m.is_dir() => Err(CoreError::unreadable(path, ErrorKind::IsADirectory.into())),
        Ok(_) => Ok(file),
        Err(e) => Err(CoreError::unreadable(path, e)),
    }
}

/// The checksum notation of the manifest.
pub fn xxh3_hex(hash: u128) -> String {
    format!("xxh3_128:{hash:032x}")
}

/// xxh3-128 of `length` bytes of `file` from `offset`, read [`READ_BYTES`] at a time.
pub fn hash_range(file: &File, offset: u64, length: u64, at: &Location) -> Result<u128> {
    let mut h = XxHash3_128::new();
    let mut buf = vec![0u8; READ_BYTES.min(length) as usize];
    let mut done = 0u64;
    while done < length {
        let n = READ_BYTES.min(length - done) as usize;
        file.read_exact_at(&mut buf[..n], offset + done)
            .corrupt(at, "cannot read")?;
        h.write(&buf[..n]);
        done += n as u64;
    }
    Ok(h.finish_128())
}

/// `xxh3_128:<hex>` of some bytes: the manifest's checksum of a byte range, for a reader that
/// fetched the range itself (a shard on object storage) and checks it before keeping it.
pub fn bytes_checksum(data: &[u8]) -> String {
    xxh3_hex(XxHash3_128::oneshot(data))
}

/// Size and `xxh3_128:<hex>` checksum of a whole file.
pub fn file_checksum(path: &Path) -> Result<(u64, String)> {
    let at = Location::file(path);
    let file = open_file(path)?;
    let size = file.metadata().corrupt(&at, "cannot stat")?.len();
    Ok((size, xxh3_hex(hash_range(&file, 0, size, &at)?)))
}

/// Checked byte ranges of a file standing in for the file: reads outside them fail.
pub(crate) struct CheckedBytes {
    pub size: u64,
    pub ranges: Vec<(u64, Bytes)>,
}

impl CheckedBytes {
    /// The bytes from `start` to the end of the range holding them, and how many there are.
    fn tail(&self, start: u64) -> parquet::errors::Result<Bytes> {
        self.ranges
            .iter()
            .find(|(offset, data)| start >= *offset && start <= offset + data.len() as u64)
            .map(|(offset, data)| data.slice((start - offset) as usize..))
            .ok_or_else(|| {
                ParquetError::General(format!("offset {start} is outside the checked bytes"))
            })
    }
}

impl Length for CheckedBytes {
    fn len(&self) -> u64 {
        self.size
    }
}

impl ChunkReader for CheckedBytes {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.tail(start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let tail = self.tail(start)?;
        if length > tail.len() {
            return Err(ParquetError::General(format!(
                "bytes {start}..{} are outside the checked bytes",
                start + length as u64
            )));
        }
        Ok(tail.slice(..length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_not_opened_as_a_file() {
        let err = open_file(&std::env::temp_dir()).unwrap_err();
        assert!(
            matches!(&err, CoreError::Unreadable { source, .. } if source.kind() == ErrorKind::IsADirectory),
            "{err}"
        );
    }
}

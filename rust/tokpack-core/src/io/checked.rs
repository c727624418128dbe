//! Reading packed shards against the checksums recorded when they were written: a row group's
//! bytes and the footer's are read once, hashed (xxh3-128), compared with the manifest's, and
//! only then decoded, from memory. A damaged, truncated or replaced shard therefore fails
//! instead of yielding other tokens, and the check covers exactly the bytes that are decoded.

use super::filebytes::{bytes_checksum, open_file, ByteRange, CheckedBytes};
use super::source::{assemble_batch, decode};
use crate::error::{Context, CoreError, Location, Result};
use arrow::array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::ProjectionMask;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What the manifest records about one row group of a shard, as a reader needs it.
pub struct GroupCheck {
    /// Size of the whole file.
    pub size: u64,
    pub footer: ByteRange,
    pub group: ByteRange,
}

/// Reads `range` of `file` (the `part` of the unit at `at`: "footer: " or nothing) and checks
/// its bytes against the recorded checksum.
fn read_checked(file: &File, at: &Location, part: &str, range: &ByteRange) -> Result<Bytes> {
    let mut buf = vec![0u8; range.length as usize];
    file.read_exact_at(&mut buf, range.offset)
        .corrupt(at, &format!("{part}cannot read"))?;
    let got = bytes_checksum(&buf);
    if got != range.checksum {
        let what = format!(
            "{part}bytes {}..{} do not match their checksum (they hash to {got}, the manifest \
             says {})",
            range.offset,
            range.offset + range.length,
            range.checksum
        );
        return Err(CoreError::corrupt(at.clone(), what, None));
    }
    Ok(Bytes::from(buf))
}

/// Row group `unit` of the packed shard `path` with only `columns`, after checking the file's
/// size and the checksums of the footer and of the row group's bytes.
pub fn read_checked_row_group(
    path: &Path,
    unit: usize,
    columns: &[&str],
    check: &GroupCheck,
) -> Result<RecordBatch> {
    let at = Location::unit(path, "row group", unit);
    let file = open_file(path)?;
    let size = file.metadata().corrupt(&at, "cannot stat")?.len();
    if size != check.size {
        let what = format!(
            "the file has {size} bytes, the manifest says {}",
            check.size
        );
        return Err(CoreError::corrupt(at, what, None));
    }
    let footer = read_checked(&file, &at, "footer: ", &check.footer)?;
    let group = read_checked(&file, &at, "", &check.group)?;
    let data = CheckedBytes {
        size,
        ranges: vec![(check.footer.offset, footer), (check.group.offset, group)],
    };
    let meta = ArrowReaderMetadata::load(&data, ArrowReaderOptions::new())
        .corrupt(&at, "cannot decode")?;
    let groups = meta.metadata().row_groups();
    let Some(rows) = groups.get(unit).map(|g| g.num_rows()) else {
        let what = format!("does not exist (the file has {})", groups.len());
        return Err(CoreError::corrupt(at, what, None));
    };
    let index = |c: &&str| {
        let column = at.clone().column(c);
        meta.schema().index_of(c).corrupt(&column, "no such column")
    };
    let indices = columns.iter().map(index).collect::<Result<Vec<_>>>()?;
    let mask = ProjectionMask::roots(meta.parquet_schema(), indices);
    let mut batches = Vec::new();
    let schema = decode(data, &meta, mask, unit, rows as usize, &at, &mut |b| {
        batches.push(b);
        Ok(())
    })?;
    assemble_batch(&at, schema, batches, columns)
}

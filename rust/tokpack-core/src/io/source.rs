//! Input files: Parquet (one unit per row group) and Arrow IPC / Feather v2 (one unit per
//! record batch), read with only the requested columns.

use super::filebytes::{hash_range, open_file, CheckedBytes};
use super::fingerprint::Parts;
use super::pagecache::drop_read;
use crate::error::{Context, CoreError, Location, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::ChunkReader;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Row groups up to this size are read whole into memory, hashed for the file's fingerprint
/// and decoded from there; larger ones are decoded from the file and hashed separately.
const WHOLE_UNIT_BYTES: u64 = 1 << 28;

/// An opened input file: its Arrow schema and units.
pub struct Source {
    pub path: PathBuf,
    /// "row group" (Parquet) or "record batch" (IPC), for messages.
    pub unit_kind: &'static str,
    pub schema: SchemaRef,
    parquet: Option<ArrowReaderMetadata>,
    /// Row groups (Parquet) or record batches (IPC).
    pub units: usize,
    /// The parts the file's fingerprint is taken over (`super::fingerprint`).
    pub parts: Parts,
    /// Drop the row groups a hashed read reads from the page cache once read
    /// (`super::pagecache::drop_read`).
    pub read_once: bool,
}

impl Source {
    /// Opens `path` and reads its footer; the format is recognised by its magic bytes.
    pub fn open(path: &Path) -> Result<Self> {
        let at = Location::file(path);
        let file = open_file(path)?;
        let size = file
            .metadata()
            .map_err(|e| CoreError::unreadable(path, e))?
            .len();
        let mut magic = Vec::with_capacity(6);
        (&file)
            .take(6)
            .read_to_end(&mut magic)
            .map_err(|e| CoreError::unreadable(path, e))?;
        let (unit_kind, schema, units, parts, parquet) = if magic.starts_with(b"PAR1") {
            let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
                .corrupt(&at, "not a valid Parquet file")?;
            let (schema, units) = (meta.schema().clone(), meta.metadata().num_row_groups());
            let parts = Parts::parquet(meta.metadata(), size);
            ("row group", schema, units, parts, Some(meta))
        } else if magic == b"ARROW1" {
            let reader = FileReader::try_new_buffered(open_file(path)?, None)
                .corrupt(&at, "not a valid Arrow IPC file")?;
            let (schema, units) = (reader.schema(), reader.num_batches());
            ("record batch", schema, units, Parts::plain(size), None)
        } else {
            let what = "not a Parquet or Arrow IPC (Feather v2) file";
            return Err(CoreError::corrupt(at, what, None));
        };
        Ok(Self {
            path: path.to_path_buf(),
            unit_kind,
            schema,
            parquet,
            units,
            parts,
            read_once: false,
        })
    }

    /// Top-level column indices of `names`, or a schema error naming the missing one.
    pub fn column_indices(&self, names: &[&str]) -> Result<Vec<usize>> {
        names
            .iter()
            .map(|name| {
                self.schema.index_of(name).map_err(|_| {
                    let have: Vec<&str> = self
                        .schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect();
                    let what = format!("no column {name:?} (columns: {})", have.join(", "));
                    CoreError::schema(Location::file(&self.path), what)
                })
            })
            .collect()
    }

    /// Streams unit `unit` in batches of at most `batch_rows` rows holding only `columns`;
    /// with `hashed`, also hashes the row group's part of the file (Parquet): `(part index,
    /// xxh3-128)`, read once for both when not too large.
    pub fn read_unit(
        &self,
        unit: usize,
        columns: &[&str],
        batch_rows: usize,
        hashed: bool,
        mut f: impl FnMut(RecordBatch) -> Result<()>,
    ) -> Result<Option<(usize, u128)>> {
        let indices = self.column_indices(columns)?;
        let at = Location::unit(&self.path, self.unit_kind, unit);
        let file = open_file(&self.path)?;
        let mut digest = None;
        match &self.parquet {
            Some(meta) => {
                let mask = ProjectionMask::roots(meta.parquet_schema(), indices);
                let part = self.parts.units.get(unit).copied().filter(|_| hashed);
                let whole = part.filter(|&p| {
                    self.parts.parts[p].1 <= WHOLE_UNIT_BYTES && self.holds(meta, unit, p)
                });
                if let Some(p) = whole {
                    let (offset, length) = self.parts.parts[p];
                    let mut buf = vec![0u8; length as usize];
                    file.read_exact_at(&mut buf, offset)
                        .corrupt(&at, "cannot read")?;
                    digest = Some((p, twox_hash::XxHash3_128::oneshot(&buf)));
                    let data = CheckedBytes {
                        size: self.parts.size,
                        ranges: vec![(offset, bytes::Bytes::from(buf))],
                    };
                    decode(data, meta, mask, unit, batch_rows, &at, &mut f)?;
                } else {
                    let data = file.try_clone().corrupt(&at, "cannot read")?;
                    decode(data, meta, mask, unit, batch_rows, &at, &mut f)?;
                    if let Some(p) = part {
                        let (offset, length) = self.parts.parts[p];
                        let d = hash_range(&file, offset, length, &at)?;
                        digest = Some((p, d));
                    }
                }
                if let Some((p, _)) = digest.filter(|_| self.read_once) {
                    let (offset, length) = self.parts.parts[p];
                    drop_read(&file, offset, length);
                }
            }
            None => {
                let mut reader = FileReader::try_new_buffered(file, Some(indices))
                    .corrupt(&at, "cannot decode")?;
                reader.set_index(unit).corrupt(&at, "cannot decode")?;
                let missing =
                    || CoreError::corrupt(at.clone(), "cannot decode (record batch missing)", None);
                let batch = reader.next().ok_or_else(missing)?;
                f(batch.corrupt(&at, "cannot decode")?)?;
            }
        }
        Ok(digest)
    }

    /// Whether part `p` holds every column chunk of row group `unit` (it does unless the
    /// footer lists row groups out of file order).
    fn holds(&self, meta: &ArrowReaderMetadata, unit: usize, p: usize) -> bool {
        let (offset, length) = self.parts.parts[p];
        meta.metadata().row_group(unit).columns().iter().all(|c| {
            let (s, n) = c.byte_range();
            s >= offset && s.saturating_add(n) <= offset + length
        })
    }
}

/// Decodes row group `unit` of a Parquet file from `data` (the file, or its bytes) in batches;
/// returns the projected schema.
pub(crate) fn decode<R: ChunkReader + 'static>(
    data: R,
    meta: &ArrowReaderMetadata,
    mask: ProjectionMask,
    unit: usize,
    batch_rows: usize,
    at: &Location,
    f: &mut impl FnMut(RecordBatch) -> Result<()>,
) -> Result<SchemaRef> {
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(data, meta.clone())
        .with_projection(mask)
        .with_row_groups(vec![unit])
        .with_batch_size(batch_rows.max(1))
        .build()
        .corrupt(at, "cannot decode")?;
    let schema = arrow::array::RecordBatchReader::schema(&reader);
    for batch in reader {
        f(batch.corrupt(at, "cannot decode")?)?;
    }
    Ok(schema)
}

/// One whole row group (Parquet) or record batch (IPC) of `path`, with only `columns`.
pub fn read_row_group(path: &Path, unit: usize, columns: &[&str]) -> Result<RecordBatch> {
    let source = Source::open(path)?;
    if unit >= source.units {
        return Err(CoreError::Config(format!(
            "{}: {} {unit} does not exist (the file has {})",
            path.display(),
            source.unit_kind,
            source.units
        )));
    }
    let mut indices = source.column_indices(columns)?;
    indices.sort_unstable();
    indices.dedup();
    let mut batches = Vec::new();
    source.read_unit(unit, columns, 1 << 20, false, |b| {
        batches.push(b);
        Ok(())
    })?;
    let projected = std::sync::Arc::new(
        source
            .schema
            .project(&indices)
            .corrupt(&Location::file(path), "")?,
    );
    let at = Location::unit(path, source.unit_kind, unit);
    assemble_batch(&at, projected, batches, columns)
}

/// One record batch from the decoded batches of the unit at `at`, with `columns` in the order
/// asked for, not the file's order. `projected` is the schema when there are no batches.
pub(crate) fn assemble_batch(
    at: &Location,
    projected: SchemaRef,
    batches: Vec<RecordBatch>,
    columns: &[&str],
) -> Result<RecordBatch> {
    let schema = batches.first().map_or(projected, |b| b.schema());
    let batch = arrow::compute::concat_batches(&schema, &batches).corrupt(at, "")?;
    let ordered: Vec<_> = columns
        .iter()
        .map(|c| batch.column_by_name(c).cloned())
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CoreError::schema(at.clone(), "column missing"))?;
    let fields: Vec<_> = columns
        .iter()
        .filter_map(|c| schema.field_with_name(c).ok().cloned())
        .collect();
    RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
        ordered,
    )
    .corrupt(at, "")
}

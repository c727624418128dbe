//! Input files: Parquet (one unit per row group) and Arrow IPC / Feather v2 (one unit per
//! record batch), read with only the requested columns.

use crate::error::{Context, CoreError, Location, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// An opened input file: its Arrow schema and units.
pub struct Source {
    pub path: PathBuf,
    /// "row group" (Parquet) or "record batch" (IPC), for messages.
    pub unit_kind: &'static str,
    pub schema: SchemaRef,
    parquet: Option<ArrowReaderMetadata>,
    /// Row groups (Parquet) or record batches (IPC).
    pub units: usize,
}

pub(crate) fn open_file(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| CoreError::unreadable(path, e))
}

impl Source {
    /// Opens `path` and reads its footer; the format is recognised by its magic bytes.
    pub fn open(path: &Path) -> Result<Self> {
        let at = Location::file(path);
        let file = open_file(path)?;
        let mut magic = Vec::with_capacity(6);
        (&file)
            .take(6)
            .read_to_end(&mut magic)
            .map_err(|e| CoreError::unreadable(path, e))?;
        if magic.starts_with(b"PAR1") {
            let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
                .corrupt(&at, "not a valid Parquet file")?;
            Ok(Self {
                path: path.to_path_buf(),
                unit_kind: "row group",
                schema: meta.schema().clone(),
                units: meta.metadata().num_row_groups(),
                parquet: Some(meta),
            })
        } else if magic == b"ARROW1" {
            let reader = FileReader::try_new_buffered(open_file(path)?, None)
                .corrupt(&at, "not a valid Arrow IPC file")?;
            Ok(Self {
                path: path.to_path_buf(),
                unit_kind: "record batch",
                schema: reader.schema(),
                units: reader.num_batches(),
                parquet: None,
            })
        } else {
            Err(CoreError::corrupt(
                at,
                "not a Parquet or Arrow IPC (Feather v2) file",
                None,
            ))
        }
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
                    CoreError::Schema {
                        at: Box::new(Location::file(&self.path)),
                        what: format!("no column {name:?} (columns: {})", have.join(", ")),
                    }
                })
            })
            .collect()
    }

    /// Streams unit `unit` in batches of at most `batch_rows` rows holding only `columns`.
    pub fn read_unit(
        &self,
        unit: usize,
        columns: &[&str],
        batch_rows: usize,
        mut f: impl FnMut(RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let indices = self.column_indices(columns)?;
        let at = Location::unit(&self.path, self.unit_kind, unit);
        let file = open_file(&self.path)?;
        match &self.parquet {
            Some(meta) => {
                let mask = ProjectionMask::roots(meta.parquet_schema(), indices);
                let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta.clone())
                    .with_projection(mask)
                    .with_row_groups(vec![unit])
                    .with_batch_size(batch_rows.max(1))
                    .build()
                    .corrupt(&at, "cannot decode")?;
                for batch in reader {
                    f(batch.corrupt(&at, "cannot decode")?)?;
                }
            }
            None => {
                let mut reader = FileReader::try_new_buffered(file, Some(indices))
                    .corrupt(&at, "cannot decode")?;
                reader.set_index(unit).corrupt(&at, "cannot decode")?;
                match reader.next() {
                    Some(batch) => f(batch.corrupt(&at, "cannot decode")?)?,
                    None => {
                        return Err(CoreError::corrupt(
                            at,
                            "cannot decode (record batch missing)",
                            None,
                        ))
                    }
                }
            }
        }
        Ok(())
    }
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
    source.read_unit(unit, columns, 1 << 20, |b| {
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
        .ok_or_else(|| CoreError::Schema {
            at: Box::new(at.clone()),
            what: "column missing".into(),
        })?;
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

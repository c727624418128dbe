//! Packed shards: `part-NNNNN.parquet` (one row per packed row, row groups of at most
//! `row_group_rows` rows) and `_index-part-NNNNN.arrow` (per row: token offset inside the shard,
//! tokens, segments, loss tokens) so readers learn lengths without touching token data.
//!
//! While a shard is written, its bytes are hashed (xxh3-128) as a whole and per byte range: one
//! range per row group (its column chunks, contiguous in the file) and one for the footer (page
//! indexes and metadata). Readers check exactly the bytes they decode against these (see
//! [`super::checked`]).

use super::carry::{per_segment, Carried};
use super::filebytes::{xxh3_hex, ByteRange};
use super::pagecache::WriteBehind;
use super::pairs::{Pairs, Part};
use super::progress::Progress;
use crate::error::{Context, CoreError, Result};
use crate::format::{col, index_name, shard_name};
use crate::plan::Plan;
use crate::policy::IGNORE_INDEX;
use arrow::array::{ArrayRef, Int32Array, Int64Array, Int8Array, ListArray, RecordBatch};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::writer::FileWriter;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// What was written for one shard (recorded in the manifest).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ShardInfo {
    pub file: String,
    pub index: String,
    pub rows: u64,
    pub row_groups: u64,
    pub tokens: u64,
    pub loss_tokens: u64,
    /// File size in bytes.
    pub size: u64,
    /// `xxh3_128:<hex>` of the shard file's bytes.
    pub checksum: String,
    /// The bytes of each row group's column chunks.
    pub row_group_bytes: Vec<ByteRange>,
    /// Everything after the last row group: page indexes and the footer.
    pub footer_bytes: ByteRange,
    /// The index side file's size in bytes and `xxh3_128:<hex>` of its bytes.
    pub index_size: u64,
    pub index_checksum: String,
}

/// `zstd`, `zstd:LEVEL`, `snappy`, `lz4` or `none`.
pub fn parse_compression(name: &str) -> Result<Compression> {
    let bad = || {
        CoreError::Config(format!(
            "unknown compression {name:?}; expected \"zstd\" (or \"zstd:LEVEL\"), \"snappy\", \"lz4\" or \"none\""
        ))
    };
    Ok(match name {
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        "snappy" => Compression::SNAPPY,
        "lz4" => Compression::LZ4_RAW,
        "none" | "uncompressed" => Compression::UNCOMPRESSED,
        _ => match name
            .strip_prefix("zstd:")
            .and_then(|l| l.parse::<i32>().ok())
        {
            Some(level) => Compression::ZSTD(ZstdLevel::try_new(level).map_err(|_| bad())?),
            None => return Err(bad()),
        },
    })
}

pub(crate) fn list_field(name: &str, child: DataType) -> Field {
    Field::new(
        name,
        DataType::List(Arc::new(Field::new("item", child, true))),
        false,
    )
}

/// The per-row boundary columns every packed shard has after its tokens (and labels):
/// `seq_lengths`, `sample_ids`, the row's counts and `seq_loss_tokens`.
pub(crate) fn boundary_fields() -> [Field; 6] {
    [
        list_field(col::SEQ_LENGTHS, DataType::Int32),
        list_field(col::SAMPLE_IDS, DataType::Int64),
        Field::new(col::NUM_TOKENS, DataType::Int32, false),
        Field::new(col::NUM_SEQS, DataType::Int32, false),
        Field::new(col::NUM_LOSS_TOKENS, DataType::Int32, false),
        list_field(col::SEQ_LOSS_TOKENS, DataType::Int32),
    ]
}

/// The packed-shard schema (see PACKED_FORMAT / README): with `pairs`, the preference columns
/// `seq_roles` and `num_pairs`; then one list column per carried column.
pub fn shard_schema(has_labels: bool, pairs: bool, carried: &[Carried]) -> SchemaRef {
    let mut fields = vec![list_field(col::INPUT_IDS, DataType::Int32)];
    if has_labels {
        fields.push(list_field(col::LABELS, DataType::Int32));
    }
    fields.extend(boundary_fields());
    if pairs {
        fields.extend([
            list_field(col::SEQ_ROLES, DataType::Int8),
            Field::new(col::NUM_PAIRS, DataType::Int32, false),
        ]);
    }
    fields.extend(
        carried
            .iter()
            .map(|c| list_field(&c.name, c.values.data_type().clone())),
    );
    Arc::new(Schema::new(fields))
}

fn index_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(col::OFFSET, DataType::Int64, false),
        Field::new(col::NUM_TOKENS, DataType::Int32, false),
        Field::new(col::NUM_SEQS, DataType::Int32, false),
        Field::new(col::NUM_LOSS_TOKENS, DataType::Int32, false),
    ]))
}

/// Hashes everything written through it, as a whole and in ranges ended by [`Hashing::cut`].
struct Hashing<W: Write> {
    inner: W,
    hasher: twox_hash::XxHash3_128,
    range: twox_hash::XxHash3_128,
    range_start: u64,
    pos: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: twox_hash::XxHash3_128::new(),
            range: twox_hash::XxHash3_128::new(),
            range_start: 0,
            pos: 0,
        }
    }

    /// Ends the current range (the bytes received since the previous cut) and starts the next.
    fn cut(&mut self) -> ByteRange {
        let hash = std::mem::replace(&mut self.range, twox_hash::XxHash3_128::new());
        let out = ByteRange {
            offset: self.range_start,
            length: self.pos - self.range_start,
            checksum: xxh3_hex(hash.finish_128()),
        };
        self.range_start = self.pos;
        out
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.write(&buf[..n]);
        self.range.write(&buf[..n]);
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Where a shard writer gathers the tokens of the plan's segments from: the spill files of
/// `pack_files`, or the samples a `tokpack.ray` shard task holds in memory ([`super::shard`]).
/// `seq` is the sequence of the sample (0 for a plain sample; a pair's chosen or rejected one,
/// see [`super::pairs`]).
pub trait SampleSource: Sync {
    /// Tokens `start..start+tokens.len()` of sequence `seq` of input sample `sample`, and the
    /// labels of the same span into `labels` (given only when the shard has labels).
    fn read(
        &self,
        sample: i64,
        seq: u8,
        start: i64,
        tokens: &mut [i32],
        labels: Option<&mut [i32]>,
    ) -> Result<()>;
}

/// Everything a shard writer needs besides its row range.
pub struct ShardContext<'a> {
    pub out: ShardOut<'a>,
    pub plan: &'a Plan,
    pub source: &'a dyn SampleSource,
    pub has_labels: bool,
    /// The plan's units are preference pairs, each written as two or three segments.
    pub pairs: Option<&'a Pairs>,
    pub carried: &'a [Carried],
}

pub(crate) fn list(offsets: &[i32], values: ArrayRef) -> ArrayRef {
    let field = Arc::new(Field::new("item", values.data_type().clone(), true));
    let offsets = OffsetBuffer::new(offsets.to_vec().into());
    Arc::new(ListArray::new(field, offsets, values, None))
}

/// Writes shard `shard` holding plan rows `rows`.
pub fn write_shard(ctx: &ShardContext, shard: usize, rows: Range<usize>) -> Result<ShardInfo> {
    let schema = shard_schema(ctx.has_labels, ctx.pairs.is_some(), ctx.carried);
    write_rows(&ctx.out, shard, rows, &schema, |range, index, info| {
        row_group(ctx, &schema, range, index, info)
    })
}

/// Where and how shards are written, whatever their rows hold.
pub struct ShardOut<'a> {
    pub dir: &'a Path,
    pub row_group_rows: usize,
    pub compression: Compression,
    pub progress: &'a Progress,
}

/// Writes shard `shard` of `schema` holding rows `rows`, each row group's batch made by
/// `batch` (which records each row in the index and the shard's counts, [`IndexColumns::row`]).
pub(crate) fn write_rows(
    ctx: &ShardOut,
    shard: usize,
    rows: Range<usize>,
    schema: &SchemaRef,
    make: impl Fn(Range<usize>, &mut IndexColumns, &mut ShardInfo) -> Result<RecordBatch>,
) -> Result<ShardInfo> {
    let name = shard_name(shard);
    let index_file = index_name(shard);
    let path = ctx.dir.join(&name);
    let props = WriterProperties::builder()
        .set_compression(ctx.compression)
        .set_max_row_group_row_count(Some(ctx.row_group_rows))
        .set_created_by(format!("tokpack {}", env!("CARGO_PKG_VERSION")))
        .build();
    let file = File::create(&path).output(&path)?;
    let sink = Hashing::new(BufWriter::with_capacity(1 << 20, file));
    let mut writer = ArrowWriter::try_new(sink, schema.clone(), Some(props)).output(&path)?;
    // `sync` pushes parquet's buffered bytes into the sink, so each cut ends exactly at the
    // bytes written so far: first the magic, then one range per row group.
    writer.sync().output(&path)?;
    writer.inner_mut().cut();
    let mut write_behind = WriteBehind::default();
    let mut index = IndexColumns::default();
    let mut info = ShardInfo {
        file: name,
        index: index_file.clone(),
        rows: rows.len() as u64,
        ..ShardInfo::default()
    };
    // An empty shard (every sample dropped) has no row group; its footer still holds the schema.
    let mut start = rows.start;
    while start < rows.end {
        ctx.progress.check()?;
        let end = (start + ctx.row_group_rows).min(rows.end);
        let batch = make(start..end, &mut index, &mut info)?;
        writer.write(&batch).output(&path)?;
        writer.flush().output(&path)?;
        writer.sync().output(&path)?;
        let sink = writer.inner_mut();
        let range = sink.cut();
        sink.inner.flush().output(&path)?;
        write_behind.advance(sink.inner.get_ref(), sink.pos);
        check_group_range(&path, writer.flushed_row_groups(), info.row_groups, &range)?;
        info.row_group_bytes.push(range);
        info.row_groups += 1;
        ctx.progress.advance((end - start) as u64);
        start = end;
    }
    let mut sink = writer.into_inner().output(&path)?;
    sink.flush().output(&path)?;
    info.footer_bytes = sink.cut();
    info.size = sink.pos;
    info.checksum = xxh3_hex(sink.hasher.finish_128());
    (info.index_size, info.index_checksum) = write_index(&ctx.dir.join(&index_file), index)?;
    Ok(info)
}

/// The column chunks of row group `group` must lie inside `range`, the bytes written while it
/// was flushed: otherwise the recorded ranges would not cover what readers decode.
fn check_group_range(
    path: &Path,
    flushed: &[parquet::file::metadata::RowGroupMetaData],
    group: u64,
    range: &ByteRange,
) -> Result<()> {
    let inside = flushed.get(group as usize).is_some_and(|g| {
        g.columns().iter().all(|c| {
            let (start, len) = c.byte_range();
            start >= range.offset && start + len <= range.offset + range.length
        })
    }) && flushed.len() as u64 == group + 1;
    if inside {
        Ok(())
    } else {
        Err(CoreError::Output {
            path: path.to_path_buf(),
            what: format!("row group {group} was not written within bytes {range:?}"),
            source: None,
        })
    }
}

#[derive(Default)]
pub(crate) struct IndexColumns {
    offset: Vec<i64>,
    num_tokens: Vec<i32>,
    num_seqs: Vec<i32>,
    num_loss_tokens: Vec<i32>,
}

impl IndexColumns {
    /// Records the shard's next row (`tokens` tokens, `seqs` sequences, `loss` loss tokens)
    /// in the index and in `info`'s counts.
    pub(crate) fn row(&mut self, info: &mut ShardInfo, tokens: i32, seqs: i32, loss: i32) {
        self.offset.push(info.tokens as i64);
        self.num_tokens.push(tokens);
        self.num_seqs.push(seqs);
        self.num_loss_tokens.push(loss);
        info.tokens += tokens as u64;
        info.loss_tokens += loss as u64;
    }
}

/// Writes the index side file; returns its size and checksum (the manifest records both, so
/// every reader and the cache check catch a damaged index as they do a damaged shard).
fn write_index(path: &Path, index: IndexColumns) -> Result<(u64, String)> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).output(dir)?;
    }
    let batch = RecordBatch::try_new(
        index_schema(),
        vec![
            Arc::new(Int64Array::from(index.offset)),
            Arc::new(Int32Array::from(index.num_tokens)),
            Arc::new(Int32Array::from(index.num_seqs)),
            Arc::new(Int32Array::from(index.num_loss_tokens)),
        ],
    )
    .output(path)?;
    let file = File::create(path).output(path)?;
    let sink = Hashing::new(BufWriter::new(file));
    let mut w = FileWriter::try_new(sink, &index_schema()).output(path)?;
    w.write(&batch).output(path)?;
    w.finish().output(path)?;
    let mut sink = w.into_inner().output(path)?;
    sink.flush().output(path)?;
    Ok((sink.pos, xxh3_hex(sink.hasher.finish_128())))
}

/// The segments of plan rows `rows`: each plan unit is one segment, or a pair's two or three.
/// Returns `(sample, part)` per segment and each row's end in them.
fn expand(ctx: &ShardContext, rows: Range<usize>) -> (Vec<(i64, Part)>, Vec<usize>) {
    let plan = ctx.plan;
    let units = plan.bin_offsets[rows.start] as usize..plan.bin_offsets[rows.end] as usize;
    let mut segments = Vec::with_capacity(units.len() * if ctx.pairs.is_some() { 3 } else { 1 });
    let mut row_ends = Vec::with_capacity(rows.len());
    let mut parts = Vec::with_capacity(3);
    for r in rows {
        for k in plan.bin_offsets[r] as usize..plan.bin_offsets[r + 1] as usize {
            let sample = plan.sample_ids[k];
            match ctx.pairs {
                Some(pairs) => {
                    parts.clear();
                    pairs.parts(sample, &mut parts);
                    segments.extend(parts.iter().map(|&p| (sample, p)));
                }
                None => segments.push((
                    sample,
                    Part {
                        seq: 0,
                        start: plan.starts[k],
                        len: plan.lengths[k],
                        role: 0,
                    },
                )),
            }
        }
        row_ends.push(segments.len());
    }
    (segments, row_ends)
}

/// Gathers plan rows `rows` from the spill into one record batch.
fn row_group(
    ctx: &ShardContext,
    schema: &SchemaRef,
    rows: Range<usize>,
    index: &mut IndexColumns,
    info: &mut ShardInfo,
) -> Result<RecordBatch> {
    let plan = ctx.plan;
    let (segments, row_ends) = expand(ctx, rows.clone());
    let total: usize = segments.iter().map(|(_, p)| p.len as usize).sum();
    let mut tokens = vec![0i32; total];
    let mut labels = vec![0i32; if ctx.has_labels { total } else { 0 }];
    let mut seg_loss = Vec::with_capacity(segments.len());
    let mut pos = 0usize;
    for &(sample, part) in &segments {
        let len = part.len as usize;
        let span = pos..pos + len;
        let mut out_labels = ctx.has_labels.then(|| &mut labels[span.clone()]);
        let out = &mut tokens[span];
        ctx.source
            .read(sample, part.seq, part.start, out, out_labels.as_deref_mut())?;
        let trained = |l: &mut [i32]| l.iter().filter(|&&v| v != IGNORE_INDEX).count();
        seg_loss.push(out_labels.map_or(len, trained) as i32);
        pos += len;
    }
    // Row-level offsets into this row group's tokens and segments.
    let mut tok_offsets = Vec::with_capacity(rows.len() + 1);
    let mut seg_offsets = Vec::with_capacity(rows.len() + 1);
    let first = index.offset.len();
    let mut t = 0i64;
    tok_offsets.push(0i32);
    seg_offsets.push(0i32);
    let mut a = 0usize;
    for &b in &row_ends {
        let n: i64 = segments[a..b].iter().map(|(_, p)| p.len).sum();
        t += n;
        tok_offsets.push(t as i32);
        seg_offsets.push(b as i32);
        index.row(info, n as i32, (b - a) as i32, seg_loss[a..b].iter().sum());
        a = b;
    }
    let of_rows = |column: &[i32]| Arc::new(Int32Array::from(column[first..].to_vec())) as ArrayRef;
    let seq_lengths: Vec<i32> = segments.iter().map(|(_, p)| p.len as i32).collect();
    let sample_ids: Vec<i64> = segments.iter().map(|&(s, _)| s).collect();
    let mut columns: Vec<ArrayRef> = vec![list(&tok_offsets, Arc::new(Int32Array::from(tokens)))];
    if ctx.has_labels {
        columns.push(list(&tok_offsets, Arc::new(Int32Array::from(labels))));
    }
    columns.extend([
        list(&seg_offsets, Arc::new(Int32Array::from(seq_lengths))),
        list(&seg_offsets, Arc::new(Int64Array::from(sample_ids.clone()))),
        of_rows(&index.num_tokens),
        of_rows(&index.num_seqs),
        of_rows(&index.num_loss_tokens),
        list(&seg_offsets, Arc::new(Int32Array::from(seg_loss))),
    ]);
    if ctx.pairs.is_some() {
        let roles: Vec<i8> = segments.iter().map(|(_, p)| p.role).collect();
        let num_pairs: Vec<i32> = rows
            .map(|r| (plan.bin_offsets[r + 1] - plan.bin_offsets[r]) as i32)
            .collect();
        columns.extend([
            list(&seg_offsets, Arc::new(Int8Array::from(roles))),
            Arc::new(Int32Array::from(num_pairs)) as ArrayRef,
        ]);
    }
    let starts: Vec<i64> = segments.iter().map(|(_, p)| p.start).collect();
    for carried in ctx.carried {
        let values = per_segment(carried, &sample_ids, &starts, ctx.out.dir)?;
        columns.push(list(&seg_offsets, values));
    }
    RecordBatch::try_new(schema.clone(), columns).output(ctx.out.dir)
}

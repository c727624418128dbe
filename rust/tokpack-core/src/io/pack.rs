//! `pack_files`: token shards on disk in, packed shards out, with memory bounded by the number
//! of samples (a few bytes each) and the row-group size, not by the number of tokens.
//!
//! 1. Read every unit (row group / record batch) in parallel, checking values, and append the
//!    tokens (and labels) to per-thread spill files; keep only each sample's length and location.
//! 2. Plan from the lengths (`crate::plan`).
//! 3. Write shards in parallel, each row group gathered from the spill by positioned reads.
//!
//! Output bytes depend only on the inputs and the config: the spill layout varies with thread
//! scheduling but is only ever addressed through the per-sample locations.

use super::carry::{carried_values, concat, with_pieces, Carried};
use super::columns::{flatten_sequence, BatchAt, Role};
use super::pagecache::inputs_read_once;
use super::pairs::{pair_lengths, plan_pairs, PairLayout, PairLengths, SEQ_REJECTED};
use super::progress::{Phase, Progress};
pub use super::read_columns::LabelSource;
use super::read_columns::{open_all, resolve_columns, Columns};
use super::source::Source;
use super::spill::{Spill, SpillReader};
use super::trees::{check_group_column, pack_trees, TreeCounts, TreeJob};
use super::writer::{
    parse_compression, write_shard, SampleSource, ShardContext, ShardInfo, ShardOut,
};
use crate::config::PackConfig;
use crate::cuts::Cuts;
use crate::error::{Context, CoreError, Location, Result};
use crate::format::{col, MEDIA_COLUMNS};
use crate::kind::CutRule;
use crate::kind::PAIR_COLUMNS;
use crate::media::{media_cuts, parse_media, MediaCuts, String3};
use crate::plan::{Plan, PlanConfig};
use crate::policy::{SampleKind, Strategy};
use arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use arrow::datatypes::{DataType, Int64Type};
use rayon::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct PackFilesConfig {
    pub paths: Vec<PathBuf>,
    /// Directory the shards are written into (it must exist).
    pub out_dir: PathBuf,
    /// Empty directory for the spill files (removed by the caller).
    pub spill_dir: PathBuf,
    /// The pack options, a config `for_kind` of the inputs: the plan, the columns read (for
    /// preference token shards the [`PAIR_COLUMNS`], packed as units in its pair layout), the
    /// carried columns, the shard layout and prefix trees' options.
    pub config: PackConfig,
    /// Rows decoded at a time inside a unit (bounds the memory of reading).
    pub batch_rows: usize,
    /// The kind of samples (`crate::kind`): multimodal samples are cut only at safe blocks,
    /// planned here once ([`crate::media`]), each piece carrying its own media; tree samples
    /// are packed as prefix trees (`super::trees`).
    pub kind: SampleKind,
}

#[derive(Default)]
pub struct PackOutcome {
    /// Samples (pairs for preference shards) in each input file, in order.
    pub input_rows: Vec<u64>,
    pub plan: Plan,
    pub has_labels: bool,
    pub shards: Vec<ShardInfo>,
    /// Each input file's content fingerprint (`super::fingerprint`), taken while reading it.
    pub input_fingerprints: Vec<String>,
    /// Multimodal samples dropped for having no safe cut (ascending).
    pub no_safe_cut: Vec<i64>,
    /// Prefix trees' figures ([`SampleKind::Tree`]).
    pub tree: Option<TreeCounts>,
}

/// The spilled samples, found through each sample's spill location (and, for pairs, the
/// rejected sequence's) and length.
struct Spilled<'a> {
    read: &'a UnitOut,
    reader: &'a SpillReader,
}

impl SampleSource for Spilled<'_> {
    fn read(
        &self,
        sample: i64,
        seq: u8,
        start: i64,
        tokens: &mut [i32],
        labels: Option<&mut [i32]>,
    ) -> Result<()> {
        let s = sample as usize;
        let read = self.read;
        let (loc, n) = match (seq == SEQ_REJECTED, read.pairs.get(s)) {
            (true, Some(p)) => (read.rejected[s], i64::from(p.rejected)),
            (false, Some(p)) => (read.locations[s], i64::from(p.chosen)),
            (_, None) => (read.locations[s], read.lengths[s]),
        };
        self.reader.read(loc, n, start, tokens, labels)
    }
}

/// What was read of one unit (or, concatenated, of all of them): per sample its length (plain
/// samples) or its pair's lengths, its spill locations, and the chunks of the carried columns.
#[derive(Default)]
struct UnitOut {
    rows: u64,
    lengths: Vec<i64>,
    pairs: Vec<PairLengths>,
    locations: Vec<u64>,
    rejected: Vec<u64>,
    carried: Vec<Vec<ArrayRef>>,
    /// The unit's part of its file and that part's digest (`super::fingerprint`).
    digest: Option<(usize, u128)>,
}

impl UnitOut {
    fn new(columns: &Columns) -> Self {
        Self {
            carried: vec![Vec::new(); columns.carry.len()],
            ..Self::default()
        }
    }

    fn append(&mut self, other: UnitOut) {
        self.rows += other.rows;
        self.lengths.extend_from_slice(&other.lengths);
        self.pairs.extend_from_slice(&other.pairs);
        self.locations.extend_from_slice(&other.locations);
        self.rejected.extend_from_slice(&other.rejected);
        self.carried.resize_with(other.carried.len(), Vec::new);
        for (all, chunks) in self.carried.iter_mut().zip(other.carried) {
            all.extend(chunks);
        }
    }
}

fn read_unit(
    source: &Source,
    unit: usize,
    columns: &Columns,
    batch_rows: usize,
    spill: Option<&Spill>,
    hashed: bool,
    progress: &Progress,
) -> Result<UnitOut> {
    let names = columns.names();
    let at = Location::unit(&source.path, source.unit_kind, unit);
    let mut out = UnitOut::new(columns);
    let worker = rayon::current_thread_index().unwrap_or(0);
    out.digest = source.read_unit(unit, &names, batch_rows, hashed, |batch| {
        progress.check()?;
        let loc = BatchAt {
            unit: &at,
            row_base: out.rows,
        };
        let column = |name: &str| batch.column_by_name(name).expect("projected column");
        // A sequence's tokens (and labels) read and spilled: the flat tokens, each row's
        // location in the spill.
        let spilled = |tokens: &str, labels: Option<(&str, Role)>| {
            let labels = labels.map(|(name, role)| (column(name), name, role));
            let (flat, labels) = flatten_sequence((column(tokens), tokens), labels, &loc)?;
            let labels = labels.as_ref().map(|l| &l.values[..]);
            let locations = match spill {
                Some(spill) => spill.append(worker, &flat.values, &flat.offsets, labels)?,
                None => Vec::new(),
            };
            Ok::<_, CoreError>((flat, locations))
        };
        match columns.pairs {
            Some(layout) => {
                let [ci, cl, ri, rl, p] = PAIR_COLUMNS;
                let (chosen, c) = spilled(ci, Some((cl, Role::Labels)))?;
                let (rejected, r) = spilled(ri, Some((rl, Role::Labels)))?;
                let prompts = column(p);
                let lengths = pair_lengths(&chosen, &rejected, prompts, layout, &loc)?;
                out.pairs.extend(lengths);
                out.locations.extend(c);
                out.rejected.extend(r);
            }
            None => {
                let labels = columns.labels.as_ref().map(|(c, r)| (c.as_str(), *r));
                let (tokens, locations) = spilled(&columns.tokens, labels)?;
                out.lengths
                    .extend(tokens.offsets.windows(2).map(|w| w[1] - w[0]));
                out.locations.extend(locations);
            }
        }
        for (chunks, (name, _)) in out.carried.iter_mut().zip(&columns.carry) {
            chunks.push(carried_values(column(name), name, &loc)?);
        }
        out.rows += batch.num_rows() as u64;
        progress.add_samples(batch.num_rows() as u64);
        Ok(())
    })?;
    progress.advance(1);
    Ok(out)
}

/// Reads all units in parallel; units are concatenated in file order, so sample `i` is the
/// `i`-th row across the inputs. On failure, the error of the first failing unit is returned.
/// Returns the units read, the rows of each file and, with `hashed`, each file's fingerprint
/// taken from the bytes read (plus the parts no unit covers; else there are none).
fn read_all(
    sources: &[Source],
    columns: &Columns,
    batch_rows: usize,
    spill: Option<&Spill>,
    hashed: bool,
    progress: &Progress,
) -> Result<(UnitOut, Vec<u64>, Vec<String>)> {
    let units: Vec<(usize, usize)> = sources
        .iter()
        .enumerate()
        .flat_map(|(s, src)| (0..src.units).map(move |u| (s, u)))
        .collect();
    progress.start(Phase::Reading, units.len() as u64);
    let first_failed = AtomicUsize::new(usize::MAX);
    let results: Vec<Option<Result<UnitOut>>> = units
        .par_iter()
        .enumerate()
        .map(|(i, &(s, u))| {
            if i > first_failed.load(Ordering::Relaxed) {
                return None; // an earlier unit failed: its error is the one reported
            }
            let r = read_unit(&sources[s], u, columns, batch_rows, spill, hashed, progress);
            if r.is_err() {
                first_failed.fetch_min(i, Ordering::Relaxed);
            }
            Some(r)
        })
        .collect();
    let mut all = UnitOut::new(columns);
    let mut rows = vec![0u64; sources.len()];
    let mut digests: Vec<Vec<Option<u128>>> = sources
        .iter()
        .map(|s| vec![None; s.parts.parts.len()])
        .collect();
    for (r, &(s, _)) in results.into_iter().zip(&units) {
        let Some(unit) = r.transpose()? else {
            continue;
        };
        if let Some((part, digest)) = unit.digest {
            digests[s][part] = Some(digest);
        }
        rows[s] += unit.rows;
        all.append(unit);
    }
    let fingerprints = if !hashed {
        Vec::new()
    } else {
        sources
            .par_iter()
            .zip(digests.par_iter_mut())
            .map(|(source, digests)| {
                let file = super::filebytes::open_file(&source.path)?;
                let at = Location::file(&source.path);
                source.parts.finish(&file, &at, digests)
            })
            .collect::<Result<Vec<_>>>()?
    };
    Ok((all, rows, fingerprints))
}

fn no_samples(paths: &[PathBuf]) -> CoreError {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    CoreError::data(format!("the inputs hold no samples: {}", names.join(", ")))
}

/// The file and row of global sample `index`.
fn locate(sources: &[Source], rows: &[u64], index: usize) -> Location {
    let mut base = 0u64;
    for (s, &n) in sources.iter().zip(rows) {
        if (index as u64) < base + n {
            return Location {
                row: Some(index as u64 - base),
                ..Location::file(&s.path)
            };
        }
        base += n;
    }
    Location::default()
}

/// Sample lengths of the token column of every input (for `stats`), and rows per file. With
/// `pairs`, the inputs are preference shards and a sample's length is its pair's footprint in
/// that layout, as `pack_files` plans it (0 for a pair it drops as empty).
pub fn read_lengths(
    paths: &[PathBuf],
    tokens_column: &str,
    pairs: Option<PairLayout>,
    batch_rows: usize,
    progress: &Progress,
) -> Result<(Vec<i64>, Vec<u64>)> {
    let sources = open_all(paths)?;
    let columns = resolve_columns(&sources, tokens_column, &LabelSource::None, pairs, &[])?;
    let (read, rows, _) = read_all(&sources, &columns, batch_rows, None, false, progress)?;
    if read.rows == 0 {
        return Err(no_samples(paths));
    }
    progress.start(Phase::Done, 0);
    let lengths = match pairs {
        Some(layout) => read
            .pairs
            .iter()
            .map(|p| if p.is_empty() { 0 } else { p.footprint(layout) })
            .collect(),
        None => read.lengths,
    };
    Ok((lengths, rows))
}

/// The media cuts of multimodal samples read (`read`), from their carried `media` and
/// `vision_tokens` columns; `bad(sample, why)` names a sample whose media is not a list.
fn media_cuts_of(
    read: &UnitOut,
    columns: &Columns,
    plan: &PlanConfig,
    bad: impl Fn(usize, String) -> CoreError,
) -> Result<Option<MediaCuts>> {
    let column = |name: &str, to: &DataType| -> Result<ArrayRef> {
        let k = columns.carry.iter().position(|(c, _)| c == name);
        let k = k.ok_or_else(|| CoreError::Config(format!("{name:?} is not carried")))?;
        let values = concat(&read.carried[k], &columns.carry[k].1)?;
        arrow::compute::cast(&values, to).corrupt(&Location::default(), "cannot read media")
    };
    let media = column(col::MEDIA, &DataType::Utf8)?;
    let media = media.as_string::<i32>();
    let vision = column(col::VISION_TOKENS, &DataType::Int64)?;
    let vision = vision.as_primitive::<Int64Type>();
    let random = plan.strategy == Strategy::Random;
    media_cuts(
        &read.lengths,
        |i| {
            let with_images = vision.is_valid(i) && vision.value(i) > 0;
            with_images.then(|| parse_media(media.value(i)).map_err(|e| bad(i, e)))
        },
        i64::from(plan.max_len),
        plan.overlong,
        random,
    )
}

/// Each named column's values.
type ColumnValues = Vec<(String, ArrayRef)>;

/// The pieces carrying their own media and each media column's values for them, typed as the
/// carried columns (none when no piece is cut).
fn piece_arrays(
    (pieces, values): (Cuts, String3),
    columns: &Columns,
) -> Result<(Option<Cuts>, ColumnValues)> {
    if pieces.samples.is_empty() {
        return Ok((None, Vec::new()));
    }
    let (media, tokens, patches) = values;
    let arrays: [ArrayRef; 3] = [
        Arc::new(StringArray::from(media)),
        Arc::new(Int64Array::from(tokens)),
        Arc::new(Int64Array::from(patches)),
    ];
    let typed = MEDIA_COLUMNS
        .iter()
        .zip(arrays)
        .map(|(name, array)| {
            let (_, to) = columns
                .carry
                .iter()
                .find(|(c, _)| c == name)
                .expect("carried");
            let array = arrow::compute::cast(&array, to);
            Ok((
                name.to_string(),
                array.corrupt(&Location::default(), "media values")?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((Some(pieces), typed))
}

/// The carried columns of the samples read (`chunks`: each column's, in sample order), each
/// with the values of the pieces some samples are packed in (`pieces`, `piece_values`).
fn carried_columns(
    columns: &Columns,
    chunks: Vec<Vec<ArrayRef>>,
    pieces: Option<&Arc<Cuts>>,
    piece_values: &ColumnValues,
) -> Result<Vec<Carried>> {
    columns
        .carry
        .iter()
        .zip(chunks)
        .map(|((name, data_type), chunks)| {
            let values = piece_values.iter().find(|(n, _)| n == name).map(|(_, v)| v);
            with_pieces(name, concat(&chunks, data_type)?, pieces, values)
        })
        .collect()
}

/// Packs the token shards `job.paths` into `job.out_dir`. Call inside `pool::install`.
pub fn pack_files(job: &PackFilesConfig, progress: &Progress) -> Result<PackOutcome> {
    let config = &job.config;
    let out = ShardOut {
        dir: &job.out_dir,
        row_group_rows: config.row_group_rows,
        compression: parse_compression(&config.compression)?,
        progress,
    };
    let mut sources = open_all(&job.paths)?;
    let read_once = inputs_read_once(sources.iter().map(|s| s.parts.size).sum());
    for source in &mut sources {
        source.read_once = read_once;
    }
    let columns = resolve_columns(
        &sources,
        &config.tokens_column,
        &config.labels(),
        config.pair_layout,
        &config.carry,
    )?;
    let has_labels = columns.pairs.is_some() || columns.labels.is_some();
    let tree = job.kind == SampleKind::Tree;
    if tree {
        check_group_column(&sources, config.tree_group_column())?;
    }
    let spill = Spill::create(&job.spill_dir, rayon::current_num_threads(), has_labels)?;
    let (mut read, input_rows, input_fingerprints) = read_all(
        &sources,
        &columns,
        job.batch_rows,
        Some(&spill),
        true,
        progress,
    )?;
    if read.rows == 0 {
        return Err(no_samples(&job.paths));
    }
    let locate = |i: usize| locate(&sources, &input_rows, i);
    if tree {
        let packed = pack_tree_files(config, &columns, read, spill, out, &locate)?;
        progress.start(Phase::Done, 0);
        return Ok(PackOutcome {
            input_rows,
            input_fingerprints,
            ..packed
        });
    }
    progress.start(Phase::Planning, 1);
    let media = match job.kind.spec().cut {
        CutRule::SafeBlocks => {
            media_cuts_of(&read, &columns, &config.plan, |i, what| CoreError::Data {
                at: Box::new(Location {
                    column: Some(col::MEDIA.into()),
                    ..locate(i)
                }),
                what,
            })?
        }
        _ => None,
    };
    let locate_overlong = |mut e: CoreError, column: Option<&str>| {
        if let CoreError::Overlong { at, index, .. } = &mut e {
            **at = Location {
                column: column.map(str::to_string),
                ..locate(*index)
            };
        }
        e
    };
    let (plan, pairs) = match config.pair_layout {
        Some(layout) => {
            let (plan, pairs) = plan_pairs(&read.pairs, layout, &config.plan)
                .map_err(|e| locate_overlong(e, None))?;
            (plan, Some(pairs))
        }
        None => {
            let cuts = media.as_ref().map(|m| &m.cuts);
            let plan = crate::plan::plan_cut(&read.lengths, &config.plan, cuts)
                .map_err(|e| locate_overlong(e, Some(&config.tokens_column)))?;
            (plan, None)
        }
    };
    let (pieces, piece_values) = match &media {
        Some(m) => m.pieces(&plan).and_then(|p| piece_arrays(p, &columns))?,
        None => (None, Vec::new()),
    };
    let pieces = pieces.map(Arc::new);
    let chunks = std::mem::take(&mut read.carried);
    let carried = carried_columns(&columns, chunks, pieces.as_ref(), &piece_values)?;
    progress.advance(1);
    let reader = spill.into_reader();
    let n_rows = plan.n_bins();
    let rows_per_shard = config.rows_per_shard;
    // An empty shard still carries the schema when every sample was dropped.
    let n_shards = n_rows.div_ceil(rows_per_shard).max(1);
    progress.start(Phase::Writing, n_rows as u64);
    let ctx = ShardContext {
        out,
        plan: &plan,
        source: &Spilled {
            read: &read,
            reader: &reader,
        },
        has_labels,
        pairs: pairs.as_ref(),
        carried: &carried,
    };
    let shards: Vec<Result<ShardInfo>> = (0..n_shards)
        .into_par_iter()
        .map(|s| {
            let a = s * rows_per_shard;
            write_shard(&ctx, s, a.min(n_rows)..(a + rows_per_shard).min(n_rows))
        })
        .collect();
    let shards = shards.into_iter().collect::<Result<Vec<_>>>()?;
    progress.start(Phase::Done, 0);
    Ok(PackOutcome {
        input_rows,
        plan,
        has_labels,
        shards,
        input_fingerprints,
        no_safe_cut: media.map(|m| m.no_safe_cut).unwrap_or_default(),
        tree: None,
    })
}

/// The read and spilled samples of tree token shards packed as prefix trees
/// (`super::trees`); their shards have no `labels` column (the targets are the trees').
fn pack_tree_files(
    config: &PackConfig,
    columns: &Columns,
    mut read: UnitOut,
    spill: Spill,
    out: ShardOut,
    locate: &(dyn Fn(usize) -> Location + Sync),
) -> Result<PackOutcome> {
    let chunks = std::mem::take(&mut read.carried);
    let carried = carried_columns(columns, chunks, None, &Vec::new())?;
    let reader = spill.into_reader();
    let data = super::trees::Spilled {
        locate,
        lengths: &read.lengths,
        locations: &read.locations,
        reader: &reader,
        has_labels: columns.labels.is_some(),
        carried: &carried,
        tokens_column: &config.tokens_column,
        labels_column: columns.labels.as_ref().map(|(c, _)| c.as_str()),
    };
    let progress = out.progress;
    let job = TreeJob {
        plan: &config.plan,
        min_shared: config.tree_min_shared as usize,
        max_path: config.tree_max_path.unwrap_or(config.plan.max_len),
        out,
        rows_per_shard: config.rows_per_shard,
    };
    let packed = pack_trees(&data, &job, progress)?;
    Ok(PackOutcome {
        plan: packed.plan,
        shards: packed.shards,
        tree: Some(packed.counts),
        ..PackOutcome::default()
    })
}

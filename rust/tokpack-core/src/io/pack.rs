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

use super::columns::{check_aligned, check_type, flatten, labels_from_mask, BatchAt, Role};
use super::progress::{Phase, Progress};
use super::source::Source;
use super::spill::{Spill, SpillReader};
use super::writer::{write_shard, SampleSource, ShardContext, ShardInfo};
use crate::error::{CoreError, Location, Result};
use crate::plan::{Plan, PlanConfig};
use parquet::basic::Compression;
use rayon::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where labels come from.
#[derive(Clone, Debug)]
pub enum LabelSource {
    /// No labels.
    None,
    /// A labels column (-100 = not trained on). With `required: false` it is used when every
    /// input has it and ignored when none has.
    Labels { column: String, required: bool },
    /// A 0/1 loss-mask column; labels are the tokens where it is 1, -100 elsewhere.
    LossMask(String),
}

pub struct PackFilesConfig {
    pub paths: Vec<PathBuf>,
    /// Directory the shards are written into (it must exist).
    pub out_dir: PathBuf,
    /// Empty directory for the spill files (removed by the caller).
    pub spill_dir: PathBuf,
    pub tokens_column: String,
    pub labels: LabelSource,
    pub plan: PlanConfig,
    pub rows_per_shard: usize,
    pub row_group_rows: usize,
    pub compression: Compression,
    /// Rows decoded at a time inside a unit (bounds the memory of reading).
    pub batch_rows: usize,
}

pub struct PackOutcome {
    /// Samples in each input file, in order.
    pub input_rows: Vec<u64>,
    pub plan: Plan,
    pub has_labels: bool,
    pub shards: Vec<ShardInfo>,
}

/// The spilled samples, found through each sample's spill location.
struct Spilled<'a> {
    locations: &'a [u64],
    reader: &'a SpillReader,
}

impl SampleSource for Spilled<'_> {
    fn tokens(&self, sample: i64, start: i64, out: &mut [i32]) -> Result<()> {
        self.reader
            .tokens(self.locations[sample as usize], start, out)
    }
    fn labels(&self, sample: i64, start: i64, out: &mut [i32]) -> Result<()> {
        self.reader
            .labels(self.locations[sample as usize], start, out)
    }
}

/// The resolved columns to read from every file.
struct Columns {
    tokens: String,
    labels: Option<(String, Role)>,
}

fn resolve_columns(sources: &[Source], tokens: &str, labels: &LabelSource) -> Result<Columns> {
    let has = |s: &Source, c: &str| s.schema.index_of(c).is_ok();
    let labels = match labels {
        LabelSource::None => None,
        LabelSource::LossMask(c) => Some((c.clone(), Role::LossMask)),
        LabelSource::Labels { column, required } => {
            let missing: Vec<&Source> = sources.iter().filter(|s| !has(s, column)).collect();
            if missing.is_empty() {
                Some((column.clone(), Role::Labels))
            } else if missing.len() == sources.len() && !required {
                None
            } else {
                // Present in some files only, or asked for explicitly: name a file lacking it.
                missing[0].column_indices(&[column.as_str()])?;
                None
            }
        }
    };
    for s in sources {
        let file = Location::file(&s.path);
        let mut wanted = vec![(tokens, Role::Tokens)];
        if let Some((c, role)) = &labels {
            wanted.push((c.as_str(), *role));
        }
        for (column, role) in wanted {
            let idx = s.column_indices(&[column])?[0];
            check_type(&file, column, s.schema.field(idx).data_type(), role)?;
        }
    }
    Ok(Columns {
        tokens: tokens.to_string(),
        labels,
    })
}

/// Lengths and spill locations of one unit's samples.
struct UnitOut {
    lengths: Vec<i64>,
    locations: Vec<u64>,
}

fn read_unit(
    source: &Source,
    unit: usize,
    columns: &Columns,
    batch_rows: usize,
    spill: Option<&Spill>,
    progress: &Progress,
) -> Result<UnitOut> {
    let mut names = vec![columns.tokens.as_str()];
    if let Some((c, _)) = &columns.labels {
        names.push(c.as_str());
    }
    let at = Location::unit(&source.path, source.unit_kind, unit);
    let mut out = UnitOut {
        lengths: Vec::new(),
        locations: Vec::new(),
    };
    let worker = rayon::current_thread_index().unwrap_or(0);
    source.read_unit(unit, &names, batch_rows, |batch| {
        progress.check()?;
        let loc = BatchAt {
            unit: &at,
            row_base: out.lengths.len() as u64,
        };
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| CoreError::Schema {
                at: Box::new(Location::file(&source.path)),
                what: format!("no column {name:?}"),
            })
        };
        let tokens = flatten(
            column(&columns.tokens)?,
            &columns.tokens,
            Role::Tokens,
            &loc,
        )?;
        let labels = match &columns.labels {
            Some((name, role)) => {
                let flat = flatten(column(name)?, name, *role, &loc)?;
                check_aligned(&tokens, &flat, name, &loc)?;
                Some(match role {
                    Role::LossMask => labels_from_mask(&tokens.values, &flat.values),
                    _ => flat.values,
                })
            }
            None => None,
        };
        let lengths = tokens.offsets.windows(2).map(|w| w[1] - w[0]);
        out.lengths.extend(lengths);
        if let Some(spill) = spill {
            let base = spill.append(worker, &tokens.values, labels.as_deref())?;
            out.locations.extend(
                tokens.offsets[..tokens.offsets.len() - 1]
                    .iter()
                    .map(|&o| base + o as u64),
            );
        }
        progress.add_samples(batch.num_rows() as u64);
        Ok(())
    })?;
    progress.advance(1);
    Ok(out)
}

/// Reads all units in parallel; units are concatenated in file order, so sample `i` is the
/// `i`-th row across the inputs. On failure, the error of the first failing unit is returned.
fn read_all(
    sources: &[Source],
    columns: &Columns,
    batch_rows: usize,
    spill: Option<&Spill>,
    progress: &Progress,
) -> Result<(Vec<i64>, Vec<u64>, Vec<u64>)> {
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
            let r = read_unit(&sources[s], u, columns, batch_rows, spill, progress);
            if r.is_err() {
                first_failed.fetch_min(i, Ordering::Relaxed);
            }
            Some(r)
        })
        .collect();
    let n: usize = results
        .iter()
        .map(|r| match r {
            Some(Ok(u)) => u.lengths.len(),
            _ => 0,
        })
        .sum();
    let mut lengths = Vec::with_capacity(n);
    let mut locations = Vec::with_capacity(if spill.is_some() { n } else { 0 });
    let mut rows = vec![0u64; sources.len()];
    for (r, &(s, _)) in results.into_iter().zip(&units) {
        let unit = match r {
            Some(r) => r?,
            None => continue,
        };
        rows[s] += unit.lengths.len() as u64;
        lengths.extend_from_slice(&unit.lengths);
        locations.extend_from_slice(&unit.locations);
    }
    Ok((lengths, locations, rows))
}

fn open_all(paths: &[PathBuf]) -> Result<Vec<Source>> {
    if paths.is_empty() {
        return Err(CoreError::Config("no input files given".into()));
    }
    paths.iter().map(|p| Source::open(p)).collect()
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

/// Sample lengths of the token column of every input (for `stats`), and rows per file.
pub fn read_lengths(
    paths: &[PathBuf],
    tokens_column: &str,
    batch_rows: usize,
    progress: &Progress,
) -> Result<(Vec<i64>, Vec<u64>)> {
    let sources = open_all(paths)?;
    let columns = resolve_columns(&sources, tokens_column, &LabelSource::None)?;
    let (lengths, _, rows) = read_all(&sources, &columns, batch_rows, None, progress)?;
    if lengths.is_empty() {
        return Err(no_samples(paths));
    }
    progress.start(Phase::Done, 0);
    Ok((lengths, rows))
}

/// The output layout must be positive and a row group's tokens must fit int32 offsets.
pub(crate) fn check_layout(
    rows_per_shard: usize,
    row_group_rows: usize,
    max_len: u32,
) -> Result<()> {
    let max_tokens = row_group_rows as u64 * u64::from(max_len);
    if row_group_rows == 0 || rows_per_shard == 0 || max_tokens > i32::MAX as u64 {
        return Err(CoreError::Config(format!(
            "row_group_rows ({row_group_rows}) and rows_per_shard ({rows_per_shard}) must be \
             positive, and row_group_rows * max_len must fit in int32"
        )));
    }
    Ok(())
}

/// Packs the token shards `config.paths` into `config.out_dir`. Call inside `pool::install`.
pub fn pack_files(config: &PackFilesConfig, progress: &Progress) -> Result<PackOutcome> {
    check_layout(
        config.rows_per_shard,
        config.row_group_rows,
        config.plan.max_len,
    )?;
    let sources = open_all(&config.paths)?;
    let columns = resolve_columns(&sources, &config.tokens_column, &config.labels)?;
    let has_labels = columns.labels.is_some();
    let spill = Spill::create(&config.spill_dir, rayon::current_num_threads(), has_labels)?;
    let (lengths, locations, input_rows) = read_all(
        &sources,
        &columns,
        config.batch_rows,
        Some(&spill),
        progress,
    )?;
    if lengths.is_empty() {
        return Err(no_samples(&config.paths));
    }
    progress.start(Phase::Planning, 1);
    let plan = crate::plan::plan(&lengths, &config.plan).map_err(|e| match e {
        CoreError::Overlong {
            index,
            length,
            max_len,
            ..
        } => CoreError::Overlong {
            at: Box::new(Location {
                column: Some(config.tokens_column.clone()),
                ..locate(&sources, &input_rows, index)
            }),
            index,
            length,
            max_len,
        },
        other => other,
    })?;
    drop(lengths);
    progress.advance(1);
    let reader = spill.into_reader();
    let n_rows = plan.n_bins();
    // An empty shard still carries the schema when every sample was dropped.
    let n_shards = n_rows.div_ceil(config.rows_per_shard).max(1);
    progress.start(Phase::Writing, n_rows as u64);
    let ctx = ShardContext {
        dir: &config.out_dir,
        plan: &plan,
        source: &Spilled {
            locations: &locations,
            reader: &reader,
        },
        has_labels,
        row_group_rows: config.row_group_rows,
        compression: config.compression,
        progress,
    };
    let shards: Vec<Result<ShardInfo>> = (0..n_shards)
        .into_par_iter()
        .map(|s| {
            let a = s * config.rows_per_shard;
            write_shard(
                &ctx,
                s,
                a.min(n_rows)..(a + config.rows_per_shard).min(n_rows),
            )
        })
        .collect();
    let shards = shards.into_iter().collect::<Result<Vec<_>>>()?;
    progress.start(Phase::Done, 0);
    Ok(PackOutcome {
        input_rows,
        plan,
        has_labels,
        shards,
    })
}

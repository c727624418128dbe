//! Prefix trees on disk ([`SampleKind::Tree`](crate::policy::SampleKind)): token shards whose
//! sequences carry a `group` (sequences of one group may share prefixes) into packed shards of
//! tree rows, one row of [`crate::tree`]'s layout per packed row (`docs/format.md`).
//!
//! The tokens are read and spilled as for any kind (`super::pack`); then, with memory bounded
//! by the row group and the largest group, not the corpus:
//!
//! 1. each group's trie is built from its sequences read back from the spill and cut into
//!    pieces at `max_len` ([`tree::build`], [`tree::pieces`]); only the pieces' sizes are kept;
//! 2. the pieces are planned into rows by the configured strategy ([`crate::plan`], the pieces
//!    as its units);
//! 3. each row group rebuilds the groups its pieces come from (the same trie: the build depends
//!    only on the sequences and their order) and lays its rows out ([`tree::layout_each`]).
//!
//! Every step is indexed by sample, group and piece only, so the bytes do not depend on the
//! thread count.

use super::carry::{per_segment, Carried};
use super::progress::{Phase, Progress};
use super::source::Source;
use super::spill::SpillReader;
use super::writer::{
    boundary_fields, list, list_field, write_rows, IndexColumns, ShardInfo, ShardOut,
};
use crate::error::{Context, CoreError, Location, Result};
use crate::format::{col, TREE_COLUMNS};
use crate::plan::{Plan, PlanConfig};
use crate::policy::{Overlong, IGNORE_INDEX};
use crate::tree::{self, Seq, Trained, TreeRows};
use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// The figures of a pack of prefix trees (the report's `tree_*` figures).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeCounts {
    /// Sequences in the rows (packed whole or truncated).
    pub sequences: u64,
    /// Nodes of the groups' tries (before pieces repeat the paths they hang from).
    pub nodes: u64,
    /// Pieces of trees planned into rows.
    pub pieces: u64,
    /// Tokens of the same sequences packed flat, each whole, and the rows that would take.
    pub flat_tokens: u64,
    pub flat_rows: u64,
}

/// Every input's group column holds integers (it is read as a carried column, which takes any
/// scalar).
pub(super) fn check_group_column(sources: &[Source], column: &str) -> Result<()> {
    for s in sources {
        let idx = s.column_indices(&[column])?[0];
        let t = s.schema.field(idx).data_type();
        if !t.is_integer() {
            return Err(CoreError::schema(
                Location::file(&s.path).column(column),
                format!(
                    "has type {t}; the group of a tree's sequence is an integer (int64), \
                     sequences of one group sharing prefixes"
                ),
            ));
        }
    }
    Ok(())
}

/// The samples read and spilled, as `super::pack` holds them.
pub(super) struct Spilled<'a> {
    /// The file and row of a sample.
    pub locate: &'a (dyn Fn(usize) -> Location + Sync),
    pub lengths: &'a [i64],
    pub locations: &'a [u64],
    pub reader: &'a SpillReader,
    pub has_labels: bool,
    /// The carried columns, the group column first.
    pub carried: &'a [Carried],
    pub tokens_column: &'a str,
    pub labels_column: Option<&'a str>,
}

/// How the trees are packed and written.
pub(super) struct TreeJob<'a> {
    pub plan: &'a PlanConfig,
    pub min_shared: usize,
    /// The longest root-to-leaf path (`tree_max_path`, at most `max_len`): a longer sequence
    /// is over-long, and a truncated one keeps this many tokens.
    pub max_path: u32,
    pub out: ShardOut<'a>,
    pub rows_per_shard: usize,
}

/// The kept sequences in groups: group `g` is `members[starts[g]..starts[g + 1]]`, ascending
/// sample ids; groups in order of their group value.
struct Groups {
    members: Vec<usize>,
    starts: Vec<usize>,
}

impl Groups {
    fn of(&self, g: usize) -> &[usize] {
        &self.members[self.starts[g]..self.starts[g + 1]]
    }

    fn len(&self) -> usize {
        self.starts.len() - 1
    }
}

/// Sequences read back from the spill (truncated to `max_len`) with their trained flags.
struct Loaded {
    tokens: Vec<Vec<i64>>,
    trained: Vec<Vec<bool>>,
    has_labels: bool,
}

impl Loaded {
    fn seqs(&self) -> Vec<Seq<'_>> {
        self.tokens
            .iter()
            .zip(&self.trained)
            .map(|(t, f)| {
                let trained = if self.has_labels {
                    Trained::Flags(f)
                } else {
                    Trained::All
                };
                Seq::new(t, trained)
            })
            .collect()
    }
}

impl Spilled<'_> {
    fn at(&self, sample: usize, column: Option<&str>) -> Location {
        Location {
            column: column.map(str::to_string),
            ..(self.locate)(sample)
        }
    }

    /// Sequences `ids` (ascending) from the spill, each its first `max_len` tokens. A label is
    /// -100 or its token: a tree scores each sequence's own next tokens.
    fn load(&self, ids: &[usize], max_len: usize) -> Result<Loaded> {
        let one = |&id: &usize| -> Result<(Vec<i64>, Vec<bool>)> {
            let n = self.lengths[id];
            let keep = (n as usize).min(max_len);
            let mut tokens = vec![0i32; keep];
            let mut labels = vec![0i32; if self.has_labels { keep } else { 0 }];
            let labels_out = self.has_labels.then_some(labels.as_mut_slice());
            self.reader
                .read(self.locations[id], n, 0, &mut tokens, labels_out)?;
            if let Some(j) = (0..labels.len())
                .find(|&j| !matches!(labels[j], IGNORE_INDEX) && labels[j] != tokens[j])
            {
                return Err(CoreError::Data {
                    at: Box::new(self.at(id, self.labels_column)),
                    what: format!(
                        "label {} at position {j} is neither -100 nor its token {}: a prefix \
                         tree trains each sequence on its own next tokens",
                        labels[j], tokens[j]
                    ),
                });
            }
            let trained = labels.iter().map(|&l| l != IGNORE_INDEX).collect();
            Ok((tokens.into_iter().map(i64::from).collect(), trained))
        };
        let read: Vec<(Vec<i64>, Vec<bool>)> = ids.par_iter().map(one).collect::<Result<_>>()?;
        let (tokens, trained) = read.into_iter().unzip();
        Ok(Loaded {
            tokens,
            trained,
            has_labels: self.has_labels,
        })
    }
}

/// What pass 1 learnt: the pieces' sizes (group by group, each group's in `tree::pieces`'
/// order), where each group's pieces start, each piece's group, and the tries' nodes.
struct Pieces {
    sizes: Vec<i64>,
    group_start: Vec<usize>,
    group_of: Vec<u32>,
    nodes: u64,
}

/// The outcome of packing trees: the plan (its units are pieces; its counts of samples,
/// dropped, truncated and input tokens are the sequences') and the shards written.
pub(super) struct Packed {
    pub plan: Plan,
    pub shards: Vec<ShardInfo>,
    pub counts: TreeCounts,
}

/// Packs the spilled sequences as prefix trees into `job.out.dir`.
pub(super) fn pack_trees(data: &Spilled, job: &TreeJob, progress: &Progress) -> Result<Packed> {
    let plan_cfg = job.plan;
    let max_len = job.max_path as usize;
    let n = data.lengths.len();
    let (mut dropped, mut empty, mut truncated) = (Vec::new(), Vec::new(), Vec::new());
    let mut kept = Vec::with_capacity(n);
    for (i, &len) in data.lengths.iter().enumerate() {
        if len == 0 {
            empty.push(i as i64);
            dropped.push(i as i64);
        } else if len as usize > max_len {
            match plan_cfg.overlong {
                Overlong::Drop => dropped.push(i as i64),
                Overlong::Truncate => {
                    truncated.push(i as i64);
                    kept.push(i);
                }
                // `split` is refused with the config (`PackConfig::for_kind`).
                Overlong::Error | Overlong::Split if job.max_path < plan_cfg.max_len => {
                    return Err(CoreError::Data {
                        at: Box::new(data.at(i, Some(data.tokens_column))),
                        what: format!(
                            "sample {i} has {len} tokens, more than tree_max_path={} (the \
                             longest path of a tree); pass overlong=\"truncate\" or \"drop\", \
                             or raise tree_max_path",
                            job.max_path
                        ),
                    })
                }
                Overlong::Error | Overlong::Split => {
                    return Err(CoreError::Overlong {
                        at: Box::new(data.at(i, Some(data.tokens_column))),
                        index: i,
                        length: len,
                        max_len: plan_cfg.max_len,
                    })
                }
            }
        } else {
            kept.push(i);
        }
    }
    let groups = group(data, kept)?;
    progress.start(Phase::Planning, groups.len() as u64);
    let pieces = pass_one(data, job, &groups, progress)?;
    let mut plan = crate::plan::plan(&pieces.sizes, plan_cfg)?;
    let kept_lengths: Vec<i64> = groups
        .members
        .iter()
        .map(|&i| data.lengths[i].min(max_len as i64))
        .collect();
    let flat = crate::plan::plan(&kept_lengths, plan_cfg)?;
    let counts = TreeCounts {
        sequences: groups.members.len() as u64,
        nodes: pieces.nodes,
        pieces: pieces.sizes.len() as u64,
        flat_tokens: flat.total_tokens(),
        flat_rows: flat.n_bins() as u64,
    };
    let n_rows = plan.n_bins();
    let n_shards = n_rows.div_ceil(job.rows_per_shard).max(1);
    progress.start(Phase::Writing, n_rows as u64);
    let schema = tree_schema(data.carried);
    let writer = RowGroups {
        data,
        job,
        groups: &groups,
        pieces: &pieces,
        plan: &plan,
        schema: &schema,
    };
    let shards = (0..n_shards)
        .into_par_iter()
        .map(|s| {
            let a = (s * job.rows_per_shard).min(n_rows);
            let b = (a + job.rows_per_shard).min(n_rows);
            write_rows(&job.out, s, a..b, &schema, |r, index, info| {
                writer.batch(r, index, info)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    plan.n_samples = n;
    plan.input_tokens = data.lengths.iter().map(|&l| l as u64).sum();
    plan.dropped = dropped;
    plan.empty = empty;
    plan.truncated = truncated;
    plan.split = Vec::new();
    Ok(Packed {
        plan,
        shards,
        counts,
    })
}

/// The kept samples grouped by their group value (the group column, carried first).
fn group(data: &Spilled, mut kept: Vec<usize>) -> Result<Groups> {
    let values = arrow::compute::cast(&data.carried[0].values, &DataType::Int64)
        .corrupt(&Location::default(), "cannot read the group column")?;
    let values = values.as_primitive::<Int64Type>();
    debug_assert_eq!(values.len(), data.lengths.len());
    kept.par_sort_unstable_by_key(|&i| (values.value(i), i));
    let mut starts = vec![0];
    for k in 1..kept.len() {
        if values.value(kept[k]) != values.value(kept[k - 1]) {
            starts.push(k);
        }
    }
    if !kept.is_empty() {
        starts.push(kept.len());
    }
    Ok(Groups {
        members: kept,
        starts,
    })
}

/// Pass 1: each group's trie cut into pieces, only their sizes kept.
fn pass_one(data: &Spilled, job: &TreeJob, groups: &Groups, progress: &Progress) -> Result<Pieces> {
    let (max_len, max_path) = (job.plan.max_len as usize, job.max_path as usize);
    let per_group: Vec<(Vec<i64>, u64)> = (0..groups.len())
        .into_par_iter()
        .map(|g| {
            progress.check()?;
            let ids = groups.of(g);
            let loaded = data.load(ids, max_path)?;
            let seqs = loaded.seqs();
            let all: Vec<u32> = (0..ids.len() as u32).collect();
            let forest = tree::build(&seqs, &[all], job.min_shared)?;
            let pieces = tree::pieces(&forest, max_len as u64)?;
            progress.advance(1);
            Ok((
                pieces.iter().map(|p| p.tokens as i64).collect(),
                forest.len() as u64,
            ))
        })
        .collect::<Result<_>>()?;
    let mut out = Pieces {
        sizes: Vec::new(),
        group_start: vec![0],
        group_of: Vec::new(),
        nodes: 0,
    };
    for (g, (sizes, nodes)) in per_group.into_iter().enumerate() {
        out.group_of
            .extend(std::iter::repeat_n(g as u32, sizes.len()));
        out.sizes.extend(sizes);
        out.group_start.push(out.sizes.len());
        out.nodes += nodes;
    }
    Ok(out)
}

/// The packed-shard schema of tree rows: the common columns (no `labels`), the tree columns,
/// then one list column per carried column, one value per sequence.
pub fn tree_schema(carried: &[Carried]) -> SchemaRef {
    let mut fields = vec![list_field(col::INPUT_IDS, DataType::Int32)];
    fields.extend(boundary_fields());
    fields.extend(TREE_COLUMNS.iter().map(|c| list_field(c, DataType::Int32)));
    fields.extend(
        carried
            .iter()
            .map(|c| list_field(&c.name, c.values.data_type().clone())),
    );
    Arc::new(Schema::new(fields))
}

/// Pass 2: the row groups of the planned rows.
struct RowGroups<'a> {
    data: &'a Spilled<'a>,
    job: &'a TreeJob<'a>,
    groups: &'a Groups,
    pieces: &'a Pieces,
    plan: &'a Plan,
    schema: &'a SchemaRef,
}

/// An int32 list column being built, row by row.
struct Lists {
    offsets: Vec<i32>,
    values: Vec<i32>,
}

impl Lists {
    fn new() -> Self {
        Lists {
            offsets: vec![0],
            values: Vec::new(),
        }
    }

    fn push(&mut self, row: impl IntoIterator<Item = i64>, dir: &Path) -> Result<()> {
        self.values.extend(row.into_iter().map(|v| v as i32));
        let end = i32::try_from(self.values.len()).map_err(|_| CoreError::Output {
            path: dir.to_path_buf(),
            what: "a row group's list column holds more than 2^31 values; lower row_group_rows"
                .into(),
            source: None,
        })?;
        self.offsets.push(end);
        Ok(())
    }

    fn array(self) -> ArrayRef {
        list(&self.offsets, Arc::new(Int32Array::from(self.values)))
    }
}

impl RowGroups<'_> {
    /// Planned rows `rows` laid out: the groups their pieces come from rebuilt (sequences in
    /// ascending sample order, as in pass 1), then each row on its own.
    fn lay(&self, rows: Range<usize>) -> Result<(Vec<usize>, Loaded, Vec<TreeRows>)> {
        let (plan, pieces) = (self.plan, self.pieces);
        let row_pieces = |r: usize| {
            &plan.sample_ids[plan.bin_offsets[r] as usize..plan.bin_offsets[r + 1] as usize]
        };
        let mut needed: Vec<u32> = rows
            .clone()
            .flat_map(|r| row_pieces(r).iter().map(|&p| pieces.group_of[p as usize]))
            .collect();
        needed.sort_unstable();
        needed.dedup();
        let mut ids: Vec<usize> = needed
            .iter()
            .flat_map(|&g| self.groups.of(g as usize).iter().copied())
            .collect();
        ids.sort_unstable();
        let local = |id: &usize| ids.binary_search(id).expect("a member") as u32;
        let local_groups: Vec<Vec<u32>> = needed
            .iter()
            .map(|&g| self.groups.of(g as usize).iter().map(local).collect())
            .collect();
        let max_len = self.job.plan.max_len as usize;
        let loaded = self.data.load(&ids, self.job.max_path as usize)?;
        let seqs = loaded.seqs();
        let forest = tree::build(&seqs, &local_groups, self.job.min_shared)?;
        let laid_pieces = tree::pieces(&forest, max_len as u64)?;
        // Where each needed group's pieces start among `laid_pieces`.
        let mut base = Vec::with_capacity(needed.len());
        let mut next = 0usize;
        for &g in &needed {
            base.push(next);
            next += pieces.group_start[g as usize + 1] - pieces.group_start[g as usize];
        }
        let rebuilt = |what: &str| CoreError::Output {
            path: self.job.out.dir.to_path_buf(),
            what: format!("rebuilding the trees of a row group gave other {what} than planned"),
            source: None,
        };
        if next != laid_pieces.len() {
            return Err(rebuilt("pieces"));
        }
        let mut local_rows = Vec::with_capacity(rows.len());
        for r in rows {
            let mut row = Vec::new();
            for &p in row_pieces(r) {
                let g = pieces.group_of[p as usize];
                let k = needed.binary_search(&g).expect("a needed group");
                let q = base[k] + (p as usize - pieces.group_start[g as usize]);
                if laid_pieces[q].tokens as i64 != pieces.sizes[p as usize] {
                    return Err(rebuilt("piece sizes"));
                }
                row.push(q as u32);
            }
            local_rows.push(row);
        }
        let laid = tree::layout_each(&seqs, &forest, &laid_pieces, &local_rows);
        Ok((ids, loaded, laid))
    }

    /// The record batch of planned rows `rows`.
    fn batch(
        &self,
        rows: Range<usize>,
        index: &mut IndexColumns,
        info: &mut ShardInfo,
    ) -> Result<RecordBatch> {
        self.job.out.progress.check()?;
        let dir = self.job.out.dir;
        let (ids, loaded, laid) = self.lay(rows.clone())?;
        let mut input_ids = Lists::new();
        let mut seq_lengths = Lists::new();
        let mut seq_loss = Lists::new();
        let mut tree_cols: Vec<Lists> = TREE_COLUMNS.iter().map(|_| Lists::new()).collect();
        let mut sample_ids: Vec<i64> = Vec::new();
        let (mut num_tokens, mut num_seqs, mut num_loss) = (Vec::new(), Vec::new(), Vec::new());
        for t in &laid {
            let seqs = t.seq_index.iter().map(|&s| s as usize);
            sample_ids.extend(seqs.clone().map(|s| ids[s] as i64));
            seq_lengths.push(seqs.map(|s| loaded.tokens[s].len() as i64), dir)?;
            let loss: Vec<i64> = t.target_offsets.windows(2).map(|w| w[1] - w[0]).collect();
            let row_loss: i64 = loss.iter().sum();
            seq_loss.push(loss, dir)?;
            input_ids.push(t.input_ids.iter().copied(), dir)?;
            let arrays: [&Vec<i64>; 11] = [
                &t.token_node,
                &t.node_parent,
                &t.node_depth,
                &t.node_tin,
                &t.node_tout,
                &t.node_len,
                &t.seq_end_node,
                &t.target_pred,
                &t.pred_pos,
                &t.pred_token,
                &t.pred_weight,
            ];
            for (c, a) in tree_cols.iter_mut().zip(arrays) {
                c.push(a.iter().copied(), dir)?;
            }
            let (tokens, n_seqs) = (t.input_ids.len() as i32, t.seq_index.len() as i32);
            index.row(info, tokens, n_seqs, row_loss as i32);
            num_tokens.push(tokens);
            num_seqs.push(n_seqs);
            num_loss.push(row_loss as i32);
        }
        let seq_offsets = seq_lengths.offsets.clone();
        let mut columns: Vec<ArrayRef> = vec![
            input_ids.array(),
            seq_lengths.array(),
            list(&seq_offsets, Arc::new(Int64Array::from(sample_ids.clone()))),
            Arc::new(Int32Array::from(num_tokens)),
            Arc::new(Int32Array::from(num_seqs)),
            Arc::new(Int32Array::from(num_loss)),
            seq_loss.array(),
        ];
        columns.extend(tree_cols.into_iter().map(Lists::array));
        let starts = vec![0i64; sample_ids.len()];
        for carried in self.data.carried {
            let values = per_segment(carried, &sample_ids, &starts, dir)?;
            columns.push(list(&seq_offsets, values));
        }
        RecordBatch::try_new(self.schema.clone(), columns).output(dir)
    }
}

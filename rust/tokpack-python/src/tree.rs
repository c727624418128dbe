//! `tokpack.tree`'s two entry points: `tree_pack` (sequences into rows of prefix trees) and
//! `tree_step` (a step's rollouts into this rank's balanced micro-batches of trees). Numpy
//! arrays in (read in place), a dict of numpy arrays and counts out, the GIL released.

use crate::errors::detached;
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rustc_hash::FxHashMap;
use tokpack_core::balance::{self, CostModel, MicroBatchConfig};
use tokpack_core::tree::{self, Forest, Piece, Seq, Trained, TreeBatch};
use tokpack_core::CoreError;

/// The figures of a layout beside its arrays.
struct Counts {
    trees: usize,
    nodes: usize,
    pieces: usize,
    split_trees: usize,
    unique_tokens: u64,
}

impl Counts {
    fn of(forest: &Forest, pieces: &[Piece]) -> Self {
        let split = pieces.iter().filter(|p| !p.chain.is_empty());
        let mut roots: Vec<u32> = split.map(|p| p.chain[0]).collect();
        roots.dedup();
        Counts {
            trees: forest.roots.len(),
            nodes: forest.len(),
            pieces: pieces.len(),
            split_trees: roots.len(),
            unique_tokens: forest.unique_tokens(),
        }
    }
}

fn slices<'a>(tokens: &'a [i64], starts: &[i64], lengths: &[i64]) -> PyResult<Vec<&'a [i64]>> {
    starts
        .iter()
        .zip(lengths)
        .enumerate()
        .map(|(i, (&s, &n))| {
            usize::try_from(s)
                .ok()
                .zip(usize::try_from(n).ok())
                .and_then(|(s, n)| tokens.get(s..s.checked_add(n)?))
                .ok_or_else(|| {
                    crate::errors::to_py(CoreError::Config(format!(
                        "sequence {i}: start {s} and length {n} lie outside its {} tokens",
                        tokens.len()
                    )))
                })
        })
        .collect()
}

fn flags<'a>(trained: Option<&'a [bool]>, start: i64, len: usize, all: Trained<'a>) -> Trained<'a> {
    match trained {
        Some(t) => Trained::Flags(&t[start as usize..start as usize + len]),
        None => all,
    }
}

fn check_flags(trained: Option<&[bool]>, n: usize) -> PyResult<()> {
    match trained {
        Some(t) if t.len() != n => Err(crate::errors::to_py(CoreError::Config(format!(
            "the trained flags must be aligned with the {n} tokens, got {}",
            t.len()
        )))),
        _ => Ok(()),
    }
}

/// The step's counts, as every result dict of this module carries them.
fn set_counts(d: &Bound<'_, PyDict>, counts: &Counts) -> PyResult<()> {
    d.set_item("trees", counts.trees)?;
    d.set_item("nodes", counts.nodes)?;
    d.set_item("pieces", counts.pieces)?;
    d.set_item("split_trees", counts.split_trees)?;
    d.set_item("unique_tokens", counts.unique_tokens)
}

/// A batch's arrays under `tokpack.tree.batch`'s keys, the per-token ones `[rows, width]`;
/// every array handed over without a copy.
fn batch_dict<'py>(py: Python<'py>, b: TreeBatch) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let shape = (b.rows, b.width);
    let block = |v: Vec<i64>| {
        Array2::from_shape_vec(shape, v)
            .map(|a| a.into_pyarray(py))
            .map_err(|e| crate::errors::to_py(CoreError::Config(format!("tree batch: {e}"))))
    };
    d.set_item("input_ids", block(b.input_ids)?)?;
    d.set_item("position_ids", block(b.position_ids)?)?;
    d.set_item("tree_tout", block(b.token_tout)?)?;
    d.set_item("tree_node", block(b.token_node)?)?;
    macro_rules! put {
        ($($name:ident),*) => {
            $( d.set_item(concat!("tree_", stringify!($name)), b.$name.into_pyarray(py))?; )*
        };
    }
    put!(
        node_offsets,
        node_parent,
        node_depth,
        node_tin,
        node_tout,
        node_len,
        seq_index,
        seq_row,
        seq_end_node,
        target_offsets,
        target_pred,
        pred_row,
        pred_pos,
        pred_token,
        pred_weight,
        completion_lengths
    );
    Ok(d)
}

/// Sequences `tokens[starts[i]..starts[i] + lengths[i]]` (trained where `trained`, aligned with
/// `tokens`, says; all when None) into rows of prefix trees of at most `max_tokens` tokens.
/// Sequences of different `groups` (one id per sequence) never share; None: one group. The rows
/// as one batch (`"batch"`, aligned to `pad_to_multiple_of`, padded with `pad_token_id`) with
/// its figures.
#[pyfunction]
#[pyo3(signature = (*, tokens, starts, lengths, trained, groups, max_tokens, min_shared,
    pad_to_multiple_of, pad_token_id, threads))]
#[allow(clippy::too_many_arguments)]
pub fn tree_pack<'py>(
    py: Python<'py>,
    tokens: PyReadonlyArray1<'py, i64>,
    starts: PyReadonlyArray1<'py, i64>,
    lengths: PyReadonlyArray1<'py, i64>,
    trained: Option<PyReadonlyArray1<'py, bool>>,
    groups: Option<PyReadonlyArray1<'py, i64>>,
    max_tokens: u64,
    min_shared: usize,
    pad_to_multiple_of: usize,
    pad_token_id: i64,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let tokens = tokens.as_slice()?;
    let (starts, lengths) = (starts.as_slice()?, lengths.as_slice()?);
    let trained = trained.as_ref().map(|t| t.as_slice()).transpose()?;
    let groups = groups.as_ref().map(|g| g.as_slice()).transpose()?;
    let parts = slices(tokens, starts, lengths)?;
    let seqs: Vec<Seq<'_>> = parts
        .iter()
        .zip(starts)
        .map(|(t, &s)| Seq::new(t, flags(trained, s, t.len(), Trained::All)))
        .collect();
    check_flags(trained, tokens.len())?;
    let members = match groups {
        None => vec![(0..seqs.len() as u32).collect()],
        Some(g) => bucket(g),
    };
    let (batch, counts) = detached(py, threads, || {
        let forest = tree::build(&seqs, &members, min_shared)?;
        let pieces = tree::pieces(&forest, max_tokens)?;
        let sizes: Vec<u64> = pieces.iter().map(|p| p.tokens).collect();
        let rows = tree::pack_rows(&sizes, max_tokens);
        let laid = tree::layout(&seqs, &forest, &pieces, &rows);
        Ok((
            laid.into_batch(pad_to_multiple_of, pad_token_id),
            Counts::of(&forest, &pieces),
        ))
    })?;
    let d = PyDict::new(py);
    d.set_item("rows", batch.rows)?;
    d.set_item("forward_tokens", batch.forward_tokens)?;
    d.set_item("batch", batch_dict(py, batch)?)?;
    set_counts(&d, &counts)?;
    Ok(d)
}

/// Indices by equal key, groups in order of first appearance.
fn bucket<K: std::hash::Hash + Eq + Copy>(keys: impl IntoIterator<Item = K>) -> Vec<Vec<u32>> {
    let keys = keys.into_iter();
    let mut index: FxHashMap<K, usize> =
        FxHashMap::with_capacity_and_hasher(keys.size_hint().0, Default::default());
    let mut out: Vec<Vec<u32>> = Vec::new();
    for (i, k) in keys.enumerate() {
        let g = *index.entry(k).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[g].push(i as u32);
    }
    out
}

/// A step's rollouts: rollout `i` is prompt `prompt_of[i]` then its completion. Rollouts of
/// equal prompts form a tree; the pieces are split into micro-batches of at most `max_tokens`
/// tokens over `dp_size` ranks by `tokpack.balance`'s planner, and rank `rank`'s micro-batches
/// laid out, one row each (a batch dict each, as `tree_pack`'s, in `micro_batches`). Also
/// returns every rank's micro-batch tokens.
#[pyfunction]
#[pyo3(signature = (*, prompt_tokens, prompt_starts, prompt_lengths, prompt_of, tokens, starts,
    lengths, trained, max_tokens, min_shared, dp_size, rank, a, b, same_count, min_micro_batches,
    divisible_by, order, pad_to_multiple_of, pad_token_id, threads))]
#[allow(clippy::too_many_arguments)]
pub fn tree_step<'py>(
    py: Python<'py>,
    prompt_tokens: PyReadonlyArray1<'py, i64>,
    prompt_starts: PyReadonlyArray1<'py, i64>,
    prompt_lengths: PyReadonlyArray1<'py, i64>,
    prompt_of: PyReadonlyArray1<'py, i64>,
    tokens: PyReadonlyArray1<'py, i64>,
    starts: PyReadonlyArray1<'py, i64>,
    lengths: PyReadonlyArray1<'py, i64>,
    trained: Option<PyReadonlyArray1<'py, bool>>,
    max_tokens: u64,
    min_shared: usize,
    dp_size: usize,
    rank: usize,
    a: f64,
    b: f64,
    same_count: bool,
    min_micro_batches: usize,
    divisible_by: usize,
    order: &str,
    pad_to_multiple_of: usize,
    pad_token_id: i64,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let prompts = slices(
        prompt_tokens.as_slice()?,
        prompt_starts.as_slice()?,
        prompt_lengths.as_slice()?,
    )?;
    let prompt_of = prompt_of.as_slice()?;
    let (starts, lengths) = (starts.as_slice()?, lengths.as_slice()?);
    let completions = slices(tokens.as_slice()?, starts, lengths)?;
    let trained = trained.as_ref().map(|t| t.as_slice()).transpose()?;
    let config = MicroBatchConfig {
        max_tokens,
        dp_size,
        cost: CostModel::new(a, b).map_err(crate::errors::to_py)?,
        same_count,
        min_micro_batches,
        divisible_by,
        order: order.parse().map_err(crate::errors::to_py)?,
        over_cap: "error".parse().map_err(crate::errors::to_py)?,
    };
    check_flags(trained, tokens.as_slice()?.len())?;
    if rank >= dp_size {
        return Err(crate::errors::to_py(CoreError::Config(format!(
            "rank must be below world_size={dp_size}, got {rank}"
        ))));
    }
    if let Some((i, &p)) = prompt_of
        .iter()
        .enumerate()
        .find(|(_, &p)| !usize::try_from(p).is_ok_and(|p| p < prompts.len()))
    {
        return Err(crate::errors::to_py(CoreError::Config(format!(
            "rollout {i} names prompt {p}, outside the {} prompts",
            prompts.len()
        ))));
    }
    let (rows, counts, mb_tokens, rank_offsets) = detached(py, threads, || {
        // Equal prompts are one: each rollout's head is its group's first prompt, so the
        // trie never compares them again.
        let same = bucket(prompts.iter().copied());
        let mut first = vec![0usize; prompts.len()];
        for g in &same {
            for &p in g {
                first[p as usize] = g[0] as usize;
            }
        }
        let seqs: Vec<Seq<'_>> = completions
            .iter()
            .zip(starts)
            .zip(prompt_of)
            .map(|((t, &s), &p)| Seq {
                head: prompts[first[p as usize]],
                tail: t,
                head_trained: Trained::None,
                tail_trained: flags(trained, s, t.len(), Trained::All),
            })
            .collect();
        let groups = bucket(prompt_of.iter().map(|&p| first[p as usize]));
        let forest = tree::build(&seqs, &groups, min_shared)?;
        let pieces = tree::pieces(&forest, max_tokens)?;
        let sizes: Vec<i64> = pieces.iter().map(|p| p.tokens as i64).collect();
        let plan = balance::micro_batches(&sizes, &config)?;
        let (lo, hi) = (plan.rank_offsets[rank], plan.rank_offsets[rank + 1]);
        let rows: Vec<Vec<u32>> = (lo..hi)
            .map(|m| {
                let (x, y) = (plan.mb_offsets[m as usize], plan.mb_offsets[m as usize + 1]);
                plan.indices[x as usize..y as usize]
                    .iter()
                    .map(|&i| i as u32)
                    .collect()
            })
            .collect();
        let laid = tree::layout_each(&seqs, &forest, &pieces, &rows);
        Ok((
            laid.into_iter()
                .map(|r| r.into_batch(pad_to_multiple_of, pad_token_id))
                .collect::<Vec<_>>(),
            Counts::of(&forest, &pieces),
            plan.mb_tokens,
            plan.rank_offsets,
        ))
    })?;
    let d = PyDict::new(py);
    let batches = rows
        .into_iter()
        .map(|r| batch_dict(py, r))
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("micro_batches", batches)?;
    d.set_item("mb_tokens", mb_tokens.into_pyarray(py))?;
    d.set_item("rank_offsets", rank_offsets.into_pyarray(py))?;
    set_counts(&d, &counts)?;
    Ok(d)
}

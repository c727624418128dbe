//! Rows of pieces into arrays: tokens in DFS order, positions along each token's own path,
//! the ancestor interval of every node, and per sequence its trained targets as predictions
//! (a packed position and the token it predicts), each distinct prediction once with the number
//! of sequences that train it as its weight.

use super::build::NONE;
use super::{Forest, Piece, Seq};
use rayon::prelude::*;
use rustc_hash::FxHashMap;

/// Rows laid out, flat: row `r` has tokens `row_offsets[r]..row_offsets[r + 1]` and nodes
/// `node_offsets[r]..node_offsets[r + 1]`; node and token indices inside a row are row-local.
/// Key `k` may be attended by query `q` of the same row iff `k <= q < token_tout[k]`.
/// Sequences (those in the rows) are listed by ascending original index, `seq_index`; sequence
/// `i`'s trained targets are predictions `target_pred[target_offsets[i]..target_offsets[i + 1]]`
/// in path order; prediction `p` is row `pred_row[p]`'s logits at `pred_pos[p]` scoring token
/// `pred_token[p]`, trained by `pred_weight[p]` sequences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeRows {
    pub row_offsets: Vec<i64>,
    pub input_ids: Vec<i64>,
    pub position_ids: Vec<i64>,
    pub token_node: Vec<i64>,
    pub token_tout: Vec<i64>,
    pub node_offsets: Vec<i64>,
    pub node_parent: Vec<i64>,
    pub node_depth: Vec<i64>,
    pub node_tin: Vec<i64>,
    pub node_tout: Vec<i64>,
    pub node_len: Vec<i64>,
    pub seq_index: Vec<i64>,
    pub seq_row: Vec<i64>,
    pub seq_end_node: Vec<i64>,
    pub target_offsets: Vec<i64>,
    pub target_pred: Vec<i64>,
    pub pred_row: Vec<i64>,
    pub pred_pos: Vec<i64>,
    pub pred_token: Vec<i64>,
    pub pred_weight: Vec<i64>,
}

/// One row's arrays; its sequences (ascending) with their targets as predictions numbered
/// inside the row.
#[derive(Default)]
struct Row {
    input_ids: Vec<i64>,
    position_ids: Vec<i64>,
    token_node: Vec<i64>,
    token_tout: Vec<i64>,
    node_parent: Vec<i64>,
    node_depth: Vec<i64>,
    node_tin: Vec<i64>,
    node_tout: Vec<i64>,
    node_len: Vec<i64>,
    seq_index: Vec<i64>,
    seq_end_node: Vec<i64>,
    target_offsets: Vec<i64>,
    target_pred: Vec<i64>,
    pred_pos: Vec<i64>,
    pred_token: Vec<i64>,
    pred_weight: Vec<i64>,
}

impl Row {
    /// Room for `tokens` tokens, `nodes` nodes, `seqs` sequences and `targets` targets: each
    /// array is written once, never grown (a row has at most one prediction per token).
    fn with_capacity(tokens: usize, nodes: usize, seqs: usize, targets: usize) -> Self {
        let mut target_offsets = Vec::with_capacity(seqs + 1);
        target_offsets.push(0);
        Row {
            input_ids: Vec::with_capacity(tokens),
            position_ids: Vec::with_capacity(tokens),
            token_node: Vec::with_capacity(tokens),
            token_tout: Vec::with_capacity(tokens),
            node_parent: Vec::with_capacity(nodes),
            node_depth: Vec::with_capacity(nodes),
            node_tin: Vec::with_capacity(nodes),
            node_tout: Vec::with_capacity(nodes),
            node_len: Vec::with_capacity(nodes),
            seq_index: Vec::with_capacity(seqs),
            seq_end_node: Vec::with_capacity(seqs),
            target_offsets,
            target_pred: Vec::with_capacity(targets),
            pred_pos: Vec::with_capacity(tokens),
            pred_token: Vec::with_capacity(tokens),
            pred_weight: Vec::with_capacity(tokens),
        }
    }

    /// The row alone as [`TreeRows`]: its arrays moved, not copied.
    fn alone(self) -> TreeRows {
        let (tokens, nodes) = (self.input_ids.len() as i64, self.node_parent.len() as i64);
        TreeRows {
            row_offsets: vec![0, tokens],
            input_ids: self.input_ids,
            position_ids: self.position_ids,
            token_node: self.token_node,
            token_tout: self.token_tout,
            node_offsets: vec![0, nodes],
            node_parent: self.node_parent,
            node_depth: self.node_depth,
            node_tin: self.node_tin,
            node_tout: self.node_tout,
            node_len: self.node_len,
            seq_row: vec![0; self.seq_index.len()],
            seq_index: self.seq_index,
            seq_end_node: self.seq_end_node,
            target_offsets: self.target_offsets,
            target_pred: self.target_pred,
            pred_row: vec![0; self.pred_pos.len()],
            pred_pos: self.pred_pos,
            pred_token: self.pred_token,
            pred_weight: self.pred_weight,
        }
    }
}

/// Lays out `rows` (lists of indices into `pieces`), rows in parallel on the current pool.
pub fn layout(seqs: &[Seq<'_>], forest: &Forest, pieces: &[Piece], rows: &[Vec<u32>]) -> TreeRows {
    let laid: Vec<Row> = rows
        .par_iter()
        .map(|row| lay_row(seqs, forest, pieces, row))
        .collect();
    merge(laid)
}

/// Lays out each of `rows` on its own (a micro-batch of one row each), in parallel.
pub fn layout_each(
    seqs: &[Seq<'_>],
    forest: &Forest,
    pieces: &[Piece],
    rows: &[Vec<u32>],
) -> Vec<TreeRows> {
    rows.par_iter()
        .map(|row| lay_row(seqs, forest, pieces, row).alone())
        .collect()
}

/// Where one piece's nodes are in the row: chain node `i` is `chain_base + i`; subtree root
/// `subtrees[j]`'s nodes start at `subtree_base[j]`.
struct Placed<'p> {
    piece: &'p Piece,
    chain_base: i64,
    subtree_base: Vec<i64>,
}

impl Placed<'_> {
    /// Row-local node of forest node `w` on this piece (`w` lies on it).
    fn local(&self, f: &Forest, w: u32) -> i64 {
        let p = self.piece;
        let j = p.subtrees.partition_point(|&r| r <= w);
        if j > 0 {
            let r = p.subtrees[j - 1];
            if w < r + f.size[r as usize] {
                return self.subtree_base[j - 1] + i64::from(w - r);
            }
        }
        let i = p
            .chain
            .iter()
            .position(|&c| c == w)
            .expect("an ancestor lies on the chain");
        self.chain_base + i as i64
    }
}

fn lay_row(seqs: &[Seq<'_>], f: &Forest, pieces: &[Piece], row: &[u32]) -> Row {
    let members = members_of(f, pieces, row);
    let tokens: u64 = row.iter().map(|&pi| pieces[pi as usize].tokens).sum();
    let nodes: u32 = row
        .iter()
        .map(|&pi| {
            let p = &pieces[pi as usize];
            p.chain.len() as u32 + p.subtrees.iter().map(|&r| f.size[r as usize]).sum::<u32>()
        })
        .sum();
    let n_targets = members.iter().map(|m| seqs[m.0 as usize].len()).sum();
    let mut out = Row::with_capacity(tokens as usize, nodes as usize, members.len(), n_targets);
    let mut placed = Vec::with_capacity(row.len());
    for &pi in row {
        let piece = &pieces[pi as usize];
        let piece_end = out.input_ids.len() as i64 + piece.tokens as i64;
        let chain_base = out.node_parent.len() as i64;
        for (i, &c) in piece.chain.iter().enumerate() {
            let parent = if i == 0 {
                -1
            } else {
                chain_base + i as i64 - 1
            };
            emit(&mut out, seqs, f, c, parent, piece_end);
        }
        let hang = if piece.chain.is_empty() {
            -1
        } else {
            chain_base + piece.chain.len() as i64 - 1
        };
        let mut subtree_base = Vec::with_capacity(piece.subtrees.len());
        for &r in &piece.subtrees {
            let base = out.node_parent.len() as i64;
            subtree_base.push(base);
            for w in r..r + f.size[r as usize] {
                let parent = if w == r {
                    hang
                } else {
                    base + i64::from(f.parent[w as usize] - r)
                };
                let tout = out.input_ids.len() as i64 + f.subtree_tokens[w as usize] as i64;
                emit(&mut out, seqs, f, w, parent, tout);
            }
        }
        placed.push(Placed {
            piece,
            chain_base,
            subtree_base,
        });
    }
    let mut interior = vec![NONE; out.input_ids.len()];
    let mut boundary: FxHashMap<(i64, i64), u32> =
        FxHashMap::with_capacity_and_hasher(nodes as usize, Default::default());
    let mut path = Vec::new();
    for (s, k, end) in members {
        let p = &placed[k];
        path.clear();
        let mut w = end;
        loop {
            path.push(p.local(f, w));
            w = f.parent[w as usize];
            if w == NONE {
                break;
            }
        }
        path.reverse();
        targets(
            &mut out,
            &seqs[s as usize],
            &path,
            &mut interior,
            &mut boundary,
        );
        out.target_offsets.push(out.target_pred.len() as i64);
        out.seq_index.push(i64::from(s));
        out.seq_end_node
            .push(*path.last().expect("a path has a node"));
    }
    out
}

/// The sequences a row's pieces own, as (sequence, piece in the row, end node), ascending.
fn members_of(f: &Forest, pieces: &[Piece], row: &[u32]) -> Vec<(u32, usize, u32)> {
    let mut members: Vec<(u32, usize, u32)> = Vec::new();
    for (k, &pi) in row.iter().enumerate() {
        let piece = &pieces[pi as usize];
        if piece.owns_last {
            let last = *piece
                .chain
                .last()
                .expect("a piece owning its last node has a chain");
            members.extend(f.ends_at(last as usize).iter().map(|&s| (s, k, last)));
        }
        for &r in &piece.subtrees {
            for w in r..r + f.size[r as usize] {
                members.extend(f.ends_at(w as usize).iter().map(|&s| (s, k, w)));
            }
        }
    }
    members.sort_unstable();
    members
}

/// Appends forest node `w`'s tokens as a row node with `parent` and subtree end `tout`.
fn emit(out: &mut Row, seqs: &[Seq<'_>], f: &Forest, w: u32, parent: i64, tout: i64) {
    let (start, end) = (f.start[w as usize], f.end[w as usize]);
    let node = out.node_parent.len() as i64;
    out.node_parent.push(parent);
    out.node_depth.push(i64::from(start));
    out.node_tin.push(out.input_ids.len() as i64);
    out.node_tout.push(tout);
    out.node_len.push(i64::from(end - start));
    seqs[f.rep[w as usize] as usize].extend_into(start as usize, end as usize, &mut out.input_ids);
    out.position_ids.extend(i64::from(start)..i64::from(end));
    let n = (end - start) as usize;
    out.token_node.extend(std::iter::repeat_n(node, n));
    out.token_tout.extend(std::iter::repeat_n(tout, n));
}

/// Appends to `out.target_pred` the predictions of sequence `seq`'s trained targets along its
/// row-local `path`: a target inside a node has one prediction per position; one at a branch
/// (a node's first token, predicted by its parent's last) one per (position, token).
fn targets(
    out: &mut Row,
    seq: &Seq<'_>,
    path: &[i64],
    interior: &mut [u32],
    boundary: &mut FxHashMap<(i64, i64), u32>,
) {
    let mut prev_last = -1i64;
    let from = seq.first_target() as i64;
    for &u in path {
        let u = u as usize;
        let (tin, depth, len) = (out.node_tin[u], out.node_depth[u], out.node_len[u]);
        for j in depth.max(from)..depth + len {
            if !seq.trained(j as usize) {
                continue;
            }
            let t = seq.token(j as usize);
            let p = if j == depth {
                *boundary.entry((prev_last, t)).or_insert_with(|| {
                    new_pred(
                        &mut out.pred_pos,
                        &mut out.pred_token,
                        &mut out.pred_weight,
                        prev_last,
                        t,
                    )
                })
            } else {
                let src = tin + (j - 1 - depth);
                let slot = &mut interior[src as usize];
                if *slot == NONE {
                    *slot = new_pred(
                        &mut out.pred_pos,
                        &mut out.pred_token,
                        &mut out.pred_weight,
                        src,
                        t,
                    );
                }
                *slot
            };
            out.pred_weight[p as usize] += 1;
            out.target_pred.push(i64::from(p));
        }
        prev_last = tin + len - 1;
    }
}

fn new_pred(
    pos: &mut Vec<i64>,
    token: &mut Vec<i64>,
    weight: &mut Vec<i64>,
    at: i64,
    t: i64,
) -> u32 {
    pos.push(at);
    token.push(t);
    weight.push(0);
    (pos.len() - 1) as u32
}

fn merge(rows: Vec<Row>) -> TreeRows {
    let mut t = TreeRows {
        row_offsets: vec![0],
        node_offsets: vec![0],
        target_offsets: vec![0],
        ..TreeRows::default()
    };
    // (sequence, row, its targets in that row's target_pred, the row's first prediction)
    let mut seqs: Vec<(i64, i64, i64, usize, usize, i64)> = Vec::new();
    let mut targets: Vec<Vec<i64>> = Vec::with_capacity(rows.len());
    for (r, row) in rows.into_iter().enumerate() {
        let pred_base = t.pred_pos.len() as i64;
        t.input_ids.extend(row.input_ids);
        t.position_ids.extend(row.position_ids);
        t.token_node.extend(row.token_node);
        t.token_tout.extend(row.token_tout);
        t.row_offsets.push(t.input_ids.len() as i64);
        t.node_parent.extend(row.node_parent);
        t.node_depth.extend(row.node_depth);
        t.node_tin.extend(row.node_tin);
        t.node_tout.extend(row.node_tout);
        t.node_len.extend(row.node_len);
        t.node_offsets.push(t.node_parent.len() as i64);
        t.pred_row
            .extend(std::iter::repeat_n(r as i64, row.pred_pos.len()));
        t.pred_pos.extend(row.pred_pos);
        t.pred_token.extend(row.pred_token);
        t.pred_weight.extend(row.pred_weight);
        for (i, (&s, &end)) in row.seq_index.iter().zip(&row.seq_end_node).enumerate() {
            let (lo, hi) = (row.target_offsets[i], row.target_offsets[i + 1]);
            seqs.push((s, r as i64, end, lo as usize, hi as usize, pred_base));
        }
        targets.push(row.target_pred);
    }
    seqs.sort_unstable_by_key(|x| x.0);
    for (s, r, end, lo, hi, base) in seqs {
        t.seq_index.push(s);
        t.seq_row.push(r);
        t.seq_end_node.push(end);
        t.target_pred
            .extend(targets[r as usize][lo..hi].iter().map(|&p| base + p));
        t.target_offsets.push(t.target_pred.len() as i64);
    }
    t
}

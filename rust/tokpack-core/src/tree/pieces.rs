//! Trees into rows: a tree that fits a row is one piece; a larger one is cut at subtrees, each
//! piece carrying the path from the root down to where it hangs (those tokens are computed once
//! per piece: the price of the cut). Pieces then go into rows by best-fit decreasing.

use super::Forest;
use crate::error::{CoreError, Result};
use std::collections::BTreeSet;

/// Part of one tree: the path `chain` (each node the parent of the next; empty for a whole
/// tree) and whole subtrees hanging from its last node (or, without a chain, roots).
/// Sequences ending inside the subtrees belong to this piece, and those ending at the chain's
/// last node when `owns_last`; a chain's earlier nodes belong to the pieces where they are last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub chain: Vec<u32>,
    pub subtrees: Vec<u32>,
    pub owns_last: bool,
    pub tokens: u64,
}

/// The pieces of `forest`'s trees under `max_tokens` tokens each: a tree in order, its pieces
/// in DFS order of where they hang. Every path must fit (`max_tokens` at least the longest
/// sequence).
pub fn pieces(forest: &Forest, max_tokens: u64) -> Result<Vec<Piece>> {
    let mut out = Vec::with_capacity(forest.roots.len());
    for &r in &forest.roots {
        let tokens = forest.subtree_tokens[r as usize];
        if tokens <= max_tokens {
            out.push(Piece {
                chain: Vec::new(),
                subtrees: vec![r],
                owns_last: false,
                tokens,
            });
        } else {
            cut(forest, r, &mut Vec::new(), 0, max_tokens, &mut out)?;
        }
    }
    Ok(out)
}

/// Cuts the subtree of `v` (which does not fit beside `chain`) into pieces hanging from `v`.
fn cut(
    f: &Forest,
    v: u32,
    chain: &mut Vec<u32>,
    chain_tokens: u64,
    cap: u64,
    out: &mut Vec<Piece>,
) -> Result<()> {
    let here = chain_tokens + f.tokens(v as usize);
    if here > cap {
        return Err(CoreError::Config(format!(
            "a path of {here} tokens does not fit max_tokens={cap}; raise max_tokens to the \
             longest sequence at least"
        )));
    }
    let room = cap - here;
    chain.push(v);
    let mut small = Vec::new();
    let mut big = Vec::new();
    let (mut c, stop) = (v + 1, v + f.size[v as usize]);
    while c < stop {
        if f.subtree_tokens[c as usize] <= room {
            small.push(c);
        } else {
            big.push(c);
        }
        c += f.size[c as usize];
    }
    let sizes: Vec<u64> = small
        .iter()
        .map(|&c| f.subtree_tokens[c as usize])
        .collect();
    let bins = pack_rows(&sizes, room);
    let owns = !f.ends_at(v as usize).is_empty();
    for (i, bin) in bins.iter().enumerate() {
        let subtrees: Vec<u32> = bin.iter().map(|&j| small[j as usize]).collect();
        let tokens = here + bin.iter().map(|&j| sizes[j as usize]).sum::<u64>();
        out.push(Piece {
            chain: chain.clone(),
            subtrees,
            owns_last: i == 0,
            tokens,
        });
    }
    if bins.is_empty() && owns {
        out.push(Piece {
            chain: chain.clone(),
            subtrees: Vec::new(),
            owns_last: true,
            tokens: here,
        });
    }
    for c in big {
        cut(f, c, chain, here, cap, out)?;
    }
    chain.pop();
    Ok(())
}

/// Items of `sizes` into bins of at most `cap` (best-fit decreasing; ties by index, so the
/// result is deterministic): each bin's items ascending, bins in order of their first item's
/// placement. An item larger than `cap` gets a bin of its own.
pub fn pack_rows(sizes: &[u64], cap: u64) -> Vec<Vec<u32>> {
    let mut order: Vec<u32> = (0..sizes.len() as u32).collect();
    order.sort_by(|&a, &b| sizes[b as usize].cmp(&sizes[a as usize]).then(a.cmp(&b)));
    let mut bins: Vec<Vec<u32>> = Vec::new();
    // (room left, bin): the tightest bin that fits is the first at or above the need.
    let mut room: BTreeSet<(u64, usize)> = BTreeSet::new();
    for i in order {
        let need = sizes[i as usize];
        let found = room.range((need, 0)..).next().copied();
        match found {
            Some((left, b)) => {
                room.remove(&(left, b));
                bins[b].push(i);
                room.insert((left - need, b));
            }
            None => {
                bins.push(vec![i]);
                room.insert((cap.saturating_sub(need), bins.len() - 1));
            }
        }
    }
    for b in &mut bins {
        b.sort_unstable();
    }
    bins
}

//! The trie: each group's sequences sorted by their tokens, the common prefix of neighbours
//! giving the branch points (a compressed trie built in one pass with a stack), then prefixes
//! shorter than `min_shared` dissolved into their children and the nodes numbered in DFS order.

use super::{common_prefix, compare, Seq};
use crate::error::{CoreError, Location, Result};
use rayon::prelude::*;

/// The parent of a root.
pub const NONE: u32 = u32::MAX;

/// Trees of sequences, nodes numbered in DFS order (each tree's nodes contiguous, trees in the
/// order of their groups, then of their tokens). Node `u` holds tokens `start[u]..end[u]` of
/// sequence `rep[u]` (its positions: a node's first position is its parent's end); its subtree is
/// nodes `u..u + size[u]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forest {
    pub parent: Vec<u32>,
    pub rep: Vec<u32>,
    pub start: Vec<u32>,
    pub end: Vec<u32>,
    pub size: Vec<u32>,
    /// Tokens of node `u`'s subtree.
    pub subtree_tokens: Vec<u64>,
    /// The sequences ending at node `u`: `ends[end_offsets[u]..end_offsets[u + 1]]`.
    pub end_offsets: Vec<u32>,
    pub ends: Vec<u32>,
    pub roots: Vec<u32>,
    /// The node each sequence ends at.
    pub seq_node: Vec<u32>,
}

impl Forest {
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    pub fn tokens(&self, u: usize) -> u64 {
        u64::from(self.end[u] - self.start[u])
    }

    /// Tokens of all nodes: what the trees compute, each shared prefix once.
    pub fn unique_tokens(&self) -> u64 {
        self.roots
            .iter()
            .map(|&r| self.subtree_tokens[r as usize])
            .sum()
    }

    pub fn ends_at(&self, u: usize) -> &[u32] {
        &self.ends[self.end_offsets[u] as usize..self.end_offsets[u + 1] as usize]
    }
}

/// A trie node while building: its children in token order.
struct Node {
    parent: u32,
    rep: u32,
    start: u32,
    end: u32,
    children: Vec<u32>,
    ends: Vec<u32>,
}

/// The prefix trees of `seqs`, each of `groups` (lists of sequence indices; sequences of
/// different groups never share a node) built on its own, in parallel on the current pool.
/// A shared prefix shorter than `min_shared` tokens is not shared: each sequence through it
/// gets its own copy. Every sequence needs at least one token.
pub fn build(seqs: &[Seq<'_>], groups: &[Vec<u32>], min_shared: usize) -> Result<Forest> {
    if let Some(i) = seqs.iter().position(Seq::is_empty) {
        return Err(CoreError::Data {
            at: Box::new(Location::default()),
            what: format!("sequence {i} is empty; a tree needs at least one token per sequence"),
        });
    }
    if let Some(i) = seqs.iter().position(|s| s.len() > u32::MAX as usize) {
        return Err(CoreError::Config(format!(
            "sequence {i} has {} tokens, more than a tree holds ({})",
            seqs[i].len(),
            u32::MAX
        )));
    }
    let mut seen = vec![false; seqs.len()];
    for &s in groups.iter().flatten() {
        match seen.get_mut(s as usize) {
            Some(x) if !*x => *x = true,
            _ => {
                return Err(CoreError::Config(format!(
                    "groups must name each of the {} sequences once, got {s} twice or out of range",
                    seqs.len()
                )))
            }
        }
    }
    if let Some(i) = seen.iter().position(|x| !x) {
        return Err(CoreError::Config(format!(
            "groups must name each of the {} sequences once; sequence {i} is in none",
            seqs.len()
        )));
    }
    let min_shared = min_shared.clamp(1, u32::MAX as usize) as u32;
    let trees: Vec<Forest> = groups
        .par_iter()
        .map(|g| numbered(seqs, &trie(seqs, g), min_shared))
        .collect();
    Ok(concatenate(trees, seqs.len()))
}

/// The compressed trie of one group, from its sequences in token order: each sequence's
/// common prefix with the one before it says where it branches off that one's path.
fn trie(seqs: &[Seq<'_>], group: &[u32]) -> (Vec<Node>, Vec<u32>) {
    let mut order = group.to_vec();
    order.sort_by(|&a, &b| compare(&seqs[a as usize], &seqs[b as usize]).then(a.cmp(&b)));
    let mut nodes: Vec<Node> = Vec::with_capacity(2 * order.len());
    let mut roots = Vec::new();
    // The previous sequence's path, root first.
    let mut path: Vec<u32> = Vec::new();
    let mut prev: Option<u32> = None;
    for &s in &order {
        let len = seqs[s as usize].len() as u32;
        let shared = prev.map_or(0, |p| {
            common_prefix(&seqs[p as usize], &seqs[s as usize]) as u32
        });
        prev = Some(s);
        if shared == 0 {
            path.clear();
            roots.push(nodes.len() as u32);
            path.push(new_node(&mut nodes, NONE, s, 0, len));
            continue;
        }
        while nodes[*path.last().expect("a shared prefix lies on the path") as usize].start
            >= shared
        {
            path.pop();
        }
        let t = *path.last().expect("a shared prefix lies on the path");
        if nodes[t as usize].end > shared {
            split(&mut nodes, t, shared);
        }
        if len == shared {
            nodes[t as usize].ends.push(s);
        } else {
            let c = new_node(&mut nodes, t, s, shared, len);
            nodes[t as usize].children.push(c);
            path.push(c);
        }
    }
    (nodes, roots)
}

fn new_node(nodes: &mut Vec<Node>, parent: u32, rep: u32, start: u32, end: u32) -> u32 {
    // A new node is where its sequence ends (later sequences may split it).
    nodes.push(Node {
        parent,
        rep,
        start,
        end,
        children: Vec::new(),
        ends: vec![rep],
    });
    (nodes.len() - 1) as u32
}

/// Cuts node `t` at position `at`: `t` keeps the tokens before, a new child the rest (with
/// `t`'s children and ending sequences).
fn split(nodes: &mut Vec<Node>, t: u32, at: u32) {
    let y = nodes.len() as u32;
    let (rep, end) = (nodes[t as usize].rep, nodes[t as usize].end);
    let children = std::mem::take(&mut nodes[t as usize].children);
    let ends = std::mem::take(&mut nodes[t as usize].ends);
    for &c in &children {
        nodes[c as usize].parent = y;
    }
    nodes.push(Node {
        parent: t,
        rep,
        start: at,
        end,
        children,
        ends,
    });
    let node = &mut nodes[t as usize];
    node.end = at;
    node.children.push(y);
}

/// Sequences through each node (building order: a child is created after its parent).
fn counts(nodes: &[Node]) -> Vec<u32> {
    let mut count: Vec<u32> = nodes.iter().map(|n| n.ends.len() as u32).collect();
    for u in (0..nodes.len()).rev() {
        let p = nodes[u].parent;
        if p != NONE {
            count[p as usize] += count[u];
        }
    }
    count
}

/// One group's trie in DFS order, with shared prefixes shorter than `min_shared` dissolved.
fn numbered(seqs: &[Seq<'_>], (nodes, roots): &(Vec<Node>, Vec<u32>), min_shared: u32) -> Forest {
    let count = counts(nodes);
    let mut f = Forest::default();
    let mut ends: Vec<Vec<u32>> = Vec::new();
    // (node, new parent, start inherited from a dissolved parent)
    let mut stack: Vec<(u32, u32, Option<u32>)> =
        roots.iter().rev().map(|&r| (r, NONE, None)).collect();
    let mut emit = |f: &mut Forest, parent: u32, rep: u32, start: u32, end: u32, e: Vec<u32>| {
        f.parent.push(parent);
        f.rep.push(rep);
        f.start.push(start);
        f.end.push(end);
        ends.push(e);
        (f.parent.len() - 1) as u32
    };
    while let Some((v, parent, inherited)) = stack.pop() {
        let n = &nodes[v as usize];
        let start = inherited.unwrap_or(n.start);
        let shared = count[v as usize] > 1;
        if shared && n.end - start < min_shared {
            // Too short to share: each sequence ending here gets its own leaf, each child
            // takes these tokens in front of its own.
            for &s in &n.ends {
                emit(&mut f, parent, s, start, n.end, vec![s]);
            }
            for &c in n.children.iter().rev() {
                stack.push((c, parent, Some(start)));
            }
        } else {
            let u = emit(&mut f, parent, n.rep, start, n.end, n.ends.clone());
            for &c in n.children.iter().rev() {
                stack.push((c, u, None));
            }
        }
    }
    let m = f.parent.len();
    f.size = vec![1; m];
    f.subtree_tokens = (0..m).map(|u| f.tokens(u)).collect();
    for u in (0..m).rev() {
        let p = f.parent[u];
        if p != NONE {
            f.size[p as usize] += f.size[u];
            f.subtree_tokens[p as usize] += f.subtree_tokens[u];
        } else {
            f.roots.push(u as u32);
        }
    }
    f.roots.reverse();
    f.end_offsets.push(0);
    for e in ends {
        f.ends.extend(e);
        f.end_offsets.push(f.ends.len() as u32);
    }
    debug_assert!(f.rep.iter().all(|&r| (r as usize) < seqs.len()));
    f
}

/// The groups' forests as one, node numbers shifted.
fn concatenate(trees: Vec<Forest>, n_seqs: usize) -> Forest {
    let mut f = Forest {
        end_offsets: vec![0],
        seq_node: vec![NONE; n_seqs],
        ..Forest::default()
    };
    for t in trees {
        let base = f.parent.len() as u32;
        let ends_base = f.ends.len() as u32;
        f.parent.extend(
            t.parent
                .iter()
                .map(|&p| if p == NONE { NONE } else { p + base }),
        );
        f.rep.extend(t.rep);
        f.start.extend(t.start);
        f.end.extend(t.end);
        f.size.extend(t.size);
        f.subtree_tokens.extend(t.subtree_tokens);
        f.roots.extend(t.roots.iter().map(|&r| r + base));
        f.end_offsets
            .extend(t.end_offsets[1..].iter().map(|&o| o + ends_base));
        f.ends.extend(t.ends);
    }
    for u in 0..f.len() {
        for i in f.end_offsets[u]..f.end_offsets[u + 1] {
            f.seq_node[f.ends[i as usize] as usize] = u as u32;
        }
    }
    f
}

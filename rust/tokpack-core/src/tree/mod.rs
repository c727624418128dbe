//! Prefix trees over token ids: sequences that share a prefix (a prompt's completions, the turns
//! of one chat each repeating the history) become one tree whose shared tokens are computed once.
//!
//! [`build`] groups sequences into a [`Forest`] (a compressed trie per group, nodes in DFS
//! order); [`pieces`] cuts trees larger than a row at subtrees, each piece carrying its path
//! prefix; [`pack_rows`] bins pieces into rows; [`layout`] writes the rows' tokens, positions,
//! ancestor intervals and per-sequence targets; [`TreeRows::into_batch`] pads them into blocks.
//! Every step is deterministic: same inputs, same output, whatever the thread count.

mod batch;
mod build;
mod layout;
mod pieces;
#[cfg(test)]
mod tests;

pub use batch::TreeBatch;
pub use build::{build, Forest};
pub use layout::{layout, layout_each, TreeRows};
pub use pieces::{pack_rows, pieces, Piece};

/// Which tokens of a part of a sequence are trained (are targets of the token before them).
#[derive(Clone, Copy, Debug)]
pub enum Trained<'a> {
    None,
    All,
    Flags(&'a [bool]),
}

impl Trained<'_> {
    fn at(&self, i: usize) -> bool {
        match self {
            Trained::None => false,
            Trained::All => true,
            Trained::Flags(f) => f[i],
        }
    }
}

/// One sequence: `head` then `tail` (a rollout: its prompt, then its completion). Sequences
/// whose `head` is the same slice (same address and length) are known to share it: the trie
/// skips comparing it.
#[derive(Clone, Copy, Debug)]
pub struct Seq<'a> {
    pub head: &'a [i64],
    pub tail: &'a [i64],
    pub head_trained: Trained<'a>,
    pub tail_trained: Trained<'a>,
}

impl<'a> Seq<'a> {
    /// A sequence of `tokens` alone, trained where `trained` says.
    pub fn new(tokens: &'a [i64], trained: Trained<'a>) -> Self {
        Seq {
            head: &[],
            tail: tokens,
            head_trained: Trained::None,
            tail_trained: trained,
        }
    }

    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn token(&self, i: usize) -> i64 {
        let h = self.head.len();
        if i < h {
            self.head[i]
        } else {
            self.tail[i - h]
        }
    }

    /// Whether token `i` is a trained target (predicted by token `i - 1`); token 0 never is.
    pub fn trained(&self, i: usize) -> bool {
        let h = self.head.len();
        i > 0
            && if i < h {
                self.head_trained.at(i)
            } else {
                self.tail_trained.at(i - h)
            }
    }

    /// No token before this one is a trained target (a prompt is skipped whole).
    fn first_target(&self) -> usize {
        match (self.head_trained, self.tail_trained) {
            (Trained::None, Trained::None) => self.len(),
            (Trained::None, _) => self.head.len().max(1),
            _ => 1,
        }
    }

    /// The longest contiguous run of tokens starting at `i` (up to the head/tail boundary).
    fn run(&self, i: usize) -> &'a [i64] {
        let h = self.head.len();
        if i < h {
            &self.head[i..]
        } else {
            &self.tail[(i - h).min(self.tail.len())..]
        }
    }

    /// Appends tokens `start..end` to `out`.
    fn extend_into(&self, start: usize, end: usize, out: &mut Vec<i64>) {
        let h = self.head.len();
        if start < h {
            out.extend_from_slice(&self.head[start..end.min(h)]);
        }
        if end > h {
            out.extend_from_slice(&self.tail[start.max(h) - h..end - h]);
        }
    }
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix(a: &Seq<'_>, b: &Seq<'_>) -> usize {
    let mut n = 0;
    if std::ptr::eq(a.head, b.head) {
        n = a.head.len();
    }
    loop {
        let (x, y) = (a.run(n), b.run(n));
        let m = x.len().min(y.len());
        if m == 0 {
            return n;
        }
        let k = x[..m]
            .iter()
            .zip(&y[..m])
            .take_while(|(p, q)| p == q)
            .count();
        n += k;
        if k < m {
            return n;
        }
    }
}

/// Lexicographic order of token ids (a prefix first); ties by index, so sorting is stable.
fn compare(a: &Seq<'_>, b: &Seq<'_>) -> std::cmp::Ordering {
    let n = common_prefix(a, b);
    match (n < a.len(), n < b.len()) {
        (true, true) => a.token(n).cmp(&b.token(n)),
        (x, y) => x.cmp(&y),
    }
}

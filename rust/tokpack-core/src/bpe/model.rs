//! The BPE model of a byte-level tokenizer: bytes to initial symbols, then merges applied
//! lowest rank first (leftmost first among equal ranks), as `tokenizers` applies them.

use rustc_hash::FxHashMap;

/// Vocabulary and merge table with ids for everything.
pub(crate) struct Model {
    /// Initial symbol of each byte (the byte-level alphabet's character).
    pub byte_ids: [u32; 256],
    /// `(left, right) -> (rank, merged)`.
    pub merges: FxHashMap<(u32, u32), (u32, u32)>,
    /// Whole pre-tokens found in the vocabulary skip the merges (`ignore_merges`).
    pub whole_words: Option<FxHashMap<Box<[u8]>, u32>>,
    /// Length in bytes of each token.
    pub token_bytes: Vec<u32>,
}

/// GPT-2's map of bytes to printable characters, used by byte-level vocabularies.
pub fn byte_to_char() -> [char; 256] {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        map[b as usize] = char::from_u32(c).expect("valid char");
    }
    map
}

impl Model {
    /// Appends the ids of one pre-token to `out`.
    pub(crate) fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if let Some(whole) = &self.whole_words {
            if let Some(&id) = whole.get(word) {
                out.push(id);
                return;
            }
        }
        let start = out.len();
        out.extend(word.iter().map(|&b| self.byte_ids[b as usize]));
        let symbols = &mut out[start..];
        let mut n = symbols.len();
        // Words are short and cached, so a scan per merge beats a heap.
        while n > 1 {
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..n - 1 {
                if let Some(&(rank, merged)) = self.merges.get(&(symbols[i], symbols[i + 1])) {
                    match best {
                        Some((r, _, _)) if r <= rank => {}
                        _ => best = Some((rank, i, merged)),
                    }
                }
            }
            let Some((_, i, merged)) = best else { break };
            symbols[i] = merged;
            symbols.copy_within(i + 2..n, i + 1);
            n -= 1;
        }
        out.truncate(start + n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        let m = byte_to_char();
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        let mut all: Vec<char> = m.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}

//! Batches of texts to flat ids and labels, in parallel on the current rayon pool, with one
//! word cache per thread. The output is the same for any number of threads.

use super::model::Model;
use super::BpeTokenizer;
use crate::policy::IGNORE_INDEX;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use std::borrow::Cow;
use std::cell::RefCell;

/// Words cached per thread before the cache is cleared (bounds memory on huge vocabularies
/// of rare words; common words come back at once).
const CACHE_WORDS: usize = 1 << 18;

pub(crate) struct WordCache {
    uid: u64,
    words: FxHashMap<Box<[u8]>, Box<[u32]>>,
}

impl WordCache {
    pub(crate) fn encode(&mut self, model: &Model, word: &[u8], out: &mut Vec<u32>) {
        if let Some(ids) = self.words.get(word) {
            out.extend_from_slice(ids);
            return;
        }
        let from = out.len();
        model.encode_word(word, out);
        if self.words.len() >= CACHE_WORDS {
            self.words.clear();
        }
        self.words.insert(word.into(), out[from..].into());
    }
}

thread_local! {
    static CACHE: RefCell<WordCache> = RefCell::new(WordCache { uid: 0, words: FxHashMap::default() });
}

pub(crate) fn with_cache<R>(uid: u64, f: impl FnOnce(&mut WordCache) -> R) -> R {
    CACHE.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.uid != uid {
            cache.uid = uid;
            cache.words.clear();
        }
        f(&mut cache)
    })
}

/// Flat token ids and labels of a batch: text `i` owns `ids[offsets[i]..offsets[i + 1]]`.
/// Texts listed in `fallback` (see [`BpeTokenizer::can_encode`]) own no tokens: the caller
/// encodes them another way.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EncodedBatch {
    pub ids: Vec<i32>,
    pub labels: Vec<i32>,
    pub offsets: Vec<i64>,
    pub fallback: Vec<i64>,
}

/// Encodes `texts` (`add_special_tokens=False`). Text `i` is trained on the character spans
/// `spans[span_offsets[i]..span_offsets[i + 1]]` (half-open, in characters): a token is trained
/// from the first token covering a span's first character through the token covering its last
/// character, the rule of `transformers`' `return_assistant_tokens_mask` (`char_to_token`).
pub fn encode_batch(
    tokenizer: &BpeTokenizer,
    texts: &[String],
    span_offsets: &[i64],
    spans: &[(i64, i64)],
) -> EncodedBatch {
    assert_eq!(
        span_offsets.len(),
        texts.len() + 1,
        "one span range per text"
    );
    encode_each(tokenizer, texts.len(), |i| {
        let text_spans = &spans[span_offsets[i] as usize..span_offsets[i + 1] as usize];
        Some((Cow::Borrowed(texts[i].as_str()), Cow::Borrowed(text_spans)))
    })
}

/// A text to encode and its trained character spans.
pub type Prepared<'a> = (Cow<'a, str>, Cow<'a, [(i64, i64)]>);

/// Encodes items `0..n`, each made into its text and trained spans by `prepare` on the
/// worker thread that encodes it (as [`encode_batch`]). An item `prepare` gives None for, or
/// whose text [`BpeTokenizer::can_encode`] refuses, owns no tokens and is listed in
/// `fallback`.
pub fn encode_each<'a>(
    tokenizer: &BpeTokenizer,
    n: usize,
    prepare: impl Fn(usize) -> Option<Prepared<'a>> + Sync,
) -> EncodedBatch {
    let per_task = (n / (rayon::current_num_threads() * 8)).clamp(1, 64);
    let parts: Vec<EncodedBatch> = (0..n.div_ceil(per_task))
        .into_par_iter()
        .map(|chunk| {
            let mut out = EncodedBatch {
                offsets: vec![0],
                ..Default::default()
            };
            let (mut ids, mut ends) = (Vec::new(), Vec::new());
            for i in chunk * per_task..((chunk + 1) * per_task).min(n) {
                ids.clear();
                ends.clear();
                match prepare(i) {
                    Some((text, text_spans)) if tokenizer.can_encode(&text) => {
                        tokenizer.encode_into(&text, &mut ids, &mut ends);
                        let base = out.labels.len();
                        out.ids.extend(ids.iter().map(|&id| id as i32));
                        out.labels.resize(base + ids.len(), IGNORE_INDEX);
                        let (labels, ids) = (&mut out.labels[base..], &out.ids[base..]);
                        mark_spans(&text, &ends, &text_spans, labels, ids);
                    }
                    _ => out.fallback.push(i as i64),
                }
                out.offsets.push(out.ids.len() as i64);
            }
            out
        })
        .collect();
    let total: usize = parts.iter().map(|p| p.ids.len()).sum();
    let mut out = EncodedBatch {
        ids: Vec::with_capacity(total),
        labels: Vec::with_capacity(total),
        offsets: Vec::with_capacity(n + 1),
        fallback: Vec::new(),
    };
    out.offsets.push(0);
    for part in parts {
        let base = out.ids.len() as i64;
        out.ids.extend_from_slice(&part.ids);
        out.labels.extend_from_slice(&part.labels);
        out.offsets
            .extend(part.offsets[1..].iter().map(|&o| o + base));
        out.fallback.extend_from_slice(&part.fallback);
    }
    out
}

/// Copies ids into labels over each span (see [`encode_batch`]); `ends[t]` is the byte where
/// token `t` ends.
fn mark_spans(text: &str, ends: &[u32], spans: &[(i64, i64)], labels: &mut [i32], ids: &[i32]) {
    if spans.is_empty() {
        return;
    }
    // Byte position of a character index (texts are mostly ASCII: then they are equal).
    let char_starts: Option<Vec<u32>> =
        (!text.is_ascii()).then(|| text.char_indices().map(|(b, _)| b as u32).collect());
    let n_chars = char_starts.as_ref().map_or(text.len(), Vec::len);
    let byte_of = |c: usize| char_starts.as_ref().map_or(c as u32, |starts| starts[c]);
    let token_at = |byte: u32| ends.partition_point(|&e| e <= byte);
    for &(start, end) in spans {
        let start = start.clamp(0, n_chars as i64) as usize;
        let end = end.clamp(0, n_chars as i64) as usize;
        if start >= end {
            continue;
        }
        let first = token_at(byte_of(start));
        let last = token_at(byte_of(end - 1));
        if first < ids.len() && last < ids.len() && first <= last {
            labels[first..=last].copy_from_slice(&ids[first..=last]);
        }
    }
}

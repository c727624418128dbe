//! A fast exact encoder for byte-level BPE tokenizers (`tokenizer.json` of the GPT-2, Llama 3
//! and Qwen2 kinds), with a per-thread word cache and hand-written pre-tokenizers. It gives the
//! ids `tokenizers` gives for the configurations it accepts; [`BpeTokenizer::from_json`] says
//! [`LoadError::Unsupported`] for every other one, so callers fall back to `tokenizers`.

mod added;
mod batch;
mod model;
mod pretokenize;
mod unicode;

pub use batch::{encode_batch, encode_each, EncodedBatch, Prepared};
pub use model::byte_to_char;
pub use pretokenize::{Pattern, LLAMA3_REGEX, QWEN2_REGEX};

use added::{AddedTokens, Piece};
use model::Model;
use rustc_hash::FxHashMap;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a `tokenizer.json` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not a readable tokenizer file.
    #[error("{0}")]
    Invalid(String),
    /// A valid tokenizer this encoder does not reproduce exactly (use `tokenizers`).
    #[error("{0}")]
    Unsupported(String),
}

/// A loaded byte-level BPE tokenizer.
pub struct BpeTokenizer {
    model: Model,
    /// An NFC normalizer: text already in NFC is encoded as is; other text is left to the
    /// caller (see [`BpeTokenizer::can_encode`]).
    nfc: bool,
    added: AddedTokens,
    pattern: Pattern,
    /// The post-processor adds tokens when `add_special_tokens=True` (a template, BOS, ...).
    pub post_processor_adds_tokens: bool,
    /// Identifies this instance in the per-thread word caches.
    uid: u64,
}

fn unsupported<T>(what: impl Into<String>) -> Result<T, LoadError> {
    Err(LoadError::Unsupported(what.into()))
}

fn is_null_or_false(v: Option<&Value>) -> bool {
    matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
}

/// `Some(uses_regex)` for a ByteLevel pre-tokenizer without a prefix space.
fn byte_level(pre: &Value) -> Result<bool, LoadError> {
    if pre.get("type").and_then(Value::as_str) != Some("ByteLevel") {
        return unsupported(format!(
            "pre-tokenizer {}",
            pre.get("type").unwrap_or(&Value::Null)
        ));
    }
    if !is_null_or_false(pre.get("add_prefix_space")) {
        return unsupported("ByteLevel pre-tokenizer with add_prefix_space");
    }
    Ok(pre.get("use_regex").and_then(Value::as_bool) != Some(false))
}

/// GPT-2's ByteLevel, or Llama 3 / Qwen2's `Sequence[Split(regex), ByteLevel(no regex)]`.
fn pattern_of(pre: &Value) -> Result<Pattern, LoadError> {
    if pre.get("type").and_then(Value::as_str) != Some("Sequence") {
        return if byte_level(pre)? {
            Ok(Pattern::Gpt2)
        } else {
            unsupported("ByteLevel pre-tokenizer without its regex")
        };
    }
    let steps = pre.get("pretokenizers").and_then(Value::as_array);
    let [split, last] = steps.map(Vec::as_slice).unwrap_or_default() else {
        return unsupported("a pre-tokenizer sequence other than Split + ByteLevel");
    };
    if byte_level(last)? {
        return unsupported("a Split before a ByteLevel pre-tokenizer with its own regex");
    }
    let regex = split
        .get("pattern")
        .and_then(|p| p.get("Regex"))
        .and_then(Value::as_str);
    let isolated = split.get("behavior").and_then(Value::as_str) == Some("Isolated");
    if split.get("type").and_then(Value::as_str) != Some("Split")
        || !isolated
        || !is_null_or_false(split.get("invert"))
    {
        return unsupported("a pre-tokenizer sequence other than Split(Isolated) + ByteLevel");
    }
    match regex {
        Some(r) if r == pretokenize::LLAMA3_REGEX => Ok(Pattern::Llama3 { max_digits: 3 }),
        Some(r) if r == pretokenize::QWEN2_REGEX => Ok(Pattern::Llama3 { max_digits: 1 }),
        _ => unsupported(format!(
            "a Split pattern other than Llama 3's or Qwen2's ({regex:?})"
        )),
    }
}

/// Whether the post-processor adds tokens to an encoding made with `add_special_tokens=True`.
fn adds_tokens(post: Option<&Value>) -> Result<bool, LoadError> {
    let Some(post) = post.filter(|v| !v.is_null()) else {
        return Ok(false);
    };
    match post.get("type").and_then(Value::as_str) {
        Some("ByteLevel") => {
            if !is_null_or_false(post.get("trim_offsets")) {
                // Trimmed offsets change which tokens a character maps to.
                return unsupported("ByteLevel post-processor with trim_offsets");
            }
            Ok(false)
        }
        Some("Sequence") => {
            let steps = post.get("processors").and_then(Value::as_array);
            let mut adds = steps.into_iter().flatten().map(|p| adds_tokens(Some(p)));
            adds.try_fold(false, |any, a| Ok(any | a?))
        }
        Some(_) => Ok(true),
        None => unsupported("post-processor without a type"),
    }
}

/// No normalizer (false) or NFC alone (true); anything else is unsupported.
fn is_nfc_normalizer(normalizer: Option<&Value>) -> Result<bool, LoadError> {
    let Some(n) = normalizer.filter(|v| !v.is_null()) else {
        return Ok(false);
    };
    match n.get("type").and_then(Value::as_str) {
        Some("NFC") => Ok(true),
        Some("Sequence") => {
            let steps = n.get("normalizers").and_then(Value::as_array);
            match steps.map(Vec::as_slice).unwrap_or_default() {
                [] => Ok(false),
                [one] => is_nfc_normalizer(Some(one)),
                _ => unsupported("a normalizer other than NFC"),
            }
        }
        _ => unsupported("a normalizer other than NFC"),
    }
}

fn merge_pair(m: &Value) -> Option<(&str, &str)> {
    match m {
        Value::String(s) => s.split_once(' '),
        Value::Array(a) if a.len() == 2 => Some((a[0].as_str()?, a[1].as_str()?)),
        _ => None,
    }
}

fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}

impl BpeTokenizer {
    /// Loads the text of a `tokenizer.json`.
    pub fn from_json(text: &str) -> Result<Self, LoadError> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| LoadError::Invalid(format!("not a tokenizer.json file ({e})")))?;
        let nfc = is_nfc_normalizer(root.get("normalizer"))?;
        let pattern = pattern_of(root.get("pre_tokenizer").unwrap_or(&Value::Null))?;
        let post_processor_adds_tokens = adds_tokens(root.get("post_processor"))?;
        let model = root
            .get("model")
            .ok_or_else(|| LoadError::Invalid("tokenizer.json has no model".into()))?;
        if model.get("type").and_then(Value::as_str) != Some("BPE") {
            return unsupported("a model other than BPE");
        }
        let affixes = ["dropout", "continuing_subword_prefix", "end_of_word_suffix"];
        if !affixes
            .iter()
            .all(|k| matches!(model.get(*k), None | Some(Value::Null)))
            || !is_null_or_false(model.get("byte_fallback"))
        {
            return unsupported("BPE with dropout, affixes or byte fallback");
        }
        let vocab_json = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| LoadError::Invalid("BPE model without a vocab".into()))?;
        let mut vocab: FxHashMap<&str, u32> = FxHashMap::default();
        let mut max_id = 0u32;
        for (token, id) in vocab_json {
            let id =
                token_id(id).ok_or_else(|| LoadError::Invalid(format!("bad id of {token:?}")))?;
            vocab.insert(token.as_str(), id);
            max_id = max_id.max(id);
        }
        let added_json = root.get("added_tokens").and_then(Value::as_array);
        for t in added_json.into_iter().flatten() {
            if let Some(id) = t.get("id").and_then(token_id) {
                max_id = max_id.max(id);
            }
        }
        // Per-id tables are sized by the largest id: ids far above the number of tokens would
        // make them huge (an id near u32::MAX asks for 16 GiB); `tokenizers` keeps a map.
        let n_tokens = vocab.len() + added_json.map_or(0, Vec::len);
        if max_id as usize > 2 * n_tokens {
            return unsupported(format!(
                "sparse token ids (up to {max_id} for {n_tokens} tokens)"
            ));
        }

        let mut char_byte: FxHashMap<char, u8> = FxHashMap::default();
        let mut byte_ids = [0u32; 256];
        for (b, c) in byte_to_char().into_iter().enumerate() {
            char_byte.insert(c, b as u8);
            match vocab.get(c.encode_utf8(&mut [0; 4]) as &str) {
                Some(&id) => byte_ids[b] = id,
                None => return unsupported(format!("byte {b:#04x} is not in the vocabulary")),
            }
        }
        // Token lengths in bytes; tokens outside the byte alphabet cannot come out of merges.
        let mut token_bytes = vec![0u32; max_id as usize + 1];
        let mut decoded: FxHashMap<u32, Vec<u8>> = FxHashMap::default();
        for (&token, &id) in &vocab {
            let bytes: Option<Vec<u8>> =
                token.chars().map(|c| char_byte.get(&c).copied()).collect();
            if let Some(bytes) = bytes {
                token_bytes[id as usize] = bytes.len() as u32;
                decoded.insert(id, bytes);
            }
        }
        let merges_json = model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or_else(|| LoadError::Invalid("BPE model without merges".into()))?;
        let mut merges = FxHashMap::default();
        for (rank, m) in merges_json.iter().enumerate() {
            let (a, b) = merge_pair(m)
                .ok_or_else(|| LoadError::Invalid(format!("bad merge #{rank}: {m}")))?;
            let (Some(&ia), Some(&ib)) = (vocab.get(a), vocab.get(b)) else {
                return Err(LoadError::Invalid(format!(
                    "merge #{rank} uses an unknown token"
                )));
            };
            let merged = format!("{a}{b}");
            let Some(&im) = vocab.get(merged.as_str()) else {
                return Err(LoadError::Invalid(format!(
                    "merge #{rank} makes an unknown token"
                )));
            };
            // The first occurrence of a pair wins, as in `tokenizers`.
            merges.entry((ia, ib)).or_insert((rank as u32, im));
        }
        let whole_words = (model.get("ignore_merges").and_then(Value::as_bool) == Some(true))
            .then(|| decoded.into_iter().map(|(id, b)| (b.into(), id)).collect());

        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        for t in added_json.into_iter().flatten() {
            let content = t.get("content").and_then(Value::as_str);
            let id = t.get("id").and_then(token_id);
            let (Some(content), Some(id)) = (content, id) else {
                return Err(LoadError::Invalid(format!("bad added token {t}")));
            };
            if ["single_word", "lstrip", "rstrip"]
                .iter()
                .any(|k| !is_null_or_false(t.get(*k)))
            {
                return unsupported(format!(
                    "added token {content:?} with single_word/lstrip/rstrip"
                ));
            }
            if content.is_empty() {
                continue;
            }
            if vocab.get(content).is_some_and(|&v| v != id) {
                // tokenizers would use the vocabulary's id.
                return unsupported(format!("added token {content:?} has two ids"));
            }
            token_bytes[id as usize] = content.len() as u32;
            let set = if t.get("normalized").and_then(Value::as_bool).unwrap_or(true) {
                &mut normalized
            } else {
                &mut raw
            };
            set.push((content.to_string(), id));
        }

        static NEXT_UID: AtomicU64 = AtomicU64::new(1);
        Ok(Self {
            model: Model {
                byte_ids,
                merges,
                whole_words,
                token_bytes,
            },
            nfc,
            added: AddedTokens::new(raw, normalized)
                .map_err(|e| LoadError::Unsupported(format!("added tokens ({e})")))?,
            pattern,
            post_processor_adds_tokens,
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Appends the ids of `text` to `ids` and the byte offset where each token ends to `ends`
    /// (tokens cover the text without gaps). No post-processing: `add_special_tokens=False`.
    pub fn encode_into(&self, text: &str, ids: &mut Vec<u32>, ends: &mut Vec<u32>) {
        batch::with_cache(self.uid, |cache| {
            self.added.split(text, &mut |piece| match piece {
                Piece::Added { id, end, .. } => {
                    ids.push(id);
                    ends.push(end as u32);
                }
                Piece::Text { start, end } => {
                    let segment = &text[start..end];
                    pretokenize::split(self.pattern, segment, |a, b| {
                        let word = &segment.as_bytes()[a..b];
                        let from = ids.len();
                        cache.encode(&self.model, word, ids);
                        let mut pos = (start + a) as u32;
                        for &id in &ids[from..] {
                            pos += self.model.token_bytes[id as usize];
                            ends.push(pos);
                        }
                    });
                }
            });
        });
    }

    /// Whether [`Self::encode_into`] gives `tokenizers`' result for `text`: always, unless
    /// the tokenizer normalizes to NFC and `text` is not in NFC (normalizing would move the
    /// character offsets the labels are computed from).
    pub fn can_encode(&self, text: &str) -> bool {
        !self.nfc || text.is_ascii() || unicode_normalization::is_nfc(text)
    }

    /// The ids of `text` (`add_special_tokens=False`); None when [`Self::can_encode`] is false.
    pub fn encode(&self, text: &str) -> Option<Vec<u32>> {
        if !self.can_encode(text) {
            return None;
        }
        let (mut ids, mut ends) = (Vec::new(), Vec::new());
        self.encode_into(text, &mut ids, &mut ends);
        Some(ids)
    }
}

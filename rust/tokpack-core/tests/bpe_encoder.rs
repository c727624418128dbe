//! The byte-level BPE encoder on a hand-made tokenizer: merges by rank, added tokens, token
//! ends, labels from character spans, and (proptest) token ends that cover the text.

mod common;

use proptest::prelude::*;
use serde_json::json;
use tokpack_core::bpe::{byte_to_char, encode_batch, BpeTokenizer, LoadError};

/// Byte `b` is token `b + added.len()`, then the merges' tokens; the added tokens come first.
fn tokenizer_json(merges: &[(&str, &str)], added: &[&str]) -> String {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_to_char().iter().enumerate() {
        vocab.insert(c.to_string(), json!(i + added.len()));
    }
    for (a, b) in merges {
        let next = vocab.len() + added.len();
        vocab.entry(format!("{a}{b}")).or_insert(json!(next));
    }
    let added_tokens: Vec<_> = added
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "trim_offsets": false},
        "model": {"type": "BPE", "dropout": null, "vocab": vocab,
                  "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()},
    })
    .to_string()
}

fn sample() -> BpeTokenizer {
    let merges = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
    ];
    BpeTokenizer::from_json(&tokenizer_json(&merges, &["<s>", "</s>"])).unwrap()
}

/// The id of byte `b` in [`sample`] (after its two added tokens).
fn id_of(b: u8) -> u32 {
    u32::from(b) + 2
}

#[test]
fn merges_apply_by_rank() {
    let tok = sample();
    let hello = tok.encode("hello").unwrap();
    assert_eq!(hello.len(), 1, "{hello:?}");
    let hell = tok.encode("hell").unwrap();
    assert_eq!(hell.len(), 1);
    assert_ne!(hell, hello);
    // "ll" merges before "he" would only if its rank were lower: it is not, both apply.
    assert_eq!(tok.encode("hel").unwrap().len(), 2);
    assert_eq!(tok.encode(" w").unwrap().len(), 1);
    assert_eq!(
        tok.encode("xyz").unwrap(),
        vec![id_of(b'x'), id_of(b'y'), id_of(b'z')]
    );
}

#[test]
fn added_tokens_split_the_text_and_ends_cover_it() {
    let tok = sample();
    let (mut ids, mut ends) = (Vec::new(), Vec::new());
    tok.encode_into("a<s>b</s>", &mut ids, &mut ends);
    assert_eq!(ids, vec![id_of(b'a'), 0, id_of(b'b'), 1]);
    assert_eq!(ends, vec![1, 4, 5, 9]);
}

#[test]
fn labels_cover_tokens_touching_the_span() {
    let tok = sample();
    // "é" is two bytes, two tokens: a span starting at it starts at its first token; a span
    // ending at it ends at its first token too (the token char_to_token names).
    let texts = vec!["ab é cd".to_string()];
    let out = encode_batch(&tok, &texts, &[0, 1], &[(3, 4)]);
    assert_eq!(out.offsets, vec![0, out.ids.len() as i64]);
    let trained: Vec<bool> = out.labels.iter().map(|&l| l != -100).collect();
    // tokens: a b Ġ Ã ©(second byte of é) Ġ c d -> the span covers 'é' = token 3 only.
    assert_eq!(
        trained,
        vec![false, false, false, true, false, false, false, false]
    );
    assert!(out
        .labels
        .iter()
        .zip(&out.ids)
        .all(|(&l, &i)| l == -100 || l == i));
}

#[test]
fn unsupported_configurations_are_named() {
    let mut value: serde_json::Value = serde_json::from_str(&tokenizer_json(&[], &[])).unwrap();
    value["normalizer"] = json!({"type": "NFKC"});
    match BpeTokenizer::from_json(&value.to_string()) {
        Err(LoadError::Unsupported(why)) => assert!(why.contains("normalizer")),
        other => panic!("expected Unsupported, got {:?}", other.err()),
    }
    assert!(matches!(
        BpeTokenizer::from_json("{not json"),
        Err(LoadError::Invalid(_))
    ));
}

/// A token id near u32::MAX (in the vocabulary or an added token) once sized a per-id table
/// of 2^32 entries, 16 GiB: such sparse ids are left to `tokenizers`, which keeps a map.
#[test]
fn sparse_token_ids_are_left_to_tokenizers() {
    let base: serde_json::Value = serde_json::from_str(&tokenizer_json(&[], &["<|x|>"])).unwrap();
    let mut added = base.clone();
    added["added_tokens"][0]["id"] = json!(u32::MAX - 1);
    let mut vocab = base;
    vocab["model"]["vocab"]["zz"] = json!(u32::MAX);
    for json in [added, vocab] {
        match BpeTokenizer::from_json(&json.to_string()) {
            Err(LoadError::Unsupported(why)) => assert!(why.contains("sparse"), "{why}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("loaded a tokenizer with an id near u32::MAX"),
        }
    }
}

#[test]
fn nfc_tokenizers_leave_text_not_in_nfc_to_the_caller() {
    let mut value: serde_json::Value =
        serde_json::from_str(&tokenizer_json(&[("h", "e")], &[])).unwrap();
    value["normalizer"] = json!({"type": "NFC"});
    let tok = BpeTokenizer::from_json(&value.to_string()).unwrap();
    assert!(tok.encode("he café").is_some());
    assert!(tok.encode("cafe\u{301}").is_none());
    let texts = vec!["he".to_string(), "e\u{301}".to_string(), "he".to_string()];
    let out = encode_batch(&tok, &texts, &[0, 0, 0, 0], &[]);
    assert_eq!(out.fallback, vec![1]);
    assert_eq!(out.offsets, vec![0, 1, 1, 2]);
}

proptest! {
    #![proptest_config(common::deterministic(256))]
    #[test]
    fn token_ends_cover_the_text_in_order(text in "[a-z hé東🙂\n\t'.,0-9<s/>]{0,40}") {
        let tok = sample();
        let (mut ids, mut ends) = (Vec::new(), Vec::new());
        tok.encode_into(&text, &mut ids, &mut ends);
        prop_assert_eq!(ids.len(), ends.len());
        prop_assert!(ends.windows(2).all(|w| w[0] < w[1]));
        prop_assert_eq!(ends.last().copied().unwrap_or(0) as usize, text.len());
        let batch = encode_batch(&tok, &[text.clone(), text.clone()], &[0, 0, 0], &[]);
        prop_assert_eq!(&batch.ids[..ids.len()], &batch.ids[ids.len()..]);
        prop_assert!(batch.labels.iter().all(|&l| l == -100));
    }
}

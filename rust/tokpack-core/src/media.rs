//! The cuts of multimodal samples, planned once here: each sample's images (its `media`
//! column, a JSON list of one object per image or video, in token order), their blocks (an
//! image's pad tokens with its `vision_start` and `vision_end` markers: no cut falls inside
//! one, [`crate::cuts`]), the pieces over-long samples keep, and each piece's own `media` (the
//! images it holds whole, spans rebased to the piece), `vision_tokens` and `vision_patches`.
//! The rules of `tokpack.multimodal.pieces` (tokenize-time cuts), exactly.
//!
//! A piece's `media` is its images' objects as the sample holds them (each key and value's
//! text kept, the compact JSON the tokenizer writes), but each `span` rebased.

use crate::cuts::{safe_pieces, Blocks, Cuts};
use crate::error::{CoreError, Result};
use crate::plan::Plan;
use crate::policy::Overlong;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// One image (or video) of a sample: its object's `(key, value)` texts, its `span` `[start,
/// n]` (`n` pad tokens from token `start`), its pad tokens and its encoder patches.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    fields: Vec<(String, String)>,
    span: (i64, i64),
    tokens: i64,
    patches: i64,
}

/// The images of a sample, from its `media` JSON text (`[]`: none).
pub fn parse_media(text: &str) -> std::result::Result<Vec<Item>, String> {
    let objects: Vec<Fields> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    objects.into_iter().map(|f| item(f.0)).collect()
}

/// An object's keys and the text of their values, in order (no value is re-written).
struct Fields(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an image's object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Ordered)
    }
}

fn item(fields: Vec<(String, Box<RawValue>)>) -> std::result::Result<Item, String> {
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| serde_json::from_str::<serde_json::Value>(v.get()))
            .transpose()
            .map_err(|e| format!("{key}: {e}"))
    };
    let ints = |v: &serde_json::Value, key: &str| -> std::result::Result<Vec<i64>, String> {
        v.as_array()
            .and_then(|a| a.iter().map(|x| x.as_i64()).collect::<Option<Vec<i64>>>())
            .ok_or_else(|| format!("an image's {key:?} is not a list of integers"))
    };
    let span = get("span")?.ok_or("an image without a \"span\"")?;
    let span = match ints(&span, "span")?[..] {
        [start, n] => (start, n),
        _ => return Err("an image's \"span\" is not [start, n]".into()),
    };
    let tokens = match get("tokens")? {
        Some(t) => t
            .as_i64()
            .ok_or("an image's \"tokens\" is not an integer")?,
        None => span.1,
    };
    let grid = get("grid")?.ok_or("an image without a \"grid\"")?;
    let patches = ints(&grid, "grid")?.iter().product();
    let fields = fields
        .into_iter()
        .map(|(k, v)| (serde_json::Value::from(k).to_string(), v.get().to_string()))
        .collect();
    Ok(Item {
        fields,
        span,
        tokens,
        patches,
    })
}

/// The tokens `[a, b)` each image takes with its markers: no cut falls inside one.
pub fn image_blocks(items: &[Item]) -> Vec<(i64, i64)> {
    items
        .iter()
        .map(|m| (m.span.0 - 1, m.span.0 + m.span.1 + 1))
        .collect()
}

/// The `media` JSON, vision tokens and vision patches of tokens `start..end` of a sample with
/// `items`: the images it holds whole (with their markers), spans rebased to the piece.
pub fn piece_media(items: &[Item], start: i64, end: i64) -> (String, i64, i64) {
    let kept: Vec<&Item> = items
        .iter()
        .filter(|m| start < m.span.0 && m.span.0 + m.span.1 < end)
        .collect();
    let objects: Vec<String> = kept
        .iter()
        .map(|m| {
            let fields: Vec<String> = m
                .fields
                .iter()
                .map(|(k, v)| match k.as_str() {
                    "\"span\"" => format!("{k}:[{},{}]", m.span.0 - start, m.span.1),
                    _ => format!("{k}:{v}"),
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        })
        .collect();
    let tokens = kept.iter().map(|m| m.tokens).sum();
    let patches = kept.iter().map(|m| m.patches).sum();
    (format!("[{}]", objects.join(",")), tokens, patches)
}

/// What packing multimodal samples needs: the cuts (chosen pieces of over-long samples with
/// images, and with `random` the blocks of every sample with images), the samples with no safe
/// cut (dropped), and the images of the samples that matter.
pub struct MediaCuts {
    pub cuts: Cuts,
    pub no_safe_cut: Vec<i64>,
    media: BTreeMap<i64, Vec<Item>>,
    random: bool,
}

/// The media cuts of samples of `lengths` (`media(i)`: sample `i`'s media text when it has
/// vision tokens, else None), for `max_len` and `overlong`; `random`: the strategy cuts
/// samples at row ends. None when nothing may be cut inside an image.
pub fn media_cuts(
    lengths: &[i64],
    media: impl Fn(usize) -> Option<Result<Vec<Item>>>,
    max_len: i64,
    overlong: Overlong,
    random: bool,
) -> Result<Option<MediaCuts>> {
    let cutting = matches!(overlong, Overlong::Truncate | Overlong::Split);
    if !random && !cutting {
        return Ok(None);
    }
    let mut images = BTreeMap::new();
    for (i, &n) in lengths.iter().enumerate() {
        if !random && n <= max_len {
            continue;
        }
        if let Some(items) = media(i).transpose()? {
            if !items.is_empty() {
                images.insert(i as i64, items);
            }
        }
    }
    let (mut samples, mut offsets, mut starts, mut sizes) = (vec![], vec![0], vec![], vec![]);
    let mut no_safe_cut = Vec::new();
    for (&sample, items) in &images {
        let n = lengths[sample as usize];
        if !cutting || n <= max_len {
            continue;
        }
        let whole = overlong == Overlong::Split;
        let pieces = safe_pieces(n, max_len, whole, &image_blocks(items));
        samples.push(sample);
        if pieces.is_empty() {
            no_safe_cut.push(sample);
        }
        for (a, b) in pieces {
            starts.push(a);
            sizes.push(b - a);
        }
        offsets.push(starts.len());
    }
    let mut cuts = Cuts::new(samples, offsets, starts, sizes)?;
    if random {
        let (mut samples, mut offsets, mut a, mut b) = (vec![], vec![0], vec![], vec![]);
        for (&sample, items) in &images {
            let mut blocks = image_blocks(items);
            blocks.sort_unstable();
            samples.push(sample);
            a.extend(blocks.iter().map(|x| x.0));
            b.extend(blocks.iter().map(|x| x.1));
            offsets.push(a.len());
        }
        cuts = cuts.with_blocks(Blocks::new(samples, offsets, a, b)?);
    }
    Ok(Some(MediaCuts {
        cuts,
        no_safe_cut,
        media: images,
        random,
    }))
}

impl MediaCuts {
    /// The pieces of `plan` that carry their own media (the chosen cuts; with `random`, every
    /// segment of every sample the plan cuts), and each media column's values for them (in
    /// [`crate::format::MEDIA_COLUMNS`] order).
    pub fn pieces(&self, plan: &Plan) -> Result<(Cuts, String3)> {
        let pieces = if self.random {
            plan_pieces(plan)?
        } else {
            self.cuts.clone().with_blocks(Blocks::default())
        };
        let mut values: String3 = (vec![], vec![], vec![]);
        for (i, &sample) in pieces.samples.iter().enumerate() {
            let items = self.media.get(&sample).map_or(&[][..], |v| v.as_slice());
            for k in pieces.offsets[i]..pieces.offsets[i + 1] {
                let start = pieces.starts[k];
                let (media, tokens, patches) = piece_media(items, start, start + pieces.lengths[k]);
                values.0.push(media);
                values.1.push(tokens);
                values.2.push(patches);
            }
        }
        Ok((pieces, values))
    }
}

/// Each piece's `media`, `vision_tokens` and `vision_patches`.
pub type String3 = (Vec<String>, Vec<i64>, Vec<i64>);

/// Every segment of every sample `plan` truncates or splits, by sample then start.
fn plan_pieces(plan: &Plan) -> Result<Cuts> {
    let mut cut: Vec<i64> = plan.split.iter().chain(&plan.truncated).copied().collect();
    cut.sort_unstable();
    cut.dedup();
    let mut segments: Vec<(i64, i64, i64)> = (0..plan.sample_ids.len())
        .filter(|&k| cut.binary_search(&plan.sample_ids[k]).is_ok())
        .map(|k| (plan.sample_ids[k], plan.starts[k], plan.lengths[k]))
        .collect();
    segments.sort_unstable();
    let (mut samples, mut offsets, mut starts, mut lengths) = (vec![], vec![0], vec![], vec![]);
    for (k, &(sample, start, length)) in segments.iter().enumerate() {
        if k > 0 && segments[k - 1].0 != sample {
            offsets.push(starts.len());
        }
        if samples.last() != Some(&sample) {
            samples.push(sample);
        }
        starts.push(start);
        lengths.push(length);
    }
    if !samples.is_empty() {
        offsets.push(starts.len());
    }
    Cuts::new(samples, offsets, starts, lengths).map_err(|e| match e {
        CoreError::Config(m) => CoreError::data(m),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEDIA: &str = r#"[{"ref":"a\"b.png","hash":"x","size":[4,4],"grid":[1,2,2],"span":[3,4]},{"type":"video","grid":[2,2,2],"span":[10,2],"tokens":1}]"#;

    #[test]
    fn pieces_keep_their_whole_images_rebased() {
        let items = parse_media(MEDIA).unwrap();
        assert_eq!(image_blocks(&items), vec![(2, 8), (9, 13)]);
        let (media, tokens, patches) = piece_media(&items, 1, 9);
        assert_eq!(
            media,
            r#"[{"ref":"a\"b.png","hash":"x","size":[4,4],"grid":[1,2,2],"span":[2,4]}]"#
        );
        assert_eq!((tokens, patches), (4, 4));
        assert_eq!(piece_media(&items, 0, 20).1, 5);
        assert_eq!(piece_media(&items, 0, 20).0, MEDIA);
        assert_eq!(
            piece_media(&items, 5, 20).0,
            r#"[{"type":"video","grid":[2,2,2],"span":[5,2],"tokens":1}]"#
        );
        assert_eq!(parse_media("[]").unwrap(), vec![]);
        assert!(parse_media("[{\"span\":[1]}]").is_err());
        assert!(parse_media("[{").is_err());
    }
}

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
    let mut s = Scanner {
        b: text.as_bytes(),
        i: 0,
    };
    let mut items = Vec::new();
    s.expect(b'[')?;
    if !s.eat(b']') {
        loop {
            items.push(item(s.object()?)?);
            if s.eat(b']') {
                break;
            }
            s.expect(b',')?;
        }
    }
    s.ws();
    if s.i != s.b.len() {
        return Err("trailing characters after the list".into());
    }
    Ok(items)
}

fn item(fields: Vec<(String, String)>) -> std::result::Result<Item, String> {
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == &format!("{key:?}"))
            .map(|(_, v)| serde_json::from_str::<serde_json::Value>(v))
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
    Ok(Item {
        fields,
        span,
        tokens,
        patches,
    })
}

/// A JSON scanner keeping the text of each object's keys and values (no value is re-written).
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.b.get(self.i) == Some(&c);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        match self.eat(c) {
            true => Ok(()),
            false => Err(format!("expected {:?} at character {}", c as char, self.i)),
        }
    }

    fn text(&self, from: usize) -> String {
        String::from_utf8_lossy(&self.b[from..self.i]).into_owned()
    }

    fn object(&mut self) -> std::result::Result<Vec<(String, String)>, String> {
        self.expect(b'{')?;
        let mut fields = Vec::new();
        if self.eat(b'}') {
            return Ok(fields);
        }
        loop {
            self.ws();
            let at = self.i;
            self.string()?;
            let key = self.text(at);
            self.expect(b':')?;
            self.ws();
            let at = self.i;
            self.value()?;
            fields.push((key, self.text(at)));
            if self.eat(b'}') {
                return Ok(fields);
            }
            self.expect(b',')?;
        }
    }

    fn string(&mut self) -> std::result::Result<(), String> {
        if self.b.get(self.i) != Some(&b'"') {
            return Err(format!("expected a string at character {}", self.i));
        }
        self.i += 1;
        while let Some(&c) = self.b.get(self.i) {
            self.i += if c == b'\\' { 2 } else { 1 };
            if c == b'"' {
                return Ok(());
            }
        }
        Err("an unterminated string".into())
    }

    fn value(&mut self) -> std::result::Result<(), String> {
        match self.b.get(self.i) {
            Some(b'"') => self.string(),
            Some(b'{' | b'[') => {
                let mut depth = 0usize;
                while let Some(&c) = self.b.get(self.i) {
                    match c {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => depth -= 1,
                        _ => {}
                    }
                    self.i += 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Err("an unterminated list or object".into())
            }
            _ => {
                let at = self.i;
                while self
                    .b
                    .get(self.i)
                    .is_some_and(|c| !b",}] \t\r\n".contains(c))
                {
                    self.i += 1;
                }
                match self.i > at {
                    true => Ok(()),
                    false => Err(format!("expected a value at character {at}")),
                }
            }
        }
    }
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

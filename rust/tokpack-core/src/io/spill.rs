//! Spill files: the tokens (and labels) of every sample, kept on disk between reading and
//! writing so memory does not grow with the corpus. Worker threads append to [`MAX_FILES`] files
//! at most (worker `w` to file `w % files`, a mutex per file serialises appends); a sample is
//! found again by a 64-bit location and its length, both kept in memory.
//!
//! Each sample is one record, encoded compactly (about 2.1 bytes per token for an SFT sample
//! with a vocabulary below 65,536, 2.25 below 131,072, against 8 for raw int32 tokens and
//! labels); the location says how:
//!
//! | part | bytes | |
//! |---|---|---|
//! | ids | `n × 2`, `n × 3` or `n × 4` | little-endian, the narrowest width the sample's ids allow; `u17` is `n × 2` (the low 16 bits) plus a bit plane of bit 16 |
//! | label bits | `⌈n / 8⌉` | bit `i` set: the label is the token; clear: -100 (or an exception) |
//! | exceptions | `4 + 8 e` | `e` (u32), then `e` positions (u32, ascending), then their labels (i32) |
//!
//! Labels that are neither -100 nor the token go to the exception list; when that list would be
//! larger than the labels themselves (pre-shifted labels, say), the record holds the labels raw
//! (`n × 4` bytes, int32) instead of the bits and exceptions.
//!
//! Reads use positioned reads (`pread`), not a memory map: pages of a mapped file count in the
//! process's resident memory, while `pread` copies only what each row group needs.

use super::pagecache::random_reads;
use crate::error::{Context, Result};
use crate::policy::IGNORE_INDEX;
use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

// A location: file (6 bits) | id width (2) | label encoding (2) | byte position of the record.
const FILE_SHIFT: u32 = 58;
const WIDTH_SHIFT: u32 = 56;
const LABELS_SHIFT: u32 = 54;
const POS_MASK: u64 = (1 << LABELS_SHIFT) - 1;

/// Spill files. Must fit in the location's file bits; a few dozen already keep the threads
/// from waiting on each other's appends.
pub const MAX_FILES: usize = 64;
const _: () = assert!(MAX_FILES <= 1 << (64 - FILE_SHIFT));

/// How a record stores its ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    U16,
    /// The low 16 bits, then a bit plane of bit 16.
    U17,
    U24,
    I32,
}

impl Width {
    const ALL: [Width; 4] = [Width::U16, Width::U17, Width::U24, Width::I32];

    /// The narrowest width holding every id (negative ids, rejected before the spill, would
    /// take the int32 width).
    fn of(ids: &[i32]) -> Width {
        match ids.iter().map(|&v| v as u32).max().unwrap_or(0) {
            m if m < 1 << 16 => Width::U16,
            m if m < 1 << 17 => Width::U17,
            m if m < 1 << 24 => Width::U24,
            _ => Width::I32,
        }
    }

    /// Bytes per id in the ids part (bit planes apart).
    fn bytes(self) -> usize {
        match self {
            Width::U16 | Width::U17 => 2,
            Width::U24 => 3,
            Width::I32 => 4,
        }
    }

    fn planes(self) -> usize {
        usize::from(self == Width::U17)
    }
}

/// How a record stores its labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Labels {
    /// Not spilled (the run has no labels).
    None,
    /// Label bits only: each label is the token or -100.
    Bits,
    /// Label bits and an exception list.
    Exceptions,
    /// Raw int32 labels.
    Raw,
}

impl Labels {
    const ALL: [Labels; 4] = [Labels::None, Labels::Bits, Labels::Exceptions, Labels::Raw];
}

/// The codes of `width` and `labels` are their discriminants: their index in `ALL`.
fn location(file: usize, width: Width, labels: Labels, pos: u64) -> u64 {
    debug_assert!(pos <= POS_MASK);
    ((file as u64) << FILE_SHIFT)
        | ((width as u64) << WIDTH_SHIFT)
        | ((labels as u64) << LABELS_SHIFT)
        | pos
}

fn parts(loc: u64) -> (usize, Width, Labels, u64) {
    (
        (loc >> FILE_SHIFT) as usize,
        Width::ALL[((loc >> WIDTH_SHIFT) & 3) as usize],
        Labels::ALL[((loc >> LABELS_SHIFT) & 3) as usize],
        loc & POS_MASK,
    )
}

fn plane_bytes(n: usize) -> usize {
    n.div_ceil(8)
}

/// Appends a bit plane: bit `i` (LSB first) is `bit(i)`.
fn push_plane(out: &mut Vec<u8>, n: usize, bit: impl Fn(usize) -> bool) {
    for chunk in 0..plane_bytes(n) {
        let mut byte = 0u8;
        for i in chunk * 8..(chunk * 8 + 8).min(n) {
            byte |= u8::from(bit(i)) << (i % 8);
        }
        out.push(byte);
    }
}

fn plane_bit(plane: &[u8], i: usize) -> bool {
    plane[i / 8] >> (i % 8) & 1 == 1
}

/// Appends the record of one sample to `out`; returns how its ids and labels are stored.
fn encode(ids: &[i32], labels: Option<&[i32]>, out: &mut Vec<u8>) -> (Width, Labels) {
    let n = ids.len();
    let width = Width::of(ids);
    match width {
        Width::U16 | Width::U17 => {
            out.extend(ids.iter().flat_map(|&v| (v as u16).to_le_bytes()));
            if width == Width::U17 {
                push_plane(out, n, |i| ids[i] >> 16 & 1 == 1);
            }
        }
        Width::U24 => out.extend(ids.iter().flat_map(|&v| {
            let b = v.to_le_bytes();
            [b[0], b[1], b[2]]
        })),
        Width::I32 => out.extend(ids.iter().flat_map(|&v| v.to_le_bytes())),
    }
    let Some(labels) = labels else {
        return (width, Labels::None);
    };
    let odd = |(&l, &v): (&i32, &i32)| l != IGNORE_INDEX && l != v;
    let exceptions = labels.iter().zip(ids).filter(|&p| odd(p)).count();
    if exceptions == 0 {
        push_plane(out, n, |i| labels[i] == ids[i]);
        return (width, Labels::Bits);
    }
    if plane_bytes(n) + 4 + 8 * exceptions >= 4 * n {
        out.extend(labels.iter().flat_map(|&l| l.to_le_bytes()));
        return (width, Labels::Raw);
    }
    push_plane(out, n, |i| labels[i] == ids[i]);
    out.extend((exceptions as u32).to_le_bytes());
    let odd_at = || (0..n).filter(|&i| odd((&labels[i], &ids[i])));
    out.extend(odd_at().flat_map(|i| (i as u32).to_le_bytes()));
    out.extend(odd_at().flat_map(|i| labels[i].to_le_bytes()));
    (width, Labels::Exceptions)
}

/// Byte offsets inside a record of `n` values: of its ids part's end (bit planes included),
/// and of its labels part's end (without the exception entries).
fn layout(n: usize, width: Width, labels: Labels) -> (usize, usize) {
    let ids = n * width.bytes() + width.planes() * plane_bytes(n);
    let labels = match labels {
        Labels::None => 0,
        Labels::Bits => plane_bytes(n),
        Labels::Exceptions => plane_bytes(n) + 4,
        Labels::Raw => 4 * n,
    };
    (ids, ids + labels)
}

/// Values of `W` little-endian bytes each (an int32's low bytes) from `bytes` into `out`.
fn unpack<const W: usize>(bytes: &[u8], out: &mut [i32]) {
    for (v, b) in out.iter_mut().zip(bytes.chunks_exact(W)) {
        let mut word = [0u8; 4];
        word[..W].copy_from_slice(b);
        *v = i32::from_le_bytes(word);
    }
}

struct Appender {
    file: File,
    /// Bytes written so far.
    len: u64,
}

/// The writing side: one file per worker, at most [`MAX_FILES`].
pub struct Spill {
    dir: PathBuf,
    files: Vec<Mutex<Appender>>,
    with_labels: bool,
}

thread_local! {
    /// Encoded records of the batch being appended, and bytes being decoded.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Spill {
    /// Creates the spill files in `dir` (which must exist) for `workers` threads.
    pub fn create(dir: &Path, workers: usize, with_labels: bool) -> Result<Self> {
        let n = workers.clamp(1, MAX_FILES);
        let mut files = Vec::with_capacity(n);
        for w in 0..n {
            let path = dir.join(format!("spill-{w}.bin"));
            let file = File::options()
                .create_new(true)
                .read(true)
                .write(true)
                .open(&path)
                .output(&path)?;
            files.push(Mutex::new(Appender { file, len: 0 }));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            with_labels,
        })
    }

    /// Appends the samples `ids[offsets[i]..offsets[i + 1]]` (with the same spans of `labels`
    /// when the spill has labels); returns each sample's location.
    pub fn append(
        &self,
        worker: usize,
        ids: &[i32],
        offsets: &[i64],
        labels: Option<&[i32]>,
    ) -> Result<Vec<u64>> {
        let file = worker % self.files.len();
        SCRATCH.with_borrow_mut(|buf| {
            buf.clear();
            let mut locations = Vec::with_capacity(offsets.len().saturating_sub(1));
            for w in offsets.windows(2) {
                let span = w[0] as usize..w[1] as usize;
                let start = buf.len() as u64;
                let labels = match (self.with_labels, labels) {
                    (true, Some(l)) => Some(&l[span.clone()]),
                    _ => None,
                };
                let (width, coding) = encode(&ids[span], labels, buf);
                locations.push(location(file, width, coding, start));
            }
            let mut a = self.files[file].lock().unwrap_or_else(|e| e.into_inner());
            a.file.write_all(buf).output(&self.dir)?;
            let base = a.len;
            a.len += buf.len() as u64;
            drop(a);
            for loc in &mut locations {
                *loc += base;
            }
            Ok(locations)
        })
    }

    /// The reading side over the same files.
    pub fn into_reader(self) -> SpillReader {
        let files: Vec<File> = self
            .files
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()).file)
            .collect();
        files.iter().for_each(random_reads);
        SpillReader {
            dir: self.dir,
            files,
        }
    }
}

/// Positioned reads of spilled samples, safe to share between threads.
pub struct SpillReader {
    dir: PathBuf,
    files: Vec<File>,
}

impl SpillReader {
    /// Values `start..start + tokens.len()` of the sample of `n` values stored at `loc`: its
    /// tokens, and its labels when `labels` is given (-100 when none were spilled).
    pub fn read(
        &self,
        loc: u64,
        n: i64,
        start: i64,
        tokens: &mut [i32],
        labels: Option<&mut [i32]>,
    ) -> Result<()> {
        let (file, width, coding, pos) = parts(loc);
        let file = &self.files[file];
        let read_at = |buf: &mut [u8], at: u64| file.read_exact_at(buf, at).output(&self.dir);
        let (n, start) = (n as usize, start as usize);
        // `scratch` holds the bytes read.
        SCRATCH.with_borrow_mut(|scratch| {
            let len = tokens.len();
            let end = start + len;
            debug_assert!(end <= n);
            let (ids_end, labels_end) = layout(n, width, coding);
            let w = width.bytes();
            // One read from the span's first id to the last byte it needs: whole records mostly.
            let first = start * w;
            let last = match (&labels, coding) {
                (None, _) | (_, Labels::None) => match width {
                    Width::U17 => n * w + plane_bytes(end),
                    _ => end * w,
                },
                (Some(_), Labels::Raw) => ids_end + 4 * end,
                (Some(_), Labels::Bits) => ids_end + plane_bytes(end),
                (Some(_), Labels::Exceptions) => labels_end,
            };
            scratch.resize(last - first, 0);
            read_at(scratch, pos + first as u64)?;
            let bytes = |at: usize| &scratch[at - first..];
            match w {
                2 => unpack::<2>(bytes(first), tokens),
                3 => unpack::<3>(bytes(first), tokens),
                _ => unpack::<4>(bytes(first), tokens),
            }
            if width == Width::U17 {
                let plane = bytes(n * w);
                for (i, t) in tokens.iter_mut().enumerate() {
                    *t |= i32::from(plane_bit(plane, start + i)) << 16;
                }
            }
            let Some(labels) = labels else {
                return Ok(());
            };
            match coding {
                Labels::None => labels.fill(IGNORE_INDEX),
                Labels::Raw => unpack::<4>(bytes(ids_end + 4 * start), labels),
                Labels::Bits | Labels::Exceptions => {
                    let plane = bytes(ids_end);
                    for (i, (l, &t)) in labels.iter_mut().zip(tokens.iter()).enumerate() {
                        *l = if plane_bit(plane, start + i) {
                            t
                        } else {
                            IGNORE_INDEX
                        };
                    }
                    if coding == Labels::Exceptions {
                        let c = bytes(labels_end - 4);
                        let count = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
                        let mut entries = vec![0u8; 8 * count];
                        read_at(&mut entries, pos + labels_end as u64)?;
                        let (at, values) = entries.split_at(4 * count);
                        let word = |b: &[u8], k: usize| {
                            [b[4 * k], b[4 * k + 1], b[4 * k + 2], b[4 * k + 3]]
                        };
                        for k in 0..count {
                            let i = u32::from_le_bytes(word(at, k)) as usize;
                            if (start..end).contains(&i) {
                                labels[i - start] = i32::from_le_bytes(word(values, k));
                            }
                        }
                    }
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sft_labels_take_a_bit_per_token() {
        let ids: Vec<i32> = (0..800).map(|i| i * 80).collect();
        let labels: Vec<i32> = ids
            .iter()
            .enumerate()
            .map(|(i, &t)| if i < 200 { IGNORE_INDEX } else { t })
            .collect();
        let mut out = Vec::new();
        assert_eq!(
            encode(&ids, Some(&labels), &mut out),
            (Width::U16, Labels::Bits)
        );
        assert_eq!(out.len(), 800 * 2 + 100);
        out.clear();
        let ids: Vec<i32> = ids.iter().map(|t| t + 60_000).collect();
        assert_eq!(encode(&ids, None, &mut out), (Width::U17, Labels::None));
        assert_eq!(out.len(), 800 * 2 + 100);
    }

    #[test]
    fn shifted_labels_are_stored_raw() {
        let ids: Vec<i32> = (0..100).collect();
        let labels: Vec<i32> = (1..101).collect();
        let mut out = Vec::new();
        assert_eq!(
            encode(&ids, Some(&labels), &mut out),
            (Width::U16, Labels::Raw)
        );
        assert_eq!(out.len(), 100 * 6);
    }

    /// A sample: ids of a width class, and labels that are -100, the token, or anything else.
    fn sample() -> impl Strategy<Value = (Vec<i32>, Vec<i32>)> {
        let id_max = prop_oneof![
            Just(300),
            Just(65_535),
            Just(131_071),
            Just(1 << 24),
            Just(i32::MAX)
        ];
        (id_max, 0usize..70).prop_flat_map(|(max, n)| {
            let ids = proptest::collection::vec(0..=max, n);
            let kinds = proptest::collection::vec(0u8..10, n);
            let odd = proptest::collection::vec(0..=i32::MAX, n);
            (ids, kinds, odd).prop_map(|(ids, kinds, odd)| {
                let labels = ids
                    .iter()
                    .zip(&kinds)
                    .zip(&odd)
                    .map(|((&t, &k), &o)| match k {
                        0..=3 => IGNORE_INDEX,
                        4..=8 => t,
                        _ => o,
                    })
                    .collect();
                (ids, labels)
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Every span of every sample reads back as written, from several workers' files,
        /// with and without labels.
        #[test]
        fn spans_read_back_as_written(
            samples in proptest::collection::vec(sample(), 1..12),
            with_labels in any::<bool>(),
            cut in 0usize..70,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let spill = Spill::create(dir.path(), 3, with_labels).unwrap();
            let mut locs = Vec::new();
            for (k, chunk) in samples.chunks(3).enumerate() {
                let mut ids = Vec::new();
                let mut labels = Vec::new();
                let mut offsets = vec![0i64];
                for (i, l) in chunk {
                    ids.extend_from_slice(i);
                    labels.extend_from_slice(l);
                    offsets.push(ids.len() as i64);
                }
                let labels = with_labels.then_some(labels.as_slice());
                locs.extend(spill.append(k, &ids, &offsets, labels).unwrap());
            }
            let reader = spill.into_reader();
            for ((ids, labels), &loc) in samples.iter().zip(&locs) {
                let n = ids.len();
                for start in [0, cut.min(n), n / 2] {
                    for end in [n, (start + cut).min(n), start] {
                        let mut t = vec![0; end - start];
                        let mut l = vec![0; end - start];
                        let want_labels = if with_labels {
                            labels[start..end].to_vec()
                        } else {
                            vec![IGNORE_INDEX; end - start]
                        };
                        reader.read(loc, n as i64, start as i64, &mut t, Some(&mut l)).unwrap();
                        prop_assert_eq!(&t[..], &ids[start..end]);
                        prop_assert_eq!(l, want_labels);
                        let mut t = vec![0; end - start];
                        reader.read(loc, n as i64, start as i64, &mut t, None).unwrap();
                        prop_assert_eq!(&t[..], &ids[start..end]);
                    }
                }
            }
        }
    }
}

//! Spill files: the tokens (and labels) of every sample, kept on disk between reading and
//! writing so memory does not grow with the corpus. Worker threads append to [`MAX_FILES`] files
//! at most (worker `w` to file `w % files`, a mutex per file serialises appends); a sample is
//! found again by a 64-bit location (file in the top byte, position below).
//!
//! Reads use positioned reads (`pread`), not a memory map: pages of a mapped file count in the
//! process's resident memory, while `pread` copies only what each row group needs.

use crate::error::{Context, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const FILE_SHIFT: u32 = 56;

/// Spill files per kind. Must fit in the location's top byte; a few dozen already keep the
/// threads from waiting on each other's appends.
pub const MAX_FILES: usize = 64;
const _: () = assert!(MAX_FILES <= 1 << (64 - FILE_SHIFT));

struct Appender {
    tokens: File,
    labels: Option<File>,
    /// Values written so far (int32 units).
    len: u64,
}

/// The writing side: one file (two with labels) per worker, at most [`MAX_FILES`].
pub struct Spill {
    dir: PathBuf,
    files: Vec<Mutex<Appender>>,
}

fn bytes(v: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and any byte pattern of u8 is valid; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_mut(v: &mut [i32]) -> &mut [u8] {
    // SAFETY: as above, and every byte pattern is a valid i32.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl Spill {
    /// Creates the spill files in `dir` (which must exist) for `workers` threads.
    pub fn create(dir: &Path, workers: usize, with_labels: bool) -> Result<Self> {
        let n = workers.clamp(1, MAX_FILES);
        let mut out = Vec::with_capacity(n);
        for w in 0..n {
            let open = |name: String| {
                let path = dir.join(name);
                File::options()
                    .create_new(true)
                    .read(true)
                    .write(true)
                    .open(&path)
                    .output(&path)
            };
            let tokens = open(format!("tokens-{w}.bin"))?;
            let labels = if with_labels {
                Some(open(format!("labels-{w}.bin"))?)
            } else {
                None
            };
            out.push(Mutex::new(Appender {
                tokens,
                labels,
                len: 0,
            }));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files: out,
        })
    }

    /// Appends one batch of samples; returns the location of its first value.
    pub fn append(&self, worker: usize, tokens: &[i32], labels: Option<&[i32]>) -> Result<u64> {
        let file = worker % self.files.len();
        let mut a = self.files[file].lock().unwrap_or_else(|e| e.into_inner());
        a.tokens.write_all(bytes(tokens)).output(&self.dir)?;
        if let (Some(f), Some(l)) = (a.labels.as_mut(), labels) {
            f.write_all(bytes(l)).output(&self.dir)?;
        }
        let pos = a.len;
        a.len += tokens.len() as u64;
        Ok(((file as u64) << FILE_SHIFT) | pos)
    }

    /// The reading side over the same files.
    pub fn into_reader(self) -> SpillReader {
        let mut tokens = Vec::with_capacity(self.files.len());
        let mut labels = Vec::with_capacity(self.files.len());
        for m in self.files {
            let a = m.into_inner().unwrap_or_else(|e| e.into_inner());
            tokens.push(a.tokens);
            if let Some(l) = a.labels {
                labels.push(l);
            }
        }
        SpillReader {
            dir: self.dir,
            tokens,
            labels: if labels.is_empty() {
                None
            } else {
                Some(labels)
            },
        }
    }
}

/// Positioned reads of spilled values, safe to share between threads.
pub struct SpillReader {
    dir: PathBuf,
    tokens: Vec<File>,
    labels: Option<Vec<File>>,
}

impl SpillReader {
    fn read(&self, files: &[File], loc: u64, start: i64, out: &mut [i32]) -> Result<()> {
        let file = (loc >> FILE_SHIFT) as usize;
        let pos = (loc & ((1 << FILE_SHIFT) - 1)) + start as u64;
        files[file]
            .read_exact_at(bytes_mut(out), pos * 4)
            .output(&self.dir)
    }

    /// Tokens `start..start+out.len()` of the sample stored at `loc`.
    pub fn tokens(&self, loc: u64, start: i64, out: &mut [i32]) -> Result<()> {
        self.read(&self.tokens, loc, start, out)
    }

    /// Labels of the same span (only when labels were spilled).
    pub fn labels(&self, loc: u64, start: i64, out: &mut [i32]) -> Result<()> {
        match &self.labels {
            Some(files) => self.read(files, loc, start, out),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers 256 and up once wrapped around the location's top byte and read another
    /// worker's file (wrong tokens, or "failed to fill whole buffer").
    #[test]
    fn any_worker_index_reads_back_its_own_values() {
        let dir = std::env::temp_dir().join(format!("tokpack-spill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let spill = Spill::create(&dir, 300, false).unwrap();
        let locs: Vec<(usize, u64)> = [0usize, 1, 63, 64, 255, 256, 257, 299]
            .iter()
            .map(|&w| (w, spill.append(w, &[w as i32, -(w as i32)], None).unwrap()))
            .collect();
        let reader = spill.into_reader();
        for (w, loc) in locs {
            let mut out = [0i32; 2];
            reader.tokens(loc, 0, &mut out).unwrap();
            assert_eq!(out, [w as i32, -(w as i32)], "worker {w}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

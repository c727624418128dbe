//! Spill files: the tokens (and labels) of every sample, kept on disk between reading and
//! writing so memory does not grow with the corpus. Each worker thread appends to its own file;
//! a sample is found again by a 64-bit location (worker in the top byte, position below).
//!
//! Reads use positioned reads (`pread`), not a memory map: pages of a mapped file count in the
//! process's resident memory, while `pread` copies only what each row group needs.

use crate::error::{CoreError, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const WORKER_SHIFT: u32 = 56;

struct Appender {
    tokens: File,
    labels: Option<File>,
    /// Values written so far (int32 units).
    len: u64,
}

/// The writing side: one file (two with labels) per worker.
pub struct Spill {
    dir: PathBuf,
    workers: Vec<Mutex<Appender>>,
}

fn io_err(path: &Path, e: std::io::Error) -> CoreError {
    CoreError::Output(format!("{}: {e}", path.display()))
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
        let mut out = Vec::with_capacity(workers);
        for w in 0..workers {
            let open = |name: String| {
                let path = dir.join(name);
                File::options()
                    .create_new(true)
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| io_err(&path, e))
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
            workers: out,
        })
    }

    /// Appends one batch of samples; returns the location of its first value.
    pub fn append(&self, worker: usize, tokens: &[i32], labels: Option<&[i32]>) -> Result<u64> {
        let worker = worker % self.workers.len();
        let mut a = self.workers[worker]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        a.tokens
            .write_all(bytes(tokens))
            .map_err(|e| io_err(&self.dir, e))?;
        if let (Some(f), Some(l)) = (a.labels.as_mut(), labels) {
            f.write_all(bytes(l)).map_err(|e| io_err(&self.dir, e))?;
        }
        let pos = a.len;
        a.len += tokens.len() as u64;
        Ok(((worker as u64) << WORKER_SHIFT) | pos)
    }

    /// The reading side over the same files.
    pub fn into_reader(self) -> SpillReader {
        let mut tokens = Vec::with_capacity(self.workers.len());
        let mut labels = Vec::with_capacity(self.workers.len());
        for m in self.workers {
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
        let worker = (loc >> WORKER_SHIFT) as usize;
        let pos = (loc & ((1 << WORKER_SHIFT) - 1)) + start as u64;
        files[worker]
            .read_exact_at(bytes_mut(out), pos * 4)
            .map_err(|e| io_err(&self.dir, e))
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

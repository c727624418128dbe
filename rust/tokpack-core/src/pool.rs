//! Process-local rayon pools. Rayon's global pool does not survive `fork()` (DataLoader workers
//! fork): its threads are gone in the child and the first parallel call hangs. Pools here are
//! keyed by process id, so a forked child builds its own and never touches the parent's.
//!
//! Every thread count (an argument, or `TOKPACK_NUM_THREADS`) goes through [`resolve_threads`],
//! so an absurd one is refused up front with the same message whatever the entry point.

use crate::error::{CoreError, Result};
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::sync::{Arc, Mutex};

/// The most worker threads tokpack starts. Far above any useful count; it keeps a typo
/// (`--threads 10000`) from spending minutes starting threads.
pub const MAX_THREADS: usize = 1024;

const THREADS_ENV: &str = "TOKPACK_NUM_THREADS";

static POOL: Mutex<Option<(u32, usize, Arc<ThreadPool>)>> = Mutex::new(None);

fn check_count(n: usize, what: &str) -> Result<usize> {
    if (1..=MAX_THREADS).contains(&n) {
        Ok(n)
    } else {
        Err(CoreError::Config(format!(
            "{what} must be between 1 and {MAX_THREADS}, got {n}"
        )))
    }
}

/// Threads used when the caller does not say: `TOKPACK_NUM_THREADS`, else all cores (at most
/// [`MAX_THREADS`]). A set but invalid `TOKPACK_NUM_THREADS` is an error, not ignored.
pub fn default_threads() -> Result<usize> {
    match std::env::var(THREADS_ENV) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) => check_count(n, THREADS_ENV),
            Err(_) => Err(CoreError::Config(format!(
                "{THREADS_ENV} must be an integer between 1 and {MAX_THREADS}, got {v:?}"
            ))),
        },
        Err(_) => Ok(std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS)),
    }
}

/// The thread count to use: `threads` when given (1..=[`MAX_THREADS`]), else [`default_threads`].
pub fn resolve_threads(threads: Option<usize>) -> Result<usize> {
    match threads {
        Some(n) => check_count(n, "threads"),
        None => default_threads(),
    }
}

/// Runs `f` inside a pool of `threads` threads (default: [`default_threads`]) owned by this process.
pub fn install<R: Send>(threads: Option<usize>, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    pool_for(resolve_threads(threads)?)?.install(f)
}

fn pool_for(threads: usize) -> Result<Arc<ThreadPool>> {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, n, pool)) = slot.as_ref() {
        if *p == pid && *n == threads {
            return Ok(Arc::clone(pool));
        }
    }
    if let Some((p, _, stale)) = slot.take() {
        if p != pid {
            // Inherited across fork: its threads do not exist here, so never drop (join) it.
            std::mem::forget(stale);
        }
    }
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("tokpack-{i}"))
        .build()
        .map_err(|e| {
            CoreError::Config(format!(
                "cannot start {threads} worker threads ({e}); pass fewer threads"
            ))
        })?;
    let pool = Arc::new(pool);
    *slot = Some((pid, threads, Arc::clone(&pool)));
    Ok(pool)
}

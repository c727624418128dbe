//! Process-local rayon pools. Rayon's global pool does not survive `fork()` (DataLoader workers
//! fork): its threads are gone in the child and the first parallel call hangs. Pools here are
//! keyed by process id, so a forked child builds its own and never touches the parent's.

use rayon::{ThreadPool, ThreadPoolBuilder};
use std::sync::{Arc, Mutex};

static POOL: Mutex<Option<(u32, usize, Arc<ThreadPool>)>> = Mutex::new(None);

/// Threads used when the caller does not say: `TOKPACK_NUM_THREADS`, else all cores.
pub fn default_threads() -> usize {
    std::env::var("TOKPACK_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f` inside a pool of `threads` threads (default: [`default_threads`]) owned by this process.
pub fn install<R: Send>(threads: Option<usize>, f: impl FnOnce() -> R + Send) -> R {
    let threads = threads.filter(|&n| n > 0).unwrap_or_else(default_threads);
    let pool = pool_for(threads);
    pool.install(f)
}

fn pool_for(threads: usize) -> Arc<ThreadPool> {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, n, pool)) = slot.as_ref() {
        if *p == pid && *n == threads {
            return Arc::clone(pool);
        }
    }
    if let Some((p, _, stale)) = slot.take() {
        if p != pid {
            // Inherited across fork: its threads do not exist here, so never drop (join) it.
            std::mem::forget(stale);
        }
    }
    let pool = Arc::new(
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tokpack-{i}"))
            .build()
            .expect("failed to start tokpack worker threads"),
    );
    *slot = Some((pid, threads, Arc::clone(&pool)));
    pool
}

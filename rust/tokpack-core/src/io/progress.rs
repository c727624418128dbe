//! Progress counters shared with the caller's thread, which polls them to draw progress bars,
//! and a cancel flag it sets on Ctrl-C. Workers never call back into the caller.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

crate::policy::named!(
    /// The phases of a run, in order.
    Phase, "phase", {
        Starting = "starting",
        Reading = "reading",
        Planning = "planning",
        Writing = "writing",
        Done = "done",
    }
);

#[derive(Default)]
pub struct Progress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    samples: AtomicU64,
    cancel: AtomicBool,
}

impl Progress {
    pub fn new() -> Self {
        Self::default()
    }

    /// Enters `phase` with `total` units of work to do.
    pub fn start(&self, phase: Phase, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Release);
    }

    pub fn advance(&self, units: u64) {
        self.done.fetch_add(units, Ordering::Relaxed);
    }

    pub fn add_samples(&self, n: u64) {
        self.samples.fetch_add(n, Ordering::Relaxed);
    }

    /// `(phase, done, total, samples read so far)`.
    pub fn snapshot(&self) -> (Phase, u64, u64, u64) {
        let phase = Phase::ALL.get(usize::from(self.phase.load(Ordering::Acquire)));
        (
            phase.copied().unwrap_or(Phase::Starting),
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
            self.samples.load(Ordering::Relaxed),
        )
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// `Err(Cancelled)` once the caller asked to stop; checked between units of work.
    pub fn check(&self) -> crate::Result<()> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(crate::CoreError::Cancelled)
        } else {
            Ok(())
        }
    }
}

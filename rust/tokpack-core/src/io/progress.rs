//! Progress counters shared with the caller's thread, which polls them to draw progress bars,
//! and a cancel flag it sets on Ctrl-C. Workers never call back into the caller.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Starting = 0,
    Reading = 1,
    Planning = 2,
    Writing = 3,
    Done = 4,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Reading => "reading",
            Phase::Planning => "planning",
            Phase::Writing => "writing",
            Phase::Done => "done",
        }
    }
}

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
        let phase = match self.phase.load(Ordering::Acquire) {
            1 => Phase::Reading,
            2 => Phase::Planning,
            3 => Phase::Writing,
            4 => Phase::Done,
            _ => Phase::Starting,
        };
        (
            phase,
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

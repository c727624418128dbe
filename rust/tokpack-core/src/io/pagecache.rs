//! Page-cache hints for the files `pack_files` writes once (Linux; no-ops elsewhere). At scale
//! the spill must stay in the page cache while shards are written: shards are written once and
//! not read back, so their pages are handed to the disk early and dropped, instead of pushing
//! the spill out; the spill is read at random, so readahead would only read what is not needed.
//! Inputs larger than a quarter of the memory are dropped as they are read ([`drop_read`]):
//! they are read once, and their pages would otherwise push the spill written meanwhile out.

use std::fs::File;

/// Write-behind for a file written from start to end: each [`WriteBehind::advance`] starts the
/// writeback of the bytes written since the previous call and drops from the page cache the
/// bytes whose writeback the previous call started (those already on disk; it never waits).
#[derive(Default)]
pub struct WriteBehind {
    started: u64,
    dropped: u64,
}

impl WriteBehind {
    /// `written`: the file's length so far (everything before it is in the file, not in a
    /// user-space buffer).
    pub fn advance(&mut self, file: &File, written: u64) {
        if written <= self.started {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (start, len) = (self.started as i64, (written - self.started) as i64);
            // SAFETY: a plain system call on an open descriptor; a failure only loses the hint.
            unsafe {
                libc::sync_file_range(file.as_raw_fd(), start, len, libc::SYNC_FILE_RANGE_WRITE)
            };
        }
        if self.started > self.dropped {
            drop_read(file, self.dropped, self.started - self.dropped);
        }
        self.dropped = self.started;
        self.started = written;
    }
}

/// `posix_fadvise`: a failure only loses the hint.
#[cfg(target_os = "linux")]
fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on an open descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), offset as i64, len as i64, advice) };
}

/// Tells the kernel `file` will be read at random: no readahead.
pub fn random_reads(file: &File) {
    #[cfg(target_os = "linux")]
    fadvise(file, 0, 0, libc::POSIX_FADV_RANDOM);
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Drops `len` bytes of `file` from `offset` from the page cache: input read once, not needed
/// again by this run.
pub fn drop_read(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED);
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Whether inputs of `bytes` in all are too large to keep in the page cache beside the spill
/// (more than a quarter of the physical memory).
pub fn inputs_read_once(bytes: u64) -> bool {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    pages > 0 && size > 0 && bytes > (pages as u64).saturating_mul(size as u64) / 4
}

//! Handles given out again once their object is destroyed, the last destroyed first: a driver's
//! objects come from allocators and pools that reuse freed entries, so a program (or a library
//! such as gpuslice) still holding a destroyed context's or event's handle may find it naming a new
//! one. simgpu makes that reuse certain rather than up to its heap, so that code keeping stale
//! handles fails every time on simgpu, not once in a while.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The handles of one kind of object: never NULL, never the address of anything (they are only
/// looked up), distinct from every other kind's.
pub(crate) struct Handles {
    next: AtomicUsize,
    free: Mutex<Vec<usize>>,
}

impl Handles {
    /// Handles `base`, `base + 0x40`, ... (a driver's objects are aligned; so are these).
    pub(crate) const fn new(base: usize) -> Handles {
        Handles {
            next: AtomicUsize::new(base),
            free: Mutex::new(Vec::new()),
        }
    }

    /// The most recently given back handle, else a new one.
    pub(crate) fn take(&self) -> usize {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        reused.unwrap_or_else(|| self.next.fetch_add(0x40, Ordering::Relaxed))
    }

    /// `handle`'s object is destroyed: its handle is the next one handed out. Call once the handle
    /// no longer finds the object.
    pub(crate) fn give_back(&self, handle: usize) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
    }
}

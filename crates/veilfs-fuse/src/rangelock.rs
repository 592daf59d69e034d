//! Block-range locks for one file: readers share, writers exclude overlapping ranges only.
//!
//! This is what lets two writers on different blocks of one file run in parallel (gocryptfs
//! serializes all writes to a file: gocryptfs issue #862 on GitHub) while a read never sees a block half
//! rewritten and two read-modify-writes of one block never interleave.

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
struct Held {
    ranges: Vec<(u64, u64, bool)>,
}

/// A set of held block ranges.
#[derive(Debug, Default)]
pub struct RangeLock {
    held: Mutex<Held>,
    freed: Condvar,
}

/// A held range; released on drop.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    lock: &'a RangeLock,
    range: (u64, u64, bool),
}

impl RangeLock {
    /// Locks blocks `first..=last`, exclusively when `write`.
    pub fn lock(&self, first: u64, last: u64, write: bool) -> RangeGuard<'_> {
        let mut h = self.held.lock();
        while h.ranges.iter().any(|&(a, b, w)| a <= last && first <= b && (w || write)) {
            self.freed.wait(&mut h);
        }
        h.ranges.push((first, last, write));
        RangeGuard { lock: self, range: (first, last, write) }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut h = self.lock.held.lock();
        if let Some(i) = h.ranges.iter().position(|r| *r == self.range) {
            h.ranges.swap_remove(i);
        }
        drop(h);
        self.lock.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn disjoint_writers_run_together_overlapping_do_not() {
        let l = Arc::new(RangeLock::default());
        let g1 = l.lock(0, 9, true);
        let _g2 = l.lock(10, 19, true); // disjoint: does not block
        let _r = l.lock(20, 30, false);
        let entered = Arc::new(AtomicUsize::new(0));
        let (l2, e2) = (l.clone(), entered.clone());
        let t = std::thread::spawn(move || {
            let _g = l2.lock(5, 12, false);
            e2.store(1, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(entered.load(Ordering::SeqCst), 0, "reader must wait for overlapping writer");
        drop(g1);
        drop(_g2);
        t.join().unwrap();
        assert_eq!(entered.load(Ordering::SeqCst), 1);
    }
}

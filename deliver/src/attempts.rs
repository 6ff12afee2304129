//! Group commit of the lanes' entries. Before each request a lane needs
//! its record's entry in the ledger (and in its mirror); one thread
//! writes what every lane queued since its last write in one write, and
//! wakes the lanes it covered. A delivery's entry is queued without
//! waiting; the main thread waits for them all before a position passes
//! them. Sixteen lanes writing RocksDB themselves
//! spent more CPU in its write group's hand-offs than in their requests
//! (see `docs/benchmarks.md`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::ledger::{Entry, Ledger, LedgerError};

/// What the lanes and the writer share.
#[derive(Default)]
struct Shared {
    /// Entries queued and not yet taken by the writer.
    queued: Vec<(String, Entry)>,
    /// The number of entries queued so far.
    queued_count: u64,
    /// The number of entries written so far (in queue order).
    written_count: u64,
    /// The write that failed, if one did: every later write fails with it.
    failed: Option<String>,
    stop: bool,
}

/// The shared state and its two signals: entries queued (the writer
/// waits for it), entries written (the lanes wait for it).
#[derive(Default)]
struct Signals {
    shared: Mutex<Shared>,
    queued: Condvar,
    written: Condvar,
}

/// The attempt writer: [`AttemptWriter::write`] returns once the entry is
/// in the ledger's log and its mirror.
pub struct AttemptWriter {
    signals: Arc<Signals>,
    ledger: Arc<Ledger>,
    thread: Option<JoinHandle<()>>,
}

impl AttemptWriter {
    /// Starts the writer thread of `ledger`.
    pub fn start(ledger: Arc<Ledger>) -> AttemptWriter {
        let signals: Arc<Signals> = Arc::default();
        let thread = {
            let (signals, ledger) = (signals.clone(), ledger.clone());
            std::thread::spawn(move || write_loop(&signals, &ledger))
        };
        AttemptWriter { signals, ledger, thread: Some(thread) }
    }

    /// Writes `entries`; returns once they are written.
    pub fn write_many(&self, entries: &[(String, Entry)]) -> Result<(), LedgerError> {
        let mine = self.submit(entries);
        self.wait_for(mine)
    }

    /// Queues `entries` for the next write, without waiting for it.
    pub fn submit(&self, entries: &[(String, Entry)]) -> u64 {
        let signals = &*self.signals;
        let mut shared = locked(&signals.shared);
        shared.queued.extend_from_slice(entries);
        shared.queued_count += entries.len() as u64;
        signals.queued.notify_one();
        shared.queued_count
    }

    /// Returns once every entry queued so far is written.
    pub fn flush(&self) -> Result<(), LedgerError> {
        let queued = locked(&self.signals.shared).queued_count;
        self.wait_for(queued)
    }

    /// Returns once the first `mine` entries queued are written.
    fn wait_for(&self, mine: u64) -> Result<(), LedgerError> {
        let signals = &*self.signals;
        let mut shared = locked(&signals.shared);
        while shared.written_count < mine && shared.failed.is_none() {
            shared = signals.written.wait(shared).unwrap_or_else(PoisonError::into_inner);
        }
        match &shared.failed {
            Some(reason) if shared.written_count < mine => Err(self.ledger.failed(reason.clone())),
            _ => Ok(()),
        }
    }
}

impl Drop for AttemptWriter {
    fn drop(&mut self) {
        locked(&self.signals.shared).stop = true;
        self.signals.queued.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn locked(lock: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes whatever the lanes queued, writes it in one write, and wakes
/// them; until stopped.
fn write_loop(signals: &Signals, ledger: &Ledger) {
    loop {
        let (batch, upto) = {
            let mut shared = locked(&signals.shared);
            while shared.queued.is_empty() && !shared.stop {
                shared = signals.queued.wait(shared).unwrap_or_else(PoisonError::into_inner);
            }
            if shared.queued.is_empty() {
                return;
            }
            (std::mem::take(&mut shared.queued), shared.queued_count)
        };
        let result = ledger.put_many(&batch).and_then(|()| ledger.mirror_flush());
        let mut shared = locked(&signals.shared);
        match result {
            Ok(()) => shared.written_count = upto,
            Err(err) => {
                shared.failed.get_or_insert(err.to_string());
            }
        }
        signals.written.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_written_from_many_threads_are_all_in_the_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Arc::new(Ledger::open(&dir.path().join("ledger")).unwrap());
        let writer = Arc::new(AttemptWriter::start(ledger.clone()));
        let threads: Vec<_> = (0..8)
            .map(|thread| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for n in 0..50u64 {
                        let entry = Entry::unsent(thread, n, "ab".into());
                        writer.write_many(&[(format!("{thread}/{n}"), entry)]).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(ledger.entries().unwrap().len(), 400);
        assert_eq!(ledger.entry("7/49").unwrap(), Some(Entry::unsent(7, 49, "ab".into())));
    }
}

//! `OutputBuffer`: the output of one attempt between the executor that produces it and the
//! agent that sends it. Owns buffering, its memory cap and the "bytes dropped" note; knows
//! nothing of HTTP or of processes.

use std::sync::{Arc, Mutex, MutexGuard};

/// Output of one attempt, in the order it was produced (stdout and stderr interleaved).
/// Cloning shares the buffer.
#[derive(Debug, Clone)]
pub struct OutputBuffer {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    pending: Vec<u8>,
    cap: usize,
    /// Bytes dropped since the last `take` because `pending` was full.
    dropped: u64,
    /// No one wants this output any more (its lease is gone): writes are discarded.
    discarded: bool,
}

impl OutputBuffer {
    /// A buffer that holds at most `cap` unsent bytes; more is dropped and counted.
    pub fn new(cap: usize) -> Self {
        OutputBuffer {
            inner: Arc::new(Mutex::new(Inner {
                pending: Vec::new(),
                cap,
                dropped: 0,
                discarded: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves plain bytes behind: still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn write(&self, bytes: &[u8]) {
        let mut inner = self.lock();
        if inner.discarded {
            return;
        }
        let room = inner.cap.saturating_sub(inner.pending.len());
        let kept = bytes.len().min(room);
        inner.pending.extend_from_slice(&bytes[..kept]);
        inner.dropped += (bytes.len() - kept) as u64;
    }

    /// Removes and returns up to `max` bytes from the front. Once everything buffered is
    /// taken, a note about dropped bytes (if any) is appended.
    pub fn take(&self, max: usize) -> Vec<u8> {
        let mut inner = self.lock();
        let n = inner.pending.len().min(max);
        let mut chunk: Vec<u8> = if n == inner.pending.len() {
            std::mem::take(&mut inner.pending)
        } else {
            inner.pending.drain(..n).collect()
        };
        if inner.pending.is_empty() && inner.dropped > 0 {
            let note = format!(
                "\n[sked-worker: {} bytes of output dropped: the server could not take them fast enough]\n",
                inner.dropped
            );
            chunk.extend_from_slice(note.as_bytes());
            inner.dropped = 0;
        }
        chunk
    }

    /// Puts back at the front a chunk from `take` that could not be sent.
    pub fn restore(&self, mut chunk: Vec<u8>) {
        let mut inner = self.lock();
        if inner.discarded || chunk.is_empty() {
            return;
        }
        chunk.extend_from_slice(&inner.pending);
        inner.pending = chunk;
    }

    /// Drops what is buffered and everything written from now on.
    pub fn discard(&self) {
        let mut inner = self.lock();
        inner.discarded = true;
        inner.pending = Vec::new();
        inner.dropped = 0;
    }

    /// Nothing to send: no bytes and no note pending.
    pub fn is_empty(&self) -> bool {
        let inner = self.lock();
        inner.pending.is_empty() && inner.dropped == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_restores_at_the_front() {
        let out = OutputBuffer::new(100);
        out.write(b"hello ");
        out.write(b"world");
        let first = out.take(3);
        assert_eq!(first, b"hel");
        out.write(b"!");
        out.restore(first);
        assert_eq!(out.take(usize::MAX), b"hello world!");
        assert!(out.is_empty());
    }

    #[test]
    fn over_the_cap_bytes_are_dropped_and_counted() {
        let out = OutputBuffer::new(4);
        out.write(b"abcdef");
        assert!(!out.is_empty());
        let text = String::from_utf8(out.take(usize::MAX)).unwrap_or_default();
        assert!(
            text.starts_with("abcd\n[sked-worker: 2 bytes of output dropped"),
            "{text}"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn discarded_output_stays_empty() {
        let out = OutputBuffer::new(100);
        out.write(b"abc");
        out.discard();
        out.write(b"def");
        out.restore(b"xyz".to_vec());
        assert!(out.is_empty());
        assert!(out.take(usize::MAX).is_empty());
    }
}

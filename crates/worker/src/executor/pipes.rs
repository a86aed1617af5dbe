//! A process's stdout and stderr on their way to the attempt's output: read to their end,
//! cut at the job's `max_output` with a marker saying how much was dropped. Shared by the
//! shell and the container executors; knows nothing of processes.

use crate::output::OutputBuffer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};

/// The output of one attempt's pipes, kept up to a cap shared by all of them.
#[derive(Clone)]
pub(crate) struct Sink {
    output: OutputBuffer,
    /// Bytes the run's log may take; `u64::MAX` without `max_output`.
    cap: u64,
    /// Bytes read from every pipe so far.
    seen: Arc<AtomicU64>,
}

impl Sink {
    pub(crate) fn new(output: &OutputBuffer, cap: Option<u64>) -> Sink {
        Sink {
            output: output.clone(),
            cap: cap.unwrap_or(u64::MAX),
            seen: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Keeps what fits under the cap; the first chunk past it writes the marker.
    fn write(&self, bytes: &[u8]) {
        let before = self.seen.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if before >= self.cap {
            return;
        }
        let room = usize::try_from(self.cap - before).unwrap_or(usize::MAX);
        if bytes.len() <= room {
            self.output.write(bytes);
        } else {
            self.output.write(&bytes[..room]);
            self.output.write(
                format!(
                    "\n[sked-worker: output cut at max_output ({}); the rest is dropped]\n",
                    sked_core::limits::ByteSize(self.cap)
                )
                .as_bytes(),
            );
        }
    }

    /// Reads `pipe` to its end in a task of its own.
    pub(crate) fn pump(&self, pipe: impl AsyncRead + Unpin + Send + 'static) -> JoinHandle<()> {
        self.pump_seen(pipe, |_| {})
    }

    /// [`Sink::pump`], with every chunk read also shown to `seen`, cap or not.
    pub(crate) fn pump_seen(
        &self,
        mut pipe: impl AsyncRead + Unpin + Send + 'static,
        mut seen: impl FnMut(&[u8]) + Send + 'static,
    ) -> JoinHandle<()> {
        let sink = self.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            loop {
                match pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    // Past the cap the pipe is still read, so the process never blocks on it.
                    Ok(n) => {
                        seen(&buf[..n]);
                        sink.write(&buf[..n]);
                    }
                }
            }
        })
    }
}

/// Waits up to `bound` for the readers to reach the end of their pipes; true if they all did.
/// Finished readers are removed, so none is polled again.
pub(crate) async fn settle(readers: &mut Vec<JoinHandle<()>>, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while let Some(reader) = readers.last_mut() {
        if timeout_at(deadline, reader).await.is_err() {
            return false;
        }
        readers.pop();
    }
    true
}

/// Stops reading: what is still open is abandoned.
pub(crate) fn abandon(readers: &[JoinHandle<()>]) {
    for reader in readers {
        reader.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_past_the_cap_is_dropped_with_one_marker() {
        let output = OutputBuffer::new(1 << 20);
        let sink = Sink::new(&output, Some(10));
        let mut readers = vec![sink.pump(&b"0123456"[..]), sink.pump(&b"789abcdef"[..])];
        assert!(settle(&mut readers, Duration::from_secs(5)).await);
        let text = String::from_utf8(output.take(1 << 20)).unwrap();
        let kept: String = text.split('\n').next().unwrap().to_string();
        assert_eq!(kept.len(), 10, "{text:?}");
        assert_eq!(
            text.matches("output cut at max_output (10)").count(),
            1,
            "{text:?}"
        );
    }

    #[tokio::test]
    async fn without_a_cap_everything_is_kept() {
        let output = OutputBuffer::new(1 << 20);
        let sink = Sink::new(&output, None);
        let mut readers = vec![sink.pump(&b"hello"[..])];
        assert!(settle(&mut readers, Duration::from_secs(5)).await);
        assert_eq!(output.take(100), b"hello");
    }
}

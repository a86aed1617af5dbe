//! A thread the store owns and feeds through a channel. Dropping its handle closes the channel
//! and waits for the thread to end, so that what the thread holds (a connection) is released
//! before the store's drop returns.

use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;

pub(super) struct OwnedThread<M> {
    sender: Option<Sender<M>>,
    thread: Option<JoinHandle<()>>,
}

impl<M: Send + 'static> OwnedThread<M> {
    /// Starts thread `name` on `body`, which ends once its receiver says the channel closed.
    pub(super) fn spawn(
        name: &str,
        body: impl FnOnce(Receiver<M>) + Send + 'static,
    ) -> std::io::Result<OwnedThread<M>> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(receiver))?;
        Ok(OwnedThread {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Sends `message` to the thread; gives it back if the thread has ended.
    pub(super) fn send(&self, message: M) -> Result<(), M> {
        match &self.sender {
            Some(sender) => sender.send(message).map_err(|e| e.0),
            None => Err(message),
        }
    }
}

impl<M> Drop for OwnedThread<M> {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            // The threads catch what their work may panic with; a join error has nothing left
            // to release.
            let _ = thread.join();
        }
    }
}

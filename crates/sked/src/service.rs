//! What a service manager hears from a long-running sked (systemd's `Type=notify` units):
//! ready once the node serves (as `/readyz` first answers 200), stopping once a stop signal
//! arrived. Without `NOTIFY_SOCKET` in the environment it says nothing. It only reports; when
//! to start or stop is decided elsewhere.

use sd_notify::NotifyState;
use tokio::sync::watch;

/// Says `READY=1` once `ready` turns true; a server that stops first never says it.
pub async fn ready_when(mut ready: watch::Receiver<bool>) {
    if ready.wait_for(|ready| *ready).await.is_ok() {
        tell(&[NotifyState::Ready, NotifyState::Status("serving")]);
    }
}

/// Says `STOPPING=1`: the drain has begun, the service manager's stop timeout runs.
pub fn stopping() {
    tell(&[NotifyState::Stopping, NotifyState::Status("draining")]);
}

fn tell(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

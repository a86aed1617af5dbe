//! A real OpenID Connect provider for the console's login tests: `oidc-provider` (a certified
//! implementation, from npm, pinned by `tests/oidc/package-lock.json`) with its development
//! login form, run by Node on a loopback port. `tests/oidc/provider.mjs` says which accounts
//! are in which groups.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The client sked is registered as.
pub const CLIENT_ID: &str = "sked-console";
pub const CLIENT_SECRET: &str = "a client secret only the provider and sked know";

/// A running provider; it is killed when dropped.
pub struct Provider {
    child: Child,
    pub issuer: String,
}

impl Provider {
    /// Starts a provider that sends people back to `redirect_uri`; `log` receives its output.
    pub async fn start(redirect_uri: &str, log: &Path) -> Provider {
        let home = super::npm::installed("oidc", "node_modules/oidc-provider/package.json");
        let port = super::free_port();
        let log_file = std::fs::File::create(log).expect("provider log");
        let child = Command::new("node")
            .arg(home.join("provider.mjs"))
            .args([&port.to_string(), CLIENT_ID, CLIENT_SECRET, redirect_uri])
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run node (apt-get install nodejs): {e}"));
        let provider = Provider {
            child,
            issuer: format!("http://127.0.0.1:{port}"),
        };
        let discovery = format!("{}/.well-known/openid-configuration", provider.issuer);
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(answer) = http.get(&discovery).send().await {
                if answer.status().is_success() {
                    return provider;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the OpenID Connect provider did not start; see {}",
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

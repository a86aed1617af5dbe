//! Chromium under ChromeDriver for the console's browser tests (`console.rs`,
//! `console_graph.rs`, `console_grid.rs`): start it, open pages, and check each page for JavaScript errors and
//! requests outside sked's origin; screenshots into `SKED_UI_SCREENSHOTS` when it is set.
//! A test includes it with `#[path = "common/browser.rs"] mod browser;` beside `mod common;`,
//! so the other tests are not built with a browser driver.
#![allow(dead_code)]

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest any wait in a browser test takes.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// ChromeDriver's own command for the browser's console log (not part of W3C WebDriver).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({"type": "browser"}).to_string()),
        )
    }
}

/// Chromium under ChromeDriver, looking at one sked.
pub struct Browser {
    pub client: Client,
    driver: Child,
    pub base: String,
    shots: Option<PathBuf>,
    /// What the window holds besides the page (width, height): screenshots are of the page.
    chrome: (u32, u32),
}

impl Browser {
    pub async fn start(base: &str) -> Browser {
        let driver_bin = std::env::var("SKED_TEST_CHROMEDRIVER").unwrap_or_else(|_| {
            panic!(
                "SKED_TEST_CHROMEDRIVER must name chromedriver (apt-get install chromium \
                 chromium-driver; /usr/bin/chromedriver)"
            )
        });
        let chromium =
            std::env::var("SKED_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let port = crate::common::free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver_bin}: {e}"));
        let capabilities: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
                         "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
                         "--disable-background-networking", "--disable-component-update",
                         "--disable-sync", "--disable-default-apps",
                         // No name resolves: whatever a page asks for, nothing leaves the
                         // machine (an identity provider's login page links a web font).
                         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"]
            },
            "goog:loggingPrefs": {"browser": "ALL"}
        }))
        .expect("capabilities");
        let webdriver = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + PATIENCE;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&webdriver)
                .await
            {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session from {driver_bin}: {e}"),
            }
        };
        let shots = std::env::var_os("SKED_UI_SCREENSHOTS").map(PathBuf::from);
        let browser_chrome = client
            .execute(
                "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]",
                vec![],
            )
            .await
            .expect("window sizes");
        let extra = |i: usize| browser_chrome[i].as_u64().unwrap_or(0) as u32;
        let chrome = (extra(0), extra(1));
        if let Some(dir) = &shots {
            std::fs::create_dir_all(dir).expect("screenshot directory");
        }
        let browser = Browser {
            client,
            driver,
            base: base.to_string(),
            shots,
            chrome,
        };
        browser.viewport(1280, 800).await;
        browser
    }

    /// Sizes the window so that the page itself is `width` x `height`.
    pub async fn viewport(&self, width: u32, height: u32) {
        self.client
            .set_window_size(width + self.chrome.0, height + self.chrome.1)
            .await
            .expect("resize");
    }

    pub async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        self.check_page().await;
    }

    /// The page logged no error and fetched nothing from another origin.
    pub async fn check_page(&self) {
        let url = self.client.current_url().await.expect("current url");
        let log = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .expect("browser log");
        // A page sent with an error status (a refused login is a 401, a refused form a 400)
        // is logged as a failed load of that page: that one is meant; anything else is not.
        let page_status = format!("{url} - Failed to load resource");
        let errors: Vec<&Value> = log
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|e| e["level"] == "SEVERE")
                    .filter(|e| {
                        let message = e["message"].as_str().unwrap_or_default();
                        !(e["source"] == "network" && message.starts_with(&page_status))
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert!(errors.is_empty(), "{url} logged errors: {errors:?}");
        let fetched = self
            .client
            .execute(
                "return performance.getEntriesByType('resource').map(e => e.name)",
                vec![],
            )
            .await
            .expect("resources");
        for name in fetched.as_array().into_iter().flatten() {
            let name = name.as_str().unwrap_or_default();
            assert!(
                name.starts_with(&self.base),
                "{url} fetched {name}, outside {}",
                self.base
            );
        }
    }

    pub async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a screenshot is a PNG");
        if let Some(dir) = &self.shots {
            std::fs::write(dir.join(format!("{name}.png")), png).expect("save screenshot");
        }
    }

    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        match self
            .client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css(css))
            .await
        {
            Ok(element) => element,
            Err(e) => panic!("no {css} on {}: {e}", self.path().await),
        }
    }

    pub async fn exists(&self, css: &str) -> bool {
        !self
            .client
            .find_all(Locator::Css(css))
            .await
            .expect("find_all")
            .is_empty()
    }

    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.expect("text")
    }

    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("current url");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        }
    }

    pub async fn fill(&self, css: &str, value: &str) {
        let input = self.find(css).await;
        input.clear().await.expect("clear");
        input.send_keys(value).await.expect("type");
    }

    /// Marks the page, so that [`Browser::wait_next_page`] sees when another replaced it.
    pub async fn mark_page(&self) {
        self.client
            .execute("window.skedTestOldPage = true", vec![])
            .await
            .expect("mark the page");
    }

    /// Clicks and waits for the next page to load.
    pub async fn click(&self, css: &str) {
        self.mark_page().await;
        self.find(css).await.click().await.expect("click");
        self.wait_next_page().await;
    }

    /// Waits until the marked page was replaced and the new one loaded, then checks it.
    pub async fn wait_next_page(&self) {
        self.wait_loaded().await;
        self.check_page().await;
    }

    /// Clicks on a page of another site (an identity provider's) and waits for the next page
    /// to load, checking nothing of it: it is not sked's.
    pub async fn click_away(&self, css: &str) {
        self.mark_page().await;
        self.find(css).await.click().await.expect("click");
        self.wait_loaded().await;
    }

    /// Reads away what the browser logged so far: the page open is another site's (an
    /// identity provider's), whose errors are not sked's.
    pub async fn forget_log(&self) {
        self.client
            .issue_cmd(BrowserLog)
            .await
            .expect("browser log");
    }

    /// Waits until the marked page was replaced and the new one loaded.
    async fn wait_loaded(&self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let state = self
                .client
                .execute(
                    "return window.skedTestOldPage ? 'old' : document.readyState",
                    vec![],
                )
                .await
                .unwrap_or_default();
            if state == "complete" {
                break;
            }
            assert!(Instant::now() < deadline, "no new page loaded");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reloads `path` until `css` shows up on it.
    pub async fn reload_until(&self, path: &str, css: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            self.open(path).await;
            if self.exists(css).await {
                return;
            }
            assert!(Instant::now() < deadline, "{css} never showed on {path}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    pub async fn log_in(&self, token: &str) {
        self.open("/login").await;
        self.fill("#token", token).await;
        self.click("form button[type=submit]").await;
    }

    /// Types `keys` as a person would, into whatever has the focus.
    pub async fn press(&self, keys: &str) {
        use fantoccini::actions::{InputSource, KeyAction, KeyActions};
        let mut actions = KeyActions::new("keyboard".into());
        for key in keys.chars() {
            actions = actions
                .then(KeyAction::Down { value: key })
                .then(KeyAction::Up { value: key });
        }
        self.client
            .perform_actions(actions)
            .await
            .expect("keys pressed");
    }

    /// The page is no wider than the window: nothing but a table's own scroller moves sideways.
    pub async fn fits_the_width(&self) {
        let widths = self
            .client
            .execute(
                "return [document.documentElement.scrollWidth, window.innerWidth]",
                vec![],
            )
            .await
            .expect("widths");
        let (page, window) = (widths[0].as_u64(), widths[1].as_u64());
        assert!(
            page <= window,
            "{} is {page:?} px wide in a {window:?} px window",
            self.path().await
        );
    }

    /// axe-core finds no serious or critical violation of its rules on the page.
    pub async fn is_accessible(&self) {
        let axe = crate::common::axe::script();
        self.client
            .execute(&format!("{axe}\nreturn true;"), vec![])
            .await
            .expect("axe-core loaded into the page");
        let found = self
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, {resultTypes: ['violations']})
                   .then(r => done(r.violations
                     .filter(v => v.impact === 'serious' || v.impact === 'critical')
                     .map(v => ({rule: v.id, impact: v.impact, help: v.help,
                                 nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))))
                   .catch(e => done([{rule: 'axe failed', help: String(e)}]));",
                vec![],
            )
            .await
            .expect("axe-core ran");
        assert_eq!(
            found.as_array().map(Vec::len),
            Some(0),
            "{} breaks accessibility rules: {found:#}",
            self.path().await
        );
    }

    pub async fn close(mut self) {
        let _ = self.client.close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

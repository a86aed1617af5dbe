//! axe-core, the accessibility rules the console's browser tests run in the page: installed
//! from npm at the version `tests/axe/package-lock.json` pins (`super::npm`), and never part
//! of the sked binary.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The script of axe-core (it defines `window.axe`).
pub fn script() -> &'static str {
    static SCRIPT: OnceLock<String> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let file = installed().join("node_modules/axe-core/axe.min.js");
        std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()))
    })
}

/// Where axe-core is installed, installing it first when no test has.
fn installed() -> PathBuf {
    super::npm::installed("axe", "node_modules/axe-core/axe.min.js")
}

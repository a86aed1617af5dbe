//! axe-core, the accessibility rules the console's browser tests run in the page: installed
//! from npm at the version `tests/axe/package-lock.json` pins (with its integrity hash), once
//! per build directory, and never part of the sked binary.

use std::path::{Path, PathBuf};
use std::process::Command;
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
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("axe");
    if home.join("node_modules/axe-core/axe.min.js").exists() {
        return home;
    }
    // Installed beside and moved into place whole, so that test binaries running at once
    // never read a half-written install.
    let fresh =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("axe.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::create_dir_all(&fresh).expect("a directory for axe-core");
    let pinned = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/axe");
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(pinned.join(file), fresh.join(file)).expect("axe-core's pinned package");
    }
    let status = Command::new("npm")
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .current_dir(&fresh)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run npm to install axe-core (apt-get install npm): {e}")
        });
    assert!(status.success(), "npm ci of axe-core failed: {status}");
    if std::fs::rename(&fresh, &home).is_err() {
        // Another test binary installed it first.
        let _ = std::fs::remove_dir_all(&fresh);
    }
    home
}

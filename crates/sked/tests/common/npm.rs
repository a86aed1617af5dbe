//! Node packages the browser tests use (axe-core, an OpenID Connect provider), installed from
//! npm at the versions and integrity hashes a `tests/NAME/package-lock.json` pins, once per
//! build directory. None of them is ever part of the sked binary.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory `tests/NAME`'s packages are installed in (its `node_modules` beside its
/// files), installing them first when no test has: `witness` is a file, relative to it, that
/// only a complete install has.
pub fn installed(name: &str, witness: &str) -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let home = tmp.join(format!("npm-{name}"));
    if home.join(witness).exists() {
        return home;
    }
    // Installed beside and moved into place whole, so that test binaries running at once
    // never read a half-written install.
    let fresh = tmp.join(format!("npm-{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::create_dir_all(&fresh).expect("a directory for npm packages");
    let pinned = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    for entry in std::fs::read_dir(&pinned).expect("the pinned packages' directory") {
        let entry = entry.expect("a pinned file");
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::copy(entry.path(), fresh.join(entry.file_name())).expect("copy a pinned file");
        }
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
            panic!("cannot run npm to install tests/{name} (apt-get install npm): {e}")
        });
    assert!(status.success(), "npm ci of tests/{name} failed: {status}");
    if std::fs::rename(&fresh, &home).is_err() {
        // Another test binary installed it first.
        let _ = std::fs::remove_dir_all(&fresh);
    }
    home
}

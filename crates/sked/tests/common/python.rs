//! Python peers of the tests (a real `celery worker`, Celery's own schedule arithmetic,
//! django-celery-beat): a venv per requirements file, made with `SKED_TEST_PYTHON` under the
//! build directory and made again only when the requirements change.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The venv `name` under the build directory with `requirements` installed. The tests of one
/// binary share it: making it twice at once would break it, so they take turns.
pub fn venv(name: &str, requirements: &Path) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _turn = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let stamp = dir.join("requirements.txt");
    let wanted = std::fs::read_to_string(requirements).expect("the requirements file");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let python = std::env::var("SKED_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("SKED_TEST_PYTHON is not set: these tests need a Python 3 with venv (see .ci/run)")
    });
    let status = Command::new(&python)
        .args(["-m", "venv"])
        .arg(&dir)
        .status()
        .expect("python -m venv");
    assert!(status.success(), "{python} -m venv failed");
    let out = Command::new(dir.join("bin/pip"))
        .args(["install", "-q", "--disable-pip-version-check", "-r"])
        .arg(requirements)
        .output()
        .expect("pip install");
    assert!(
        out.status.success(),
        "pip install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&stamp, wanted).expect("stamp the venv");
    dir
}

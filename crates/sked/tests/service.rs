//! sked as a service manager and a package run it: the readiness and stopping notices a
//! `Type=notify` systemd unit waits for, sent to a real notification socket; `--version` with
//! its commit; the completions and manual pages a package installs; and the refusals that keep
//! a misconfigured service from starting half-way (a missing config file, a data directory
//! that belongs to another user).

mod common;

use common::{free_port, sked_command, Sked, BIN};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The next notice on `socket`, or `None` after `timeout`.
fn notice(socket: &UnixDatagram, timeout: Duration) -> Option<String> {
    socket
        .set_read_timeout(Some(timeout))
        .expect("a read timeout");
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test]
async fn the_server_says_ready_once_it_serves_and_stopping_when_it_drains() {
    let sked = Sked::new();
    let socket_path = sked.dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notification socket");
    let listen = format!("127.0.0.1:{}", sked.port);
    let data = sked.data_dir();
    let mut server = sked_command()
        .args(["server", "--listen", &listen, "--data-dir"])
        .arg(&data)
        .env("NOTIFY_SOCKET", &socket_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sked server");

    let ready = notice(&socket, Duration::from_secs(30)).expect("a notice within 30 s");
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    // Ready means what /readyz says: it answers 200 as soon as the notice arrived.
    let readyz = reqwest::get(format!("{}/readyz", sked.base()))
        .await
        .expect("GET /readyz");
    assert_eq!(readyz.status(), 200);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stopping = notice(&socket, Duration::from_secs(10)).expect("a notice at SIGTERM");
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.try_wait().expect("wait for the server") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server outlived its stop timeout"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn the_version_names_the_commit_and_the_build_date() {
    let out = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("sked --version");
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let rest = line
        .trim()
        .strip_prefix(&format!("sked {} (commit ", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("{line:?}"));
    let (commit, date) = rest
        .strip_suffix(')')
        .and_then(|r| r.split_once(", built "))
        .unwrap_or_else(|| panic!("{line:?}"));
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(head) => assert_eq!(commit, head, "{line:?}"),
        None => assert_eq!(commit, "unknown", "{line:?}"),
    }
    assert!(
        chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").is_ok(),
        "{line:?}"
    );
}

#[test]
fn completions_and_manual_pages_cover_every_command() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef sked"),
        ("fish", "complete -c sked"),
    ] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("sked completions");
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8(out.stdout).expect("utf-8");
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        // Nested commands and their flags are there too.
        assert!(script.contains("database-url"), "{shell}");
        assert!(script.contains("backfill"), "{shell}");
    }
    let refused = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .expect("sked completions tcsh");
    assert!(!refused.status.success());

    let dir = tempfile::tempdir().expect("tempdir");
    let pages = dir.path().join("man1");
    let out = Command::new(BIN)
        .args(["man", "--out-dir"])
        .arg(&pages)
        .output()
        .expect("sked man");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "sked.1",
        "sked-server.1",
        "sked-worker.1",
        "sked-job-apply.1",
    ] {
        let text =
            std::fs::read_to_string(pages.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is not a man page"
        );
    }
    let server = std::fs::read_to_string(pages.join("sked-server.1")).expect("sked-server.1");
    assert!(
        server.contains("data\\-dir"),
        "the server's flags are documented"
    );
}

#[test]
fn a_missing_config_file_is_named_and_nothing_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let config = dir.path().join("etc/sked.toml");
    let out = sked_command()
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--config",
        ])
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("sked server");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&config.display().to_string()), "{stderr}");
    assert!(!data.exists(), "nothing was created");
}

/// A data directory that is another user's: as root (how CI runs) one owned by `nobody`
/// (65534), which root could write but its owner's service could then not read; as anyone
/// else the root-owned `/`, which they cannot write.
#[test]
fn a_data_directory_of_another_user_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = if nix::unistd::Uid::effective().is_root() {
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("mkdir");
        std::os::unix::fs::chown(&data, Some(65534), Some(65534)).expect("chown");
        data
    } else {
        std::path::PathBuf::from("/")
    };
    let out = sked_command()
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .expect("sked server");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the data directory {} belongs to", data.display())),
        "{stderr}"
    );
    if data != std::path::Path::new("/") {
        let left: Vec<_> = std::fs::read_dir(&data).expect("read the dir").collect();
        assert!(left.is_empty(), "nothing was written: {left:?}");
    }
}

//! Real `sked` processes for the benchmarks that need them (`takeover`, `shell`, `scale`):
//! finding the binary, starting it with its output in a log file, stopping it, and reading its
//! memory and CPU time from `/proc`.

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// Clock ticks per second of `/proc/PID/stat`'s CPU times (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// The `sked` binary: `--sked-bin`, or the one built next to this benchmark.
pub fn sked_bin(given: Option<&Path>) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .context("the benchmark's own directory")?
            .join("sked"),
    };
    if !path.is_file() {
        bail!(
            "no sked binary at {}: build it with `cargo build --release -p sked`, or pass \
             --sked-bin PATH",
            path.display()
        );
    }
    Ok(path)
}

pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Starts `bin` with `args`, its stdout and stderr in `log`; it is killed if dropped.
pub fn spawn(bin: &Path, args: &[&str], log: &Path) -> Result<Child> {
    let out =
        std::fs::File::create(log).with_context(|| format!("create the log {}", log.display()))?;
    let err = out.try_clone()?;
    Command::new(bin)
        .args(args)
        .env(
            "SKED_ADMIN_TOKEN_FILE",
            crate::harness::private_file("admin.token", crate::harness::ADMIN_TOKEN)?,
        )
        .env(
            "SKED_SECRET_KEY_FILE",
            crate::harness::private_file("secret.key", crate::harness::SECRET_KEY)?,
        )
        .env("SKED_TOKEN", crate::harness::ADMIN_TOKEN)
        .env("SKED_RATE_LIMIT", "0")
        .env("RUST_LOG", "info")
        // Plain text, so the logs can be searched for errors afterwards.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))
}

/// Asks the process to stop (SIGTERM, a graceful shutdown) and waits up to `within`; kills it
/// (SIGKILL) after that. Returns whether it stopped by itself.
pub async fn terminate(child: &mut Child, within: Duration) -> Result<bool> {
    let Some(pid) = child.id() else {
        // Already reaped.
        return Ok(true);
    };
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).context("SIGTERM")?;
    match tokio::time::timeout(within, child.wait()).await {
        Ok(status) => {
            status?;
            Ok(true)
        }
        Err(_) => {
            child.start_kill()?;
            child.wait().await?;
            Ok(false)
        }
    }
}

/// Resident memory of a process, from `/proc/PID/status`, in MiB.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_mb: f64,
    /// `VmHWM`: the most it has been resident.
    pub peak_mb: f64,
    /// `RssAnon`: the part that is heap and stacks rather than mapped files.
    pub anon_mb: f64,
}

pub fn memory(pid: u32) -> Result<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let field = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    };
    Ok(Memory {
        rss_mb: field("VmRSS:"),
        peak_mb: field("VmHWM:"),
        anon_mb: field("RssAnon:"),
    })
}

/// CPU time of a process, from `/proc/PID/stat`, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    /// Its own user and system time.
    pub own: f64,
    /// User and system time of its children that it has waited for.
    pub children: f64,
}

pub fn cpu_time(pid: u32) -> Result<CpuTime> {
    let fields = stat_fields(pid)?;
    // After the name: state is field 3, so utime (14), stime (15), cutime (16) and cstime (17)
    // are at 11..=14 here.
    let tick = |i: usize| -> Result<f64> {
        let ticks: u64 = fields
            .get(i)
            .context("a short /proc/PID/stat")?
            .parse()
            .context("a CPU time in /proc/PID/stat")?;
        Ok(ticks as f64 / TICKS_PER_SECOND)
    };
    Ok(CpuTime {
        own: tick(11)? + tick(12)?,
        children: tick(13)? + tick(14)?,
    })
}

/// The fields of `/proc/PID/stat` after the command name (field 2, in parentheses, which may
/// hold spaces): the state is the first.
fn stat_fields(pid: u32) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    let rest = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("an unreadable /proc/PID/stat")?;
    Ok(rest.split_whitespace().map(str::to_string).collect())
}

/// The processes whose parent is `pid`, as /proc lists them now.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            stat_fields(child)
                .ok()
                .and_then(|f| f.get(1)?.parse::<u32>().ok())
                == Some(pid)
        })
        .collect()
}

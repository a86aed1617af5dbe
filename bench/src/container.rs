//! A container target's start-to-exit against the engine called directly, in one sitting:
//! `podman run --rm --network none IMAGE true` timed as a command, then the same image and
//! command as a container job of one real `sked worker --container-runtime podman` process
//! (the server in this process), timed from the attempt's start to its end as the ledger
//! records them (lease to completion report, so every step sked adds is inside). The two
//! alternate, one of each per round, so the machine's drift falls on both alike.
//!
//! The image is built here from the host's busybox-static (`FROM scratch`), in a podman
//! storage of this run's own (vfs, runc, cgroupfs); no registry is reached. Needs podman,
//! runc and busybox-static.

use crate::harness::{http_client, start_configured, store_with_jobs, tail_json};
use crate::process::{sked_bin, spawn, terminate};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_core::stats::percentiles;
use sked_server::ServerConfig;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const IMAGE: &str = "localhost/sked-bench-busybox";
/// How long one run may take before the benchmark gives up.
const RUN_LIMIT: Duration = Duration::from_secs(60);

pub struct Options {
    pub rounds: usize,
    pub sked_bin: Option<PathBuf>,
}

pub async fn run(options: Options) -> Result<Value> {
    if options.rounds == 0 {
        bail!("--rounds must be above zero");
    }
    let bin = sked_bin(options.sked_bin.as_deref())?;
    let dir = tempfile::Builder::new()
        .prefix("sked-container-")
        .tempdir()?;
    prepare_podman(dir.path())?;
    let spec: JobSpec = serde_json::from_value(json!({
        "schedule": {"every": "24h", "anchor": (chrono::Utc::now() + chrono::Duration::hours(12)).to_rfc3339()},
        "target": {"container": {"image": IMAGE, "command": "true", "pull": "never"}},
    }))?;
    let (store, place) = store_with_jobs(None, [("box".to_string(), spec)].into_iter()).await?;
    let config = ServerConfig {
        retention: None,
        container_policy: sked_core::container::ContainerPolicy {
            any_image: true,
            ..Default::default()
        },
        ..ServerConfig::default()
    };
    let mut server = start_configured(store, place, 1, config).await?;
    let log = dir.path().join("worker.log");
    let mut worker = spawn(
        &bin,
        &[
            "worker",
            "--server",
            server.base(),
            "--slots",
            "1",
            "--name",
            "bench-container",
            "--container-runtime",
            "podman",
        ],
        &log,
    )?;
    let measured = measure(&options, server.base()).await;
    terminate(&mut worker, Duration::from_secs(10)).await?;
    server.stop().await;
    let (mut direct, mut through_sked) =
        measured.with_context(|| format!("see {}", log.display()))?;
    let (d, s) = (percentiles(&mut direct), percentiles(&mut through_sked));
    Ok(json!({
        "scenario": "container",
        "rounds": options.rounds,
        "engine": podman_version()?,
        "direct_podman_run_ms": tail_json(&d),
        "sked_attempt_ms": tail_json(&s),
        "overhead_p50": s.p50 / d.p50 - 1.0,
        "overhead_p99": s.p99 / d.p99 - 1.0,
    }))
}

/// One direct run and one run through sked per round, after one of each as a warm-up.
async fn measure(options: &Options, base: &str) -> Result<(Vec<f64>, Vec<f64>)> {
    let http = http_client();
    let (mut direct, mut through_sked) = (Vec::new(), Vec::new());
    for round in 0..=options.rounds {
        let started = Instant::now();
        let status = std::process::Command::new("podman")
            .args([
                "run",
                "--rm",
                "--network",
                "none",
                "--pull",
                "never",
                IMAGE,
                "true",
            ])
            .status()
            .context("podman run")?;
        let took = started.elapsed();
        if !status.success() {
            bail!("podman run {IMAGE} true failed: {status}");
        }
        let attempt = run_through_sked(&http, base).await?;
        if round > 0 {
            direct.push(took.as_secs_f64() * 1000.0);
            through_sked.push(attempt.as_secs_f64() * 1000.0);
        }
    }
    Ok((direct, through_sked))
}

/// Triggers the job, waits for its run to succeed, and returns its attempt's duration.
async fn run_through_sked(http: &reqwest::Client, base: &str) -> Result<Duration> {
    let answer: Value = http
        .post(format!("{base}/api/v1/jobs/box/trigger"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let id = answer["id"].as_i64().context("a run id")?;
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let run: Value = http
            .get(format!("{base}/api/v1/runs/{id}"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        match run["state"].as_str() {
            Some("succeeded") => {
                let attempt = &run["attempt_history"][0];
                let at = |field: &str| -> Result<chrono::DateTime<chrono::Utc>> {
                    attempt[field]
                        .as_str()
                        .and_then(|t| t.parse().ok())
                        .with_context(|| format!("the attempt's {field}: {run}"))
                };
                return (at("finished_at")? - at("started_at")?)
                    .to_std()
                    .context("an attempt that ended before it started");
            }
            Some("failed" | "timed_out" | "cancelled" | "skipped") => {
                bail!("the container run did not succeed: {run}")
            }
            _ if Instant::now() > deadline => bail!("run {id} did not end: {run}"),
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// This run's podman configuration and storage, given to every process through the
/// environment, and the image built in it.
fn prepare_podman(dir: &Path) -> Result<()> {
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\n\
         cgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
    )?;
    let storage = dir.join("storage.conf");
    std::fs::write(
        &storage,
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            dir.join("graph").display(),
            dir.join("run").display()
        ),
    )?;
    // Set before any process is started, so the engine, the worker and its children agree.
    std::env::set_var("CONTAINERS_CONF", &conf);
    std::env::set_var("CONTAINERS_STORAGE_CONF", &storage);
    let context = dir.join("context");
    std::fs::create_dir_all(context.join("bin"))?;
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .context("busybox-static is not installed")?;
    std::fs::copy(busybox, context.join("bin/busybox"))?;
    std::os::unix::fs::symlink("busybox", context.join("bin/true"))?;
    std::fs::write(
        context.join("Containerfile"),
        "FROM scratch\nCOPY bin /bin\n",
    )?;
    let built = std::process::Command::new("podman")
        .args(["build", "--quiet", "--tag", IMAGE])
        .arg(&context)
        .output()
        .context("podman build")?;
    if !built.status.success() {
        bail!(
            "podman build failed: {}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    Ok(())
}

fn podman_version() -> Result<String> {
    let out = std::process::Command::new("podman")
        .arg("--version")
        .output()
        .context("podman --version")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

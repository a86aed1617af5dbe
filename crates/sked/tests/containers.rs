//! Container targets, black box, with real podman: what a container job sees of its run and
//! how a secret reaches it (only through the environment), a timeout that stops and removes
//! the container, a worker killed mid-run whose container is gone once it is back, a memory
//! limit that ends an allocating job `out_of_memory`, the image and mount policy at write time,
//! and workers without an engine that are handed no container run.
//!
//! Each test has its own podman storage (vfs, runc, cgroupfs, in its temporary directory)
//! and builds its image there from this machine's busybox: no registry is reached. Needs
//! podman, runc and busybox-static (`SKED_TEST_PODMAN`, or CI, which installs them);
//! otherwise these tests are reported as ignored.

mod common;

use common::Sked;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const IMAGE: &str = "localhost/sked-test-busybox";

/// A podman of the test's own: its configuration and storage under `dir`, given to every
/// sked process through the environment.
struct Podman {
    env: Vec<(String, String)>,
}

impl Podman {
    /// Writes the configuration and builds [`IMAGE`]: busybox and the applets the jobs use.
    fn new(dir: &Path) -> Podman {
        let root = dir.join("podman");
        std::fs::create_dir_all(root.join("context/bin")).expect("mkdir");
        let conf = root.join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .expect("write containers.conf");
        let storage = root.join("storage.conf");
        std::fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                root.join("graph").display(),
                root.join("run").display()
            ),
        )
        .expect("write storage.conf");
        let podman = Podman {
            env: vec![
                ("CONTAINERS_CONF".into(), conf.display().to_string()),
                (
                    "CONTAINERS_STORAGE_CONF".into(),
                    storage.display().to_string(),
                ),
            ],
        };
        let context = root.join("context");
        std::fs::copy(busybox(), context.join("bin/busybox")).expect("copy busybox");
        for applet in ["sh", "echo", "env", "sleep", "head", "tr", "cat", "true"] {
            std::os::unix::fs::symlink("busybox", context.join("bin").join(applet))
                .expect("symlink");
        }
        std::fs::write(
            context.join("Containerfile"),
            "FROM scratch\nCOPY bin /bin\nCMD [\"/bin/sh\"]\n",
        )
        .expect("write Containerfile");
        let built = podman.command(&[
            "build",
            "--quiet",
            "--tag",
            IMAGE,
            context.to_str().expect("utf-8"),
        ]);
        assert!(built.0, "podman build failed: {}", built.1);
        podman
    }

    fn command(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(podman_program())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .output()
            .expect("run podman");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Ids of the containers, running or not, carrying `label`.
    fn containers(&self, label: &str) -> Vec<String> {
        let filter = format!("label={label}");
        let (ok, text) = self.command(&["ps", "--all", "--quiet", "--filter", &filter]);
        assert!(ok, "podman ps: {text}");
        text.split_whitespace().map(str::to_string).collect()
    }

    /// Waits up to `bound` for `check` on the containers carrying `label`.
    async fn wait_containers(
        &self,
        label: &str,
        bound: Duration,
        check: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let deadline = Instant::now() + bound;
        loop {
            let found = self.containers(label);
            if check(&found) || Instant::now() > deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn podman_program() -> PathBuf {
    std::env::var_os("SKED_TEST_PODMAN")
        .map(PathBuf::from)
        .unwrap_or_else(|| "podman".into())
}

fn busybox() -> PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("busybox-static is installed")
}

/// A deployment whose processes use the test's podman.
fn deployment() -> (Sked, Podman) {
    let mut sked = Sked::new();
    let podman = Podman::new(sked.dir.path());
    sked.env = podman.env.clone();
    (sked, podman)
}

fn container(command: &str) -> Value {
    json!({"container": {"image": IMAGE, "command": "/bin/sh", "args": ["-c", command], "pull": "never"}})
}

fn first_attempt(run: &Value) -> &Value {
    &run["attempt_history"][0]
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn a_container_sees_its_run_and_a_secret_only_through_the_environment() {
    let (mut sked, podman) = deployment();
    sked.start_dev(&["--container-runtime", "podman"]).await;
    let secret = "s3cr3t-9f0a7c";
    let mut target = container(
        "echo A=$A; echo TOKEN=$TOKEN; echo JOB=$SKED_JOB; echo RUN=$SKED_RUN_ID; sleep 2",
    );
    target["container"]["env"] = json!({"A": "1", "TOKEN": {"secret": secret}});
    let (status, job) = sked
        .put_job(
            "env-dump",
            json!({"schedule": {"every": "1h"}, "target": target}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    assert!(
        !job.to_string().contains(secret),
        "the definition shows the secret: {job}"
    );
    let id = sked.trigger("env-dump").await;
    // While it runs, no process's command line carries the secret.
    let running = podman
        .wait_containers("sked.worker=dev", Duration::from_secs(20), |c| {
            !c.is_empty()
        })
        .await;
    assert_eq!(running.len(), 1, "the container did not start");
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(secret),
                "process {:?} has the secret on its command line",
                entry.file_name()
            );
        }
    }
    let run = sked.wait_finished(id, Duration::from_secs(60)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert_eq!(first_attempt(&run)["exit_code"], 0, "{run}");
    let log = sked.run_log(id).await;
    for line in [
        "A=1",
        &format!("TOKEN={secret}"),
        "JOB=env-dump",
        &format!("RUN={id}"),
    ] {
        assert!(log.contains(line), "{line:?} not in the log: {log}");
    }
    let left = podman
        .wait_containers(
            "sked.worker=dev",
            Duration::from_secs(10),
            <[String]>::is_empty,
        )
        .await;
    assert!(left.is_empty(), "the container was not removed: {left:?}");
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn a_timeout_stops_and_removes_the_container_within_the_grace() {
    let (mut sked, podman) = deployment();
    sked.start_dev(&["--container-runtime", "podman"]).await;
    // The container's first process ignores SIGTERM (as PID 1 does without a handler):
    // only the SIGKILL after the worker's grace (5 s) ends it.
    let (status, job) = sked
        .put_job(
            "stuck",
            json!({"schedule": {"every": "1h"}, "timeout": "2s",
                   "retry": {"max_attempts": 1},
                   "target": container("echo started; exec sleep 600")}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = sked.trigger("stuck").await;
    let run = sked.wait_finished(id, Duration::from_secs(60)).await;
    assert_eq!(run["state"], "timed_out", "{run}");
    let attempt = first_attempt(&run);
    let took = common::instant(&attempt["finished_at"]) - common::instant(&attempt["started_at"]);
    let bound = chrono::Duration::seconds(2 + 5 + 2);
    assert!(
        took <= bound,
        "the attempt took {took} to end, more than timeout + grace + 2 s"
    );
    assert!(sked.run_log(id).await.contains("started"));
    let left = podman.containers("sked.worker=dev");
    assert!(
        left.is_empty(),
        "the container outlived its attempt: {left:?}"
    );
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn a_worker_killed_mid_run_leaves_no_container_once_it_is_back() {
    let (mut sked, podman) = deployment();
    sked.start_server(&["--image-allow", "localhost/"]).await;
    // Two workers of one name on one host (the default name is the host's): one is killed.
    sked.start_worker_with("boxes", 1, &["--container-runtime", "podman"]);
    sked.start_worker_with("boxes", 1, &["--container-runtime", "podman"]);
    let (status, job) = sked
        .put_job(
            "long",
            json!({"schedule": {"every": "1h"}, "target": container("exec sleep 600")}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    sked.trigger("long").await;
    sked.trigger("long").await;
    let running = podman
        .wait_containers("sked.worker=boxes", Duration::from_secs(30), |c| {
            c.len() == 2
        })
        .await;
    assert_eq!(running.len(), 2, "both containers did not start");
    let of = |i: usize| {
        let label = format!("sked.worker.pid={}", sked.workers[i].pid());
        let found = podman.containers(&label);
        assert_eq!(found.len(), 1, "worker {i} runs one container: {found:?}");
        found[0].clone()
    };
    let (killed, alive) = (of(0), of(1));
    sked.workers[0].sigkill();
    // The engine keeps a container whose client died: a worker of the name removes it.
    assert!(
        podman.containers("sked.worker=boxes").contains(&killed),
        "the container should outlive a SIGKILLed worker until one of its name starts"
    );
    sked.start_worker_with("boxes", 1, &["--container-runtime", "podman"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = podman.containers("sked.worker=boxes");
        if !now.contains(&killed) {
            assert!(
                now.contains(&alive),
                "the live worker's container was removed: {now:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "container {killed} is still there: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn a_container_over_its_memory_limit_ends_out_of_memory() {
    let (mut sked, podman) = deployment();
    sked.start_dev(&["--container-runtime", "podman"]).await;
    let mut target =
        container("x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived ${#x}");
    target["container"]["memory"] = json!("64MiB");
    let (status, job) = sked
        .put_job(
            "hungry",
            json!({"schedule": {"every": "1h"}, "retry": {"max_attempts": 1}, "target": target}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = sked.trigger("hungry").await;
    let run = sked.wait_finished(id, Duration::from_secs(60)).await;
    assert_eq!(run["state"], "failed", "{run}");
    let error = first_attempt(&run)["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("out_of_memory"), "{error} ({run})");
    assert!(!sked.run_log(id).await.contains("survived"));
    assert!(podman.containers("sked.worker=dev").is_empty());
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn an_image_that_is_not_there_fails_the_attempt_with_the_engines_reason() {
    let (mut sked, podman) = deployment();
    sked.start_dev(&["--container-runtime", "podman"]).await;
    let (status, job) = sked
        .put_job(
            "missing",
            json!({"schedule": {"every": "1h"}, "retry": {"max_attempts": 1},
                   "target": {"container": {"image": "localhost/not-built-here", "pull": "never"}}}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = sked.trigger("missing").await;
    let run = sked.wait_finished(id, Duration::from_secs(60)).await;
    assert_eq!(run["state"], "failed", "{run}");
    let error = first_attempt(&run)["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("the container engine failed") && error.contains("not-built-here"),
        "{error}"
    );
    assert!(podman.containers("sked.worker=dev").is_empty());
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn images_and_mounts_the_server_does_not_allow_are_refused_at_write_time() {
    let mut sked = Sked::new();
    sked.start_server(&[
        "--image-allow",
        "localhost/allowed/",
        "--image-allow",
        "ops=localhost/ops-only/",
        "--mount-allow",
        "/srv/shared",
        "--mount-allow",
        "/var/cache/sked-jobs:rw",
    ])
    .await;
    let put = |name: &'static str, target: Value| {
        let sked = &sked;
        async move {
            sked.put_job(
                name,
                json!({"schedule": {"every": "1h"}, "target": {"container": target}}),
            )
            .await
        }
    };
    let refused = |answer: &Value, field: &str| {
        assert_eq!(answer["error"]["field"], field, "{answer}");
    };
    let (status, answer) = put("a", json!({"image": "localhost/other/tool"})).await;
    assert_eq!(status, 400, "{answer}");
    refused(&answer, "target.container.image");
    let (status, answer) = put("b", json!({"image": "localhost/ops-only/tool"})).await;
    assert_eq!(status, 400, "another namespace's prefix: {answer}");
    let mount = |source: &str, writable: bool| {
        json!({"image": "localhost/allowed/tool",
               "mounts": [{"source": source, "target": "/m", "writable": writable}]})
    };
    let (status, answer) = put("c", mount("/etc", false)).await;
    assert_eq!(status, 400, "{answer}");
    refused(&answer, "target.container.mounts[0].source");
    let (status, answer) = put("d", mount("/srv/shared/data", true)).await;
    assert_eq!(
        status, 400,
        "a writable mount under a read-only allowance: {answer}"
    );
    refused(&answer, "target.container.mounts[0].source");
    let (status, answer) = put(
        "e",
        json!({"image": "localhost/allowed/tool", "privileged": true}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    for (name, target) in [
        ("f", json!({"image": "localhost/allowed/tool"})),
        ("g", mount("/srv/shared/data", false)),
        ("h", mount("/var/cache/sked-jobs/x", true)),
    ] {
        let (status, answer) = put(name, target).await;
        assert_eq!(status, 201, "{name}: {answer}");
    }
    // Nothing refused was written.
    for name in ["a", "b", "c", "d", "e"] {
        let (status, _) = sked.get(&format!("/jobs/{name}")).await;
        assert_eq!(status, 404, "{name} was written");
    }
    // A container runs commands on a worker's host: a token without the shell grant may not
    // define one.
    let editor = common::client_for(
        &sked,
        "editor",
        json!({"role": "editor", "namespaces": ["default"]}),
    )
    .await;
    let answer = editor
        .put(sked.url("/jobs/i"))
        .json(&json!({"schedule": {"every": "1h"}, "target": {"container": {"image": "localhost/allowed/x"}}}))
        .send()
        .await
        .expect("PUT");
    assert_eq!(answer.status().as_u16(), 403);
}

#[cfg_attr(
    not(sked_container_tests),
    ignore = "needs podman, runc and busybox-static"
)]
#[tokio::test]
async fn only_workers_with_an_engine_are_handed_container_runs() {
    let (mut sked, podman) = deployment();
    sked.start_server(&["--image-allow", "localhost/"]).await;
    sked.start_worker_with("plain", 2, &["--container-runtime", "none"]);
    let (status, job) = sked
        .put_job(
            "boxed",
            json!({"schedule": {"every": "1h"}, "target": container("echo inside")}),
        )
        .await;
    assert_eq!(status, 201, "{job}");
    let id = sked.trigger("boxed").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let run = sked.run(id).await;
        assert_eq!(
            run["state"], "queued",
            "a worker without an engine took it: {run}"
        );
        if let Some(reason) = run["waiting_for_workers"].as_str() {
            break reason.to_string();
        }
        assert!(Instant::now() < deadline, "no waiting reason: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(waiting.contains("container engine"), "{waiting}");
    sked.start_worker_with("boxes", 2, &["--container-runtime", "podman"]);
    let run = sked.wait_finished(id, Duration::from_secs(60)).await;
    assert_eq!(run["state"], "succeeded", "{run}");
    assert!(first_attempt(&run)["worker_id"]
        .as_str()
        .unwrap_or_default()
        .starts_with("boxes"));
    assert!(sked.run_log(id).await.contains("inside"));
    assert!(podman.containers("sked.worker=boxes").is_empty());
}

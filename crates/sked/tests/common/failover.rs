//! A PostgreSQL formation that fails over, for black-box tests: a pg_auto_failover monitor and
//! two data nodes (a primary and a synchronous secondary) on free loopback ports, under a
//! temporary directory owned by `postgres`. Owns those processes and that directory: it starts
//! them, tunes the monitor to fail over within seconds, kills the primary as a crashed host
//! would die, tells when the other node has been promoted and takes writes, and tears
//! everything down on drop.
//!
//! pg_auto_failover rather than Patroni and etcd: on one machine it needs one monitor (itself
//! a PostgreSQL) and no separate consensus store, and Debian packages it
//! (`postgresql-15-auto-failover`, `pg-auto-failover-cli`). Its processes run as `postgres`
//! through `runuser`, so the tests run as root, as CI does.
//!
//! Needs `/usr/bin/pg_autoctl`; the tests that use it are compiled to run when it is there (or
//! under CI, where its absence fails them: see the store's build.rs, `sked_failover_tests`).

use super::free_port;
use super::pg::Logs;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PG_AUTOCTL: &str = "/usr/bin/pg_autoctl";
const PG_CTL: &str = "/usr/lib/postgresql/15/bin/pg_ctl";
/// The database the data nodes serve, and the tests' URL names.
const DBNAME: &str = "test";

/// The monitor's settings that decide how fast a dead primary is replaced (milliseconds; the
/// defaults, in the comments, take about 30 s plus the 30 s demote timeout). A node is
/// declared unhealthy once its health check failed `max_retries` times and its keeper has not
/// reported for `node_considered_unhealthy_timeout`; the secondary is then promoted, and takes
/// writes once the old primary has had `primary_demote_timeout` to demote itself (it cannot
/// here: it is dead). Too short for a real network, where a primary cut off for a moment must
/// have time to demote itself before another takes writes.
const MONITOR_SETTINGS: &[(&str, &str)] = &[
    // 5000
    ("pgautofailover.health_check_period", "1000"),
    // 5000
    ("pgautofailover.health_check_timeout", "1000"),
    // 2
    ("pgautofailover.health_check_max_retries", "1"),
    // 2000
    ("pgautofailover.health_check_retry_delay", "500"),
    // 20000
    ("pgautofailover.node_considered_unhealthy_timeout", "1000"),
    // 30000
    ("pgautofailover.primary_demote_timeout", "1000"),
    // 10000: no failover this long after the monitor starts
    ("pgautofailover.startup_grace_period", "1000"),
];

/// One `pg_autoctl ... --run` and the PostgreSQL it manages.
struct Keeper {
    label: String,
    /// `runuser`, the leader of a process group of its own, which holds pg_autoctl, its
    /// services and the postmaster (PostgreSQL's backends each start a session of their own).
    child: Child,
    pgdata: PathBuf,
    port: u16,
    log: PathBuf,
    dead: bool,
}

impl Keeper {
    fn spawn(label: &str, dir: &Path, logs: &Logs, port: u16, args: &[String]) -> Keeper {
        let log = logs.file(label);
        let out = std::fs::File::create(&log).expect("a pg_autoctl log file");
        let err = out.try_clone().expect("a pg_autoctl log file");
        let pgdata = dir.join(label);
        let child = Command::new("runuser")
            .args(["-u", "postgres", "--", PG_AUTOCTL])
            .args(args)
            .arg("--pgdata")
            .arg(&pgdata)
            .args(["--pgport", &port.to_string(), "--pgctl", PG_CTL])
            // pg_autoctl keeps its configuration, state and pid files under the XDG
            // directories: here, so that nothing outlives the formation. Its local
            // connections go through the sockets in `dir`.
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_RUNTIME_DIR", dir)
            .env("PG_REGRESS_SOCK_DIR", dir)
            .env("PGHOST", dir)
            .current_dir(dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start pg_autoctl ({label}): {e}"));
        Keeper {
            label: label.to_string(),
            child,
            pgdata,
            port,
            log,
            dead: false,
        }
    }

    /// SIGKILL to the keeper's process group (pg_autoctl, its services, the postmaster) and to
    /// the postmaster's children, listed before anything dies (once orphaned they would no
    /// longer be found as its children): as if the host had died, with nothing left to
    /// restart PostgreSQL and no backend left to finish a commit.
    fn kill(&mut self) {
        if self.dead {
            return;
        }
        self.dead = true;
        let postmaster = postmaster_pid(&self.pgdata);
        let backends = postmaster.map(children_of).unwrap_or_default();
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        for pid in postmaster.into_iter().chain(backends) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The postmaster's pid, from the first line of `postmaster.pid`.
fn postmaster_pid(pgdata: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = &stat[stat.rfind(')')? + 1..];
                    after.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// A monitor and two data nodes, the first primary and the other its synchronous secondary
/// (which is which is learnt, not chosen).
pub struct Formation {
    dir: Option<tempfile::TempDir>,
    logs_dir: PathBuf,
    monitor: Keeper,
    nodes: Vec<Keeper>,
    killed: Option<(usize, Instant)>,
}

impl Formation {
    /// Starts the formation and waits (up to `within`) until one data node is primary and the
    /// other secondary with synchronous replication on. Logs go to `logs`.
    pub async fn start(logs: &Logs, within: Duration) -> Formation {
        let began = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("sked-failover-")
            .tempdir()
            .expect("a directory for the formation");
        let chown = Command::new("chown")
            .arg("postgres:postgres")
            .arg(dir.path())
            .status()
            .expect("chown the formation's directory");
        assert!(
            chown.success(),
            "chown postgres {}: {chown}",
            dir.path().display()
        );
        let monitor_port = free_port();
        let monitor = Keeper::spawn(
            "pg-monitor",
            dir.path(),
            logs,
            monitor_port,
            &owned(&[
                "create",
                "monitor",
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
                "--run",
            ]),
        );
        let mut formation = Formation {
            logs_dir: logs.path().to_path_buf(),
            dir: Some(dir),
            monitor,
            nodes: Vec::new(),
            killed: None,
        };
        let deadline = began + within;

        // The monitor's tuning goes in before any node registers.
        let monitor_db = loop {
            if let Ok(client) = formation.monitor_client().await {
                let ready = client
                    .query_opt(
                        "SELECT 1 FROM pg_extension WHERE extname = 'pgautofailover'",
                        &[],
                    )
                    .await;
                if matches!(ready, Ok(Some(_))) {
                    break client;
                }
            }
            formation.check_alive(deadline, "the monitor ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for (name, value) in MONITOR_SETTINGS {
            monitor_db
                .batch_execute(&format!("ALTER SYSTEM SET {name} = {value}"))
                .await
                .unwrap_or_else(|e| panic!("set {name} on the monitor: {e}"));
        }
        monitor_db
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload the monitor's settings");

        let monitor_uri = format!(
            "postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover?sslmode=disable"
        );
        for label in ["pg-node1", "pg-node2"] {
            let port = free_port();
            let name = label.trim_start_matches("pg-");
            let args = owned(&[
                "create",
                "postgres",
                "--monitor",
                &monitor_uri,
                "--auth",
                "trust",
                "--no-ssl",
                "--dbname",
                DBNAME,
                "--hostname",
                "127.0.0.1",
                "--listen",
                "127.0.0.1",
                "--name",
                name,
                "--run",
            ]);
            let keeper = Keeper::spawn(label, formation.dir(), logs, port, &args);
            formation.nodes.push(keeper);
        }

        // Primary and secondary, both as the monitor assigned them. The secondary's base
        // backup waits for a checkpoint on the primary, spread over minutes by default: one is
        // asked for every second until it is there.
        let mut last_checkpoint = Instant::now();
        loop {
            let states = formation.states(&monitor_db).await;
            let settled = |want: &str| {
                states
                    .iter()
                    .filter(|(_, reported, goal)| reported == want && goal == want)
                    .count()
                    == 1
            };
            if states.len() == 2 && settled("primary") && settled("secondary") {
                break;
            }
            if last_checkpoint.elapsed() > Duration::from_secs(1) {
                last_checkpoint = Instant::now();
                for port in formation.ports() {
                    if let Ok(client) = node_client(port).await {
                        let _ = client.batch_execute("CHECKPOINT").await;
                    }
                }
            }
            formation.check_alive(deadline, &format!("primary and secondary: {states:?}"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // Synchronous replication: a commit is acknowledged once the secondary has it.
        let primary = formation
            .primary_port()
            .await
            .expect("a primary taking writes once the monitor says so");
        let client = node_client(primary).await.expect("connect to the primary");
        let show = |name: &'static str| {
            let client = &client;
            async move {
                client
                    .query_one(&format!("SHOW {name}"), &[])
                    .await
                    .and_then(|row| row.try_get::<_, String>(0))
                    .unwrap_or_else(|e| panic!("SHOW {name} on the primary: {e}"))
            }
        };
        let standbys = show("synchronous_standby_names").await;
        let commit = show("synchronous_commit").await;
        assert!(
            !standbys.trim().is_empty() && commit == "on",
            "the primary replicates synchronously: synchronous_standby_names = {standbys:?}, \
             synchronous_commit = {commit:?}"
        );
        println!(
            "formation up in {} ms: monitor on {monitor_port}, primary on {primary}, \
             synchronous_standby_names = {standbys:?}",
            began.elapsed().as_millis()
        );
        formation
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the formation's directory").path()
    }

    /// The data nodes' ports, in the order they were started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The multi-host URL: sked tries the hosts in order and keeps the one that takes writes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!(
            "postgres://postgres@{}/{DBNAME}?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    async fn monitor_client(&self) -> Result<tokio_postgres::Client, String> {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/pg_auto_failover?connect_timeout=2",
            self.monitor.port
        );
        sked_store::postgres::client(&url)
            .await
            .map_err(|e| e.to_string())
    }

    /// Each data node's port, reported state and goal state, as the monitor has them.
    async fn states(&self, monitor: &tokio_postgres::Client) -> Vec<(u16, String, String)> {
        monitor
            .query(
                "SELECT nodeport, reportedstate::text, goalstate::text FROM pgautofailover.node \
                 ORDER BY nodeid",
                &[],
            )
            .await
            .map(|rows| {
                rows.iter()
                    .filter_map(|r| {
                        let port: i32 = r.try_get(0).ok()?;
                        Some((port as u16, r.try_get(1).ok()?, r.try_get(2).ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Fails the test if a process of the formation exited, or if `deadline` passed before
    /// `what`.
    fn check_alive(&mut self, deadline: Instant, what: &str) {
        for keeper in std::iter::once(&mut self.monitor).chain(self.nodes.iter_mut()) {
            if keeper.dead {
                continue;
            }
            if let Ok(Some(status)) = keeper.child.try_wait() {
                panic!(
                    "pg_autoctl {} exited ({status}); its log ends:\n{}",
                    keeper.label,
                    super::pg::tail(&keeper.log, 30)
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "the formation did not reach {what} in time; logs in {}",
            self.logs_dir.display()
        );
    }

    /// The port of the data node that is out of recovery and takes writes now, if one does.
    pub async fn primary_port(&self) -> Option<u16> {
        for keeper in self.nodes.iter().filter(|k| !k.dead) {
            if takes_writes(keeper.port).await {
                return Some(keeper.port);
            }
        }
        None
    }

    /// SIGKILLs the primary's keeper and its PostgreSQL (see [`Keeper::kill`]); returns its
    /// port and the instant it died.
    pub async fn kill_primary(&mut self) -> (u16, Instant) {
        let port = self.primary_port().await.expect("a primary to kill");
        let index = self
            .nodes
            .iter()
            .position(|k| k.port == port)
            .expect("the primary is a node of the formation");
        self.nodes[index].kill();
        let at = Instant::now();
        self.killed = Some((index, at));
        (port, at)
    }

    /// Waits (up to `within`) until the surviving node is out of recovery and commits a
    /// write; returns the time since [`Formation::kill_primary`].
    pub async fn wait_promoted(&mut self, within: Duration) -> Duration {
        let (dead, killed) = self.killed.expect("kill_primary first");
        let survivor = self.nodes[1 - dead].port;
        let deadline = killed + within;
        loop {
            if takes_writes(survivor).await {
                return killed.elapsed();
            }
            self.check_alive(deadline, &format!("a promoted node on {survivor}"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Whether the node on `port` is out of recovery and commits a write (a temporary table's row:
/// refused in a read-only session, and held up while a synchronous standby is awaited).
async fn takes_writes(port: u16) -> bool {
    let probe = async {
        let client = node_client(port).await.ok()?;
        let row = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .ok()?;
        if row.try_get::<_, bool>(0).ok()? {
            return None;
        }
        client
            .batch_execute("CREATE TEMP TABLE probe (x int); INSERT INTO probe VALUES (1)")
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), probe).await,
        Ok(Some(()))
    )
}

/// A connection to the data node on `port` alone.
async fn node_client(port: u16) -> Result<tokio_postgres::Client, String> {
    let url = format!("postgres://postgres@127.0.0.1:{port}/{DBNAME}?connect_timeout=2");
    sked_store::postgres::client(&url)
        .await
        .map_err(|e| e.to_string())
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

impl Drop for Formation {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        for keeper in self
            .nodes
            .iter_mut()
            .chain(std::iter::once(&mut self.monitor))
        {
            // PostgreSQL's own log (the pg_autoctl log is in the test's logs already).
            if panicking {
                let from = keeper.pgdata.join("log");
                if let Ok(entries) = std::fs::read_dir(&from) {
                    for (i, entry) in entries.flatten().enumerate() {
                        let to = self
                            .logs_dir
                            .join(format!("{}-postgres-{i}.log", keeper.label));
                        let _ = std::fs::copy(entry.path(), to);
                    }
                }
            }
            keeper.kill();
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

//! `sked import celery-beat`, proven against Celery itself (PyPI's, in a venv this test makes,
//! pinned in `tests/import_celery/requirements.txt`):
//!
//! - the instants: for a corpus of Celery crontab entries in zones with and without daylight
//!   saving, the next 1,000 instants of each translated sked schedule equal those Celery's own
//!   `crontab.remaining_estimate` gives (`tests/import_celery/celery_instants.py` says how it
//!   steps), or the importer reported the difference for that entry (or reported it as not
//!   translatable);
//! - django-celery-beat: its tables made by its own migrations (`django-admin migrate`) in a
//!   fresh PostgreSQL database, periodic tasks saved through its models, `sked import
//!   celery-beat postgres://...` reads them, and `sked job apply` puts the file into a real
//!   `sked dev` with the `--broker` connection the jobs name;
//! - pg_cron: a private PostgreSQL with the real extension (`shared_preload_libraries =
//!   'pg_cron'`, Debian's `postgresql-15-cron`), jobs made by `cron.schedule`, imported, and
//!   applied the same way.
//!
//! The first two need `SKED_TEST_PYTHON` and the brokers (the Celery tests' gate), the
//! django one `SKED_TEST_DATABASE_URL` too; the pg_cron one needs no Python, only
//! `SKED_TEST_DATABASE_URL` and PostgreSQL's programs with pg_cron. Without them these tests
//! are reported as ignored (under CI they run, and fail loudly).

mod common;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use common::Sked;
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_import::celery_beat::{self, EXPORT_FORMAT};
use sked_import::Import;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/import_celery");

fn service(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: the Celery import tests need it (see .ci/run)")
    })
}

/// The venv with Celery and django-celery-beat.
fn venv() -> PathBuf {
    common::python::venv(
        "import-celery-venv",
        &Path::new(HERE).join("requirements.txt"),
    )
}

/// Runs the venv's Python on `script` with `input` on its standard input; its output.
fn python(args: &[&str], input: &str, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(venv().join("bin/python"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(HERE)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write to python");
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "python {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Celery crontab entries (minute, hour, day_of_week, day_of_month, month_of_year) as people
/// write them: steps, ranges (some that wrap), lists, names, both day fields (whole weeks, which
/// translate, and a Friday the 13th, which cannot), a full day-of-week written as a range,
/// leap days, and times that changes of clocks skip or repeat.
const CORPUS: &[[&str; 5]] = &[
    ["*/15", "*", "*", "*", "*"],
    ["0", "*/3", "*", "*", "*"],
    ["30", "1", "*", "*", "*"],
    ["30", "2", "*", "*", "*"],
    ["0", "9-17", "mon-fri", "*", "*"],
    ["*/10", "1-2", "*", "*", "*"],
    ["0", "0", "*", "1", "*"],
    ["0", "12", "sun", "*", "*"],
    ["0", "9", "1", "1-7", "*"],
    ["0", "9", "fri", "13", "*"],
    ["15", "22-2", "*", "*", "*"],
    ["0", "8", "fri-mon", "*", "*"],
    ["45", "23", "*", "28-31", "*"],
    ["0", "6", "*", "1", "*/3"],
    ["0,30", "*", "*", "*", "mar,oct"],
    ["5", "4", "sat,sun", "29-31", "*"],
    ["0", "0", "*", "29", "2"],
    ["1-10/3", "3", "*", "*", "*"],
    ["0", "0", "0-6", "1,15", "*"],
    ["0", "*/2", "*/2", "*", "*"],
    ["30", "1", "sunday", "*", "*"],
    ["0", "1", "*", "*", "*"],
    ["*", "1", "*", "*", "*"],
    ["0", "2", "*", "*", "*"],
    ["20", "3", "mon,wed,fri", "1-7,15-21", "jan-jun"],
];

/// Zones without daylight saving (UTC, a half-hour offset) and with it, north and south.
const ZONES: &[&str] = &[
    "UTC",
    "Asia/Kolkata",
    "Europe/London",
    "America/New_York",
    "Australia/Sydney",
];

/// Where comparisons start: a winter, and just before the northern spring and autumn changes.
const STARTS: &[&str] = &[
    "2026-01-01T00:00:00Z",
    "2026-03-01T00:00:00Z",
    "2026-10-01T00:00:00Z",
];

const COUNT: usize = 1000;

/// The end of the time zone data sked compiles in (chrono-tz's tables stop after 2099: later
/// instants in a zone with daylight saving are read at its standard offset), where Python's
/// zoneinfo goes on with the zone's rule. Instants from there on are not compared, and the
/// test says how many lists that shortened.
const ZONE_DATA_END: &str = "2100-01-01T00:00:00Z";

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn export(entry: &[&str; 5], zone: &str) -> String {
    let schedule = json!({"type": "crontab", "minute": entry[0], "hour": entry[1],
        "day_of_week": entry[2], "day_of_month": entry[3], "month_of_year": entry[4]});
    format!(
        "{{\"format\": \"{EXPORT_FORMAT}\", \"timezone\": \"{zone}\", \"entries\": [\n{}\n]}}\n",
        json!({"name": "entry", "task": "proj.task", "schedule": schedule})
    )
}

/// The next [`COUNT`] instants of the only job of `import`, as the server computes them.
fn sked_instants(import: &Import, start: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let spec: JobSpec = serde_json::from_value(import.jobs[0].job.clone()).unwrap();
    let schedule = spec
        .validate(None, start)
        .expect("the importer wrote a valid job")
        .schedule;
    let mut out = Vec::new();
    let mut next = schedule.first();
    while let Some(t) = next {
        out.push(t);
        if out.len() == COUNT {
            break;
        }
        next = schedule.next_after(t, out.len() as u64);
    }
    out
}

#[test]
#[cfg_attr(
    not(sked_celery_tests),
    ignore = "needs SKED_TEST_PYTHON (and the brokers, the Celery tests' gate)"
)]
fn celery_crontab_instants_equal_celerys_own_or_the_difference_is_reported() {
    // Every entry in every zone from every start, in one run of Celery.
    let mut cases = Vec::new();
    for entry in CORPUS {
        for zone in ZONES {
            for start in STARTS {
                cases.push((entry, *zone, *start));
            }
        }
    }
    let mut by_start: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (i, (_, _, start)) in cases.iter().enumerate() {
        by_start.entry(start).or_default().push(i);
    }
    let mut celery: Vec<Vec<DateTime<Utc>>> = vec![Vec::new(); cases.len()];
    for (start, indices) in &by_start {
        let entries: Vec<Value> = indices
            .iter()
            .map(|i| {
                let (e, zone, _) = cases[*i];
                json!({"minute": e[0], "hour": e[1], "day_of_week": e[2],
                       "day_of_month": e[3], "month_of_year": e[4], "timezone": zone})
            })
            .collect();
        let request = json!({"start": start, "count": COUNT, "entries": entries});
        let out = python(&["celery_instants.py"], &request.to_string(), &[]);
        let lists: Vec<Vec<String>> = serde_json::from_str(&out).expect("the script's JSON");
        for (i, list) in indices.iter().zip(lists) {
            celery[*i] = list.iter().map(|s| at(s)).collect();
        }
    }
    let (mut same, mut differ, mut untranslated, mut shortened) = (0, 0, 0, 0);
    let mut exact_entries = std::collections::BTreeSet::new();
    let mut inexact_entries = std::collections::BTreeSet::new();
    for (i, (entry, zone, start)) in cases.iter().enumerate() {
        let tz: Tz = zone.parse().unwrap();
        let import = celery_beat::import_json_with(
            &export(entry, zone),
            &celery_beat::Options {
                connection: "celery".into(),
                as_of: Some(at(STARTS[0])),
            },
        )
        .unwrap();
        if import.jobs.is_empty() {
            // Only what sked's cron cannot say is left out, and it says why.
            assert_eq!(import.untranslated.len(), 1);
            let why = &import.untranslated[0].reason;
            assert!(
                why.contains("both day_of_month and day_of_week"),
                "{entry:?}: {why}"
            );
            untranslated += 1;
            inexact_entries.insert(**entry);
            continue;
        }
        let start = at(start);
        let mut sked = sked_instants(&import, start);
        // sked's cron names instants up to the end of 2199 (its documented horizon).
        assert!(
            sked.len() == COUNT
                || sked
                    .last()
                    .is_some_and(|t| *t >= at("2195-01-01T00:00:00Z")),
            "{entry:?} in {zone}: {} instants",
            sked.len()
        );
        let end = at(ZONE_DATA_END);
        if sked.iter().chain(&celery[i]).any(|t| *t >= end) {
            sked.retain(|t| *t < end);
            celery[i].retain(|t| *t < end);
            shortened += 1;
        }
        if sked == celery[i] {
            same += 1;
            exact_entries.insert(**entry);
            continue;
        }
        let k = sked
            .iter()
            .zip(&celery[i])
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        // A difference is the importer's to report, and only a change of clocks makes one.
        assert!(
            !import.differences.is_empty(),
            "{entry:?} in {zone} from {start}: instant {k} is {} in sked, {} in Celery, and \
             the importer said nothing",
            sked[k],
            celery[i][k]
        );
        let near_change = (-2..=2).any(|h: i64| {
            let t = sked[k].min(celery[i][k]) + chrono::Duration::hours(h) * 12;
            tz.offset_from_utc_datetime(&t.naive_utc())
                != tz.offset_from_utc_datetime(&(t + chrono::Duration::hours(12)).naive_utc())
        });
        assert!(
            near_change,
            "{entry:?} in {zone}: they part at {} / {}",
            sked[k], celery[i][k]
        );
        differ += 1;
        inexact_entries.insert(**entry);
    }
    eprintln!(
        "{} comparisons of {COUNT} instants ({} entries x {} zones x {} starts): {same} \
         identical, {differ} differing around a change of clocks (each reported), \
         {untranslated} not translated (reported); {shortened} lists cut at {ZONE_DATA_END}; \
         entries identical in every zone and start: {}",
        cases.len(),
        CORPUS.len(),
        ZONES.len(),
        STARTS.len(),
        CORPUS
            .iter()
            .filter(|e| exact_entries.contains(*e) && !inexact_entries.contains(*e))
            .count()
    );
    assert!(same > cases.len() / 2);
    // Zones without daylight saving never differ.
    assert!(differ > 0, "the corpus meets changes of clocks");
}

/// A fresh database on the test server, dropped at the end.
struct Database {
    admin: String,
    name: String,
    url: String,
}

impl Database {
    async fn create() -> Database {
        let admin = service("SKED_TEST_DATABASE_URL");
        let client = sked_store::postgres::client(&admin).await.expect("connect");
        let name = format!("sked_import_{:08x}", rand::random::<u32>());
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create a database");
        let url = match admin.rsplit_once('/') {
            Some((base, rest)) => {
                let query = rest
                    .split_once('?')
                    .map(|(_, q)| format!("?{q}"))
                    .unwrap_or_default();
                format!("{base}/{name}{query}")
            }
            None => panic!("SKED_TEST_DATABASE_URL has no database part"),
        };
        Database { admin, name, url }
    }

    async fn drop(self) {
        if let Ok(client) = sked_store::postgres::client(&self.admin).await {
            let _ = client
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .await;
        }
    }
}

/// The `sked` command line's import, writing `out`: exit code, standard error.
fn sked_import(args: &[&str]) -> (i32, String) {
    let out = common::sked_command()
        .arg("import")
        .args(args)
        .output()
        .expect("sked import");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
#[cfg_attr(
    not(all(sked_celery_tests, sked_pg_tests)),
    ignore = "needs SKED_TEST_PYTHON, the brokers and SKED_TEST_DATABASE_URL"
)]
async fn django_celery_beat_tables_import_and_apply() {
    let db = Database::create().await;
    // django-celery-beat's own migrations make its tables; its models save the tasks.
    let settings = [("SKED_DJANGO_DATABASE_URL", db.url.as_str())];
    python(&["django_beat.py", "migrate"], "", &settings);
    python(&["django_beat.py", "populate"], "", &settings);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("jobs.yaml");
    let (code, err) = sked_import(&[
        "celery-beat",
        &db.url,
        "--connection",
        "celery",
        "--namespace",
        "default",
        "--out",
        out.to_str().unwrap(),
    ]);
    // The solar task and Friday the 13th are reported: exit 3, the file written.
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("\"sunset\"") && err.contains("sunrise or sunset"),
        "{err}"
    );
    assert!(err.contains("\"friday 13th\""), "{err}");
    let file = std::fs::read_to_string(&out).unwrap();
    assert!(
        !file.contains("postgres://"),
        "the URL stays out of the file:\n{file}"
    );
    let doc: serde_yaml::Value = serde_yaml::from_str(&file).unwrap();
    let jobs: Value = serde_json::to_value(&doc["jobs"]).unwrap();
    let job = |name: &str| -> Value {
        jobs.as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no job {name} in\n{file}"))
    };
    let report = job("nightly-report");
    assert_eq!(
        report["schedule"],
        json!({"cron": "30 4 * * 1-5", "timezone": "Europe/London"})
    );
    assert_eq!(
        report["target"]["celery"],
        json!({"connection": "celery", "task": "proj.tasks.report", "args": [7, "eu"],
               "kwargs": {"full": true}, "queue": "reports", "priority": 6,
               "expires": "300s"})
    );
    assert_eq!(
        report["description"],
        "Celery beat entry \"nightly report\": the nightly numbers"
    );
    let poll = job("poll-every-90s");
    assert_eq!(poll["schedule"], json!({"every": "90s"}));
    assert_eq!(poll["paused"], true);
    assert_eq!(job("first-monday")["schedule"]["cron"], "0 9 * * 1#1");
    assert_eq!(
        job("once")["schedule"],
        json!({"at": "2030-01-02T03:04:05Z"})
    );
    db.drop().await;

    // Applied to a real server whose `celery` connection is a Redis broker.
    let redis = service("SKED_TEST_REDIS_URL");
    let mut sked = Sked::new();
    sked.start_dev(&["--broker", &format!("celery={redis}")])
        .await;
    let (ok, stdout, stderr) = sked.cli(&["job", "apply", "-f", out.to_str().unwrap()]);
    assert!(ok, "apply failed: {stdout}{stderr}");
    let (status, got) = sked.get("/jobs/nightly-report").await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got["target"]["celery"]["task"], "proj.tasks.report",
        "{got}"
    );
    let (_, poll) = sked.get("/jobs/poll-every-90s").await;
    assert_eq!(poll["state"], "paused", "{poll}");
}

#[tokio::test]
#[cfg_attr(
    not(sked_pg_server_tests),
    ignore = "needs SKED_TEST_DATABASE_URL, PostgreSQL's programs and pg_cron"
)]
async fn pg_cron_jobs_from_the_real_extension_import_and_apply() {
    let pg = PrivatePg::start();
    let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    let client = sked_store::postgres::client(&admin).await.expect("connect");
    client
        .batch_execute(
            "CREATE EXTENSION pg_cron; \
             SELECT cron.schedule('nightly-vacuum', '0 3 * * *', 'VACUUM'); \
             SELECT cron.schedule('purge', '30 2 * * 6', \
                 $$DELETE FROM pg_temp.x WHERE note = 'it''s \"old\"' $$); \
             SELECT cron.schedule('*/5 * * * *', 'SELECT 1'); \
             SELECT cron.schedule('boot', '@reboot', 'SELECT 2'); \
             UPDATE cron.job SET active = false WHERE jobname = 'purge';",
        )
        .await
        .expect("schedule pg_cron jobs");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("jobs.yaml");
    let url = format!(
        "postgres://postgres:not-a-real-password@127.0.0.1:{}/postgres",
        pg.port
    );
    let (code, err) = sked_import(&["pg-cron", &url, "--out", out.to_str().unwrap()]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("@reboot"), "{err}");
    assert!(!err.contains("not-a-real-password"), "{err}");
    let file = std::fs::read_to_string(&out).unwrap();
    assert!(!file.contains("not-a-real-password"), "{file}");
    let doc: serde_yaml::Value = serde_yaml::from_str(&file).unwrap();
    let jobs: Value = serde_json::to_value(&doc["jobs"]).unwrap();
    let names: Vec<&str> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nightly-vacuum", "purge", "pg-cron-3"], "{file}");
    let purge = &jobs[1];
    assert_eq!(
        purge["schedule"],
        json!({"cron": "30 2 * * 6", "timezone": "UTC"})
    );
    assert_eq!(purge["paused"], true);
    assert_eq!(
        purge["target"]["shell"]["env"]["PG_CRON_COMMAND"],
        "DELETE FROM pg_temp.x WHERE note = 'it''s \"old\"' "
    );
    assert_eq!(purge["target"]["shell"]["env"]["PGDATABASE"], "postgres");

    // Applied, and run: the worker's psql reaches the server through PGHOST and PGPORT.
    let mut sked = Sked::new();
    sked.env.push(("PGHOST".into(), "127.0.0.1".into()));
    sked.env.push(("PGPORT".into(), pg.port.to_string()));
    sked.start_dev(&[]).await;
    let (ok, stdout, stderr) = sked.cli(&["job", "apply", "-f", out.to_str().unwrap()]);
    assert!(ok, "apply failed: {stdout}{stderr}");
    let run = sked.trigger("pg-cron-3").await;
    let done = sked
        .wait_finished(run, std::time::Duration::from_secs(30))
        .await;
    assert_eq!(
        done["state"],
        "succeeded",
        "{done}\n{}",
        sked.run_log(run).await
    );
}

/// A PostgreSQL of this test's own, with pg_cron preloaded, stopped when dropped.
struct PrivatePg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

impl PrivatePg {
    fn start() -> PrivatePg {
        let bin = PathBuf::from(
            std::env::var("SKED_TEST_PG_BIN")
                .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into()),
        );
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let port = common::free_port();
        // initdb refuses to run as root: the cluster belongs to the postgres account then.
        let as_postgres = nix::unistd::geteuid().is_root();
        if as_postgres {
            let _ = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status();
        }
        let run = |program: &str, args: &[&str]| {
            let mut cmd = if as_postgres {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(bin.join(program));
                c
            } else {
                Command::new(bin.join(program))
            };
            let out = cmd.args(args).output().expect(program);
            assert!(
                out.status.success(),
                "{program} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let data_s = data.to_str().unwrap();
        run(
            "initdb",
            &["-D", data_s, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        );
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             shared_preload_libraries = 'pg_cron'\ncron.database_name = 'postgres'\n",
            dir.path().display()
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .and_then(|mut f| f.write_all(conf.as_bytes()))
            .expect("configure");
        let log = dir.path().join("pg.log");
        run(
            "pg_ctl",
            &["-D", data_s, "-l", log.to_str().unwrap(), "-w", "start"],
        );
        PrivatePg { dir, bin, port }
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let mut cmd = if nix::unistd::geteuid().is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"));
            c
        } else {
            Command::new(self.bin.join("pg_ctl"))
        };
        let _ = cmd
            .args([
                "-D",
                data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}

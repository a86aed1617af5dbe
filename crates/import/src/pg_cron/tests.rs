use super::*;
use serde_json::json;

fn row(jobid: i64, name: Option<&str>, schedule: &str, command: &str) -> PgCronJob {
    PgCronJob {
        jobid,
        jobname: name.map(str::to_string),
        schedule: schedule.to_string(),
        command: command.to_string(),
        database: "app".to_string(),
        username: "reporter".to_string(),
        nodename: "localhost".to_string(),
        nodeport: 5432,
        active: true,
    }
}

fn at(s: &str) -> Instant {
    s.parse().unwrap()
}

fn options(tz: Option<Tz>) -> Options {
    Options {
        timezone: tz,
        match_dom_and_dow: false,
        as_of: Some(at("2026-01-01T00:00:00Z")),
    }
}

#[test]
fn a_cron_row_becomes_a_psql_job_with_the_sql_in_its_environment() {
    let sql = "DELETE FROM events WHERE at < now() - interval '1 week'; SELECT \"$HOME\" `x`";
    let import = import_rows_with(
        &[row(3, Some("Purge events"), "30 3 * * 6", sql)],
        &options(None),
    );
    assert!(import.is_exact(), "{import:?}");
    let job = &import.jobs[0].job;
    assert_eq!(job["name"], "purge-events");
    assert_eq!(
        job["schedule"],
        json!({"cron": "30 3 * * 6", "timezone": "UTC"})
    );
    let shell = &job["target"]["shell"];
    // The SQL is only in the environment: the shell text is the same for every job.
    assert_eq!(shell["command"], PSQL_COMMAND);
    assert_eq!(shell["env"][SQL_VARIABLE], sql);
    assert_eq!(shell["env"]["PGDATABASE"], "app");
    assert_eq!(shell["env"]["PGUSER"], "reporter");
    assert!(shell["env"].get("PGPASSWORD").is_none());
    assert_eq!(job["overlap"], "buffer_all");
    assert!(job["description"]
        .as_str()
        .unwrap()
        .contains("pg_cron job 3 (\"Purge events\")"));
    assert!(import.jobs[0]
        .comments
        .iter()
        .any(|c| c.contains("localhost:5432")));
}

#[test]
fn seconds_last_day_names_and_inactive_rows_translate() {
    let rows = [
        row(1, None, "10 seconds", "SELECT 1"),
        row(2, None, " 1 Second ", "SELECT 1"),
        row(3, None, "0 23 $ * *", "CALL month_end()"),
        row(4, Some("weekly"), "0 4 * jan-jun sun", "VACUUM"),
        row(5, None, "@daily", "VACUUM"),
        PgCronJob {
            active: false,
            ..row(6, None, "*/5 * * * *", "SELECT 2")
        },
    ];
    let import = import_rows_with(&rows, &options(None));
    assert!(import.is_exact(), "{import:?}");
    let jobs: Vec<&Value> = import.jobs.iter().map(|j| &j.job).collect();
    assert_eq!(jobs[0]["schedule"], json!({"every": "10s"}));
    assert_eq!(jobs[0]["overlap"], "buffer_one");
    assert_eq!(jobs[0]["name"], "pg-cron-1");
    assert_eq!(jobs[1]["schedule"]["every"], "1s");
    assert_eq!(jobs[2]["schedule"]["cron"], "0 23 L * *");
    assert_eq!(jobs[3]["schedule"]["cron"], "0 4 * jan-jun sun");
    assert_eq!(jobs[4]["schedule"]["cron"], "@daily");
    assert_eq!(jobs[5]["paused"], true);
    assert!(import.jobs[5]
        .comments
        .iter()
        .any(|c| c.contains("inactive")));
}

#[test]
fn what_pg_cron_refuses_or_sked_cannot_hold_is_reported_with_its_jobid() {
    let rows = [
        row(1, None, "@reboot", "SELECT 1"),
        row(2, None, "60 seconds", "SELECT 1"),
        row(3, None, "5/10 * * * *", "SELECT 1"),
        row(4, None, "0 0 * * * *", "SELECT 1"),
        row(5, None, "0 0 L * *", "SELECT 1"),
        row(6, None, "0 25 * * *", "SELECT 1"),
        row(7, None, "@Daily", "SELECT 1"),
        row(8, None, "0 0 * * *", "  "),
        row(9, None, "every day", "SELECT 1"),
    ];
    let import = import_rows_with(&rows, &options(None));
    assert!(import.jobs.is_empty(), "{:?}", import.jobs);
    assert_eq!(import.untranslated.len(), rows.len());
    for (item, row) in import.untranslated.iter().zip(&rows) {
        assert!(
            item.text.starts_with(&format!("jobid {}:", row.jobid)),
            "{item:?}"
        );
    }
    assert!(import.untranslated[0].reason.contains("@reboot"));
    assert!(import.untranslated[1].reason.contains("1 to 59"));
    assert!(import.untranslated[2]
        .reason
        .contains("a step needs a range"));
    assert!(import.untranslated[3].reason.contains("five fields"));
    assert!(import.untranslated[4].reason.contains("pg_cron refuses"));
    assert!(import.untranslated[5].reason.contains("out of range"));
}

#[test]
fn and_logic_for_both_restricted_days_is_reported_not_approximated() {
    let rows = [
        row(1, None, "0 0 1-7 * 1", "SELECT 1"),
        row(2, None, "0 0 * * 1", "SELECT 1"),
    ];
    let mut opts = options(None);
    opts.match_dom_and_dow = true;
    let import = import_rows_with(&rows, &opts);
    assert_eq!(import.jobs.len(), 1);
    assert!(import.untranslated[0].reason.contains("match_dom_and_dow"));
    // Off (the default), Vixie's either-day rule is sked's too.
    assert!(import_rows_with(&rows, &options(None)).is_exact());
}

#[test]
fn a_zone_with_daylight_saving_and_yearly_are_reported_as_differences() {
    let rows = [
        row(1, None, "30 * * * *", "SELECT 1"),
        row(2, None, "@yearly", "SELECT 1"),
    ];
    let import = import_rows_with(&rows, &options(Some(chrono_tz::Europe::London)));
    assert_eq!(import.jobs.len(), 2);
    assert_eq!(import.jobs[0].job["schedule"]["timezone"], "Europe/London");
    assert_eq!(import.differences.len(), 2, "{:?}", import.differences);
    assert!(import.differences[0]
        .reason
        .contains("pg_cron does not run it"));
    assert!(import.differences[1].reason.contains("never ran"));
    let utc = import_rows_with(&rows[..1], &options(None));
    assert!(utc.is_exact());
}

#[test]
fn names_stay_unique_and_the_file_reads_back() {
    let rows = [
        row(1, Some("nightly"), "0 1 * * *", "SELECT 1"),
        row(2, Some("nightly"), "0 2 * * *", "SELECT 2"),
        row(3, Some("!!!"), "0 3 * * *", "SELECT 3"),
    ];
    let import = import_rows(&rows);
    let names: Vec<&str> = import
        .jobs
        .iter()
        .map(|j| j.job["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["nightly", "nightly-2", "pg-cron-3"]);
    let doc: Value = serde_yaml::from_str(&import.to_yaml("cron.job")).unwrap();
    assert_eq!(doc["jobs"][1], import.jobs[1].job);
}

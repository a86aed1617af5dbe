use super::*;
use crate::MAX_INPUT_BYTES;

fn translate(timer: &str, service: Option<&str>, unit: &str) -> Result<Import, ImportError> {
    super::import(timer, service, unit)
}

const SERVICE: &str = "[Unit]\n\
                       Description=Nightly backup\n\
                       [Service]\n\
                       Type=oneshot\n\
                       ExecStart=/usr/bin/backup --all\n";

fn reasons(import: &Import) -> Vec<String> {
    import
        .untranslated
        .iter()
        .map(|u| format!("{}: {} -- {}", u.line, u.text, u.reason))
        .collect()
}

fn has(import: &Import, line: usize, needle: &str) -> bool {
    import
        .untranslated
        .iter()
        .any(|u| u.line == line && (u.reason.contains(needle) || u.text.contains(needle)))
}

#[test]
fn a_calendar_timer_and_its_service_become_one_job() {
    let timer = "[Unit]\n\
                 Description=Run the backup\n\
                 [Timer]\n\
                 OnCalendar=Mon..Fri *-*-* 09:00 Europe/Berlin\n\
                 Persistent=true\n\
                 RandomizedDelaySec=5min\n\
                 AccuracySec=1s\n\
                 [Install]\n\
                 WantedBy=timers.target\n";
    let import = translate(timer, Some(SERVICE), "backup.timer").unwrap();
    assert_eq!(import.jobs.len(), 1, "{:?}", reasons(&import));
    let job = &import.jobs[0];
    assert_eq!(
        job.job,
        json!({
            "name": "backup",
            "description": "Nightly backup",
            "schedule": {"cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin", "jitter": "5m"},
            "target": {"shell": {"command": "/usr/bin/backup --all"}},
            "misfire": {"policy": "run_once"},
            "overlap": "skip",
        })
    );
    assert_eq!(job.line, 4);
    assert!(job.comments.iter().any(|c| c.contains("AccuracySec=1s")));
    assert!(job.comments.iter().any(|c| c.contains("jitter")));
    assert!(import.untranslated.is_empty(), "{:?}", reasons(&import));
}

#[test]
fn without_persistent_a_missed_instant_is_skipped_and_a_missing_zone_is_reported() {
    let import = translate("[Timer]\nOnCalendar=daily\n", Some(SERVICE), "backup.timer").unwrap();
    let job = &import.jobs[0].job;
    assert_eq!(job["misfire"], json!({"policy": "skip"}));
    assert_eq!(job["schedule"], json!({"cron": "0 0 * * *"}));
    assert!(has(&import, 2, "local zone"), "{:?}", reasons(&import));
}

#[test]
fn several_calendar_lines_become_numbered_jobs_and_an_empty_one_resets() {
    let timer = "[Timer]\n\
                 OnCalendar=hourly\n\
                 OnCalendar=\n\
                 OnCalendar=*-*-* 06:00 UTC\n\
                 OnCalendar=Sat,Sun 10:30 UTC\n";
    let import = translate(timer, Some(SERVICE), "backup.timer").unwrap();
    let names: Vec<_> = import.jobs.iter().map(|j| j.job["name"].clone()).collect();
    assert_eq!(names, [json!("backup-1"), json!("backup-2")]);
    assert_eq!(import.jobs[0].job["schedule"]["cron"], json!("0 6 * * *"));
    assert_eq!(
        import.jobs[1].job["schedule"]["cron"],
        json!("30 10 * * SAT,SUN")
    );
    assert_eq!(import.jobs[1].line, 5);
    assert!(import.jobs[0].comments.iter().any(|c| c.contains("union")));
    assert!(import.untranslated.is_empty(), "{:?}", reasons(&import));
}

#[test]
fn unit_active_sec_alone_is_every_and_boot_relative_triggers_are_reported() {
    let timer = "[Timer]\nOnBootSec=15min\nOnUnitActiveSec=1h 30min\nRandomizedDelaySec=2h\n";
    let import = translate(timer, Some(SERVICE), "sync.timer").unwrap();
    assert_eq!(import.jobs.len(), 1, "{:?}", reasons(&import));
    let job = &import.jobs[0];
    assert_eq!(job.job["schedule"], json!({"every": "1h30m"}));
    assert!(job.comments.iter().any(|c| c.contains("fixed grid")));
    assert!(has(&import, 2, "boot"), "{:?}", reasons(&import));
    assert!(has(&import, 4, "at most 1h"), "{:?}", reasons(&import));

    let both = "[Timer]\nOnCalendar=daily UTC\nOnUnitActiveSec=1h\nOnUnitInactiveSec=5min\n";
    let import = translate(both, Some(SERVICE), "sync.timer").unwrap();
    assert_eq!(import.jobs.len(), 1);
    assert!(has(&import, 3, "last start"), "{:?}", reasons(&import));
    assert!(has(&import, 4, "finished"), "{:?}", reasons(&import));
}

#[test]
fn wake_system_and_unknown_settings_are_reported_with_their_line() {
    let timer = "[Unit]\nAfter=network.target\n[Timer]\nOnCalendar=daily UTC\nWakeSystem=yes\n\
                 OnClockChange=true\nFrobnicate=3\n";
    let import = translate(timer, Some(SERVICE), "backup.timer").unwrap();
    assert_eq!(import.jobs.len(), 1);
    assert!(has(&import, 2, "After=network.target"));
    assert!(has(&import, 5, "wake"));
    assert!(has(&import, 6, "clock"));
    assert!(has(&import, 7, "Frobnicate=3"));
}

#[test]
fn calendar_syntax_sked_cannot_hold_is_reported_not_approximated() {
    let timer = "[Timer]\n\
                 OnCalendar=Fri *-*-13 UTC\n\
                 OnCalendar=*:*:0.5/1.5 UTC\n\
                 OnCalendar=every tuesday\n\
                 OnCalendar=*-02-30 UTC\n\
                 OnCalendar=Mon *-*-1..7 12:00 UTC\n";
    let import = translate(timer, Some(SERVICE), "odd.timer").unwrap();
    assert!(has(&import, 2, "whole weeks"), "{:?}", reasons(&import));
    assert!(has(&import, 3, "fraction"));
    assert!(has(&import, 4, "weekday"));
    assert!(has(&import, 5, "sked refuses"), "{:?}", reasons(&import));
    assert_eq!(import.jobs.len(), 1);
    assert_eq!(
        import.jobs[0].job["schedule"]["cron"],
        json!("0 12 * * MON#1")
    );
    assert_eq!(import.jobs[0].job["name"], json!("odd-5"));
}

#[test]
fn the_dst_difference_is_reported_on_the_job_and_in_the_report() {
    let timer = "[Timer]\nOnCalendar=*-*-* 02:30 Europe/Berlin\n";
    let import = translate(timer, Some(SERVICE), "backup.timer").unwrap();
    assert_eq!(import.jobs.len(), 1);
    assert!(has(&import, 2, "DST"), "{:?}", reasons(&import));
    assert!(import.jobs[0].comments.iter().any(|c| c.starts_with("DST")));
}

#[test]
fn the_service_becomes_the_shell_target() {
    let service = "[Unit]\n\
                   Description=Dump the database\n\
                   [Service]\n\
                   Type=oneshot\n\
                   User=postgres\n\
                   Group=backup\n\
                   WorkingDirectory=/var/lib/%N\n\
                   Environment=PGHOST=db \"PGOPTIONS=-c statement_timeout=0\"\n\
                   Environment=OUT=/backups\n\
                   ExecStartPre=-/usr/bin/mkdir -p ${OUT}\n\
                   ExecStart=/usr/bin/pg_dumpall -f \"${OUT}/all %i.sql\"\n\
                   ExecStart=/usr/bin/gzip -f ${OUT}/all.sql\n\
                   TimeoutStartSec=2h\n\
                   MemoryMax=512M\n\
                   CPUQuota=150%\n\
                   TasksMax=64\n";
    let import = translate(
        "[Timer]\nOnCalendar=daily UTC\n",
        Some(service),
        "pgdump@main.timer",
    )
    .unwrap();
    assert_eq!(import.jobs.len(), 1, "{:?}", reasons(&import));
    let job = &import.jobs[0].job;
    assert_eq!(job["name"], json!("pgdump-main"));
    assert_eq!(job["description"], json!("Dump the database"));
    assert_eq!(job["timeout"], json!("2h"));
    assert_eq!(
        job["target"]["shell"],
        json!({
            "command": "{ /usr/bin/mkdir -p \"${OUT}\" || true; } && \
                        /usr/bin/pg_dumpall -f \"${OUT}/all main.sql\" && \
                        /usr/bin/gzip -f \"${OUT}/all.sql\"",
            "env": {"PGHOST": "db", "PGOPTIONS": "-c statement_timeout=0", "OUT": "/backups"},
            "cwd": "/var/lib/pgdump@main",
            "run_as": {"user": "postgres", "group": "backup"},
            "limits": {"memory": "512MiB", "cpus": 1.5, "pids": 64},
        })
    );
    assert!(import.untranslated.is_empty(), "{:?}", reasons(&import));
    assert!(import.jobs[0].comments.iter().any(|c| c.contains("&&")));
}

#[test]
fn what_the_service_cannot_carry_is_reported() {
    let service = "[Service]\n\
                   Type=simple\n\
                   User=root\n\
                   EnvironmentFile=/etc/default/backup\n\
                   ExecStart=/usr/bin/backup --home %h\n\
                   ExecStart=/usr/bin/other\n\
                   RuntimeMaxSec=30d\n\
                   MemoryMax=20%\n\
                   Nice=10\n";
    let import = translate(
        "[Timer]\nOnCalendar=daily UTC\n",
        Some(service),
        "backup.timer",
    )
    .unwrap();
    assert_eq!(import.jobs.len(), 1, "{:?}", reasons(&import));
    let shell = &import.jobs[0].job["target"]["shell"];
    assert_eq!(shell, &json!({"command": "/usr/bin/backup --home %h"}));
    assert!(has(&import, 3, "root"), "{:?}", reasons(&import));
    assert!(has(&import, 4, "EnvironmentFile"));
    assert!(has(&import, 5, "%h"));
    assert!(has(&import, 6, "oneshot"));
    assert!(has(&import, 7, "at most"));
    assert!(has(&import, 8, "share"));
    assert!(has(&import, 9, "Nice=10"));
    assert!(import.jobs[0]
        .comments
        .iter()
        .any(|c| c.contains("CHECK: %h")));
}

#[test]
fn without_the_service_no_job_is_written_and_the_report_says_why() {
    let timer = "[Timer]\nOnCalendar=daily UTC\nUnit=db-dump.service\n";
    let import = translate(timer, None, "backup.timer").unwrap();
    assert!(import.jobs.is_empty());
    assert!(has(&import, 3, "db-dump.service"), "{:?}", reasons(&import));
    let import = translate("[Timer]\nOnCalendar=daily UTC\n", None, "backup.timer").unwrap();
    assert!(has(&import, 0, "backup.service"));
    let no_command = translate(
        "[Timer]\nOnCalendar=daily UTC\n",
        Some("[Service]\n"),
        "b.timer",
    );
    assert!(has(&no_command.unwrap(), 0, "ExecStart"));
}

#[test]
fn a_timer_without_any_trigger_is_reported() {
    let import = translate("[Timer]\nPersistent=true\n", Some(SERVICE), "backup.timer").unwrap();
    assert!(import.jobs.is_empty());
    assert!(has(&import, 0, "no OnCalendar="), "{:?}", reasons(&import));
}

#[test]
fn input_that_is_not_a_unit_file_is_an_error_and_nothing_is_imported() {
    assert!(matches!(
        translate("[Timer]\nOnCalendar daily\n", Some(SERVICE), "b.timer"),
        Err(ImportError::Syntax { line: 2, message }) if message.contains("b.timer")
    ));
    assert!(matches!(
        translate("[Timer]\nOnCalendar=daily\n", Some("[Service]\nExecStart\n"), "b.timer"),
        Err(ImportError::Syntax { line: 2, message }) if message.contains("b.service")
    ));
    assert_eq!(
        translate("[Timer]\nOnCalendar=daily\0\n", Some(SERVICE), "b.timer"),
        Err(ImportError::NotText { line: 2 })
    );
    let huge = format!("[Timer]\n{}", "#".repeat(MAX_INPUT_BYTES));
    assert!(matches!(
        translate(&huge, Some(SERVICE), "b.timer"),
        Err(ImportError::TooLarge(_))
    ));
    assert!(matches!(
        translate("[Timer]\nOnCalendar=daily\n", Some(&huge), "b.timer"),
        Err(ImportError::TooLarge(_))
    ));
}

#[test]
fn the_file_written_reads_back_as_the_jobs() {
    let import = translate(
        "[Timer]\nOnCalendar=*-*-01 00:00:00 UTC\n",
        Some(SERVICE),
        "backup.timer",
    )
    .unwrap();
    let yaml = import.to_yaml("backup.timer");
    let doc: Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(doc["jobs"][0], import.jobs[0].job);
    assert!(yaml.contains("# from line 2"), "{yaml}");
}

#[test]
fn a_zoneless_calendar_is_read_in_the_machine_zone_when_given() {
    let timer = "[Timer]\nOnCalendar=*-*-* 02:30\n";
    let utc = translate(timer, Some(SERVICE), "backup.timer").unwrap();
    assert!(has(&utc, 2, "no time zone"), "{:?}", reasons(&utc));
    assert!(utc.jobs[0].job["schedule"].get("timezone").is_none());

    let zone: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
    let berlin = super::import_in(timer, Some(SERVICE), "backup.timer", Some(zone)).unwrap();
    assert!(!has(&berlin, 2, "no time zone"), "{:?}", reasons(&berlin));
    assert_eq!(berlin.jobs[0].job["schedule"]["timezone"], "Europe/Berlin");
    assert_eq!(
        berlin.jobs[0].job["schedule"]["cron"],
        utc.jobs[0].job["schedule"]["cron"]
    );
    // 02:30 falls in Berlin's spring-forward gap: the difference is reported as for a suffix.
    let suffixed = translate(
        "[Timer]\nOnCalendar=*-*-* 02:30 Europe/Berlin\n",
        Some(SERVICE),
        "backup.timer",
    )
    .unwrap();
    let why = |import: &Import| -> Vec<String> {
        import
            .untranslated
            .iter()
            .map(|u| u.reason.clone())
            .collect()
    };
    assert_eq!(why(&berlin), why(&suffixed));
    assert!(
        why(&berlin)[0].starts_with("DST: in Europe/Berlin"),
        "{:?}",
        why(&berlin)
    );
    // The report quotes the line as the timer wrote it.
    assert!(has(&berlin, 2, "OnCalendar=*-*-* 02:30"));
}

use super::*;
use crate::MAX_INPUT_BYTES;

fn at(s: &str) -> Instant {
    s.parse().unwrap()
}

fn read(text: &str) -> Import {
    import_with(
        text,
        &Options {
            as_of: Some(at("2026-01-01T00:00:00Z")),
            ..Options::default()
        },
    )
    .unwrap()
}

fn system(text: &str) -> Import {
    import_with(
        text,
        &Options {
            format: Some(Format::System),
            as_of: Some(at("2026-01-01T00:00:00Z")),
            ..Options::default()
        },
    )
    .unwrap()
}

#[test]
fn a_user_crontab_keeps_comments_names_and_the_schedule() {
    let import = read(
        "# m h dom mon dow command\n\
         \n\
         # nightly backup\n\
         # of the database\n\
         30 2 * * 1-5 /usr/local/bin/backup.sh --full /srv/db > /dev/null 2>&1\n\
         */15 * * * * /usr/local/bin/backup.sh /srv/www\n\
         0 9 * JAN,jul MON-FRI cd /srv && ./report weekly\n",
    );
    assert!(import.untranslated.is_empty(), "{:?}", import.untranslated);
    let names: Vec<&str> = import
        .jobs
        .iter()
        .map(|j| j.job["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["backup.sh-db", "backup.sh-www", "report-weekly"],
        "derived from the command, unique"
    );
    let first = &import.jobs[0];
    assert_eq!(first.line, 5);
    assert_eq!(first.comments[..2], ["nightly backup", "of the database"]);
    assert_eq!(first.job["schedule"]["cron"], "30 2 * * 1-5");
    assert_eq!(first.job["schedule"].get("timezone"), None);
    assert!(first.comments[2].contains("host's time zone"));
    assert_eq!(
        first.job["target"]["shell"]["command"],
        "/usr/local/bin/backup.sh --full /srv/db > /dev/null 2>&1"
    );
    assert_eq!(
        import.jobs[2].job["schedule"]["cron"],
        "0 9 * JAN,jul MON-FRI"
    );
    // The file reads back as the same jobs.
    let doc: Value = serde_yaml::from_str(&import.to_yaml("crontab")).unwrap();
    assert_eq!(doc["jobs"][0], first.job);
}

#[test]
fn the_same_command_twice_gets_two_names_and_names_are_stable() {
    let text = "0 1 * * * backup\n0 2 * * * backup\n0 3 * * * backup\n";
    let names = |i: &Import| -> Vec<String> {
        i.jobs
            .iter()
            .map(|j| j.job["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&read(text)), ["backup", "backup-2", "backup-3"]);
    assert_eq!(names(&read(text)), names(&read(text)));
    // A command with no word a name can hold is named after its line.
    assert_eq!(names(&read("0 1 * * * >/tmp/x\n"))[0], "x");
    assert_eq!(names(&read("0 1 * * * ***\n"))[0], "cron-line-1");
}

#[test]
fn every_macro_is_kept_and_reboot_is_reported_with_its_line() {
    let import = read(
        "@daily a\n@hourly b\n@weekly c\n@monthly d\n@yearly e\n@annually f\n@midnight g\n\
         @reboot /usr/bin/start-things\n",
    );
    let crons: Vec<&str> = import
        .jobs
        .iter()
        .map(|j| j.job["schedule"]["cron"].as_str().unwrap())
        .collect();
    assert_eq!(
        crons,
        [
            "@daily",
            "@hourly",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "@midnight"
        ]
    );
    assert_eq!(import.untranslated.len(), 1);
    assert_eq!(import.untranslated[0].line, 8);
    assert_eq!(import.untranslated[0].text, "@reboot /usr/bin/start-things");
    assert!(import.untranslated[0].reason.contains("@reboot"));
}

#[test]
fn cron_tz_sets_the_zone_of_the_entries_below_and_a_bad_zone_is_reported() {
    let import = read(
        "0 1 * * * a\n\
         CRON_TZ=Europe/Paris\n\
         0 2 * * * b\n\
         TZ=America/New_York\n\
         0 3 * * * c\n\
         CRON_TZ=Mars/Olympus\n\
         0 4 * * * d\n",
    );
    let zones: Vec<Option<&str>> = import
        .jobs
        .iter()
        .map(|j| j.job["schedule"]["timezone"].as_str())
        .collect();
    assert_eq!(
        zones,
        [None, Some("Europe/Paris"), Some("America/New_York")]
    );
    // TZ also reaches the command, as cron gives it.
    assert_eq!(
        import.jobs[2].job["target"]["shell"]["env"]["TZ"],
        "America/New_York"
    );
    assert_eq!(import.jobs[1].job["target"]["shell"].get("env"), None);
    assert_eq!(import.untranslated.len(), 1);
    assert_eq!(import.untranslated[0].line, 7);
    assert!(import.untranslated[0]
        .reason
        .contains("\"Mars/Olympus\" (line 6)"));
}

#[test]
fn a_given_zone_governs_the_entries_no_cron_tz_does() {
    let import = import_with(
        "0 1 * * * a\n",
        &Options {
            timezone: Some(chrono_tz::Europe::Berlin),
            as_of: Some(at("2026-01-01T00:00:00Z")),
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(import.jobs[0].job["schedule"]["timezone"], "Europe/Berlin");
    assert!(import.jobs[0].comments.is_empty());
}

#[test]
fn environment_lines_reach_each_following_job() {
    let import = read(
        "PATH=/usr/local/bin:/usr/bin:/bin\n\
         0 1 * * * a\n\
         GREETING = \"hello world\"\n\
         EMPTY=''\n\
         0 2 * * * b\n",
    );
    let env = |i: usize| import.jobs[i].job["target"]["shell"]["env"].clone();
    assert_eq!(env(0), json!({"PATH": "/usr/local/bin:/usr/bin:/bin"}));
    assert_eq!(
        env(1),
        json!({"PATH": "/usr/local/bin:/usr/bin:/bin", "GREETING": "hello world", "EMPTY": ""})
    );
}

#[test]
fn mailto_becomes_an_email_rule_said_to_need_the_relay() {
    let import = read(
        "0 1 * * * a\n\
         MAILTO=ops@example.com,dba@example.com\n\
         0 2 * * * b\n\
         MAILTO=\"\"\n\
         0 3 * * * c\n\
         MAILTO=root\n\
         0 4 * * * d\n",
    );
    assert_eq!(
        import.jobs[0].job.get("notify"),
        None,
        "the namespace's default"
    );
    assert_eq!(
        import.jobs[1].job["notify"],
        json!([{"on": ["failed", "timed_out"],
                "email": {"to": ["ops@example.com", "dba@example.com"]}}])
    );
    assert!(import.jobs[1]
        .comments
        .iter()
        .any(|c| c.contains("SMTP relay")));
    assert_eq!(
        import.jobs[2].job["notify"],
        json!([]),
        "MAILTO=\"\" sends nothing"
    );
    assert_eq!(import.jobs[3].job.get("notify"), None);
    assert!(import.jobs[3]
        .comments
        .iter()
        .any(|c| c.contains("\"root\" on the host")));
}

#[test]
fn percent_ends_the_command_and_the_rest_is_its_standard_input() {
    assert_eq!(
        split_percent("date +\\%Y-\\%m"),
        ("date +%Y-%m".into(), None)
    );
    assert_eq!(
        split_percent("mail -s hi ops%Dear ops,%the job ran: 100\\% done.%"),
        (
            "mail -s hi ops".into(),
            Some("Dear ops,\nthe job ran: 100% done.\n".into())
        )
    );
    let import = read("0 1 * * * mail -s hi ops%line one%line two\n");
    let command = import.jobs[0].job["target"]["shell"]["command"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        command,
        "{ mail -s hi ops\n} <<'SKED_STDIN'\nline one\nline two\nSKED_STDIN"
    );
    // Run by /bin/sh, the here-document is the command's standard input.
    let out = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(with_stdin("cat; echo end", "a %b\nSKED_STDIN\n$HOME"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "a %b\nSKED_STDIN\n$HOME\nend\n"
    );
}

#[test]
fn another_shell_runs_the_command_as_its_program() {
    let import = read("SHELL=/bin/bash\n0 1 * * * echo {a,b}\n");
    let shell = &import.jobs[0].job["target"]["shell"];
    assert_eq!(shell["command"], "/bin/bash");
    assert_eq!(shell["args"], json!(["-c", "echo {a,b}"]));
}

#[test]
fn a_system_crontab_gives_each_job_its_user() {
    let text = "SHELL=/bin/sh\n\
                PATH=/usr/local/sbin:/usr/local/bin:/sbin:/bin:/usr/sbin:/usr/bin\n\
                17 *\t* * *\troot    cd / && run-parts --report /etc/cron.hourly\n\
                25 6\t* * *\tbackup  /usr/local/bin/dump-db\n\
                @weekly www-data /usr/bin/clean-cache\n";
    assert_eq!(detect_format(text), Format::System);
    let import = system(text);
    assert!(import.untranslated.is_empty(), "{:?}", import.untranslated);
    let names: Vec<&str> = import
        .jobs
        .iter()
        .map(|j| j.job["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["run-parts-cron.hourly", "dump-db", "clean-cache"]);
    let root = &import.jobs[0];
    assert_eq!(root.job["target"]["shell"].get("run_as"), None);
    assert!(root.comments.iter().any(|c| c.contains("as root")));
    assert_eq!(
        root.job["target"]["shell"]["command"],
        "cd / && run-parts --report /etc/cron.hourly"
    );
    assert_eq!(
        import.jobs[1].job["target"]["shell"]["run_as"],
        json!({"user": "backup"})
    );
    assert_eq!(
        import.jobs[2].job["target"]["shell"]["run_as"],
        json!({"user": "www-data"})
    );
}

#[test]
fn a_user_crontab_is_not_taken_for_a_system_one() {
    assert_eq!(detect_format("0 1 * * * /bin/backup\n"), Format::User);
    assert_eq!(detect_format("0 1 * * * cd /srv && make\n"), Format::User);
    assert_eq!(detect_format("# nothing\n"), Format::User);
}

#[test]
fn both_day_fields_restricted_keep_crons_either_rule() {
    // 13th of the month or any Friday, as in Vixie cron: sked's cron reads it the same way.
    let import = read("0 0 13 * 5 friday-or-13th\n");
    let spec: sked_core::job::JobSpec = serde_json::from_value(import.jobs[0].job.clone()).unwrap();
    let schedule = spec.compiled_schedule(at("2026-01-01T00:00:00Z")).unwrap();
    let first = schedule.first().unwrap();
    let second = schedule.next_after(first, 1).unwrap();
    assert_eq!(first, at("2026-01-02T00:00:00Z"), "a Friday");
    assert_eq!(second, at("2026-01-09T00:00:00Z"));
    let thirteenth = (0..10)
        .scan(first, |t, i| {
            *t = schedule.next_after(*t, i + 1).unwrap();
            Some(*t)
        })
        .any(|t| t == at("2026-01-13T00:00:00Z"));
    assert!(thirteenth, "a Tuesday the 13th");
}

#[test]
fn a_daylight_saving_difference_is_reported_on_a_translated_job() {
    let import = read("CRON_TZ=America/New_York\n30 * * * * poll\n30 2 * * * nightly\n");
    assert_eq!(import.jobs.len(), 2);
    assert_eq!(import.differences.len(), 1, "{:?}", import.differences);
    assert_eq!(import.differences[0].line, 2);
    assert!(import.differences[0].reason.contains("America/New_York"));
    assert!(!import.is_exact());
}

#[test]
fn unknown_syntax_is_an_error_with_its_line() {
    assert_eq!(
        import("0 1 * * * ok\nthis is not cron\n"),
        Err(ImportError::Syntax {
            line: 2,
            message: "expected five time fields then a command: \"this is not cron\"".into()
        })
    );
    match import("0 1 * * * ok\nevery day at noon run-it\n") {
        Err(ImportError::Syntax { line: 2, message }) => {
            assert!(message.contains("every day at noon run-it"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_fields_a_missing_command_and_an_unknown_name_are_errors_with_their_line() {
    let line_of = |text: &str| match import(text) {
        Err(ImportError::Syntax { line, message }) => (line, message),
        other => panic!("{other:?}"),
    };
    let (line, message) = line_of("# x\n61 * * * * x\n");
    assert_eq!(line, 2);
    assert!(message.contains("61"), "{message}");
    assert_eq!(line_of("0 1 * * *\n").0, 1);
    let (line, message) = line_of("\n\n@fortnightly x\n");
    assert_eq!(line, 3);
    assert!(message.contains("@fortnightly"), "{message}");
    assert_eq!(line_of("0 1 * *\n").0, 1);
}

#[test]
fn binary_and_huge_input_is_refused() {
    assert_eq!(
        import("0 1 * * * a\n\0\0\0"),
        Err(ImportError::NotText { line: 2 })
    );
    let huge = "# filler\n".repeat(50 * 1024 * 1024 / 10);
    assert!(huge.len() > MAX_INPUT_BYTES);
    assert_eq!(import(&huge), Err(ImportError::TooLarge(huge.len())));
}

#[test]
fn a_long_crontab_in_one_zone_imports_quickly() {
    let mut text = String::from("CRON_TZ=America/New_York\n");
    for i in 0..2000 {
        text.push_str(&format!(
            "{} {} * * * /usr/local/bin/task-{i}\n",
            i % 60,
            i % 24
        ));
    }
    let started = std::time::Instant::now();
    let import = read(&text);
    assert_eq!(import.jobs.len(), 2000);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

use super::*;
use serde_json::json;

fn at(s: &str) -> Instant {
    s.parse().unwrap()
}

fn options() -> Options {
    Options {
        connection: "celery".to_string(),
        as_of: Some(at("2026-01-01T00:00:00Z")),
    }
}

fn fields(f: [&str; 5]) -> Fields {
    parse_crontab(&f.map(str::to_string)).unwrap()
}

fn export(timezone: Option<&str>, entries: &[Value]) -> String {
    let mut text = format!(
        "{{\"format\": \"{EXPORT_FORMAT}\", \"timezone\": {}, \"enable_utc\": true, \"entries\": [\n",
        json!(timezone)
    );
    let lines: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
    text.push_str(&lines.join(",\n"));
    text.push_str("\n]}\n");
    text
}

fn crontab(m: &str, h: &str, dow: &str, dom: &str, moy: &str) -> Value {
    json!({"type": "crontab", "minute": m, "hour": h, "day_of_week": dow,
           "day_of_month": dom, "month_of_year": moy})
}

#[test]
fn celery_fields_are_read_as_celerys_parser_reads_them() {
    let f = fields(["*/15", "22-2", "fri-mon", "1-7,15-21", "*/3"]);
    assert_eq!(f.minute, BTreeSet::from([0, 15, 30, 45]));
    // Ranges wrap past the end of the field.
    assert_eq!(f.hour, BTreeSet::from([22, 23, 0, 1, 2]));
    assert_eq!(f.day_of_week, BTreeSet::from([5, 6, 0, 1]));
    assert_eq!(f.month_of_year, BTreeSet::from([1, 4, 7, 10]));
    // Names by their first three letters; month names are tried first, anywhere.
    assert_eq!(
        fields(["0", "0", "Sunday", "*", "*"]).day_of_week,
        BTreeSet::from([0])
    );
    assert_eq!(
        fields(["0", "0", "*", "*", "march"]).month_of_year,
        BTreeSet::from([3])
    );
    assert_eq!(
        fields(["1-10/3", "0", "*", "*", "*"]).minute,
        BTreeSet::from([1, 4, 7, 10])
    );
    // Celery refuses 7 for Sunday, a bare step, and an empty item.
    for bad in [
        ["0", "0", "7", "*", "*"],
        ["5/15", "0", "*", "*", "*"],
        ["0,", "0", "*", "*", "*"],
        ["0", "24", "*", "*", "*"],
        ["0", "0", "*", "0", "*"],
        ["0", "0", "funday", "*", "*"],
    ] {
        assert!(parse_crontab(&bad.map(str::to_string)).is_err(), "{bad:?}");
    }
}

#[test]
fn sets_become_cron_text_with_celerys_day_rule() {
    let cron = |f: [&str; 5]| cron_of(&fields(f));
    assert_eq!(cron(["*/15", "*", "*", "*", "*"]).unwrap(), "*/15 * * * *");
    assert_eq!(
        cron(["30", "2", "mon-fri", "*", "*"]).unwrap(),
        "30 2 * * 1-5"
    );
    // A full day-of-week written as a range is no restriction: only the days of month count.
    assert_eq!(
        cron(["0", "0", "0-6", "1,15", "*"]).unwrap(),
        "0 0 1,15 * *"
    );
    assert_eq!(
        cron(["5-59/10", "1,2", "*", "*", "*"]).unwrap(),
        "5-59/10 1,2 * * *"
    );
    // Both restricted: whole weeks become n-th weekdays (first and third Monday).
    assert_eq!(
        cron(["0", "9", "1", "1-7,15-21", "*"]).unwrap(),
        "0 9 * * 1#1,1#3"
    );
    assert_eq!(
        cron(["0", "9", "sat,sun", "29-31", "*"]).unwrap(),
        "0 9 * * 0#5,6#5"
    );
    // Friday the 13th cannot be one sked cron expression.
    let err = cron(["0", "0", "fri", "13", "*"]).unwrap_err();
    assert!(err.contains("both day_of_month and day_of_week"), "{err}");
}

#[test]
fn the_export_translates_into_celery_target_jobs_with_their_lines() {
    let text = export(
        Some("Europe/Berlin"),
        &[
            json!({"name": "Add every 30s", "task": "proj.add", "args": [16, 16], "kwargs": {},
                   "options": {}, "schedule": {"type": "interval", "seconds": 30.0, "relative": false}}),
            json!({"name": "nightly report", "task": "proj.report", "args": [],
                   "kwargs": {"kind": "daily"},
                   "options": {"queue": "reports", "priority": 5, "expires": 600,
                               "routing_key": "r", "exchange": "ex", "others": ["countdown"]},
                   "schedule": crontab("0", "4", "mon-fri", "*", "*")}),
            json!({"name": "sunset", "task": "proj.s", "schedule":
                   {"type": "solar", "event": "sunset", "lat": 51.5, "lon": -0.1}}),
            json!({"name": "rel", "task": "proj.h", "schedule":
                   {"type": "interval", "seconds": 3600.0, "relative": true}}),
        ],
    );
    let import = import_json_with(&text, &options()).unwrap();
    assert_eq!(import.jobs.len(), 2, "{import:?}");
    let add = &import.jobs[0];
    assert_eq!(add.line, 2);
    assert_eq!(add.job["name"], "add-every-30s");
    assert_eq!(
        add.job["description"],
        "Celery beat entry \"Add every 30s\""
    );
    assert_eq!(add.job["schedule"], json!({"every": "30s"}));
    assert_eq!(
        add.job["target"],
        json!({"celery": {"connection": "celery", "task": "proj.add", "args": [16, 16]}})
    );
    let report = &import.jobs[1];
    assert_eq!(report.line, 3);
    assert_eq!(
        report.job["schedule"],
        json!({"cron": "0 4 * * 1-5", "timezone": "Europe/Berlin"})
    );
    assert_eq!(
        report.job["target"]["celery"],
        json!({"connection": "celery", "task": "proj.report", "kwargs": {"kind": "daily"},
               "queue": "reports", "exchange": "ex", "routing_key": "r", "priority": 5,
               "expires": "600s"})
    );
    assert_eq!(import.untranslated.len(), 2);
    assert_eq!(import.untranslated[0].line, 4);
    assert!(import.untranslated[0].reason.contains("sunrise or sunset"));
    assert_eq!(import.untranslated[1].line, 5);
    assert!(import.untranslated[1].reason.contains("relative=True"));
    // countdown is not carried; 04:00 in Berlin never meets a change of clocks.
    assert_eq!(import.differences.len(), 1, "{:?}", import.differences);
    assert!(import.differences[0].reason.contains("countdown"));
    let doc: Value = serde_yaml::from_str(&import.to_yaml("beat.json")).unwrap();
    assert_eq!(doc["jobs"][1], report.job);
}

#[test]
fn a_skipped_local_time_is_reported_where_celery_and_sked_part() {
    let text = export(
        Some("Europe/London"),
        &[
            json!({"name": "gap", "task": "t", "schedule": crontab("30", "1", "*", "*", "*")}),
            json!({"name": "quarterly", "task": "t", "schedule": crontab("*/15", "*", "*", "*", "*")}),
            json!({"name": "noon", "task": "t", "schedule": crontab("0", "12", "*", "*", "*")}),
        ],
    );
    let import = import_json_with(&text, &options()).unwrap();
    assert_eq!(import.jobs.len(), 3);
    assert_eq!(import.differences.len(), 1, "{:?}", import.differences);
    let why = &import.differences[0].reason;
    assert_eq!(import.differences[0].line, 2);
    assert!(
        why.contains("clocks skip 01:00:00 to 02:00:00 on 2026-03-29"),
        "{why}"
    );
    assert!(why.contains("02:30 BST"), "{why}");
    // The model: a skipped 01:30 takes the offset from before the change.
    let expr = CronExpr::parse("30 1 * * *").unwrap();
    let london = chrono_tz::Europe::London;
    assert_eq!(
        celery_next(&expr, london, at("2026-03-28T12:00:00Z")),
        Some(at("2026-03-29T01:30:00Z"))
    );
    assert_eq!(
        expr.next_after(at("2026-03-28T12:00:00Z"), london),
        Some(at("2026-03-29T01:00:00Z"))
    );
}

#[test]
fn bad_input_is_refused_with_its_line_or_reported_by_entry() {
    let err = import_json("{\"entries\": [\n{\"name\": 1,\n]}", "celery").unwrap_err();
    assert!(
        matches!(err, ImportError::Syntax { line: 3, .. }),
        "{err:?}"
    );
    let err = import_json("[1, 2]", "celery").unwrap_err();
    assert!(
        matches!(err, ImportError::Syntax { line: 1, .. }),
        "{err:?}"
    );
    assert_eq!(
        import_json("{}\n\0", "celery").unwrap_err(),
        ImportError::NotText { line: 2 }
    );
    let big = format!(
        "{{\"entries\": [], \"pad\": \"{}\"}}",
        "x".repeat(crate::MAX_INPUT_BYTES)
    );
    assert!(matches!(
        import_json(&big, "celery"),
        Err(ImportError::TooLarge(_))
    ));
    let text = export(
        None,
        &[
            json!({"name": "no task", "schedule": crontab("0", "0", "*", "*", "*")}),
            json!({"name": "bad field", "task": "t", "schedule": crontab("0", "0", "7", "*", "*")}),
            json!({"name": "failed", "error": "args are not JSON (object)"}),
            json!({"name": "odd", "task": "t", "schedule": {"type": "unknown", "class": "MySchedule"}}),
            json!({"name": "args", "task": "t", "args": {"a": 1}, "schedule": crontab("0", "0", "*", "*", "*")}),
        ],
    );
    let import = import_json_with(&text, &options()).unwrap();
    assert!(import.jobs.is_empty());
    let lines: Vec<usize> = import.untranslated.iter().map(|u| u.line).collect();
    assert_eq!(lines, [2, 3, 4, 5, 6]);
    assert!(import.untranslated[0]
        .text
        .starts_with("entry 1 \"no task\""));
    assert!(
        import.untranslated[1].reason.contains("above 6"),
        "{:?}",
        import.untranslated[1]
    );
}

#[test]
fn django_rows_translate_with_their_zone_state_and_kind() {
    let base = DjangoBeatTask {
        id: 1,
        name: "cleanup".into(),
        task: "proj.cleanup".into(),
        args: "[1, \"a\"]".into(),
        kwargs: "{\"x\": true}".into(),
        queue: Some("q".into()),
        enabled: true,
        ..Default::default()
    };
    let rows = [
        DjangoBeatTask {
            crontab: Some(DjangoCrontab {
                minute: "0".into(),
                hour: "3".into(),
                day_of_week: "*".into(),
                day_of_month: "*".into(),
                month_of_year: "*".into(),
                timezone: "Asia/Tokyo".into(),
            }),
            ..base.clone()
        },
        DjangoBeatTask {
            id: 2,
            name: "every 5 minutes".into(),
            enabled: false,
            expire_seconds: Some(60),
            interval: Some(DjangoInterval {
                every: 5,
                period: "minutes".into(),
            }),
            ..base.clone()
        },
        DjangoBeatTask {
            id: 3,
            name: "once".into(),
            one_off: true,
            clocked: Some(at("2027-05-01T10:00:00Z")),
            ..base.clone()
        },
        DjangoBeatTask {
            id: 4,
            name: "dawn".into(),
            solar: Some(DjangoSolar {
                event: "dawn_civil".into(),
                latitude: "1".into(),
                longitude: "2".into(),
            }),
            ..base.clone()
        },
        DjangoBeatTask {
            id: 5,
            name: "broken".into(),
            args: "not json".into(),
            interval: Some(DjangoInterval {
                every: 1,
                period: "hours".into(),
            }),
            ..base.clone()
        },
        DjangoBeatTask {
            id: 6,
            name: "none".into(),
            ..base.clone()
        },
    ];
    let import = import_django_rows_with(&rows, &options());
    assert_eq!(import.jobs.len(), 3, "{import:?}");
    let cron = &import.jobs[0].job;
    assert_eq!(
        cron["schedule"],
        json!({"cron": "0 3 * * *", "timezone": "Asia/Tokyo"})
    );
    assert_eq!(cron["target"]["celery"]["args"], json!([1, "a"]));
    assert_eq!(cron["target"]["celery"]["kwargs"], json!({"x": true}));
    assert_eq!(cron["target"]["celery"]["queue"], "q");
    let every = &import.jobs[1].job;
    assert_eq!(every["schedule"], json!({"every": "300s"}));
    assert_eq!(every["paused"], true);
    assert_eq!(every["target"]["celery"]["expires"], "60s");
    assert!(import.jobs[1]
        .comments
        .iter()
        .any(|c| c.contains("disabled")));
    assert_eq!(
        import.jobs[2].job["schedule"],
        json!({"at": "2027-05-01T10:00:00Z"})
    );
    let reasons: Vec<&str> = import
        .untranslated
        .iter()
        .map(|u| u.text.as_str())
        .collect();
    assert_eq!(
        reasons,
        [
            "periodic task 4 \"dawn\"",
            "periodic task 5 \"broken\"",
            "periodic task 6 \"none\""
        ]
    );
    assert!(import.untranslated[1].reason.contains("not JSON"));
    assert!(import.untranslated[2].reason.contains("0 schedules"));
}

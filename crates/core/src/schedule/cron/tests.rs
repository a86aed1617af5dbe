//! Tests for cron parsing and evaluation: one per syntax feature, exact DST instants, and
//! properties checked against a second-by-second reference scan.

use super::*;
use chrono::SecondsFormat;
use proptest::prelude::*;

fn t(s: &str) -> Instant {
    s.parse().unwrap()
}

fn fmt(i: Instant) -> String {
    i.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The next `n` fire times after `after`, as RFC 3339 strings.
fn fires_in(expr: &str, tz: Tz, after: &str, n: usize) -> Vec<String> {
    let e = CronExpr::parse(expr).unwrap();
    let mut cursor = t(after);
    let mut out = Vec::new();
    for _ in 0..n {
        match e.next_after(cursor, tz) {
            Some(next) => {
                out.push(fmt(next));
                cursor = next;
            }
            None => break,
        }
    }
    out
}

fn fires(expr: &str, after: &str, n: usize) -> Vec<String> {
    fires_in(expr, Tz::UTC, after, n)
}

/// Dates (YYYY-MM-DD) of the next `n` fires in UTC.
fn days(expr: &str, after: &str, n: usize) -> Vec<String> {
    fires(expr, after, n)
        .into_iter()
        .map(|s| s[..10].to_string())
        .collect()
}

fn err(expr: &str) -> String {
    CronExpr::parse(expr).unwrap_err()
}

#[test]
fn five_fields_fire_strictly_after() {
    assert_eq!(
        fires("* * * * *", "2026-01-01T00:00:30Z", 2),
        ["2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"]
    );
    assert_eq!(
        fires("* * * * *", "2026-01-01T00:01:00Z", 1),
        ["2026-01-01T00:02:00Z"]
    );
    assert_eq!(
        fires("30 2 * * *", "2026-01-01T02:30:00Z", 1),
        ["2026-01-02T02:30:00Z"]
    );
}

#[test]
fn six_fields_have_seconds() {
    assert_eq!(
        fires("*/15 * * * * *", "2026-01-01T00:00:00Z", 4),
        [
            "2026-01-01T00:00:15Z",
            "2026-01-01T00:00:30Z",
            "2026-01-01T00:00:45Z",
            "2026-01-01T00:01:00Z"
        ]
    );
    // A fraction of a second past a match does not fire it again.
    assert_eq!(
        fires("* * * * * *", "2026-01-01T00:00:00.500Z", 1),
        ["2026-01-01T00:00:01Z"]
    );
}

#[test]
fn seven_fields_have_a_year() {
    assert_eq!(
        fires("0 0 0 1 1 * 2030", "2026-05-01T00:00:00Z", 2),
        ["2030-01-01T00:00:00Z"]
    );
    assert_eq!(
        days("0 0 0 1 1 * 2028-2034/3", "2026-05-01T00:00:00Z", 5),
        ["2028-01-01", "2031-01-01", "2034-01-01"]
    );
    assert_eq!(
        days("0 0 0 1 1 * 2027,2029", "2026-05-01T00:00:00Z", 5),
        ["2027-01-01", "2029-01-01"]
    );
}

#[test]
fn lists_ranges_and_steps() {
    let minutes: Vec<String> = fires("5,10-12,20-30/5 * * * *", "2026-01-01T00:00:00Z", 8)
        .iter()
        .map(|s| s[14..16].to_string())
        .collect();
    assert_eq!(minutes, ["05", "10", "11", "12", "20", "25", "30", "05"]);
    let minutes: Vec<String> = fires("7/20 * * * *", "2026-01-01T00:00:00Z", 4)
        .iter()
        .map(|s| s[11..16].to_string())
        .collect();
    assert_eq!(minutes, ["00:07", "00:27", "00:47", "01:07"]);
    assert_eq!(
        fires("0 */6 * * *", "2026-01-01T00:00:00Z", 2),
        ["2026-01-01T06:00:00Z", "2026-01-01T12:00:00Z"]
    );
}

#[test]
fn names_are_case_insensitive() {
    let a = CronExpr::parse("0 9 * jan-Mar mon-FRI").unwrap();
    let b = CronExpr::parse("0 9 * 1-3 1-5").unwrap();
    let after = t("2026-01-01T00:00:00Z");
    let mut cursor = after;
    for _ in 0..50 {
        let next = a.next_after(cursor, Tz::UTC).unwrap();
        assert_eq!(Some(next), b.next_after(cursor, Tz::UTC));
        cursor = next;
    }
    assert_eq!(
        days("0 0 * * sat,Sun", "2026-01-01T00:00:00Z", 3),
        ["2026-01-03", "2026-01-04", "2026-01-10"]
    );
}

#[test]
fn sunday_is_zero_and_seven() {
    let sun7 = days("0 0 * * 7", "2026-01-01T00:00:00Z", 3);
    assert_eq!(sun7, days("0 0 * * 0", "2026-01-01T00:00:00Z", 3));
    assert_eq!(sun7, ["2026-01-04", "2026-01-11", "2026-01-18"]);
    assert_eq!(
        days("0 0 * * 5-7", "2026-01-01T00:00:00Z", 4),
        ["2026-01-02", "2026-01-03", "2026-01-04", "2026-01-09"]
    );
}

#[test]
fn question_mark_is_any() {
    assert_eq!(
        days("0 0 ? * MON", "2026-01-01T00:00:00Z", 2),
        ["2026-01-05", "2026-01-12"]
    );
    assert_eq!(
        days("0 0 0 1 * ?", "2026-01-15T00:00:00Z", 2),
        ["2026-02-01", "2026-03-01"]
    );
}

#[test]
fn last_day_of_month() {
    assert_eq!(
        days("0 0 L * *", "2026-01-01T00:00:00Z", 3),
        ["2026-01-31", "2026-02-28", "2026-03-31"]
    );
    assert_eq!(
        days("0 0 L 2 *", "2027-06-01T00:00:00Z", 2),
        ["2028-02-29", "2029-02-28"]
    );
    assert_eq!(
        days("0 0 L-3 * *", "2026-01-01T00:00:00Z", 2),
        ["2026-01-28", "2026-02-25"]
    );
    assert_eq!(
        days("0 0 1,L * *", "2026-01-02T00:00:00Z", 3),
        ["2026-01-31", "2026-02-01", "2026-02-28"]
    );
}

#[test]
fn weekday_forms() {
    // LW: Jan 31 2026 is a Saturday, Feb 28 a Saturday, Mar 31 a Tuesday, May 31 a Sunday.
    assert_eq!(
        days("0 0 LW * *", "2026-01-01T00:00:00Z", 3),
        ["2026-01-30", "2026-02-27", "2026-03-31"]
    );
    assert_eq!(
        days("0 0 LW 5 *", "2026-01-01T00:00:00Z", 1),
        ["2026-05-29"]
    );
    // 15W: Jan 15 is a Thursday, Feb 15 a Sunday, Aug 15 a Saturday.
    assert_eq!(
        days("0 0 15W * *", "2026-01-01T00:00:00Z", 3),
        ["2026-01-15", "2026-02-16", "2026-03-16"]
    );
    assert_eq!(
        days("0 0 15W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-14"]
    );
    // 1W never goes back into the previous month: Aug 1 2026 is a Saturday.
    assert_eq!(
        days("0 0 1W 8 *", "2026-01-01T00:00:00Z", 1),
        ["2026-08-03"]
    );
    // 31W never goes into the next month (May 31 2026 is a Sunday) and skips short months.
    assert_eq!(
        days("0 0 31W * *", "2026-04-01T00:00:00Z", 2),
        ["2026-05-29", "2026-07-31"]
    );
}

#[test]
fn last_and_nth_weekday_of_month() {
    assert_eq!(
        days("0 0 * * 5L", "2026-01-01T00:00:00Z", 3),
        ["2026-01-30", "2026-02-27", "2026-03-27"]
    );
    assert_eq!(
        days("0 0 * * FRI#3", "2026-01-01T00:00:00Z", 2),
        ["2026-01-16", "2026-02-20"]
    );
    assert_eq!(
        days("0 0 * * 1#5", "2026-01-01T00:00:00Z", 4),
        ["2026-03-30", "2026-06-29", "2026-08-31", "2026-11-30"]
    );
    assert_eq!(
        days("0 0 * * 7L", "2026-01-01T00:00:00Z", 1),
        ["2026-01-25"]
    );
}

#[test]
fn both_day_fields_restricted_means_either() {
    // April 2026: Fridays are the 3rd, 10th, 17th, 24th; the 13th is a Monday.
    assert_eq!(
        days("0 0 13 * 5", "2026-04-01T00:00:00Z", 5),
        [
            "2026-04-03",
            "2026-04-10",
            "2026-04-13",
            "2026-04-17",
            "2026-04-24"
        ]
    );
    // A day field starting with `*` counts as unrestricted, as in Vixie cron: both must match.
    assert_eq!(
        days("0 0 */10 * 1", "2026-01-01T00:00:00Z", 4),
        ["2026-05-11", "2026-06-01", "2026-08-31", "2026-09-21"]
    );
    assert_eq!(
        days("0 0 * * 5", "2026-04-01T00:00:00Z", 2),
        ["2026-04-03", "2026-04-10"]
    );
}

#[test]
fn macros_expand() {
    for (mac, fields) in [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@HOURLY", "0 * * * *"),
    ] {
        assert_eq!(
            fires(mac, "2026-03-03T10:10:10Z", 3),
            fires(fields, "2026-03-03T10:10:10Z", 3),
            "{mac}"
        );
        assert_eq!(CronExpr::parse(mac).unwrap().as_str(), mac);
    }
    assert_eq!(
        fires("@weekly", "2026-01-01T00:00:00Z", 1),
        ["2026-01-04T00:00:00Z"]
    );
    assert!(err("@reboot").contains("@reboot is not supported"));
    assert!(err("@fortnightly").contains("unknown macro @fortnightly"));
    assert!(err("@fortnightly").contains("@hourly"));
}

#[test]
fn errors_name_the_field_and_the_problem() {
    let cases = [
        (
            "75 * * * *",
            r#"minute field "75": 75 is out of range 0-59"#,
        ),
        ("* 24 * * *", r#"hour field "24": 24 is out of range 0-23"#),
        (
            "* * 0 * *",
            r#"day-of-month field "0": 0 is out of range 1-31"#,
        ),
        ("* * * 13 *", r#"month field "13": 13 is out of range 1-12"#),
        (
            "* * * * 8",
            r#"day-of-week field "8": 8 is out of range 0-7"#,
        ),
        (
            "60 * * * * *",
            r#"second field "60": 60 is out of range 0-59"#,
        ),
        (
            "0 0 0 1 1 * 1969",
            r#"year field "1969": 1969 is out of range 1970-2199"#,
        ),
        (
            "* * * FOO *",
            r#"month field "FOO": "FOO" is not a number 1-12 or a name JAN-DEC"#,
        ),
        (
            "* * * * MON-FUN",
            r#"day-of-week field "MON-FUN": "FUN" is not a number 0-7 or a name SUN-SAT"#,
        ),
        ("x * * * *", r#"minute field "x": "x" is not a number 0-59"#),
        (
            "5-1 * * * *",
            r#"minute field "5-1": range 5-1 runs backwards; write it as 5-59,0-1"#,
        ),
        (
            "*/0 * * * *",
            r#"minute field "*/0": step /0 must be at least 1"#,
        ),
        (
            "*/61 * * * *",
            r#"minute field "*/61": step /61 is larger than the range 0-59"#,
        ),
        (
            "*/x * * * *",
            r#"minute field "*/x": step /x is not a whole number"#,
        ),
        (
            "1,,2 * * * *",
            r#"minute field "1,,2": a number is missing"#,
        ),
        (
            "? * * * *",
            r#"minute field "?": ? is only allowed in the day-of-month and day-of-week fields"#,
        ),
        ("0 0 * * L", r#"day-of-week field "L": L needs a weekday"#),
        (
            "0 0 * * 5#6",
            r#"day-of-week field "5#6": in 5#6, the week after # must be 1-5"#,
        ),
        (
            "0 0 * * 9L",
            r#"day-of-week field "9L": in 9L, 9 is out of range 0-7"#,
        ),
        (
            "0 0 L-5W * *",
            r#"day-of-month field "L-5W": "L-5W": L-nW is not in the grammar; day-of-month takes L, L-n, LW or nW (e.g. L-3 or 15W)"#,
        ),
        (
            "0 0 L-31 * *",
            r#"day-of-month field "L-31": in L-31, the days before the last day must be 0-30"#,
        ),
        (
            "0 0 32W * *",
            r#"day-of-month field "32W": in 32W, 32 is out of range 1-31"#,
        ),
        (
            "0 0 3#2 * *",
            r#"day-of-month field "3#2": "3#2" is not understood"#,
        ),
        ("* * *", "expected 5, 6 or 7 fields"),
        ("* * * * * * * *", "found 8"),
        ("", "cron expression is empty"),
        ("   ", "cron expression is empty"),
        (
            "0 0 30 2 *",
            r#"day-of-month field "30": day 30 never occurs in month "2""#,
        ),
        ("0 0 31 4,6 *", "day 31 never occurs"),
        ("0 0 0 29 2 * 2100", "the expression never fires"),
    ];
    for (expr, want) in cases {
        let got = err(expr);
        assert!(got.contains(want), "{expr:?}: got {got:?}, want {want:?}");
    }
}

#[test]
fn rare_dates_and_the_year_limit() {
    assert_eq!(
        days("0 0 29 2 *", "2026-01-01T00:00:00Z", 2),
        ["2028-02-29", "2032-02-29"]
    );
    // 2100 is not a leap year.
    assert_eq!(
        days("0 0 29 2 *", "2096-03-01T00:00:00Z", 1),
        ["2104-02-29"]
    );
    assert_eq!(
        fires("0 0 1 1 *", "2199-06-01T00:00:00Z", 1),
        Vec::<String>::new()
    );
    assert_eq!(
        fires("* * * * *", "2300-01-01T00:00:00Z", 1),
        Vec::<String>::new()
    );
    assert_eq!(
        fires("0 0 0 31 12 * 2199", "1970-01-01T00:00:00Z", 2),
        ["2199-12-31T00:00:00Z"]
    );
    assert_eq!(
        fires("0 0 1 1 *", "1960-06-01T00:00:00Z", 1),
        ["1970-01-01T00:00:00Z"]
    );
    // Years all in the past parse (the definition is valid) but never fire again.
    assert_eq!(
        fires("0 0 0 1 1 * 2020", "2026-01-01T00:00:00Z", 1),
        Vec::<String>::new()
    );
}

#[test]
fn search_is_fast_for_sparse_expressions() {
    let started = std::time::Instant::now();
    let sparse = [
        "0 0 29 2 1",
        "0 0 0 29 2 MON 2100-2199",
        "0 0 0 31 12 * 2199",
        "59 59 23 L-28 2 * 2196",
        "0 0 * * 1#5",
    ];
    for expr in sparse {
        let e = CronExpr::parse(expr).unwrap();
        let mut cursor = t("1970-01-01T00:00:00Z");
        for _ in 0..20 {
            match e.next_after(cursor, Tz::UTC) {
                Some(next) => cursor = next,
                None => break,
            }
        }
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

mod dst {
    use super::*;
    use chrono_tz::America::New_York;
    use chrono_tz::Australia::Lord_Howe;
    use chrono_tz::Europe::London;

    #[test]
    fn new_york_gap_fires_when_the_gap_ends() {
        // 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00Z).
        assert_eq!(
            fires_in("30 2 * * *", New_York, "2026-03-07T12:00:00Z", 2),
            ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
        );
        // 02:00, 02:15, 02:30, 02:45 and 03:00 all fire once, at 07:00Z.
        assert_eq!(
            fires_in("*/15 * * * *", New_York, "2026-03-08T06:40:00Z", 4),
            [
                "2026-03-08T06:45:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:15:00Z",
                "2026-03-08T07:30:00Z"
            ]
        );
        assert_eq!(
            fires_in("0 59 1 * * *", New_York, "2026-03-08T06:00:00Z", 1),
            ["2026-03-08T06:59:00Z"]
        );
    }

    #[test]
    fn new_york_repeated_hour_fires_once() {
        // 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:00-02:00 happens twice.
        assert_eq!(
            fires_in("30 1 * * *", New_York, "2026-10-31T12:00:00Z", 2),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
        assert_eq!(
            fires_in("*/30 * * * *", New_York, "2026-11-01T04:00:00Z", 5),
            [
                "2026-11-01T04:30:00Z",
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T07:00:00Z",
                "2026-11-01T07:30:00Z"
            ]
        );
        // From inside the second pass, the rest of the repeated hour already fired.
        assert_eq!(
            fires_in("* * * * *", New_York, "2026-11-01T06:10:00Z", 1),
            ["2026-11-01T07:00:00Z"]
        );
        assert_eq!(
            fires_in("* * * * * *", New_York, "2026-11-01T06:10:00Z", 1),
            ["2026-11-01T07:00:00Z"]
        );
        assert_eq!(
            fires_in("* * * * * *", Lord_Howe, "2026-04-04T15:10:00Z", 1),
            ["2026-04-04T15:30:00Z"]
        );
        // From inside the first pass, the next minute of the first pass.
        assert_eq!(
            fires_in("* * * * *", New_York, "2026-11-01T05:10:00Z", 1),
            ["2026-11-01T05:11:00Z"]
        );
    }

    #[test]
    fn london() {
        // 2026-03-29: 01:00 GMT becomes 02:00 BST (01:00Z).
        assert_eq!(
            fires_in("30 1 * * *", London, "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
        );
        // 2026-10-25: 02:00 BST becomes 01:00 GMT.
        assert_eq!(
            fires_in("30 1 * * *", London, "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
        );
        assert_eq!(
            fires_in("0 0 9 * * MON-FRI", London, "2026-06-01T00:00:00Z", 1),
            ["2026-06-01T08:00:00Z"]
        );
    }

    #[test]
    fn lord_howe_half_hour_shift() {
        // 2026-10-04: 02:00 (+10:30) becomes 02:30 (+11:00) at 15:30Z; 02:00, 02:15 and 02:30
        // collapse into one fire.
        assert_eq!(
            fires_in("0,15,30 2 * * *", Lord_Howe, "2026-10-03T12:00:00Z", 2),
            ["2026-10-03T15:30:00Z", "2026-10-04T15:00:00Z"]
        );
        // 2026-04-05: 02:00 (+11:00) becomes 01:30 (+10:30) at 15:00Z; 01:30-02:00 repeats.
        assert_eq!(
            fires_in("45 1 * * *", Lord_Howe, "2026-04-04T12:00:00Z", 2),
            ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]
        );
        assert_eq!(
            fires_in("*/15 * * * *", Lord_Howe, "2026-04-04T14:00:00Z", 4),
            [
                "2026-04-04T14:15:00Z",
                "2026-04-04T14:30:00Z",
                "2026-04-04T14:45:00Z",
                "2026-04-04T15:30:00Z"
            ]
        );
    }
}

mod properties;

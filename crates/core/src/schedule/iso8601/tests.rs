//! Tests for ISO 8601 repeating intervals: counts, calendar arithmetic, fractions, the start/end
//! form, error messages, and the direct index against a step-by-step walk.

use super::*;
use chrono::{SecondsFormat, TimeZone};
use proptest::prelude::*;

fn t(s: &str) -> Instant {
    s.parse().unwrap()
}

fn fmt(i: Instant) -> String {
    i.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// Up to `limit` instants from the beginning, as `Schedule` asks for them.
fn all(text: &str, limit: usize) -> Vec<String> {
    let r = RepeatingInterval::parse(text).unwrap();
    let mut cursor = t("1900-01-01T00:00:00Z");
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(next) = r.next_after(cursor, out.len() as u64) else {
            break;
        };
        out.push(fmt(next));
        cursor = next;
    }
    out
}

fn err(text: &str) -> String {
    RepeatingInterval::parse(text).unwrap_err()
}

#[test]
fn r2_is_three_instants() {
    assert_eq!(
        all("R2/2022-06-20T14:05:16Z/PT5M", 10),
        [
            "2022-06-20T14:05:16Z",
            "2022-06-20T14:10:16Z",
            "2022-06-20T14:15:16Z"
        ]
    );
    let r = RepeatingInterval::parse("R2/2022-06-20T14:05:16Z/PT5M").unwrap();
    assert_eq!(r.next_after(t("2022-06-20T14:15:16Z"), 3), None);
    assert_eq!(
        r.next_after(t("2022-06-20T14:05:16Z"), 1),
        Some(t("2022-06-20T14:10:16Z"))
    );
    assert_eq!(r.as_str(), "R2/2022-06-20T14:05:16Z/PT5M");
}

#[test]
fn r0_is_once() {
    assert_eq!(
        all("R0/2026-01-01T00:00:00Z/P1D", 10),
        ["2026-01-01T00:00:00Z"]
    );
}

#[test]
fn r_alone_repeats_forever() {
    assert_eq!(all("R/2026-01-01T00:00:00Z/PT1H", 500).len(), 500);
    let r = RepeatingInterval::parse("r/2000-01-01T00:00:00Z/PT1S").unwrap();
    // Far ahead, computed directly rather than by walking from the start.
    assert_eq!(
        r.next_after(t("2150-06-01T12:00:00.5Z"), 0),
        Some(t("2150-06-01T12:00:01Z"))
    );
    assert_eq!(
        r.next_after(t("2026-03-03T03:03:03Z"), 0),
        Some(t("2026-03-03T03:03:04Z"))
    );
}

#[test]
fn instants_before_the_start_wait_for_it() {
    let r = RepeatingInterval::parse("R3/2026-01-01T00:00:00Z/PT10M").unwrap();
    assert_eq!(
        r.next_after(t("2025-01-01T00:00:00Z"), 0),
        Some(t("2026-01-01T00:00:00Z"))
    );
    // Set in the middle of the series: the rest of it is owed, then it ends.
    assert_eq!(
        r.next_after(t("2026-01-01T00:15:00Z"), 0),
        Some(t("2026-01-01T00:20:00Z"))
    );
    assert_eq!(
        r.next_after(t("2026-01-01T00:25:00Z"), 1),
        Some(t("2026-01-01T00:30:00Z"))
    );
    assert_eq!(r.next_after(t("2026-01-01T00:30:00Z"), 2), None);
}

#[test]
fn months_clamp_from_the_start() {
    assert_eq!(
        all("R4/2026-01-31T10:00:00Z/P1M", 10),
        [
            "2026-01-31T10:00:00Z",
            "2026-02-28T10:00:00Z",
            "2026-03-31T10:00:00Z",
            "2026-04-30T10:00:00Z",
            "2026-05-31T10:00:00Z"
        ]
    );
    assert_eq!(
        all("R3/2028-02-29T00:00:00Z/P1Y", 10),
        [
            "2028-02-29T00:00:00Z",
            "2029-02-28T00:00:00Z",
            "2030-02-28T00:00:00Z",
            "2031-02-28T00:00:00Z"
        ]
    );
    assert_eq!(
        all("R2/2026-01-31T00:00:00Z/P1M1DT1H", 10),
        [
            "2026-01-31T00:00:00Z",
            "2026-03-01T01:00:00Z",
            "2026-04-02T02:00:00Z"
        ]
    );
    // Directly far ahead: the 1,000th month after the start.
    let r = RepeatingInterval::parse("R/2026-01-31T00:00:00Z/P1M").unwrap();
    assert_eq!(
        r.next_after(t("2109-04-15T00:00:00Z"), 0),
        Some(t("2109-04-30T00:00:00Z"))
    );
}

#[test]
fn durations() {
    let cases = [
        ("R1/2026-01-01T00:00:00Z/PT0.5S", "2026-01-01T00:00:00.500Z"),
        (
            "R1/2026-01-01T00:00:00Z/PT1,25S",
            "2026-01-01T00:00:01.250Z",
        ),
        ("R1/2026-01-01T00:00:00Z/PT1.5M", "2026-01-01T00:01:30Z"),
        ("R1/2026-01-01T00:00:00Z/PT1H30M", "2026-01-01T01:30:00Z"),
        ("R1/2026-01-01T00:00:00Z/P2W", "2026-01-15T00:00:00Z"),
        ("R1/2026-01-01T00:00:00Z/P1DT12H", "2026-01-02T12:00:00Z"),
        (
            "R1/2026-01-01T00:00:00Z/P1Y2M3DT4H5M6S",
            "2027-03-04T04:05:06Z",
        ),
        ("R1/2026-01-01T00:00:00Z/pt90s", "2026-01-01T00:01:30Z"),
    ];
    for (text, second) in cases {
        assert_eq!(all(text, 5)[1], second, "{text}");
    }
}

#[test]
fn start_formats() {
    let want = ["2022-06-20T14:05:16Z", "2022-06-20T14:10:16Z"];
    for text in [
        "R1/2022-06-20T14:05:16Z/PT5M",
        "R1/2022-06-20T16:05:16+02:00/PT5M",
        "R1/2022-06-20T09:05:16-05:00/PT5M",
        "R1/20220620T140516Z/PT5M",
        "R1/20220620T160516+0200/PT5M",
        "R1/20220620T160516+02/PT5M",
        "R1/2022-06-20t14:05:16z/PT5M",
    ] {
        assert_eq!(all(text, 5), want, "{text}");
    }
    assert_eq!(
        all("R0/2022-06-20T14:05Z/PT5M", 5),
        ["2022-06-20T14:05:00Z"]
    );
    assert_eq!(
        all("R0/20220620T140516.25Z/PT5M", 5),
        ["2022-06-20T14:05:16.250Z"]
    );
}

#[test]
fn start_and_end() {
    assert_eq!(
        all("R2/2026-01-01T00:00:00Z/2026-01-01T00:30:00Z", 10),
        [
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:30:00Z",
            "2026-01-01T01:00:00Z"
        ]
    );
}

#[test]
fn errors_say_what_to_write() {
    let cases = [
        ("", "expected R<n>/<start>/<duration>"),
        (
            "2026-01-01T00:00:00Z/PT5M",
            "expected R<n>/<start>/<duration>",
        ),
        ("X2/2026-01-01T00:00:00Z/PT5M", r#""X2" should be R<n>"#),
        ("R-1/2026-01-01T00:00:00Z/PT5M", r#"repetition count "-1""#),
        ("R1.5/2026-01-01T00:00:00Z/PT5M", "is not a whole number"),
        (
            "R99999999999999999999/2026-01-01T00:00:00Z/PT5M",
            "too large",
        ),
        (
            "R/PT5M/2026-01-01T00:00:00Z",
            "the <duration>/<end> form is not supported",
        ),
        (
            "R/2026-01-01/PT5M",
            r#"start "2026-01-01" needs a date and a time"#,
        ),
        ("R/2026-01-01T00:00:00/PT5M", "has no UTC offset"),
        ("R/2026-13-01T00:00:00Z/PT5M", "is not a valid date-time"),
        ("R/2026-01-01T00:00:00+25:00/PT5M", r#"offset "+25:00""#),
        ("R/2026-01-01T00:00:00Z/PT0S", "is zero"),
        ("R/2026-01-01T00:00:00Z/P0D", "is zero"),
        (
            "R/2026-01-01T00:00:00Z/PT0.01S",
            "shorter than the minimum of 100ms",
        ),
        ("R/2026-01-01T00:00:00Z/P", "no components"),
        ("R/2026-01-01T00:00:00Z/PT", "no components"),
        ("R/2026-01-01T00:00:00Z/P1DT", "nothing follows T"),
        (
            "R/2026-01-01T00:00:00Z/P1H",
            "H belongs after T, as in PT1H",
        ),
        (
            "R/2026-01-01T00:00:00Z/PT1D",
            "D belongs before T, as in P1D",
        ),
        (
            "R/2026-01-01T00:00:00Z/P1.5Y",
            "has a fraction; Y takes whole numbers",
        ),
        (
            "R/2026-01-01T00:00:00Z/PT1.5H30M",
            "only the last component may have a fraction",
        ),
        (
            "R/2026-01-01T00:00:00Z/P1D1Y",
            "Y is repeated or out of order",
        ),
        (
            "R/2026-01-01T00:00:00Z/PT5M5M",
            "M is repeated or out of order",
        ),
        ("R/2026-01-01T00:00:00Z/PT5", "has no unit letter"),
        ("R/2026-01-01T00:00:00Z/PTM", "M has no number before it"),
        ("R/2026-01-01T00:00:00Z/PT5X", "unknown unit 'X' after T"),
        (
            "R/2026-01-01T00:00:00Z/PT1.S",
            "nothing after the decimal mark",
        ),
        (
            "R/2026-01-01T00:00:00Z/2025-01-01T00:00:00Z",
            "must be after the start",
        ),
        ("R/2026-01-01T00:00:00Z/PT5M/extra", "three parts"),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.contains(want), "{text:?}: got {got:?}, want {want:?}");
    }
}

proptest! {
    #[test]
    fn next_is_the_first_instant_after(
        start in 946_684_800i64..1_893_456_000,
        months in 0u32..30,
        secs in 0i64..400_000,
        millis in 0i64..1000,
        reps in prop::option::of(0u64..50),
        probe in 0i64..200_000_000,
    ) {
        prop_assume!(months > 0 || secs > 0);
        let start = Utc.timestamp_opt(start, 0).unwrap();
        let r = RepeatingInterval {
            source: String::new(),
            repetitions: reps,
            start,
            period: Period { months, nanos: secs * NANOS_PER_SEC + millis * 1_000_000 },
        };
        let after = start - Duration::seconds(1000) + Duration::milliseconds(probe);
        let got = r.next_after(after, 0);
        // Walk from the start: the first instant strictly after `after` within the count.
        let mut want = None;
        for k in 0..=reps.unwrap_or(u64::MAX) {
            let at = r.instant(k).unwrap();
            if at > after {
                want = Some(at);
                break;
            }
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn instants_strictly_increase(
        day in 1u32..=31,
        months in 0u32..14,
        secs in 1i64..100_000,
    ) {
        let start = NaiveDateTime::parse_from_str(
            &format!("2026-01-{:02}T07:00:00", day), "%Y-%m-%dT%H:%M:%S").unwrap().and_utc();
        let r = RepeatingInterval {
            source: String::new(),
            repetitions: None,
            start,
            period: Period { months, nanos: secs * NANOS_PER_SEC },
        };
        let mut cursor = start - Duration::seconds(1);
        for _ in 0..60 {
            let next = r.next_after(cursor, 0).unwrap();
            prop_assert!(next > cursor);
            cursor = next;
        }
    }
}

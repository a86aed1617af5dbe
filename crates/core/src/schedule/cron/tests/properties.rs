//! Property tests for cron evaluation: fire times against a second-by-second (or
//! minute-by-minute) scan of UTC instants that applies the DST contract directly, and the bit-set
//! day rules against a one-day-at-a-time reading of their definitions.

use super::*;
use chrono::NaiveDateTime;

/// Whether `t` matches, from the definitions one day at a time: a second implementation of
/// the day rules to check the bit-set one against.
fn reference_matches(e: &CronExpr, t: NaiveDateTime) -> bool {
    let date = t.date();
    let (day, weekday) = (date.day(), date.weekday().num_days_from_sunday());
    let last = (28..=31)
        .rev()
        .find(|d| date.with_day(*d).is_some())
        .unwrap();
    let is_weekday = |d: u32| {
        let w = date.with_day(d).unwrap().weekday().num_days_from_sunday();
        (1..=5).contains(&w)
    };
    let dom = e.dom & (1 << day) != 0
        || e.dom_special.iter().any(|s| match *s {
            DomSpecial::Last { before } => before < last && day == last - before,
            DomSpecial::LastWeekday => {
                (day..=last).rev().find(|d| is_weekday(*d)) == Some(day) && is_weekday(day)
            }
            DomSpecial::NearestWeekday(n) => {
                n <= last
                    && (1..=last)
                        .filter(|d| is_weekday(*d))
                        .min_by_key(|d| d.abs_diff(n))
                        == Some(day)
            }
        });
    let dow = e.dow & (1 << weekday) != 0
        || e.dow_special.iter().any(|s| match *s {
            DowSpecial::Last(w) => w == weekday && day + 7 > last,
            DowSpecial::Nth { weekday: w, n } => w == weekday && day.div_ceil(7) == n,
        });
    let day_ok = if e.dom_any || e.dow_any {
        dom && dow
    } else {
        dom || dow
    };
    day_ok
        && e.seconds & (1 << t.second()) != 0
        && e.minutes & (1 << t.minute()) != 0
        && e.hours & (1 << t.hour()) != 0
        && e.months & (1 << t.month()) != 0
        && e.year_ok(t.year())
}

/// The first instant after `after`, scanning UTC instants `step` seconds apart up to
/// `window` seconds: an instant fires when its wall time matches and is that wall time's
/// first occurrence, or when the clock jumps forward onto it over a matching wall time.
fn brute_next(e: &CronExpr, tz: Tz, after: Instant, step: i64, window: i64) -> Option<Instant> {
    let base = after.timestamp().div_euclid(step) * step;
    let wall = |t: Instant| t.with_timezone(&tz).naive_local();
    let mut k = 1;
    while k * step <= window {
        let t = Utc.timestamp_opt(base + k * step, 0).unwrap();
        k += 1;
        let w = wall(t);
        let first = tz
            .from_local_datetime(&w)
            .earliest()
            .map(|e| e.with_timezone(&Utc));
        if first == Some(t) && reference_matches(e, w) {
            return Some(t);
        }
        let before = wall(t - Duration::seconds(1)) + Duration::seconds(1);
        let mut skipped = before;
        while skipped < w {
            if reference_matches(e, skipped) {
                return Some(t);
            }
            skipped += Duration::seconds(1);
        }
    }
    None
}

fn field(min: u32, max: u32) -> BoxedStrategy<String> {
    let span = max - min + 1;
    prop_oneof![
        3 => Just("*".to_string()),
        2 => (min..=max).prop_map(|v| v.to_string()),
        2 => (min..=max, min..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        2 => (1..=span.min(20)).prop_map(|n| format!("*/{n}")),
        1 => (min..=max, 1..=span).prop_map(|(a, n)| format!("{a}/{n}")),
        1 => (min..=max, min..=max, 1..=span)
            .prop_map(|(a, b, n)| format!("{}-{}/{n}", a.min(b), a.max(b))),
        2 => prop::collection::vec(min..=max, 1..4).prop_map(|v| v
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")),
    ]
    .boxed()
}

fn dom() -> BoxedStrategy<String> {
    prop_oneof![
        6 => Just("*".to_string()),
        4 => field(1, 31),
        1 => Just("?".to_string()),
        1 => Just("L".to_string()),
        1 => (0..=10u32).prop_map(|n| format!("L-{n}")),
        1 => Just("LW".to_string()),
        1 => (1..=31u32).prop_map(|n| format!("{n}W")),
        1 => (1..=31u32).prop_map(|n| format!("{n},L")),
    ]
    .boxed()
}

fn dow() -> BoxedStrategy<String> {
    prop_oneof![
        6 => Just("*".to_string()),
        4 => field(0, 7),
        1 => Just("?".to_string()),
        1 => Just("MON-FRI".to_string()),
        1 => (0..=7u32).prop_map(|w| format!("{w}L")),
        1 => (0..=7u32, 1..=5u32).prop_map(|(w, n)| format!("{w}#{n}")),
    ]
    .boxed()
}

fn month() -> BoxedStrategy<String> {
    prop_oneof![4 => Just("*".to_string()), 1 => field(1, 12)].boxed()
}

/// Minute-resolution expressions (five fields).
fn five_fields() -> impl Strategy<Value = String> {
    (field(0, 59), field(0, 23), dom(), month(), dow())
        .prop_map(|(mi, h, d, mo, w)| format!("{mi} {h} {d} {mo} {w}"))
}

/// Second-resolution expressions over every day, to keep the reference scan short.
fn six_fields_daily() -> impl Strategy<Value = String> {
    (field(0, 59), field(0, 59), field(0, 23)).prop_map(|(s, mi, h)| format!("{s} {mi} {h} * * *"))
}

fn any_expr() -> impl Strategy<Value = String> {
    prop_oneof![
        five_fields(),
        (field(0, 59), five_fields()).prop_map(|(s, rest)| format!("{s} {rest}")),
        (
            field(0, 59),
            five_fields(),
            prop_oneof![Just("*"), Just("2020-2040"), Just("2027,2029-2031")]
        )
            .prop_map(|(s, rest, y)| format!("{s} {rest} {y}")),
    ]
}

/// A zone and a starting instant, most often shortly before one of the zone's DST changes.
fn zoned_start() -> impl Strategy<Value = (Tz, Instant)> {
    use chrono_tz::America::New_York;
    use chrono_tz::Australia::Lord_Howe;
    use chrono_tz::Europe::London;
    let changes = prop::sample::select(vec![
        (New_York, "2026-03-08T07:00:00Z"),
        (New_York, "2026-11-01T06:00:00Z"),
        (London, "2026-03-29T01:00:00Z"),
        (London, "2026-10-25T01:00:00Z"),
        (Lord_Howe, "2026-10-03T15:30:00Z"),
        (Lord_Howe, "2026-04-04T15:00:00Z"),
    ]);
    let tz = prop::sample::select(vec![Tz::UTC, London, New_York, Lord_Howe]);
    let base = prop_oneof![
        3 => (changes, 0..36 * 3600i64)
            .prop_map(|((tz, at), before)| (tz, t(at) - Duration::seconds(before))),
        1 => (tz, 1_577_836_800i64..1_893_456_000)
            .prop_map(|(tz, s)| (tz, Utc.timestamp_opt(s, 0).unwrap())),
    ];
    (base, prop_oneof![Just(0u32), 0..1_000_000_000u32])
        .prop_map(|((tz, b), ns)| (tz, b + Duration::nanoseconds(ns.into())))
}

/// Every fire in `window` seconds after `from`, by `next_after` and by the scan, must agree.
fn agree_over_window(
    expr: &str,
    tz: Tz,
    from: Instant,
    step: i64,
    window: i64,
) -> Result<usize, TestCaseError> {
    let e = CronExpr::parse(expr).unwrap();
    let end = from + Duration::seconds(window);
    let mut cursor = from;
    let mut count = 0;
    loop {
        let got = e.next_after(cursor, tz);
        let left = (end - cursor).num_seconds();
        match brute_next(&e, tz, cursor, step, left) {
            Some(want) => {
                prop_assert_eq!(got, Some(want), "{} in {} after {}", expr, tz, cursor)
            }
            None => {
                prop_assert!(
                    got.filter(|g| *g <= end).is_none(),
                    "{} in {} after {}: {:?} but the scan found nothing",
                    expr,
                    tz,
                    cursor,
                    got
                );
                return Ok(count);
            }
        }
        cursor = got.unwrap();
        count += 1;
    }
}

/// Cases the scans once found against wrong DST handling: starts right at a change.
#[test]
fn scan_agrees_at_the_edges_of_a_change() {
    use chrono_tz::America::New_York;
    use chrono_tz::Australia::Lord_Howe;
    use chrono_tz::Europe::London;
    let cases = [
        ("* 1/1 * * *", New_York, "2026-11-01T05:59:00Z", 60),
        ("* * * * * *", Lord_Howe, "2026-04-04T14:59:59Z", 1),
        ("* * * * *", London, "2026-03-29T00:59:59Z", 60),
        ("* 0-0 * * * *", London, "2026-03-29T00:59:59Z", 1),
        ("0 * * * * *", London, "2026-10-25T00:59:00Z", 1),
    ];
    for (expr, tz, from, step) in cases {
        agree_over_window(expr, tz, t(from), step, 3 * 3600).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn fire_times_strictly_increase(expr in any_expr(), (tz, from) in zoned_start()) {
        let Ok(e) = CronExpr::parse(&expr) else { return Ok(()) };
        let mut cursor = from;
        for _ in 0..40 {
            let Some(next) = e.next_after(cursor, tz) else { break };
            prop_assert!(next > cursor, "{expr}: {next} after {cursor}");
            cursor = next;
        }
    }

    #[test]
    fn minutes_agree_with_a_scan(expr in five_fields(), (tz, from) in zoned_start()) {
        if CronExpr::parse(&expr).is_ok() {
            agree_over_window(&expr, tz, from, 60, 40 * 86_400)?;
        }
    }

    #[test]
    fn seconds_agree_with_a_scan(expr in six_fields_daily(), (tz, from) in zoned_start()) {
        let fired = agree_over_window(&expr, tz, from, 1, 2 * 86_400)?;
        prop_assert!(fired >= 1, "{} matches every day", expr);
    }

    #[test]
    fn matches_agree_with_the_reference(expr in any_expr(), (_, from) in zoned_start()) {
        let Ok(e) = CronExpr::parse(&expr) else { return Ok(()) };
        let mut day = from.naive_utc();
        for _ in 0..62 {
            prop_assert_eq!(e.matches_local(day), reference_matches(&e, day), "{} at {}", expr, day);
            day += Duration::hours(13) + Duration::minutes(7) + Duration::seconds(11);
        }
    }
}

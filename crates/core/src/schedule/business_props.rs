//! Property tests of schedules that meet a calendar, against a brute-force evaluator that
//! lists every nominal instant of a window and applies the rules of `business` by their
//! definition: closed stretches found day by day, the nearest instant of a stretch moved, a
//! business day with its own run taking none.

use super::*;
use crate::calendar::{CalendarSpec, Holiday};
use chrono::{Datelike, NaiveDate, NaiveTime};
use proptest::prelude::*;
use std::collections::BTreeMap;

const ZONES: [&str; 4] = [
    "UTC",
    "Europe/London",
    "America/New_York",
    "Pacific/Auckland",
];
/// Hours that exist once on every day in every zone above (their changes fall from 01:00 to
/// 03:59), so the brute force needs no rule for gaps.
const HOURS: [u32; 6] = [0, 6, 9, 12, 18, 23];

fn d(s: &str) -> NaiveDate {
    s.parse().unwrap()
}

fn window() -> (Instant, Instant) {
    (
        "2026-01-01T00:00:00Z".parse().unwrap(),
        "2028-12-31T00:00:00Z".parse().unwrap(),
    )
}

prop_compose! {
    fn calendars()(
        zone in 0..ZONES.len(),
        weekdays in 1u8..128,
        closures in proptest::collection::vec((0u32..1050, 0u32..12), 0..12),
        yearly in proptest::collection::vec((1u32..=12, 1u32..=29), 0..3),
    ) -> CalendarSpec {
        let names = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
        let weekdays = (0..7)
            .filter(|i| weekdays & (1 << i) != 0)
            .map(|i| names[i].to_string())
            .collect();
        let mut holidays: Vec<Holiday> = closures
            .into_iter()
            .map(|(start, len)| {
                let from = d("2026-01-01") + chrono::Days::new(u64::from(start));
                Holiday {
                    date: None,
                    from: Some(from),
                    to: Some(from + chrono::Days::new(u64::from(len))),
                    label: format!("closed from {from}"),
                    yearly: false,
                }
            })
            .collect();
        for (month, day) in yearly {
            holidays.push(Holiday {
                date: NaiveDate::from_ymd_opt(2024, month, day),
                from: None,
                to: None,
                label: format!("every {month}-{day}"),
                yearly: true,
            });
        }
        CalendarSpec {
            timezone: Some(ZONES[zone].to_string()),
            weekdays: Some(weekdays),
            holidays,
            include: vec![],
            except: vec![],
            description: None,
        }
    }
}

prop_compose! {
    fn crons()(shape in 0..4usize, hour in 0..HOURS.len(), minute in 0..2u32, day in 1u32..=31, dow in 0u32..7)
        -> String {
        let (h, m) = (HOURS[hour], minute * 30);
        match shape {
            0 => format!("{m} {h} * * *"),
            1 => format!("{m} {h} {day} * *"),
            2 => format!("{m} {h} * * {dow}"),
            _ => format!("{m} {h},{} * * *", HOURS[(hour + 3) % HOURS.len()]),
        }
    }
}

/// Every outcome of the window's nominal instants, by the rules' definition, keyed by when it
/// falls due: (nominal instant, moved?, removed?).
fn brute_force(
    cal: &Calendar,
    on_holiday: OnHoliday,
    nominal: &[Instant],
) -> BTreeMap<Instant, (Instant, bool)> {
    let zone = cal.zone();
    let date = |t: &Instant| t.with_timezone(&zone).date_naive();
    let own_days: std::collections::BTreeSet<NaiveDate> = nominal.iter().map(date).collect();
    // Closed stretches as (first day, last day), with their instants.
    let mut stretches: BTreeMap<NaiveDate, (NaiveDate, Vec<Instant>)> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for t in nominal {
        let day = date(t);
        if cal.is_business_day(day) {
            out.insert(*t, (*t, false));
            continue;
        }
        let mut first = day;
        while !cal.is_business_day(first - chrono::Days::new(1)) {
            first = first - chrono::Days::new(1);
        }
        let mut last = day;
        while !cal.is_business_day(last + chrono::Days::new(1)) {
            last = last + chrono::Days::new(1);
        }
        stretches.entry(first).or_insert((last, vec![])).1.push(*t);
    }
    for (first, (last, instants)) in stretches {
        let target = match on_holiday {
            OnHoliday::Skip => None,
            OnHoliday::NextBusinessDay => Some(last + chrono::Days::new(1)),
            OnHoliday::PreviousBusinessDay => Some(first - chrono::Days::new(1)),
        };
        let mover = match on_holiday {
            OnHoliday::NextBusinessDay => instants.last(),
            _ => instants.first(),
        };
        for t in &instants {
            match target {
                Some(day) if Some(t) == mover && !own_days.contains(&day) => {
                    let time: NaiveTime = t.with_timezone(&zone).time();
                    let due = zone
                        .from_local_datetime(&day.and_time(time))
                        .earliest()
                        .unwrap()
                        .with_timezone(&chrono::Utc);
                    out.insert(due, (*t, true));
                }
                _ => {
                    out.insert(*t, (*t, false));
                }
            }
        }
    }
    out
}

fn compiled(spec: &ScheduleSpec, cal: &CalendarSpec, epoch: Instant) -> Schedule {
    let mut s = Schedule::compile(Some(spec), epoch).unwrap();
    let resolved = Calendar::resolve_spec("c", cal, &|_| None).unwrap();
    s.attach_calendar(Arc::new(resolved));
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn calendar_outcomes_match_the_brute_force(
        cal in calendars(),
        cron in crons(),
        mode in 0..3usize,
    ) {
        let on_holiday = [OnHoliday::Skip, OnHoliday::NextBusinessDay, OnHoliday::PreviousBusinessDay][mode];
        let (from, to) = window();
        let spec = ScheduleSpec {
            cron: Some(cron),
            timezone: cal.timezone.clone(),
            calendar: Some("c".into()),
            on_holiday: Some(on_holiday),
            ..Default::default()
        };
        let schedule = compiled(&spec, &cal, from);
        let resolved = schedule.calendar().unwrap().clone();
        let nominal = schedule.instants_between(from, to, 10_000);
        let expected = brute_force(&resolved, on_holiday, &nominal);
        // Outcomes near the window's ends may depend on instants outside it.
        let inner = |t: &Instant| *t > from + chrono::Duration::days(30) && *t < to - chrono::Duration::days(30);
        let mut cursor = from + chrono::Duration::days(30);
        let mut walked = Vec::new();
        while let Some(due) = schedule.next_after(cursor, 0) {
            if !inner(&due) {
                break;
            }
            prop_assert!(due > cursor);
            walked.push((due, schedule.occurrence(due)));
            cursor = due;
        }
        let expected: Vec<_> = expected.into_iter().filter(|(due, _)| inner(due)).collect();
        prop_assert_eq!(walked.len(), expected.len(), "{:?}", spec);
        for ((due, occurrence), (want_due, (nominal, moved))) in walked.iter().zip(&expected) {
            prop_assert_eq!(due, want_due);
            prop_assert_eq!(occurrence.nominal_for, moved.then_some(*nominal));
            let removed = !moved && !resolved.is_business_day(resolved.local_date(*nominal));
            prop_assert_eq!(occurrence.removed.is_some(), removed, "{:?}", occurrence);
            prop_assert_eq!(schedule.outcome(*nominal).due, *due);
        }
    }

    #[test]
    fn business_day_forms_match_the_brute_force(
        cal in calendars(),
        nth in prop_oneof![1i32..=5, -5i32..=-1],
        every in 1u32..=7,
        hour in 0..HOURS.len(),
    ) {
        let (from, _) = window();
        let at = format!("{:02}:15", HOURS[hour]);
        let resolved = Calendar::resolve_spec("c", &cal, &|_| None).unwrap();
        let local = |day: NaiveDate| {
            resolved
                .zone()
                .from_local_datetime(&day.and_time(business::parse_time(&at).unwrap()))
                .earliest()
                .unwrap()
                .with_timezone(&chrono::Utc)
        };
        let days: Vec<NaiveDate> = d("2026-01-02")
            .iter_days()
            .take_while(|day| *day < d("2028-12-30"))
            .collect();
        // The nth business day of each month, by listing the month's business days.
        let mut expected_nth = Vec::new();
        for month in days.iter().filter(|day| day.day() == 1 && **day < d("2028-12-01")) {
            let open: Vec<&NaiveDate> = days
                .iter()
                .filter(|day| day.year() == month.year() && day.month() == month.month())
                .filter(|day| resolved.is_business_day(**day))
                .collect();
            let index = if nth > 0 { (nth - 1) as usize } else { open.len().wrapping_sub((-nth) as usize) };
            if let Some(day) = open.get(index) {
                expected_nth.push(local(**day));
            }
        }
        let spec = ScheduleSpec {
            business_day: Some(BusinessDaySpec { nth, at: Some(at.clone()) }),
            calendar: Some("c".into()),
            ..Default::default()
        };
        let schedule = compiled(&spec, &cal, from);
        let first_month = expected_nth.first().copied();
        if let Some(first) = first_month {
            let walked = schedule.preview(first - chrono::Duration::seconds(1), 0, expected_nth.len());
            let walked: Vec<_> = walked.into_iter().filter(|t| *t <= *expected_nth.last().unwrap()).collect();
            prop_assert_eq!(&walked, &expected_nth);
        }
        // Every nth business day from the anchor's date.
        let anchor = d("2026-01-02");
        let open: Vec<&NaiveDate> = days.iter().filter(|day| resolved.is_business_day(**day)).collect();
        let expected_every: Vec<Instant> = open
            .iter()
            .step_by(every as usize)
            .map(|day| local(**day))
            .take(40)
            .collect();
        let anchor_instant = resolved
            .zone()
            .from_local_datetime(&anchor.and_hms_opt(0, 0, 0).unwrap())
            .earliest()
            .unwrap()
            .with_timezone(&chrono::Utc);
        let spec = ScheduleSpec {
            every_business_days: Some(EveryBusinessDaysSpec::At { every, at: Some(at) }),
            calendar: Some("c".into()),
            anchor: Some(anchor_instant),
            ..Default::default()
        };
        let schedule = compiled(&spec, &cal, from);
        let walked = schedule.preview(anchor_instant - chrono::Duration::seconds(1), 0, expected_every.len());
        prop_assert_eq!(walked, expected_every);
    }
}

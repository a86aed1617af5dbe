//! The instants of an imported crontab entry or CronJob, proven: for a corpus of real-world
//! expressions in zones with and without daylight saving time, the next 1,000 instants of the
//! translated sked schedule (compiled as the server compiles it) equal those of a reference
//! cron implementation (`croner`, set to Vixie cron's day rule); where they differ by design
//! (a change of clocks), the importer reported it for that entry.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use sked_core::job::JobSpec;
use sked_import::{crontab, k8s, Import};

/// Expressions as they appear in crontabs and CronJobs: steps, ranges, lists, names, both day
/// fields restricted (either matches) and one restricted by a step (both must), macros, and
/// dates that are not in every month or year.
const CORPUS: &[&str] = &[
    "*/5 * * * *",
    "0 * * * *",
    "15 3 * * *",
    "30 1 * * *",
    "30 2 * * *",
    "0 2 * * 0",
    "30 2 * * 1-5",
    "0 9-17 * * MON-FRI",
    "*/15 9-17 * * 1-5",
    "1-59/7 * * * *",
    "23 0-20/2 * * *",
    "0 */3 * * 6,0",
    "5 4 * * sun",
    "0 22 * * 1-5",
    "0,30 1-3 * * *",
    "0 0 1 * *",
    "0 0 1 JAN *",
    "0 12 * JAN,APR,JUL,OCT *",
    "0 0,12 1 */2 *",
    "0 4 8-14 * *",
    "0 0 13 * 5",
    "0 0 1,15 * 1",
    "0 0 1-7 * SUN",
    "0 0 */2 * 1-5",
    "0 6 1-10 * */2",
    "0 0 29 2 *",
    "0 0 31 * *",
    "45 23 L * *",
    "@hourly",
    "@daily",
    "@midnight",
    "@weekly",
    "@monthly",
    "@yearly",
    "@annually",
];

/// Zones without daylight saving (UTC, a half-hour offset) and with it, north and south, a
/// one-hour and a half-hour change.
const ZONES: &[&str] = &[
    "UTC",
    "Asia/Kolkata",
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "Australia/Sydney",
    "Australia/Lord_Howe",
];

/// Where the comparisons start: a winter, just before the northern spring changes, and just
/// before the autumn ones (and Sydney's spring).
const STARTS: &[&str] = &[
    "2026-01-01T00:00:00Z",
    "2026-03-01T00:00:00Z",
    "2026-09-30T00:00:00Z",
];

const COUNT: usize = 1000;

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// The next [`COUNT`] instants of the only job of `import`, as sked computes them.
fn sked_instants(import: &Import, start: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    assert_eq!(import.jobs.len(), 1, "{:?}", import.untranslated);
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

/// The reference: `croner` with Vixie cron's rule that a day field starting with `*` (such
/// as `*/2`) leaves the day to the other field and to both (croner's `+`), where croner would
/// take either.
fn reference_instants(
    expr: &str,
    tz: Tz,
    start: DateTime<Utc>,
    count: usize,
) -> Vec<DateTime<Utc>> {
    let pattern = match expr {
        "@midnight" => "0 0 * * *".to_string(),
        e if e.starts_with('@') => e.to_string(),
        e => {
            let mut fields: Vec<String> = e.split_whitespace().map(str::to_string).collect();
            let (dom, dow) = (&fields[2], &fields[4]);
            let restricted = |f: &str| f != "*";
            if restricted(dom) && restricted(dow) && (dom.starts_with('*') || dow.starts_with('*'))
            {
                fields[4] = format!("+{dow}");
            }
            fields.join(" ")
        }
    };
    let cron = croner::parser::CronParser::builder()
        .build()
        .parse(&pattern)
        .unwrap_or_else(|e| panic!("croner refuses {pattern:?}: {e}"));
    let mut out = Vec::new();
    let mut t = start.with_timezone(&tz);
    while out.len() < count {
        t = cron
            .find_next_occurrence(&t, false)
            .unwrap_or_else(|e| panic!("{pattern:?} in {tz}: {e}"));
        out.push(t.with_timezone(&Utc));
    }
    out
}

fn crontab_import(expr: &str, zone: &str, as_of: DateTime<Utc>) -> Import {
    crontab::import_with(
        &format!("CRON_TZ={zone}\n{expr} /usr/local/bin/task\n"),
        &crontab::Options {
            as_of: Some(as_of),
            ..crontab::Options::default()
        },
    )
    .unwrap()
}

fn cronjob_import(expr: &str, zone: &str, as_of: DateTime<Utc>) -> Import {
    let manifest = format!(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: task}}\nspec:\n  \
         schedule: \"{expr}\"\n  timeZone: {zone}\n  jobTemplate:\n    spec:\n      \
         template:\n        spec:\n          containers:\n          - {{name: task, image: busybox}}\n"
    );
    k8s::import_with(
        &manifest,
        &k8s::Options {
            as_of: Some(as_of),
            ..k8s::Options::default()
        },
    )
    .unwrap()
}

/// Compares every entry of the corpus in every zone from every start; returns how many
/// comparisons were identical and how many differed (each of those reported).
fn prove(import: impl Fn(&str, &str, DateTime<Utc>) -> Import) -> (usize, usize) {
    let (mut same, mut reported) = (0, 0);
    let first_start = at(STARTS[0]);
    for zone in ZONES {
        let tz: Tz = zone.parse().unwrap();
        let has_dst = tz.offset_from_utc_datetime(&at("2026-01-15T00:00:00Z").naive_utc())
            != tz.offset_from_utc_datetime(&at("2026-07-15T00:00:00Z").naive_utc());
        for expr in CORPUS {
            let imported = import(expr, zone, first_start);
            if !has_dst {
                assert!(
                    imported.differences.is_empty(),
                    "{expr} in {zone}: {:?}",
                    imported.differences
                );
            }
            for start in STARTS {
                let start = at(start);
                let sked = sked_instants(&imported, start);
                // sked's cron names instants up to the end of 2199 (its documented horizon):
                // a yearly entry has fewer than 1,000 of them, and the reference's next one
                // lies past it.
                let reference = reference_instants(expr, tz, start, sked.len() + 1);
                if sked.len() < COUNT {
                    assert!(reference[sked.len()] >= at("2199-12-31T00:00:00Z"));
                }
                if sked[..] == reference[..sked.len()] {
                    same += 1;
                    continue;
                }
                let at_diff = sked
                    .iter()
                    .zip(&reference)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                assert!(
                    !imported.differences.is_empty(),
                    "{expr} in {zone} from {start}: instant {at_diff} is {} in sked and {} in \
                     the reference, and the importer said nothing",
                    sked[at_diff],
                    reference[at_diff],
                );
                reported += 1;
            }
        }
    }
    (same, reported)
}

#[test]
fn crontab_entries_fire_at_crons_instants_or_say_why_not() {
    let (same, reported) = prove(crontab_import);
    eprintln!("crontab: {same} comparisons identical, {reported} differing and reported");
    assert_eq!(same + reported, ZONES.len() * CORPUS.len() * STARTS.len());
    assert!(reported > 0, "the corpus crosses changes of clocks");
}

#[test]
fn cronjob_schedules_fire_at_crons_instants_or_say_why_not() {
    let (same, reported) = prove(cronjob_import);
    eprintln!("CronJob: {same} comparisons identical, {reported} differing and reported");
    assert_eq!(same + reported, ZONES.len() * CORPUS.len() * STARTS.len());
}

//! Where a cron expression's instants in a zone with daylight saving time differ between sked
//! and the scheduler it comes from.
//!
//! sked's contract (`sked_core::schedule::cron`): a local time a change of clocks skips fires
//! once, when the skipped stretch ends; a repeated local time fires once, at its first
//! occurrence. Vixie cron (and `croner`, which follows it) does the same for an entry with one
//! fixed second, minute and hour, but skips the skipped times of any other entry and runs
//! its times of a repeated hour in both passes. Kubernetes (robfig/cron) never runs a skipped
//! time and runs a repeated one in both passes, whatever the entry. This module finds the
//! first change of clocks where the two part ways for one expression, so the importer can say
//! so. Pure: the moment to look from is an argument; it owns no parsing of its own.

use chrono::{Duration, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use sked_core::schedule::cron::CronExpr;
use sked_core::Instant;
use std::collections::HashMap;

/// The scheduler whose handling of a change of clocks is compared with sked's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Vixie cron and cronie.
    Vixie,
    /// The Kubernetes CronJob controller.
    Kubernetes,
    /// pg_cron, which checks each minute of UTC in `cron.timezone`: as Kubernetes, it never
    /// runs a skipped time and runs a repeated one in both passes.
    PgCron,
}

/// How far ahead changes of clocks are looked for: up to the end of sked's cron horizon
/// (`sked_core::schedule::cron::MAX_YEAR`) from today.
const HORIZON_YEARS: i64 = 175;

/// A change of clocks: the wall times of `[start, start + length)` either do not exist (`gap`)
/// or come twice.
pub(crate) struct Change {
    pub(crate) start: NaiveDateTime,
    pub(crate) length: Duration,
    pub(crate) gap: bool,
}

/// Whether `fields` (a 5-field expression or a macro) names one second, minute and hour: a
/// "fixed-time" entry in cron's sense.
fn fixed_time(fields: &str) -> bool {
    let body = match fields.trim() {
        "@yearly" | "@annually" | "@monthly" | "@weekly" | "@daily" | "@midnight" => return true,
        "@hourly" => return false,
        other => other,
    };
    let parts: Vec<&str> = body.split_whitespace().collect();
    let time_fields = match parts.len() {
        5 => &parts[..2],
        6 | 7 => &parts[..3],
        _ => return false,
    };
    time_fields
        .iter()
        .all(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
}

/// The changes of clocks of `tz` from `from` on, for [`HORIZON_YEARS`].
pub(crate) fn changes(tz: Tz, from: Instant) -> Vec<Change> {
    let offset = |t: Instant| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
    let mut found = Vec::new();
    let end = from + Duration::days(366 * HORIZON_YEARS);
    let step = Duration::days(1);
    let mut t = chrono::DateTime::from_timestamp(from.timestamp(), 0).unwrap_or(from);
    while t < end {
        let next = t + step;
        let (before, after) = (offset(t), offset(next));
        if before != after {
            // Bisect to the second the offset changes (changes fall on whole seconds).
            let (mut lo, mut hi) = (t.timestamp(), next.timestamp());
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                match chrono::DateTime::from_timestamp(mid, 0) {
                    Some(m) if offset(m) == before => lo = mid,
                    Some(_) => hi = mid,
                    None => break,
                }
            }
            let Some(hi) = chrono::DateTime::from_timestamp(hi, 0) else {
                break;
            };
            let shift = after.local_minus_utc() - before.local_minus_utc();
            let at = hi.naive_utc();
            found.push(if shift > 0 {
                Change {
                    start: at + Duration::seconds(i64::from(before.local_minus_utc())),
                    length: Duration::seconds(i64::from(shift)),
                    gap: true,
                }
            } else {
                Change {
                    start: at + Duration::seconds(i64::from(after.local_minus_utc())),
                    length: Duration::seconds(i64::from(-shift)),
                    gap: false,
                }
            });
        }
        t = next;
    }
    found
}

/// The whole minutes of `[start, start + length)`.
fn minutes(start: NaiveDateTime, length: Duration) -> impl Iterator<Item = NaiveDateTime> {
    let first_offset = (60 - i64::from(chrono::Timelike::second(&start))) % 60;
    let first = start + Duration::seconds(first_offset);
    let end = start + length;
    (0..)
        .map(move |i| first + Duration::minutes(i))
        .take_while(move |t| *t < end)
}

/// The changes of clocks of the zones one import meets, each zone's found once: a crontab
/// of many entries in one zone walks its calendar once.
pub(crate) struct Clocks {
    from: Instant,
    zones: HashMap<Tz, Vec<Change>>,
}

impl Clocks {
    /// Changes of clocks from `from` on.
    pub(crate) fn new(from: Instant) -> Clocks {
        Clocks {
            from,
            zones: HashMap::new(),
        }
    }

    /// The changes of clocks of `tz`, found once.
    pub(crate) fn of(&mut self, tz: Tz) -> &[Change] {
        let from = self.from;
        self.zones.entry(tz).or_insert_with(|| changes(tz, from))
    }

    /// [`difference`] of `expr` in `tz`.
    pub(crate) fn difference(
        &mut self,
        expr: &CronExpr,
        fields: &str,
        tz: Tz,
        source: Source,
    ) -> Option<String> {
        let from = self.from;
        let changes = self.zones.entry(tz).or_insert_with(|| changes(tz, from));
        difference(expr, fields, tz, source, changes)
    }
}

/// Why the instants of `expr` (written `fields`) in `tz` differ between sked and `source`
/// around one of `changes`; `None` when they never do.
fn difference(
    expr: &CronExpr,
    fields: &str,
    tz: Tz,
    source: Source,
    changes: &[Change],
) -> Option<String> {
    let fixed = fixed_time(fields);
    for change in changes {
        let Some(hit) = minutes(change.start, change.length).find(|m| expr.matches_local(*m))
        else {
            continue;
        };
        let end = change.start + change.length;
        let date = hit.date();
        let why = if change.gap {
            // Both fire a skipped time's entry once at the end of the gap only where the end
            // is itself one of its times; otherwise each rule decides.
            let end_matches = expr.matches_local(end);
            let differs = match source {
                Source::Vixie if fixed => end.date() != hit.date() && !end_matches,
                Source::Vixie | Source::Kubernetes | Source::PgCron => !end_matches,
            };
            if !differs {
                continue;
            }
            format!(
                "in {tz}, clocks skip {} to {} on {date}: sked runs this entry's time {} once, \
                 at {} when the skipped stretch ends; {} does not run it",
                change.start.time(),
                end.time(),
                hit.time(),
                end.time(),
                name(source),
            )
        } else {
            if source == Source::Vixie && fixed {
                continue;
            }
            format!(
                "in {tz}, clocks go back from {} to {} on {date}: {} runs this entry's time {} \
                 in both passes of the repeated stretch; sked runs it once, in the first",
                end.time(),
                change.start.time(),
                name(source),
                hit.time(),
            )
        };
        return Some(why);
    }
    None
}

fn name(source: Source) -> &'static str {
    match source {
        Source::Vixie => "cron",
        Source::Kubernetes => "Kubernetes",
        Source::PgCron => "pg_cron",
    }
}

/// The moment importers look for changes of clocks from when not told.
pub(crate) fn now() -> Instant {
    Utc::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Instant {
        s.parse().unwrap()
    }

    #[test]
    fn fixed_entries_are_told_from_wildcard_ones() {
        assert!(fixed_time("30 2 * * *"));
        assert!(fixed_time("@daily"));
        assert!(!fixed_time("@hourly"));
        assert!(!fixed_time("0,30 2 * * *"));
        assert!(!fixed_time("*/5 2 * * *"));
        assert!(!fixed_time("0 1-3 * * *"));
    }

    #[test]
    fn a_zone_without_daylight_saving_never_differs() {
        let expr = CronExpr::parse("*/5 * * * *").unwrap();
        let from = at("2026-01-01T00:00:00Z");
        for tz in [chrono_tz::UTC, chrono_tz::Asia::Tokyo] {
            assert_eq!(
                Clocks::new(from).difference(&expr, "*/5 * * * *", tz, Source::Vixie),
                None
            );
        }
    }

    #[test]
    fn each_rule_is_told_where_it_parts_from_skeds() {
        let from = at("2026-01-01T00:00:00Z");
        let ny = chrono_tz::America::New_York;
        let mut clocks = Clocks::new(from);
        let mut check = |fields: &str, source| {
            clocks.difference(&CronExpr::parse(fields).unwrap(), fields, ny, source)
        };
        // A fixed time in the skipped hour runs at its end under both.
        assert_eq!(check("30 2 * * *", Source::Vixie), None);
        // A wildcard entry in the skipped hour: cron skips it.
        let gap = check("30 * * * *", Source::Vixie).unwrap();
        assert!(
            gap.contains("clocks skip 02:00:00 to 03:00:00 on 2026-03-08"),
            "{gap}"
        );
        // ... unless the end of the gap is one of its times: one fire there under both.
        assert_eq!(check("*/15 2-3 * 1-6 *", Source::Vixie), None);
        // Its times of the repeated hour: twice under cron.
        let back = check("*/15 2-3 * 7-12 *", Source::Vixie);
        assert_eq!(back, None, "01:00-02:00 repeats; 2-3 has no time in it");
        let twice = check("15 * * 7-12 *", Source::Vixie).unwrap();
        assert!(twice.contains("both passes"), "{twice}");
        // Kubernetes never runs a skipped fixed time.
        assert!(check("30 2 * * *", Source::Kubernetes).is_some());
    }
}

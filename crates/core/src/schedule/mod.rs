//! When a job is due: schedule definitions as users write them, compiled into a [`Schedule`] that
//! answers "what is the next instant after this one?".
//!
//! Pure math over UTC instants. Local time and time zones exist only inside `cron`; nothing here
//! reads the clock.

pub mod blackout;
pub mod business;
#[cfg(test)]
mod business_props;
pub mod cron;
pub mod iso8601;
pub mod words;

pub use blackout::{BlackoutSpec, Blackouts};
pub use business::{BusinessDaySpec, EveryBusinessDaysSpec, Occurrence, OnHoliday, Removed};

use crate::calendar::Calendar;
use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::Instant;
use chrono::{Duration, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A schedule as the API takes it: exactly one of `cron`, `every`, `iso8601`, `at`, `event`,
/// `business_day` or `every_business_days`, plus the optional bounds of a timer and the
/// calendar it meets. A job without a schedule only runs when triggered.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// IANA zone for `cron` (and for the business-day forms without a calendar); UTC when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Fixed rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<HumanDuration>,
    /// An instant the `every` grid passes through; the moment the schedule was set when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<Instant>,
    /// ISO 8601 repeating interval, `R2/2026-01-01T00:00:00Z/PT5M`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iso8601: Option<String>,
    /// One instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Instant>,
    /// No timer: one run per event of this key (`crate::event`), at the event's instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// The nth business day of each month, at a local time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub business_day: Option<BusinessDaySpec>,
    /// Every Nth business day, at a local time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_business_days: Option<EveryBusinessDaysSpec>,
    /// The namespace's calendar (`crate::calendar`) that says which days are business days.
    /// The business-day forms without one count Monday to Friday in `timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    /// What the calendar does to an instant on a closed day: `skip` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_holiday: Option<OnHoliday>,
    /// No instant before this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Instant>,
    /// No instant after this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Instant>,
    /// At most this many instants in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u64>,
    /// Each run is handed out up to this much after its instant, spread evenly by job and
    /// instant, so that many jobs on one instant do not arrive together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<HumanDuration>,
}

/// Which one of its kinds a schedule is: what a job list filters on (`GET /jobs?kind=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    Cron,
    Every,
    Iso8601,
    At,
    Event,
    BusinessDay,
    EveryBusinessDays,
    /// No schedule: the job runs only when triggered (or as a dependant).
    Manual,
}

string_enum!(ScheduleKind {
    Cron => "cron",
    Every => "every",
    Iso8601 => "iso8601",
    At => "at",
    Event => "event",
    BusinessDay => "business_day",
    EveryBusinessDays => "every_business_days",
    Manual => "manual",
});

impl ScheduleKind {
    /// The kind of `schedule` (a definition holds at most one; validation refuses more).
    pub fn of(schedule: Option<&ScheduleSpec>) -> ScheduleKind {
        let Some(s) = schedule else {
            return ScheduleKind::Manual;
        };
        if s.cron.is_some() {
            ScheduleKind::Cron
        } else if s.every.is_some() {
            ScheduleKind::Every
        } else if s.iso8601.is_some() {
            ScheduleKind::Iso8601
        } else if s.at.is_some() {
            ScheduleKind::At
        } else if s.event.is_some() {
            ScheduleKind::Event
        } else if s.business_day.is_some() {
            ScheduleKind::BusinessDay
        } else if s.every_business_days.is_some() {
            ScheduleKind::EveryBusinessDays
        } else {
            ScheduleKind::Manual
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Cron(Box<cron::CronExpr>, Tz),
    /// `anchor` `None`: the grid passes through the schedule's epoch.
    Every {
        period: Duration,
        anchor: Option<Instant>,
    },
    // Boxed, as the cron expression is: a node holds a million schedules, most of them `every`.
    Repeating(Box<iso8601::RepeatingInterval>),
    At(Instant),
    /// The nth business day of each month at a local time (of the calendar's zone).
    BusinessDay {
        nth: i32,
        time: chrono::NaiveTime,
    },
    /// Every `n`th business day from the anchor's date (the epoch's when `None`), at a local
    /// time.
    EveryBusinessDays {
        n: u32,
        time: chrono::NaiveTime,
        anchor: Option<Instant>,
    },
    Manual,
}

/// A compiled schedule. Instants are counted by the caller (`fired`), which is how `max_runs`
/// and the repetitions of an ISO 8601 interval end a schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    kind: Kind,
    /// The moment the schedule was set: instants at or before it are not owed.
    epoch: Instant,
    /// Boxed and absent when none is set, which is the common case, to keep a schedule small.
    limits: Option<Box<Limits>>,
}

/// The optional bounds of a schedule.
#[derive(Debug, Clone, Default, PartialEq)]
struct Limits {
    start: Option<Instant>,
    end: Option<Instant>,
    max_runs: Option<u64>,
    jitter: Option<HumanDuration>,
    calendar: Option<CalendarUse>,
    /// The job's blackout windows: instants in them are removed (`skipped (blackout)`).
    blackouts: Option<Arc<Blackouts>>,
    /// Its namespace's blackout windows, attached by the caller, which reads them.
    namespace_blackouts: Option<Arc<Blackouts>>,
}

/// The calendar a schedule meets.
#[derive(Debug, Clone, PartialEq)]
struct CalendarUse {
    /// The namespace's calendar it names; `None` for Monday to Friday in `timezone`.
    name: Option<String>,
    on_holiday: OnHoliday,
    /// The calendar resolved: attached by the caller for a named one
    /// ([`Schedule::attach_calendar`]); until then, the business-day forms count Monday to
    /// Friday and the other forms meet no calendar.
    resolved: Option<Arc<Calendar>>,
}

/// The shortest `every` sked accepts.
pub const MIN_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// The longest `every` sked accepts: a century.
pub const MAX_EVERY: std::time::Duration = std::time::Duration::from_secs(3_155_760_000);
/// The longest `jitter` sked accepts (it is also at most the period of `every` and `iso8601`).
pub const MAX_JITTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// The instants a schedule may name: from the Unix epoch to the end of year 9999, cut to the
/// microsecond (the ledger's precision), so every instant a schedule derives is one the ledger
/// can store exactly.
fn check_instant(field: &str, t: Option<Instant>) -> Result<Option<Instant>, SpecError> {
    let Some(t) = t else { return Ok(None) };
    let earliest = Utc.timestamp_opt(0, 0).single();
    let latest = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).single();
    if earliest.is_some_and(|e| t < e) || latest.is_some_and(|l| t >= l + Duration::seconds(1)) {
        return Err(SpecError::new(
            field,
            "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
        ));
    }
    Ok(Some(crate::ledger_instant(t)))
}

/// The calendar a schedule meets, checked: `None` when it meets none.
fn calendar_use(
    spec: &ScheduleSpec,
    tz: Tz,
    business: bool,
) -> Result<Option<CalendarUse>, SpecError> {
    if let Some(name) = &spec.calendar {
        crate::job::validate_name("schedule.calendar", name)?;
        if spec.event.is_some() {
            return Err(SpecError::new(
                "schedule.calendar",
                "an event schedule meets no calendar: its runs come with its events",
            ));
        }
    }
    if let Some(on_holiday) = spec.on_holiday {
        if business {
            return Err(SpecError::new(
                "schedule.on_holiday",
                "a business-day schedule names business days only: nothing falls on a holiday",
            ));
        }
        if spec.calendar.is_none() {
            return Err(SpecError::new(
                "schedule.on_holiday",
                format!("{on_holiday} needs a calendar: name one in schedule.calendar"),
            ));
        }
    }
    if spec.calendar.is_none() && !business {
        return Ok(None);
    }
    Ok(Some(CalendarUse {
        name: spec.calendar.clone(),
        on_holiday: spec.on_holiday.unwrap_or_default(),
        resolved: spec
            .calendar
            .is_none()
            .then(|| Arc::new(Calendar::weekdays_in(tz))),
    }))
}

impl ScheduleSpec {
    /// Cuts the instants the definition names to the microsecond, so the stored definition
    /// shows the instants that are used (clients often send nanoseconds).
    pub fn normalize(&mut self) {
        for t in [
            &mut self.anchor,
            &mut self.at,
            &mut self.start,
            &mut self.end,
        ]
        .into_iter()
        .flatten()
        {
            *t = crate::ledger_instant(*t);
        }
    }
}

impl Schedule {
    /// Compiles a definition. `epoch` is when it was set (created or last changed): the first
    /// instant is the first one strictly after it.
    pub fn compile(spec: Option<&ScheduleSpec>, epoch: Instant) -> Result<Schedule, SpecError> {
        let epoch = crate::ledger_instant(epoch);
        let Some(spec) = spec else {
            return Ok(Schedule::manual(epoch));
        };
        let anchor = check_instant("schedule.anchor", spec.anchor)?;
        let at = check_instant("schedule.at", spec.at)?;
        let start = check_instant("schedule.start", spec.start)?;
        let end = check_instant("schedule.end", spec.end)?;
        let given = [
            spec.cron.is_some(),
            spec.every.is_some(),
            spec.iso8601.is_some(),
            spec.at.is_some(),
            spec.event.is_some(),
            spec.business_day.is_some(),
            spec.every_business_days.is_some(),
        ]
        .iter()
        .filter(|g| **g)
        .count();
        // A job without a schedule leaves `schedule` out: an object that names no kind (only
        // `start`, `jitter` and such, or nothing) is a mistake, not a manual job.
        let exactly_one = || {
            SpecError::new(
                "schedule",
                "give exactly one of cron, every, iso8601, at, event, business_day or \
                 every_business_days",
            )
        };
        if given != 1 {
            return Err(exactly_one());
        }
        if let Some(key) = &spec.event {
            crate::event::validate_key("schedule.event", key)?;
            let timer_bounds = [
                spec.start.is_some(),
                spec.end.is_some(),
                spec.max_runs.is_some(),
                spec.jitter.is_some(),
            ];
            if timer_bounds.contains(&true) {
                return Err(SpecError::new(
                    "schedule.event",
                    "an event schedule takes no start, end, max_runs or jitter: its runs \
                     come with its events",
                ));
            }
        }
        let business = spec.business_day.is_some() || spec.every_business_days.is_some();
        if spec.timezone.is_some() && spec.cron.is_none() && !business {
            return Err(SpecError::new(
                "schedule.timezone",
                "only applies to cron and business-day schedules",
            ));
        }
        if spec.timezone.is_some() && business && spec.calendar.is_some() {
            return Err(SpecError::new(
                "schedule.timezone",
                "a business-day schedule with a calendar runs in the calendar's zone",
            ));
        }
        if anchor.is_some() && spec.every.is_none() && spec.every_business_days.is_none() {
            return Err(SpecError::new(
                "schedule.anchor",
                "only applies to every and every_business_days schedules",
            ));
        }
        let tz = match &spec.timezone {
            None => Tz::UTC,
            Some(name) => name.parse::<Tz>().map_err(|_| {
                SpecError::new(
                    "schedule.timezone",
                    format!("{name:?} is not an IANA time zone such as Europe/London"),
                )
            })?,
        };
        let calendar = calendar_use(spec, tz, business)?;
        let time_of = |field: &str, at: Option<&str>| -> Result<chrono::NaiveTime, SpecError> {
            at.map_or(Ok(chrono::NaiveTime::MIN), |text| {
                business::parse_time(text).map_err(|m| SpecError::new(field, m))
            })
        };
        let kind = if let Some(expr) = &spec.cron {
            let expr = cron::CronExpr::parse(expr)
                .map_err(|message| SpecError::new("schedule.cron", message))?;
            Kind::Cron(Box::new(expr), tz)
        } else if let Some(every) = spec.every {
            if every.0 < MIN_EVERY || every.0 > MAX_EVERY {
                return Err(SpecError::new(
                    "schedule.every",
                    format!(
                        "must be between {} and {}",
                        HumanDuration(MIN_EVERY),
                        HumanDuration(MAX_EVERY)
                    ),
                ));
            }
            if every.0.subsec_nanos() % 1000 != 0 {
                return Err(SpecError::new(
                    "schedule.every",
                    "must be a whole number of microseconds",
                ));
            }
            Kind::Every {
                period: every.as_chrono(),
                anchor,
            }
        } else if let Some(text) = &spec.iso8601 {
            let interval = iso8601::RepeatingInterval::parse(text)
                .map_err(|message| SpecError::new("schedule.iso8601", message))?;
            Kind::Repeating(Box::new(interval))
        } else if let Some(at) = at {
            Kind::At(at)
        } else if let Some(day) = &spec.business_day {
            if day.nth == 0 || day.nth.abs() > business::MAX_NTH {
                return Err(SpecError::new(
                    "schedule.business_day.nth",
                    format!(
                        "must be 1 to {max} (the nth business day of the month) or -1 to -{max} \
                         (counted from its end)",
                        max = business::MAX_NTH
                    ),
                ));
            }
            Kind::BusinessDay {
                nth: day.nth,
                time: time_of("schedule.business_day.at", day.at.as_deref())?,
            }
        } else if let Some(every) = &spec.every_business_days {
            let n = every.every();
            if n == 0 || n > business::MAX_EVERY_BUSINESS_DAYS {
                return Err(SpecError::new(
                    "schedule.every_business_days",
                    format!(
                        "must be 1 to {} business days",
                        business::MAX_EVERY_BUSINESS_DAYS
                    ),
                ));
            }
            Kind::EveryBusinessDays {
                n,
                time: time_of("schedule.every_business_days.at", every.at())?,
                anchor,
            }
        } else if spec.event.is_some() {
            // Events start the runs (the store, as each is recorded); no timer fires.
            Kind::Manual
        } else {
            return Err(exactly_one());
        };
        if let (Some(start), Some(end)) = (start, end) {
            if end < start {
                return Err(SpecError::new("schedule.end", "must not be before start"));
            }
        }
        if spec.max_runs == Some(0) {
            return Err(SpecError::new("schedule.max_runs", "must be at least 1"));
        }
        if let Some(jitter) = spec.jitter {
            let period = match &kind {
                Kind::Every { period, .. } => period.to_std().ok(),
                Kind::Repeating(interval) => interval.fixed_period(),
                _ => None,
            };
            let limit = period.map_or(MAX_JITTER, |p| p.min(MAX_JITTER));
            if jitter.0 > limit {
                return Err(SpecError::new(
                    "schedule.jitter",
                    format!(
                        "must be at most {} (an hour, and no more than the schedule's period)",
                        HumanDuration(limit)
                    ),
                ));
            }
        }
        let limits = Limits {
            start,
            end,
            max_runs: spec.max_runs,
            jitter: spec.jitter,
            calendar,
            blackouts: None,
            namespace_blackouts: None,
        };
        Ok(Schedule {
            kind,
            epoch,
            limits: (limits != Limits::default()).then(|| Box::new(limits)),
        })
    }

    pub fn manual(epoch: Instant) -> Schedule {
        Schedule {
            kind: Kind::Manual,
            epoch,
            limits: None,
        }
    }

    /// When the schedule was set: instants at or before it are not owed.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// True when the schedule never fires by itself.
    pub fn is_manual(&self) -> bool {
        matches!(self.kind, Kind::Manual)
    }

    /// The first instant the schedule owes.
    pub fn first(&self) -> Option<Instant> {
        self.next_after(self.epoch, 0)
    }

    /// The calendar the schedule names, to be resolved and attached by the caller.
    pub fn calendar_name(&self) -> Option<&str> {
        self.calendar_use()?.name.as_deref()
    }

    /// Gives the schedule its named calendar, resolved.
    pub fn attach_calendar(&mut self, calendar: Arc<Calendar>) {
        if let Some(c) = self.limits.as_deref_mut().and_then(|l| l.calendar.as_mut()) {
            c.resolved = Some(calendar);
        }
    }

    /// The calendar it meets, once resolved.
    pub fn calendar(&self) -> Option<&Arc<Calendar>> {
        self.calendar_use()?.resolved.as_ref()
    }

    /// The same schedule, set at `epoch` instead.
    pub fn with_epoch(mut self, epoch: Instant) -> Schedule {
        self.epoch = crate::ledger_instant(epoch);
        self
    }

    fn calendar_use(&self) -> Option<&CalendarUse> {
        self.limits.as_deref()?.calendar.as_ref()
    }

    /// The calendar that moves or removes instants of a form that names its own days.
    fn meets_calendar(&self) -> Option<(&Calendar, OnHoliday)> {
        if matches!(
            self.kind,
            Kind::BusinessDay { .. } | Kind::EveryBusinessDays { .. }
        ) {
            return None;
        }
        let used = self.calendar_use()?;
        Some((used.resolved.as_deref()?, used.on_holiday))
    }

    /// The next instant strictly after `after` at which something falls due, given that
    /// `fired` were already produced: a run, or, where a calendar removes one, the instant it
    /// removes ([`Schedule::occurrence`] says which). `None` when the schedule is used up.
    pub fn next_after(&self, after: Instant, fired: u64) -> Option<Instant> {
        let first = self.nominal_next_after(after, fired);
        match self.meets_calendar() {
            None => first,
            Some((calendar, on_holiday)) => {
                business::next_due(calendar, on_holiday, &Bounded::owed(self), after, first)
            }
        }
    }

    /// What falls due at `due` (an instant [`Schedule::next_after`] gave): a run at its own
    /// instant, a run moved there from a closed day, or an instant a calendar or a blackout
    /// window removed.
    pub fn occurrence(&self, due: Instant) -> Occurrence {
        let occurrence = match self.meets_calendar() {
            None => Occurrence::runs(due),
            Some((calendar, on_holiday)) => {
                business::occurrence_at(calendar, on_holiday, &Bounded::owed(self), due)
            }
        };
        self.blacked_out(occurrence)
    }

    /// Gives the schedule its job's blackout windows (none when empty).
    pub fn set_blackouts(&mut self, blackouts: Blackouts) {
        let blackouts = (!blackouts.is_empty()).then(|| Arc::new(blackouts));
        if blackouts.is_none() && self.limits.is_none() {
            return;
        }
        self.limits.get_or_insert_with(Box::default).blackouts = blackouts;
    }

    /// Gives the schedule its namespace's blackout windows, replacing any it had.
    pub fn set_namespace_blackouts(&mut self, blackouts: Option<Arc<Blackouts>>) {
        if blackouts.is_none() && self.limits.is_none() {
            return;
        }
        self.limits
            .get_or_insert_with(Box::default)
            .namespace_blackouts = blackouts;
    }

    /// `occurrence`, removed when its run would fall in a blackout window, the job's or its
    /// namespace's.
    fn blacked_out(&self, mut occurrence: Occurrence) -> Occurrence {
        if occurrence.removed.is_some() {
            return occurrence;
        }
        let limits = self.limits.as_deref();
        let windows = limits
            .and_then(|l| l.blackouts.as_deref())
            .into_iter()
            .chain(limits.and_then(|l| l.namespace_blackouts.as_deref()));
        if let Some(reason) = windows.filter_map(|w| w.covering(occurrence.due)).next() {
            occurrence.removed = Some(Removed {
                by: crate::run::SkipReason::Blackout,
                why: reason.to_string(),
            });
        }
        occurrence
    }

    /// What becomes of nominal instant `t` (one [`Schedule::instants_between`] gave), judged
    /// among all the schedule's instants, however long before it was set: what a backfill
    /// records.
    pub fn outcome(&self, t: Instant) -> Occurrence {
        let occurrence = match self.meets_calendar() {
            None => Occurrence::runs(t),
            Some((calendar, on_holiday)) => {
                let every = Bounded {
                    schedule: self,
                    since_epoch: false,
                };
                business::outcome(calendar, on_holiday, &every, t)
            }
        };
        self.blacked_out(occurrence)
    }

    /// Whether anything can remove or move its instants (a calendar or blackout windows):
    /// then previews list what became of each.
    pub fn meets_rules(&self) -> bool {
        self.limits.as_deref().is_some_and(|l| {
            l.calendar.is_some() || l.blackouts.is_some() || l.namespace_blackouts.is_some()
        })
    }

    /// The next nominal instant strictly after `after`, given that `fired` were produced.
    fn nominal_next_after(&self, after: Instant, fired: u64) -> Option<Instant> {
        let limits = self.limits.as_deref();
        if limits
            .and_then(|l| l.max_runs)
            .is_some_and(|max| fired >= max)
        {
            return None;
        }
        // Instants before the schedule was set, or before `start`, are not owed.
        let mut floor = after.max(self.epoch);
        if let Some(start) = limits.and_then(|l| l.start) {
            if start > floor {
                // `start` itself may be an instant: look from just before it.
                floor = start - Duration::nanoseconds(1);
            }
        }
        if matches!(self.kind, Kind::At(_)) && fired > 0 {
            return None;
        }
        let next = self.kind_next_after(floor)?;
        match limits.and_then(|l| l.end) {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// The next instant of the schedule's kind strictly after `floor`, bounds aside.
    fn kind_next_after(&self, floor: Instant) -> Option<Instant> {
        let calendar = || -> Option<&Calendar> {
            match self.calendar_use()?.resolved.as_deref() {
                Some(c) => Some(c),
                None => Some(&WEEKDAYS_UTC),
            }
        };
        match &self.kind {
            Kind::BusinessDay { nth, time } => {
                business::nth_business_day_after(calendar()?, *nth, *time, floor)
            }
            Kind::EveryBusinessDays { n, time, anchor } => {
                let cal = calendar()?;
                let anchor = cal.local_date(anchor.unwrap_or(self.epoch));
                business::every_business_days_after(cal, *n, anchor, *time, floor)
            }
            Kind::Manual => None,
            Kind::At(at) => (*at > floor).then_some(*at),
            Kind::Every { period, anchor } => {
                every_next_after(anchor.unwrap_or(self.epoch), *period, floor)
            }
            Kind::Cron(expr, tz) => expr.next_after(floor, *tz),
            Kind::Repeating(interval) => interval.next_after(floor, 0),
        }
    }

    /// The instants the schedule names in `[from, to]`, however long ago it was set: the
    /// epoch floor and `max_runs` do not apply, `start` and `end` do. At most `limit`, in
    /// order: what a backfill records.
    pub fn instants_between(&self, from: Instant, to: Instant, limit: usize) -> Vec<Instant> {
        let limits = self.limits.as_deref();
        let from = limits.and_then(|l| l.start).map_or(from, |s| s.max(from));
        let to = limits.and_then(|l| l.end).map_or(to, |e| e.min(to));
        let mut out = Vec::new();
        // `from` itself may be an instant: look from just before it.
        let mut cursor = from - Duration::nanoseconds(1);
        while out.len() < limit {
            match self.kind_next_after(cursor) {
                Some(next) if next <= to => {
                    out.push(next);
                    cursor = next;
                }
                _ => break,
            }
        }
        out
    }

    /// The next `count` outcomes falling due strictly after `after`, for previews: runs,
    /// moved runs and removed instants, each with its reason.
    pub fn preview_occurrences(&self, after: Instant, fired: u64, count: usize) -> Vec<Occurrence> {
        let mut out = Vec::with_capacity(count.min(1000));
        let mut cursor = after;
        while out.len() < count {
            let Some(next) = self.next_after(cursor, fired + out.len() as u64) else {
                break;
            };
            out.push(self.occurrence(next));
            cursor = next;
        }
        out
    }

    /// The next `count` instants strictly after `after`, for previews.
    pub fn preview(&self, after: Instant, fired: u64, count: usize) -> Vec<Instant> {
        let mut out = Vec::with_capacity(count.min(1000));
        let mut cursor = after;
        while out.len() < count {
            let Some(next) = self.next_after(cursor, fired + out.len() as u64) else {
                break;
            };
            out.push(next);
            cursor = next;
        }
        out
    }

    /// Why a preview from `after` (its last instant, or where it started) holds fewer instants
    /// than asked for: a person reading an empty or short list is told why.
    pub fn preview_end(&self, after: Instant) -> String {
        use chrono::Datelike;
        let at = after.format("%Y-%m-%d %H:%M:%S UTC");
        match &self.kind {
            Kind::Cron(..) if after.year() >= cron::MAX_YEAR => format!(
                "no instant after {at}: cron schedules end with the year {}",
                cron::MAX_YEAR
            ),
            Kind::Manual => "no instants: the job has no schedule of its own".to_string(),
            _ => format!("the schedule names no instant after {at}"),
        }
    }

    /// How long after `instant` a run is handed out: a fixed spread in `[0, jitter)` derived from
    /// `seed` (the job) and the instant, so every node computes the same offset.
    pub fn jitter_offset(&self, seed: u64, instant: Instant) -> std::time::Duration {
        let jitter = self.limits.as_deref().and_then(|l| l.jitter);
        let Some(jitter) = jitter.filter(|j| !j.0.is_zero()) else {
            return std::time::Duration::ZERO;
        };
        let mixed = splitmix64(seed ^ instant.timestamp_micros() as u64);
        let nanos = jitter.0.as_nanos().min(u64::MAX as u128) as u64;
        std::time::Duration::from_nanos(mixed % nanos)
    }
}

/// What a business-day form counts before its named calendar is attached.
static WEEKDAYS_UTC: std::sync::LazyLock<Calendar> =
    std::sync::LazyLock::new(|| Calendar::weekdays_in(Tz::UTC));

/// A schedule's nominal instants with its bounds (epoch, start, end), counts aside: what the
/// calendar logic walks.
/// `since_epoch` false: every instant the bounds allow, however long before the schedule was
/// set (a backfill's).
struct Bounded<'a> {
    schedule: &'a Schedule,
    since_epoch: bool,
}

impl<'a> Bounded<'a> {
    fn owed(schedule: &'a Schedule) -> Self {
        Bounded {
            schedule,
            since_epoch: true,
        }
    }
}

impl business::Nominal for Bounded<'_> {
    fn next(&self, after: Instant) -> Option<Instant> {
        if self.since_epoch {
            return self.schedule.nominal_next_after(after, 0);
        }
        let next = self.schedule.kind_next_after(after)?;
        let limits = self.schedule.limits.as_deref();
        if limits.and_then(|l| l.start).is_some_and(|s| next < s)
            || limits.and_then(|l| l.end).is_some_and(|e| next > e)
        {
            // Before `start`: the first instant from it on; past `end`: none.
            let start = limits.and_then(|l| l.start).filter(|s| next < *s)?;
            return self.next(start - Duration::nanoseconds(1));
        }
        Some(next)
    }
}

/// The first point of the grid `anchor + k * period` (k any integer) strictly after `after`.
/// In microseconds (anchors and periods are whole microseconds), which reach across every
/// date chrono holds, where nanoseconds in an i64 would overflow about 292 years out.
fn every_next_after(anchor: Instant, period: Duration, after: Instant) -> Option<Instant> {
    let period_us = i128::from(period.num_microseconds()?.max(1));
    let anchor_us = i128::from(anchor.timestamp_micros());
    let offset = i128::from(after.timestamp_micros()) - anchor_us;
    let k = offset.div_euclid(period_us) + 1;
    let us = i64::try_from(anchor_us + k * period_us).ok()?;
    chrono::DateTime::from_timestamp_micros(us)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Instant {
        s.parse().unwrap()
    }

    fn spec_every(every: &str) -> ScheduleSpec {
        ScheduleSpec {
            every: Some(every.parse().unwrap()),
            ..Default::default()
        }
    }

    fn field_of(spec: &ScheduleSpec) -> String {
        let epoch = t("2026-01-01T00:00:00Z");
        match Schedule::compile(Some(spec), epoch) {
            Ok(_) => "accepted".to_string(),
            Err(e) => e.field,
        }
    }

    #[test]
    fn a_short_preview_says_why() {
        let cron = |expr: &str| {
            let spec = ScheduleSpec {
                cron: Some(expr.into()),
                ..Default::default()
            };
            Schedule::compile(Some(&spec), t("2026-01-01T00:00:00Z")).unwrap()
        };
        let yearly = cron("0 0 1 1 *");
        let from = t("2199-06-01T00:00:00Z");
        assert!(yearly.preview(from, 0, 3).is_empty());
        assert_eq!(
            yearly.preview_end(from),
            "no instant after 2199-06-01 00:00:00 UTC: cron schedules end with the year 2199"
        );
        let once = cron("0 0 0 1 1 * 2027");
        let last = once.preview(t("2026-01-01T00:00:00Z"), 0, 3);
        assert_eq!(last, [t("2027-01-01T00:00:00Z")]);
        assert_eq!(
            once.preview_end(last[0]),
            "the schedule names no instant after 2027-01-01 00:00:00 UTC"
        );
    }

    #[test]
    fn every_reaches_far_from_its_anchor() {
        // Over 292 years from the anchor, nanoseconds in an i64 overflow; microseconds do not.
        let mut spec = spec_every("1h");
        spec.anchor = Some(t("1970-01-01T00:30:00Z"));
        let s = Schedule::compile(Some(&spec), t("2026-01-01T00:00:00Z")).unwrap();
        assert_eq!(
            s.next_after(t("2500-06-01T10:00:00Z"), 0),
            Some(t("2500-06-01T10:30:00Z"))
        );
        let century = Schedule::compile(Some(&spec_every("100years")), t("2026-01-01T00:00:00Z"));
        assert!(century.unwrap().first().is_some());
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let mut anchor = spec_every("1h");
        anchor.anchor = Some(t("1700-01-01T00:00:00Z"));
        assert_eq!(field_of(&anchor), "schedule.anchor");
        assert_eq!(field_of(&spec_every("300years")), "schedule.every");
        assert_eq!(field_of(&spec_every("1s500ns")), "schedule.every");
        let at = |s: &str| ScheduleSpec {
            at: Some(t(s)),
            ..Default::default()
        };
        assert_eq!(field_of(&at("1969-12-31T23:59:59Z")), "schedule.at");
        assert_eq!(field_of(&at("2030-01-01T00:00:00.123456789Z")), "accepted");
        let jitter = |every: &str, jitter: &str| ScheduleSpec {
            jitter: Some(jitter.parse().unwrap()),
            ..spec_every(every)
        };
        assert_eq!(field_of(&jitter("1m", "500years")), "schedule.jitter");
        assert_eq!(field_of(&jitter("1m", "2m")), "schedule.jitter");
        assert_eq!(field_of(&jitter("1d", "2h")), "schedule.jitter");
        assert_eq!(field_of(&jitter("1m", "1m")), "accepted");
        let cron = ScheduleSpec {
            cron: Some("0 * * * *".into()),
            jitter: Some("61m".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(field_of(&cron), "schedule.jitter");
        let iso = ScheduleSpec {
            iso8601: Some("R/2026-01-01T00:00:00.0000001Z/PT1M".into()),
            ..Default::default()
        };
        assert_eq!(field_of(&iso), "schedule.iso8601");
    }

    #[test]
    fn instants_are_kept_to_the_microsecond() {
        let s = Schedule::compile(Some(&spec_every("1s")), t("2026-01-01T00:00:00.123456789Z"));
        assert_eq!(s.unwrap().first(), Some(t("2026-01-01T00:00:01.123456Z")));
        let mut spec = ScheduleSpec {
            at: Some(t("2030-01-01T00:00:00.123456789Z")),
            ..Default::default()
        };
        let s = Schedule::compile(Some(&spec), t("2026-01-01T00:00:00Z"));
        assert_eq!(s.unwrap().first(), Some(t("2030-01-01T00:00:00.123456Z")));
        spec.normalize();
        assert_eq!(spec.at, Some(t("2030-01-01T00:00:00.123456Z")));
    }

    #[test]
    fn every_fires_on_its_grid_after_the_epoch() {
        let epoch = t("2026-01-01T00:00:00.300Z");
        let s = Schedule::compile(Some(&spec_every("1s")), epoch).unwrap();
        assert_eq!(s.first(), Some(t("2026-01-01T00:00:01.300Z")));
        assert_eq!(
            s.next_after(t("2026-01-01T00:00:05.300Z"), 5),
            Some(t("2026-01-01T00:00:06.300Z"))
        );
        let mut anchored = spec_every("1m");
        anchored.anchor = Some(t("2020-01-01T00:00:00Z"));
        let s = Schedule::compile(Some(&anchored), epoch).unwrap();
        assert_eq!(s.first(), Some(t("2026-01-01T00:01:00Z")));
    }

    #[test]
    fn bounds_end_a_schedule() {
        let epoch = t("2026-01-01T00:00:00Z");
        let mut spec = spec_every("10s");
        spec.start = Some(t("2026-01-01T00:01:00Z"));
        spec.end = Some(t("2026-01-01T00:01:30Z"));
        let s = Schedule::compile(Some(&spec), epoch).unwrap();
        assert_eq!(
            s.preview(epoch, 0, 10),
            vec![
                t("2026-01-01T00:01:00Z"),
                t("2026-01-01T00:01:10Z"),
                t("2026-01-01T00:01:20Z"),
                t("2026-01-01T00:01:30Z"),
            ]
        );
        spec.end = None;
        spec.max_runs = Some(2);
        let s = Schedule::compile(Some(&spec), epoch).unwrap();
        assert_eq!(s.preview(epoch, 0, 10).len(), 2);
        assert_eq!(s.next_after(epoch, 2), None);
    }

    #[test]
    fn at_fires_once() {
        let epoch = t("2026-01-01T00:00:00Z");
        let spec = ScheduleSpec {
            at: Some(t("2026-01-02T00:00:00Z")),
            ..Default::default()
        };
        let s = Schedule::compile(Some(&spec), epoch).unwrap();
        assert_eq!(s.first(), Some(t("2026-01-02T00:00:00Z")));
        assert_eq!(s.next_after(t("2026-01-02T00:00:00Z"), 1), None);
    }

    #[test]
    fn rejects_two_kinds_and_stray_fields() {
        let epoch = t("2026-01-01T00:00:00Z");
        let mut spec = spec_every("1s");
        spec.cron = Some("* * * * *".into());
        assert_eq!(
            Schedule::compile(Some(&spec), epoch).unwrap_err().field,
            "schedule"
        );
        let mut spec = spec_every("1s");
        spec.timezone = Some("Europe/London".into());
        assert_eq!(
            Schedule::compile(Some(&spec), epoch).unwrap_err().field,
            "schedule.timezone"
        );
        assert_eq!(
            Schedule::compile(Some(&spec_every("1ms")), epoch)
                .unwrap_err()
                .field,
            "schedule.every"
        );
    }

    #[test]
    fn a_backfill_names_the_instants_before_the_schedule_was_set() {
        let epoch = t("2026-11-24T12:00:00Z");
        let hourly = Schedule::compile(Some(&spec_every("1h")), epoch).unwrap();
        // The grid passes through the epoch, back as well as forward; both ends count.
        assert_eq!(
            hourly.instants_between(t("2026-11-24T09:00:00Z"), t("2026-11-24T11:00:00Z"), 10),
            [
                t("2026-11-24T09:00:00Z"),
                t("2026-11-24T10:00:00Z"),
                t("2026-11-24T11:00:00Z")
            ]
        );
        assert_eq!(
            hourly
                .instants_between(t("2026-11-24T00:00:00Z"), t("2026-11-24T11:00:00Z"), 2)
                .len(),
            2,
            "at most the limit"
        );
        // Bounds apply; max_runs, a count of what the live schedule fires, does not.
        let bounded = ScheduleSpec {
            start: Some(t("2026-11-24T10:30:00Z")),
            max_runs: Some(1),
            ..spec_every("1h")
        };
        let bounded = Schedule::compile(Some(&bounded), epoch).unwrap();
        assert_eq!(
            bounded.instants_between(t("2026-11-24T09:00:00Z"), t("2026-11-24T13:00:00Z"), 10),
            [
                t("2026-11-24T11:00:00Z"),
                t("2026-11-24T12:00:00Z"),
                t("2026-11-24T13:00:00Z")
            ]
        );
        let london = ScheduleSpec {
            cron: Some("0 30 1 * * *".into()),
            timezone: Some("Europe/London".into()),
            ..Default::default()
        };
        let london = Schedule::compile(Some(&london), epoch).unwrap();
        // Across the change to winter time: 01:30 local is 00:30 UTC in summer, 01:30 after.
        assert_eq!(
            london.instants_between(t("2026-10-24T00:00:00Z"), t("2026-10-26T23:00:00Z"), 10),
            [
                t("2026-10-24T00:30:00Z"),
                t("2026-10-25T00:30:00Z"),
                t("2026-10-26T01:30:00Z")
            ]
        );
        assert!(Schedule::manual(epoch)
            .instants_between(t("2026-01-01T00:00:00Z"), epoch, 10)
            .is_empty());
    }

    #[test]
    fn an_event_schedule_has_no_timer() {
        let epoch = t("2026-01-01T00:00:00Z");
        let event = |extra: ScheduleSpec| ScheduleSpec {
            event: Some("sales.ready".into()),
            ..extra
        };
        let schedule = Schedule::compile(Some(&event(ScheduleSpec::default())), epoch).unwrap();
        assert!(schedule.is_manual());
        let field = |spec: ScheduleSpec| Schedule::compile(Some(&spec), epoch).unwrap_err().field;
        assert_eq!(
            field(event(ScheduleSpec {
                max_runs: Some(3),
                ..Default::default()
            })),
            "schedule.event"
        );
        assert_eq!(
            field(event(ScheduleSpec {
                every: Some(HumanDuration::from_secs(5)),
                ..Default::default()
            })),
            "schedule"
        );
        assert_eq!(
            field(ScheduleSpec {
                event: Some("no spaces".into()),
                ..Default::default()
            }),
            "schedule.event"
        );
    }

    #[test]
    fn a_schedule_that_names_no_kind_is_rejected() {
        let epoch = t("2026-01-01T00:00:00Z");
        let refused = |spec: ScheduleSpec| {
            let e = Schedule::compile(Some(&spec), epoch).unwrap_err();
            assert_eq!(e.field, "schedule", "{spec:?}");
            assert_eq!(
                e.message,
                "give exactly one of cron, every, iso8601, at, event, business_day or \
                 every_business_days",
                "{spec:?}"
            );
        };
        // `{"schedule": {}}`
        refused(ScheduleSpec::default());
        // Bounds, a limit or jitter do not make a schedule on their own.
        refused(ScheduleSpec {
            start: Some(t("2026-02-01T00:00:00Z")),
            ..Default::default()
        });
        refused(ScheduleSpec {
            end: Some(t("2026-02-01T00:00:00Z")),
            ..Default::default()
        });
        refused(ScheduleSpec {
            max_runs: Some(3),
            ..Default::default()
        });
        refused(ScheduleSpec {
            jitter: Some("10s".parse().unwrap()),
            ..Default::default()
        });
        // Nor do the options of one kind without it.
        refused(ScheduleSpec {
            timezone: Some("Europe/London".into()),
            ..Default::default()
        });
        refused(ScheduleSpec {
            anchor: Some(epoch),
            ..Default::default()
        });
        let parsed: ScheduleSpec = serde_json::from_str("{}").unwrap();
        refused(parsed);

        // No schedule at all is a manual job.
        let manual = Schedule::compile(None, epoch).unwrap();
        assert!(manual.is_manual());
        assert_eq!(manual.first(), None);

        // The same through a whole job definition.
        let job = |json: &str| {
            serde_json::from_str::<crate::job::JobSpec>(json)
                .unwrap()
                .validate(Some("j"), epoch)
        };
        let target = r#""target": {"shell": {"command": "true"}}"#;
        let valid = job(&format!("{{{target}}}")).unwrap();
        assert!(valid.schedule.is_manual());
        let valid = job(&format!(r#"{{"schedule": null, {target}}}"#)).unwrap();
        assert!(valid.schedule.is_manual());
        for schedule in [
            r#"{}"#,
            r#"{"start": "2026-02-01T00:00:00Z", "max_runs": 2}"#,
        ] {
            let e = job(&format!(r#"{{"schedule": {schedule}, {target}}}"#)).unwrap_err();
            assert_eq!(e.field, "schedule", "{schedule}");
        }
    }

    #[test]
    fn jitter_is_bounded_and_stable() {
        let epoch = t("2026-01-01T00:00:00Z");
        let mut spec = spec_every("1m");
        spec.jitter = Some("10s".parse().unwrap());
        let s = Schedule::compile(Some(&spec), epoch).unwrap();
        for seed in 0..100 {
            let j = s.jitter_offset(seed, epoch);
            assert!(j < std::time::Duration::from_secs(10));
            assert_eq!(j, s.jitter_offset(seed, epoch));
        }
    }
}

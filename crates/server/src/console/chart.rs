//! Charts over time for the console's pages, drawn on the server as SVG: nice value ticks
//! (steps of 1, 2 or 5 times a power of ten, in the unit the largest value reads in), time
//! ticks at round instants (seconds, minutes, hours or days, chosen by the span), and a chart
//! of lines with points or of bars with labelled axes, gridlines and each point's exact
//! figures in its `<title>`. Plain functions over the figures a page hands in: this module
//! reads nothing from the API or the store and holds no page's wording beyond the axes.

use super::layout::millis;
use chrono::{DateTime, Duration as Span, TimeZone, Utc};
use chrono_tz::Tz;
use maud::{html, Markup};
use sked_core::Instant;

/// What the values of a chart are, for their ticks and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Milliseconds, read as ms, s, min or h.
    Millis,
    /// A count: whole numbers.
    Count,
}

impl Unit {
    pub fn label(self, value: f64) -> String {
        match self {
            Unit::Millis => millis(value),
            Unit::Count => format!("{}", value.round() as i64),
        }
    }
}

/// The smallest step of 1, 2 or 5 times a power of ten that is at least `raw` (1 for
/// anything not positive or not finite).
pub fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|step| *step >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

/// Ticks from 0 to at least `max`, about `target` of them (at least 2), at a nice step in
/// the unit `max` reads in: for milliseconds, ms below a second, s below two minutes, min
/// below two hours, h above; for a count, whole numbers.
pub fn value_ticks(max: f64, unit: Unit, target: usize) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let scale = match unit {
        Unit::Count => 1.0,
        Unit::Millis if max < 1000.0 => 1.0,
        Unit::Millis if max < 120_000.0 => 1000.0,
        Unit::Millis if max < 7_200_000.0 => 60_000.0,
        Unit::Millis => 3_600_000.0,
    };
    let intervals = target.max(2) - 1;
    // Never finer than one of the unit: a millisecond, a second, …, or one of a count.
    let step = nice_step(max / scale / intervals as f64).max(1.0) * scale;
    let count = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// Steps time ticks may take, in seconds: each a round number of its unit.
const TIME_STEPS: &[i64] = &[
    1, 2, 5, 10, 15, 30, // seconds
    60, 120, 300, 600, 900, 1800, // minutes
    3600, 7200, 10_800, 21_600, 43_200, // hours
    86_400, 172_800, 604_800, // days
];

/// Ticks at round instants of `zone`'s wall clock between `from` and `to` (both included when
/// round), at most about `target` of them: the smallest step of [`TIME_STEPS`] that needs no
/// more, each tick a whole multiple of it on that clock (so minutes at :00, hours on the hour,
/// days at the zone's midnight). With the step, in seconds. A wall time a daylight saving
/// change skips has no tick.
pub fn time_ticks(from: Instant, to: Instant, target: usize, zone: Tz) -> (Vec<Instant>, i64) {
    let (from, to) = if to < from { (to, from) } else { (from, to) };
    let span = (to - from).num_seconds().max(1);
    let target = target.max(1) as i64;
    let step = TIME_STEPS
        .iter()
        .copied()
        .find(|step| span / step <= target)
        .unwrap_or_else(|| {
            let days = (span / 86_400 / target).max(1);
            days * 86_400
        });
    // Seconds of the wall clock, counted as if it were UTC.
    let wall = |t: Instant| t.with_timezone(&zone).naive_local().and_utc().timestamp();
    let start = wall(from);
    let first = start.div_euclid(step) * step
        + if start.rem_euclid(step) == 0 && from.timestamp_subsec_nanos() == 0 {
            0
        } else {
            step
        };
    let mut ticks = Vec::new();
    let mut at = first;
    while at <= wall(to) && ticks.len() <= target as usize + 1 {
        let instant = chrono::DateTime::from_timestamp(at, 0)
            .and_then(|t| zone.from_local_datetime(&t.naive_utc()).earliest())
            .map(|t| t.with_timezone(&Utc));
        if let Some(t) = instant.filter(|t| *t >= from && *t <= to) {
            ticks.push(t);
        }
        at += step;
    }
    (ticks, step)
}

/// A tick's label for a step of `step` seconds, on `zone`'s wall clock: seconds shown only
/// when the step has them, the date at days and at midnight.
pub fn time_label(t: Instant, step: i64, zone: Tz) -> String {
    let local = t.with_timezone(&zone);
    let midnight = local.naive_local().and_utc().timestamp().rem_euclid(86_400) == 0;
    if step >= 86_400 || midnight {
        local.format("%m-%d").to_string()
    } else if step >= 60 {
        local.format("%H:%M").to_string()
    } else {
        local.format("%H:%M:%S").to_string()
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mark {
    /// A line through its points, and a dot at each.
    Line,
    /// A bar per point, from its instant for `width`.
    Bars { width: Span },
}

/// One figure of a series.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub at: Instant,
    pub value: f64,
    /// Its class (a run's state, say), for its colour.
    pub class: String,
    /// More for its title ("succeeded").
    pub note: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// The series' class, for its colour and its key.
    pub class: String,
    pub mark: Mark,
    /// Oldest first.
    pub points: Vec<Point>,
}

/// A chart: what it shows (its accessible name), its axes' titles, its unit, the zone its
/// time axis and titles read in, and its series.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub label: String,
    pub value_axis: String,
    /// What the time axis counts ("instant"); the zone's name is added.
    pub time_axis: String,
    pub unit: Unit,
    pub zone: Tz,
    pub series: Vec<Series>,
}

/// The drawing's size and the plot's margins, in its own units (it scales to the page).
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 62.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 40.0;

/// Dots and bars drawn at most per series (the newest).
pub const MAX_POINTS: usize = 2000;

fn f(v: f64) -> String {
    format!("{v:.1}")
}

/// The chart as an SVG in a `figure`, with a key of its series; `None` when it has no point.
pub fn render(chart: &Chart) -> Option<Markup> {
    let series: Vec<(&Series, &[Point])> = chart
        .series
        .iter()
        .map(|s| {
            let skip = s.points.len().saturating_sub(MAX_POINTS);
            (s, &s.points[skip..])
        })
        .collect();
    let all = || series.iter().flat_map(|(_, points)| points.iter());
    let start = all().map(|p| p.at).min()?;
    let mut end = all().map(|p| p.at).max()?;
    for (s, points) in &series {
        if let (Mark::Bars { width }, Some(last)) = (s.mark, points.last()) {
            end = end.max(last.at + width);
        }
    }
    let (start, end) = if end <= start {
        (start - Span::seconds(30), start + Span::seconds(30))
    } else {
        (start, end)
    };
    let largest = all()
        .map(|p| p.value)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ticks = value_ticks(largest, chart.unit, 5);
    let top = ticks.last().copied().unwrap_or(1.0).max(f64::MIN_POSITIVE);
    let zone = chart.zone;
    let (times, step) = time_ticks(start, end, 6, zone);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let span_ms = (end - start).num_milliseconds().max(1) as f64;
    let x = |t: DateTime<Utc>| LEFT + (t - start).num_milliseconds() as f64 / span_ms * plot_w;
    let y = |v: f64| TOP + plot_h - (v.max(0.0) / top) * plot_h;
    let stamp = |t: Instant| {
        t.with_timezone(&zone)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string()
    };
    Some(html! {
        figure.chart.axes {
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" aria-label=(chart.label) {
                text.axis-title x=(f(LEFT)) y="12" { (chart.value_axis) }
                g.grid {
                    @for v in &ticks {
                        line x1=(f(LEFT)) x2=(f(WIDTH - RIGHT)) y1=(f(y(*v))) y2=(f(y(*v))) {}
                    }
                    @for t in &times {
                        line x1=(f(x(*t))) x2=(f(x(*t))) y1=(f(TOP)) y2=(f(TOP + plot_h)) {}
                    }
                }
                g.axis.value-axis {
                    line x1=(f(LEFT)) x2=(f(LEFT)) y1=(f(TOP)) y2=(f(TOP + plot_h)) {}
                    @for v in &ticks {
                        text x=(f(LEFT - 6.0)) y=(f(y(*v) + 4.0)) text-anchor="end" { (chart.unit.label(*v)) }
                    }
                }
                g.axis.time-axis {
                    line x1=(f(LEFT)) x2=(f(WIDTH - RIGHT)) y1=(f(TOP + plot_h)) y2=(f(TOP + plot_h)) {}
                    @for t in &times {
                        text x=(f(x(*t))) y=(f(TOP + plot_h + 16.0)) text-anchor="middle" { (time_label(*t, step, zone)) }
                    }
                }
                text.axis-title x=(f(LEFT + plot_w / 2.0)) y=(f(HEIGHT - 4.0)) text-anchor="middle" { (chart.time_axis) " (" (zone.name()) ")" }
                @for (s, points) in &series {
                    g class={ "series " (s.class) } {
                        @match s.mark {
                            Mark::Bars { width } => {
                                @for p in points.iter() {
                                    @let (x0, x1) = (x(p.at), x(p.at + width));
                                    rect class={ "bar " (p.class) } x=(f(x0)) width=(f((x1 - x0 - 1.0).max(1.0)))
                                        y=(f(y(p.value))) height=(f((TOP + plot_h - y(p.value)).max(0.0))) {
                                        title { (stamp(p.at)) " · " (s.name) " " (chart.unit.label(p.value))
                                            @if !p.note.is_empty() { " · " (p.note) } }
                                    }
                                }
                            }
                            Mark::Line => {
                                polyline.line points=(points.iter().map(|p| format!("{},{}", f(x(p.at)), f(y(p.value)))).collect::<Vec<_>>().join(" ")) {}
                                @for p in points.iter() {
                                    circle class={ "point " (p.class) } cx=(f(x(p.at))) cy=(f(y(p.value))) r="3.5" {
                                        title { (stamp(p.at)) " · " (s.name) " " (chart.unit.label(p.value))
                                            @if !p.note.is_empty() { " · " (p.note) } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            figcaption {
                @for (i, (s, points)) in series.iter().enumerate() {
                    @if i > 0 { " · " }
                    span class={ "key " (s.class) } { (s.name) }
                    " (" (points.len()) ", up to "
                    (chart.unit.label(points.iter().map(|p| p.value).fold(0.0, f64::max))) ")"
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Instant {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.0), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(nice_step(180.0), 200.0);
        assert_eq!(nice_step(0.03), 0.05);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(f64::NAN), 1.0);
    }

    #[test]
    fn value_ticks_cover_the_range_at_a_nice_step() {
        for (max, unit) in [
            (0.0, Unit::Millis),
            (7.0, Unit::Millis),
            (930.0, Unit::Millis),
            (1500.0, Unit::Millis),
            (59_000.0, Unit::Millis),
            (400_000.0, Unit::Millis),
            (9_000_000.0, Unit::Millis),
            (3.0, Unit::Count),
            (1234.0, Unit::Count),
        ] {
            let ticks = value_ticks(max, unit, 5);
            assert_eq!(ticks[0], 0.0);
            assert!(*ticks.last().unwrap() >= max, "{max}: {ticks:?}");
            assert!(ticks.len() >= 2 && ticks.len() <= 7, "{max}: {ticks:?}");
            let step = ticks[1];
            let scale = [1.0, 1000.0, 60_000.0, 3_600_000.0]
                .into_iter()
                .rev()
                .find(|s| step >= *s && (step / s).fract() == 0.0)
                .unwrap_or(1.0);
            let mantissa = step / scale / 10f64.powf((step / scale).log10().floor());
            assert!(
                [1.0, 2.0, 5.0].iter().any(|m| (m - mantissa).abs() < 1e-9),
                "{max}: step {step}"
            );
            // Each step is the same, and the top is less than a step past the range.
            assert!(ticks
                .windows(2)
                .all(|w| ((w[1] - w[0]) - step).abs() < 1e-6));
            assert!(*ticks.last().unwrap() - step < max.max(1.0));
        }
        // Labels read in their unit.
        let labels: Vec<String> = value_ticks(1500.0, Unit::Millis, 5)
            .into_iter()
            .map(|v| Unit::Millis.label(v))
            .collect();
        assert_eq!(labels, ["0 ms", "1.0 s", "2.0 s"]);
        assert_eq!(value_ticks(3.0, Unit::Count, 5), [0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn time_ticks_fall_on_round_instants() {
        // 90 minutes: every 15 minutes, on the quarter hour.
        let (ticks, step) = time_ticks(
            at("2026-03-01T10:07:13Z"),
            at("2026-03-01T11:37:00Z"),
            6,
            Tz::UTC,
        );
        assert_eq!(step, 900);
        assert_eq!(ticks[0], at("2026-03-01T10:15:00Z"));
        assert_eq!(*ticks.last().unwrap(), at("2026-03-01T11:30:00Z"));
        assert_eq!(time_label(ticks[0], step, Tz::UTC), "10:15");

        // A minute: every 10 seconds, seconds shown.
        let (ticks, step) = time_ticks(
            at("2026-03-01T10:00:05Z"),
            at("2026-03-01T10:01:05Z"),
            6,
            Tz::UTC,
        );
        assert_eq!(step, 10);
        assert!(ticks.iter().all(|t| t.timestamp() % 10 == 0));
        assert_eq!(time_label(ticks[0], step, Tz::UTC), "10:00:10");

        // Three days: at midnight, labelled by date.
        let (ticks, step) = time_ticks(
            at("2026-03-01T10:00:00Z"),
            at("2026-03-04T09:00:00Z"),
            6,
            Tz::UTC,
        );
        assert_eq!(step, 43_200);
        assert!(ticks.iter().all(|t| t.timestamp() % 43_200 == 0));
        assert_eq!(
            time_label(at("2026-03-02T00:00:00Z"), step, Tz::UTC),
            "03-02"
        );
        let (ticks, step) = time_ticks(
            at("2026-03-01T00:00:00Z"),
            at("2026-03-20T00:00:00Z"),
            6,
            Tz::UTC,
        );
        assert_eq!(step, 604_800);
        assert!(ticks.iter().all(|t| t.timestamp() % 86_400 == 0));

        // Every tick lies in the range, and there are never too many.
        for (from, to) in [
            ("2026-03-01T10:00:00Z", "2026-03-01T10:00:00Z"),
            ("2026-03-01T10:00:00Z", "2027-03-01T10:00:00Z"),
            ("2026-03-01T10:00:00.5Z", "2026-03-01T10:00:03Z"),
        ] {
            let (from, to) = (at(from), at(to));
            for zone in [Tz::UTC, Tz::Asia__Kolkata, Tz::America__New_York] {
                let (ticks, _) = time_ticks(from, to, 6, zone);
                assert!(ticks.len() <= 8, "{ticks:?}");
                assert!(ticks.iter().all(|t| *t >= from && *t <= to));
            }
        }
    }

    #[test]
    fn time_ticks_fall_on_the_round_instants_of_the_zone_read_in() {
        // Three days in Tokyo (UTC+9): at Tokyo's midnight, 15:00 UTC, labelled by its date.
        let tokyo = Tz::Asia__Tokyo;
        let (ticks, step) = time_ticks(
            at("2026-03-01T10:00:00Z"),
            at("2026-03-04T09:00:00Z"),
            6,
            tokyo,
        );
        assert_eq!(step, 43_200);
        assert_eq!(ticks[0], at("2026-03-01T15:00:00Z"));
        assert_eq!(time_label(ticks[0], step, tokyo), "03-02");
        // Half-hour offsets round on their own clock: 10:15 in Kolkata is 04:45 UTC.
        let kolkata = Tz::Asia__Kolkata;
        let (ticks, step) = time_ticks(
            at("2026-03-01T04:37:13Z"),
            at("2026-03-01T06:07:00Z"),
            6,
            kolkata,
        );
        assert_eq!(step, 900);
        assert_eq!(ticks[0], at("2026-03-01T04:45:00Z"));
        assert_eq!(time_label(ticks[0], step, kolkata), "10:15");
        // The hour New York skips on 2026-03-08 (02:00 to 03:00) has no tick, and the ticks
        // around it are still on the hour.
        let new_york = Tz::America__New_York;
        let (ticks, step) = time_ticks(
            at("2026-03-08T05:30:00Z"),
            at("2026-03-08T09:30:00Z"),
            6,
            new_york,
        );
        assert_eq!(step, 3600);
        let labels: Vec<String> = ticks
            .iter()
            .map(|t| time_label(*t, step, new_york))
            .collect();
        assert_eq!(labels, ["01:00", "03:00", "04:00", "05:00"]);
    }

    #[test]
    fn a_chart_labels_its_axes_and_titles_each_point() {
        let point = |at_: &str, value: f64| Point {
            at: at(at_),
            value,
            class: "succeeded".into(),
            note: "succeeded".into(),
        };
        let chart = Chart {
            label: "Duration".into(),
            value_axis: "duration".into(),
            time_axis: "instant".into(),
            unit: Unit::Millis,
            zone: Tz::UTC,
            series: vec![
                Series {
                    name: "duration".into(),
                    class: "duration".into(),
                    mark: Mark::Line,
                    points: vec![
                        point("2026-03-01T10:00:00Z", 800.0),
                        point("2026-03-01T10:05:00Z", 1500.0),
                    ],
                },
                Series {
                    name: "runs".into(),
                    class: "runs".into(),
                    mark: Mark::Bars {
                        width: Span::minutes(1),
                    },
                    points: vec![point("2026-03-01T10:01:00Z", 2.0)],
                },
            ],
        };
        let svg = render(&chart).unwrap().into_string();
        assert!(svg.contains("2.0 s"), "value ticks: {svg}");
        assert!(
            svg.contains(">10:01<") || svg.contains(">10:02<"),
            "time ticks: {svg}"
        );
        assert!(svg.contains("instant (UTC)"));
        assert!(svg.contains("<title>2026-03-01 10:05:00 UTC · duration 1.5 s · succeeded</title>"));
        assert_eq!(svg.matches("<circle").count(), 2);
        assert_eq!(svg.matches("<rect").count(), 1);
        let empty = Chart {
            series: vec![],
            ..chart
        };
        assert!(render(&empty).is_none());
    }
}

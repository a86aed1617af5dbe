//! The runs grid (`/grid`): a namespace's jobs as rows, the instants of a window as columns,
//! each cell a run coloured by its state that links to its page. It reads one page of
//! `GET /api/v1/runs/grid` as the visitor, so the job list's filters and cursor, the bounds and
//! the namespaces the visitor reaches are the API's.
//!
//! It owns the window choices, how instants become at most [`MAX_COLUMNS`] columns (bucketed
//! in time when there are more) and the cells' compact markup; it holds no rule of the API's and
//! must not read the store or change anything.

use super::{chosen, job_href, refused};
use crate::console::api::query;
use crate::console::layout::{self, millis};
use crate::console::{Console, Visitor};
use axum::extract::{Query, State};
use axum::response::Response;
use chrono::{Datelike, Duration, SecondsFormat, Timelike, Utc};
use chrono_tz::Tz;
use maud::{html, Markup, PreEscaped};
use serde::Deserialize;
use sked_core::Instant;
use std::fmt::Write as _;

/// Columns a grid shows at most; more instants share columns.
pub const MAX_COLUMNS: usize = 100;

/// The windows the page offers: the query value, its words, its length.
const WINDOWS: [(&str, &str, i64); 5] = [
    ("1h", "last hour", 3_600),
    ("6h", "last 6 hours", 6 * 3_600),
    ("1d", "last day", 86_400),
    ("7d", "last week", 7 * 86_400),
    ("31d", "last 31 days", 31 * 86_400),
];

/// Jobs a page may hold, as offered; the first is the default.
const ROWS: [&str; 4] = ["100", "50", "200", "500"];

#[derive(Debug, Default, Deserialize)]
pub struct Filters {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    search: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    label: String,
    #[serde(default)]
    window: String,
    #[serde(default)]
    rows: String,
    #[serde(default)]
    cursor: String,
}

#[derive(Debug, Deserialize)]
struct GridPage {
    jobs: Vec<Row>,
    next_cursor: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Row {
    name: String,
    state: String,
    runs: Vec<Cell>,
}

#[derive(Debug, Clone, Deserialize)]
struct Cell {
    id: i64,
    scheduled_for: Instant,
    state: String,
    started_at: Option<Instant>,
    finished_at: Option<Instant>,
}

/// The window a choice names, `[from, to)` ending at `now`; an unknown or empty choice is the
/// last day. With the choice's query value.
pub fn window(choice: &str, now: Instant) -> (&'static str, Instant, Instant) {
    let (value, _, secs) = WINDOWS
        .iter()
        .find(|(value, _, _)| *value == choice)
        .or_else(|| WINDOWS.get(2))
        .copied()
        .unwrap_or(("1d", "last day", 86_400));
    (value, now - Duration::seconds(secs), now)
}

/// A column of the grid: the instants from `first` to `last`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub first: Instant,
    pub last: Instant,
}

/// The columns for `instants`, oldest first: one per distinct instant when there are at most
/// `max`, otherwise `max` equal spans of time between the oldest and the newest, those no
/// instant falls in left out. Each column is as narrow as the instants in it.
pub fn columns(instants: &[Instant], max: usize) -> Vec<Column> {
    let mut sorted = instants.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (Some(&oldest), Some(&newest)) = (sorted.first(), sorted.last()) else {
        return Vec::new();
    };
    if max == 0 {
        return Vec::new();
    }
    if sorted.len() <= max {
        return sorted
            .into_iter()
            .map(|t| Column { first: t, last: t })
            .collect();
    }
    let span = (newest - oldest)
        .num_microseconds()
        .unwrap_or(i64::MAX)
        .max(1) as i128;
    let buckets = max as i128;
    let mut out: Vec<(usize, Column)> = Vec::new();
    for t in sorted {
        let offset = (t - oldest).num_microseconds().unwrap_or(i64::MAX) as i128;
        let bucket = ((offset * buckets / span).min(buckets - 1)) as usize;
        match out.last_mut() {
            Some((b, column)) if *b == bucket => column.last = t,
            _ => out.push((bucket, Column { first: t, last: t })),
        }
    }
    out.into_iter().map(|(_, column)| column).collect()
}

/// The column `t` falls in, if any.
pub fn column_of(columns: &[Column], t: Instant) -> Option<usize> {
    let after = columns.partition_point(|c| c.first <= t);
    let index = after.checked_sub(1)?;
    (columns.get(index)?.last >= t).then_some(index)
}

/// The short class of a run state's colour (the badges' tones, told apart a little more).
pub fn tone(state: &str) -> &'static str {
    match state {
        "succeeded" => "g",
        "failed" | "timed_out" => "b",
        "running" => "r",
        "queued" | "waiting" => "w",
        "cancelled" => "c",
        "skipped" => "k",
        _ => "u",
    }
}

/// How long a run took, or has been running, in milliseconds; none before it started.
fn took_ms(cell: &Cell, now: Instant) -> Option<i64> {
    let start = cell.started_at?;
    Some(
        (cell.finished_at.unwrap_or(now) - start)
            .num_milliseconds()
            .max(0),
    )
}

/// The height class of a duration against the longest of its row: 1 to 4 quarters.
pub fn height(took: i64, longest: i64) -> u8 {
    if longest <= 0 {
        return 1;
    }
    let quarters = (took.max(0) as i128 * 4 + longest as i128 - 1) / longest as i128;
    quarters.clamp(1, 4) as u8
}

/// `text` for HTML text or a double-quoted attribute.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The cells of one row, written straight into `out` (there may be 50,000 of them: no markup
/// tree per cell). Every value but ids and classes is HTML-escaped.
fn write_row(out: &mut String, job: &str, runs: &[Cell], cols: &[Column], now: Instant, tz: Tz) {
    let mut slots: Vec<Option<(&Cell, usize)>> = vec![None; cols.len()];
    // Runs come newest first: a column keeps its newest run and counts the others.
    for cell in runs {
        let Some(slot) = column_of(cols, cell.scheduled_for).and_then(|i| slots.get_mut(i)) else {
            continue;
        };
        match slot.as_mut() {
            Some((_, more)) => *more += 1,
            None => *slot = Some((cell, 0)),
        }
    }
    let longest = runs
        .iter()
        .filter_map(|c| took_ms(c, now))
        .max()
        .unwrap_or(0);
    let job = escape(job);
    for slot in slots {
        let Some((cell, more)) = slot else {
            out.push_str("<td></td>");
            continue;
        };
        // Written piece by piece, without a format string per instant: a page may hold
        // 50,000 of these.
        let took = took_ms(cell, now);
        let t = cell.scheduled_for.with_timezone(&tz);
        let _ = write!(
            out,
            "<td><a class=\"{} h{}\" href=\"/runs/{}\" title=\"{job} · {:04}-{:02}-{:02} {:02}:{:02}:{:02} · ",
            tone(&cell.state),
            took.map_or(1, |ms| height(ms, longest)),
            cell.id,
            t.year(),
            t.month(),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
        );
        out.push_str(&escape(&cell.state.replace('_', " ")));
        if let Some(ms) = took {
            out.push_str(" · ");
            out.push_str(&millis(ms as f64));
        }
        if more > 0 {
            let _ = write!(out, " (+{more} more in this column)");
        }
        out.push_str("\"></a></td>");
    }
}

pub async fn page(
    State(console): State<Console>,
    visitor: Visitor,
    Query(f): Query<Filters>,
) -> Response {
    let (namespace, known) = chosen(&console, &visitor, &f.namespace).await;
    let namespace = namespace.as_str();
    let now = Utc::now();
    let (window_value, from, to) = window(&f.window, now);
    let rows = ROWS
        .iter()
        .find(|r| **r == f.rows)
        .copied()
        .unwrap_or(ROWS[0]);
    let filters = [
        ("namespace", namespace),
        ("search", f.search.as_str()),
        ("state", &f.state),
        ("kind", &f.kind),
        ("label", &f.label),
        ("window", window_value),
        ("rows", rows),
    ];
    let with = |more: &[(&'static str, &str)]| {
        let mut pairs = filters.to_vec();
        pairs.extend_from_slice(more);
        query(&pairs)
    };
    // To the microsecond: a window cut to the second would leave out this second's runs.
    let from_text = from.to_rfc3339_opts(SecondsFormat::Micros, true);
    let to_text = to.to_rfc3339_opts(SecondsFormat::Micros, true);
    let path = format!(
        "/api/v1/runs/grid?{}",
        query(&[
            ("namespace", namespace),
            ("search", &f.search),
            ("state", &f.state),
            ("kind", &f.kind),
            ("label", &f.label),
            ("from", &from_text),
            ("to", &to_text),
            ("jobs", rows),
            ("instants", "100"),
            ("cursor", &f.cursor),
        ])
    );
    let grid: GridPage = match console.api.get(visitor.who(), &path).await {
        Ok(grid) => grid,
        Err(failure) => return refused(&console, &visitor, "Runs grid", failure),
    };
    let instants: Vec<Instant> = grid
        .jobs
        .iter()
        .flat_map(|j| j.runs.iter().map(|r| r.scheduled_for))
        .collect();
    let cols = columns(&instants, MAX_COLUMNS);
    let bucketed = cols.iter().any(|c| c.first != c.last);
    let label = header_format(&cols);
    // The heads and cells read in the visitor's zone (a job's own has no meaning across jobs).
    let tz = visitor.clock.tz();
    let mut body_rows = String::with_capacity(grid.jobs.len() * (cols.len() * 110 + 200));
    for job in &grid.jobs {
        let _ = write!(
            body_rows,
            "<tr><th scope=\"row\"><a href=\"{}\">{}</a>",
            escape(&job_href(namespace, &job.name)),
            escape(&job.name),
        );
        if job.state != "active" {
            let _ = write!(body_rows, " <small>{}</small>", escape(&job.state));
        }
        body_rows.push_str("</th>");
        write_row(&mut body_rows, &job.name, &job.runs, &cols, now, tz);
        body_rows.push_str("</tr>");
    }
    let first = format!("/grid?{}", with(&[]));
    let next = grid
        .next_cursor
        .as_deref()
        .map(|cursor| format!("/grid?{}", with(&[("cursor", cursor)])));
    let body = html! {
        form.filters method="get" action="/grid" role="search" {
            (super::job_filters(&known, namespace, &f.search, &f.state, &f.kind))
            label { "Label "
                input type="text" name="label" value=(f.label) maxlength="257"
                    placeholder="key=value";
            }
            label { "Window "
                select name="window" {
                    @for (value, label, _) in WINDOWS {
                        option value=(value) selected[window_value == value] { (label) }
                    }
                }
            }
            label { "Jobs "
                select name="rows" {
                    @for value in ROWS {
                        option value=(value) selected[rows == value] { (value) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
        p.hint {
            "Runs from " (visitor.clock.exact(Some(from), None)) " to " (visitor.clock.exact(Some(to), None)) ", the newest 100 of each job"
            @if bucketed { "; " (cols.len()) " columns, each a span of instants (a cell shows its newest run)" }
            "."
        }
        (legend())
        @if grid.jobs.is_empty() {
            p.empty { "No jobs match." }
        } @else {
            div.gw {
                table.grid {
                    thead { tr {
                        th.gj scope="col" { "Job" }
                        @for col in &cols {
                            th scope="col" title=(column_title(col, tz)) {
                                time datetime=(col.first.to_rfc3339_opts(SecondsFormat::Secs, true)) {
                                    (col.first.with_timezone(&tz).format(label))
                                }
                            }
                        }
                    } }
                    tbody { (PreEscaped(body_rows)) }
                }
            }
        }
        nav.pager aria-label="Pages" {
            @if !f.cursor.is_empty() {
                a href=(first) { "First page" }
            }
            @if let Some(next) = next { a rel="next" href=(next) { "Next page" } }
        }
    };
    layout::page(&console, &visitor, "Runs grid", body)
}

/// How the columns' heads write their instants: as short as tells neighbours apart, with the
/// day when the columns span more than one.
pub fn header_format(cols: &[Column]) -> &'static str {
    let days = cols
        .first()
        .zip(cols.last())
        .is_some_and(|(a, b)| a.first.date_naive() != b.last.date_naive());
    let same_minute = cols.windows(2).any(|w| {
        w[0].first.format("%Y%m%d%H%M").to_string() == w[1].first.format("%Y%m%d%H%M").to_string()
    });
    match (days, same_minute) {
        (false, false) => "%H:%M",
        (false, true) => "%H:%M:%S",
        (true, false) => "%d %H:%M",
        (true, true) => "%d %H:%M:%S",
    }
}

/// A column's instant, or the span of instants it gathers, in the visitor's zone `tz`.
fn column_title(col: &Column, tz: Tz) -> String {
    let format = "%Y-%m-%d %H:%M:%S %Z";
    let (first, last) = (col.first.with_timezone(&tz), col.last.with_timezone(&tz));
    if col.first == col.last {
        first.format(format).to_string()
    } else {
        format!("{} to {}", first.format(format), last.format(format))
    }
}

fn legend() -> Markup {
    html! {
        ul.gk aria-label="Colours" {
            @for (state, words) in [("succeeded", "succeeded"), ("failed", "failed or timed out"), ("running", "running"), ("queued", "queued or waiting"), ("cancelled", "cancelled"), ("skipped", "skipped")] {
                li { span class=(tone(state)) {} (words) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(secs: i64) -> Instant {
        Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + Duration::seconds(secs)
    }

    #[test]
    fn few_instants_are_a_column_each_oldest_first() {
        let cols = columns(&[t(5), t(1), t(5), t(3)], 100);
        assert_eq!(
            cols,
            [t(1), t(3), t(5)].map(|i| Column { first: i, last: i })
        );
        assert_eq!(column_of(&cols, t(3)), Some(1));
        assert_eq!(column_of(&cols, t(2)), None);
        assert_eq!(column_of(&cols, t(9)), None);
        assert!(columns(&[], 100).is_empty());
        assert!(columns(&[t(1)], 0).is_empty());
    }

    #[test]
    fn many_instants_share_columns_spanning_equal_times() {
        let instants: Vec<Instant> = (0..1000).map(t).collect();
        let cols = columns(&instants, 100);
        assert_eq!(cols.len(), 100);
        assert_eq!(
            cols[0],
            Column {
                first: t(0),
                last: t(9)
            }
        );
        assert_eq!(cols[99].last, t(999));
        for i in &instants {
            assert!(column_of(&cols, *i).is_some(), "{i} has a column");
        }
        // A gap leaves its spans out: fewer columns, every instant still in one.
        let gappy: Vec<Instant> = (0..150).chain(10_000..10_050).map(t).collect();
        let cols = columns(&gappy, 100);
        assert!(cols.len() < 100, "{}", cols.len());
        assert!(gappy.iter().all(|i| column_of(&cols, *i).is_some()));
        assert!(cols.windows(2).all(|w| w[0].last < w[1].first));
    }

    #[test]
    fn windows_end_now_and_default_to_a_day() {
        let now = t(1_000_000);
        assert_eq!(window("1h", now), ("1h", now - Duration::hours(1), now));
        assert_eq!(window("7d", now).1, now - Duration::days(7));
        assert_eq!(window("", now), ("1d", now - Duration::days(1), now));
        assert_eq!(window("forever", now).0, "1d");
    }

    #[test]
    fn heads_are_as_short_as_tells_columns_apart() {
        let at = |secs| Column {
            first: t(secs),
            last: t(secs),
        };
        assert_eq!(header_format(&[at(0), at(60)]), "%H:%M");
        assert_eq!(header_format(&[at(0), at(1)]), "%H:%M:%S");
        assert_eq!(header_format(&[at(0), at(86_400)]), "%d %H:%M");
        assert_eq!(header_format(&[at(0), at(1), at(86_400)]), "%d %H:%M:%S");
        assert_eq!(header_format(&[]), "%H:%M");
    }

    #[test]
    fn heights_are_quarters_of_the_rows_longest() {
        assert_eq!(height(0, 0), 1);
        assert_eq!(height(1, 100), 1);
        assert_eq!(height(26, 100), 2);
        assert_eq!(height(100, 100), 4);
        assert_eq!(height(500, 100), 4);
    }

    #[test]
    fn a_row_is_compact_escaped_and_keeps_a_columns_newest_run() {
        let cell = |id, secs, state: &str| Cell {
            id,
            scheduled_for: t(secs),
            state: state.into(),
            started_at: Some(t(secs)),
            finished_at: Some(t(secs + 2)),
        };
        let cols = [
            Column {
                first: t(0),
                last: t(1),
            },
            Column {
                first: t(5),
                last: t(5),
            },
            Column {
                first: t(9),
                last: t(9),
            },
        ];
        let mut out = String::new();
        let runs = [
            cell(3, 5, "failed"),
            cell(2, 1, "succeeded"),
            cell(1, 0, "timed_out"),
        ];
        write_row(&mut out, "a\"<b>", &runs, &cols, t(100), Tz::UTC);
        assert_eq!(
            out,
            "<td><a class=\"g h4\" href=\"/runs/2\" title=\"a&quot;&lt;b&gt; · 2026-03-01 00:00:01 · succeeded · 2.0 s (+1 more in this column)\"></a></td>\
             <td><a class=\"b h4\" href=\"/runs/3\" title=\"a&quot;&lt;b&gt; · 2026-03-01 00:00:05 · failed · 2.0 s\"></a></td>\
             <td></td>"
        );
        let mut tokyo = String::new();
        write_row(&mut tokyo, "a", &runs, &cols, t(100), Tz::Asia__Tokyo);
        assert!(tokyo.contains("2026-03-01 09:00:01"), "{tokyo}");
    }
}

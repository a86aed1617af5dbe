//! Dependencies between jobs: what a job's `depends_on` says, the window around a run's
//! instant, the check that no job waits on itself, and the verdict on a waiting run from what
//! its upstreams' runs did.
//!
//! A run of job D at instant T waits until, for every entry of D's `depends_on`, the upstream
//! job has a run whose instant lies in `[T - before, T + after]` and which ended in the awaited
//! state; an `any_of` entry needs one of its alternatives. Windows are durations on the UTC
//! time line, never wall-clock shifts: a window of `1h` before a 03:00 run is the hour before
//! it even across a DST change.
//!
//! Everything here is pure: the store gathers what each upstream did (`UpstreamRuns`) inside
//! its transaction and applies the `Verdict`.

use crate::duration::HumanDuration;
use crate::error::SpecError;
use crate::job::validate_name;
use crate::run::RunState;
use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

/// Entries in one job's `depends_on`.
pub const MAX_DEPENDENCIES: usize = 32;
/// Alternatives in one `any_of`.
pub const MAX_ALTERNATIVES: usize = 16;
/// The longest `before` or `after` of a window.
pub const MAX_WINDOW: Duration = Duration::from_secs(31 * 24 * 3600);
/// The longest `deps_timeout`.
pub const MAX_DEPS_TIMEOUT: Duration = Duration::from_secs(31 * 24 * 3600);
/// How long a run waits for its dependencies when the job does not say.
pub const DEFAULT_DEPS_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// One entry of `depends_on`: a job (`job`), an event (`event`), or alternatives (`any_of`),
/// one of which suffices.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DependencySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// An event key (`crate::event`): an event of that key recorded in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any_of: Option<Vec<DependencySpec>>,
    #[serde(default, skip_serializing_if = "Window::is_instant")]
    pub window: Window,
    #[serde(default, skip_serializing_if = "Awaited::is_default")]
    pub state: Awaited,
}

/// The stretch of time around a run's instant in which an upstream run counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    #[serde(default)]
    pub before: HumanDuration,
    #[serde(default)]
    pub after: HumanDuration,
}

impl Window {
    /// The window of no width: the upstream run must be for the very same instant.
    pub fn is_instant(&self) -> bool {
        self.before.0.is_zero() && self.after.0.is_zero()
    }

    /// The first and last instants (both included) of the window around `instant`.
    pub fn around(&self, instant: Instant) -> (Instant, Instant) {
        let from = instant
            .checked_sub_signed(self.before.as_chrono())
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let to = instant
            .checked_add_signed(self.after.as_chrono())
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        (from, to)
    }

    /// The instants of the dependant runs whose window holds an upstream run at `upstream`:
    /// T is one of them exactly when `upstream` lies in `[T - before, T + after]`.
    pub fn dependants_of(&self, upstream: Instant) -> (Instant, Instant) {
        Window {
            before: self.after,
            after: self.before,
        }
        .around(upstream)
    }
}

/// The state an upstream run must have ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Awaited {
    #[default]
    Succeeded,
    /// Any terminal state.
    Finished,
}

impl Awaited {
    fn is_default(&self) -> bool {
        *self == Awaited::Succeeded
    }

    /// Whether a run in `state` satisfies the wait.
    pub fn accepts(self, state: RunState) -> bool {
        match self {
            Awaited::Succeeded => state == RunState::Succeeded,
            Awaited::Finished => state.is_terminal(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Awaited::Succeeded => "succeeded",
            Awaited::Finished => "finished",
        }
    }
}

/// What a requirement waits for: a run of a job, or an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Upstream<'a> {
    Job(&'a str),
    Event(&'a str),
}

/// One upstream a run waits for: an entry of `depends_on` or one alternative of an `any_of`,
/// after validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement<'a> {
    pub upstream: Upstream<'a>,
    pub window: Window,
    pub state: Awaited,
}

impl DependencySpec {
    /// The requirement this entry states when it names a job or an event.
    fn requirement(&self) -> Option<Requirement<'_>> {
        let upstream = match (&self.job, &self.event) {
            (Some(job), _) => Upstream::Job(job),
            (None, Some(key)) => Upstream::Event(key),
            (None, None) => return None,
        };
        Some(Requirement {
            upstream,
            window: self.window,
            state: self.state,
        })
    }

    /// Its requirements: the one it states, or its alternatives'.
    pub fn alternatives(&self) -> Vec<Requirement<'_>> {
        match &self.any_of {
            Some(any_of) => any_of.iter().filter_map(Self::requirement).collect(),
            None => self.requirement().into_iter().collect(),
        }
    }
}

/// Every requirement of a `depends_on`, alternatives included.
pub fn requirements(depends_on: &[DependencySpec]) -> impl Iterator<Item = Requirement<'_>> {
    depends_on.iter().flat_map(DependencySpec::alternatives)
}

/// The instants of the runs of a job with `depends_on` whose windows hold a run of `upstream`
/// (or an event) at `instant` (the span over all its requirements on `upstream`); `None` when
/// it does not wait for `upstream`.
pub fn dependant_instants(
    depends_on: &[DependencySpec],
    upstream: Upstream<'_>,
    instant: Instant,
) -> Option<(Instant, Instant)> {
    requirements(depends_on)
        .filter(|r| r.upstream == upstream)
        .map(|r| r.window.dependants_of(instant))
        .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
}

/// The upstream job names of a `depends_on`, each once.
pub fn upstreams(depends_on: &[DependencySpec]) -> BTreeSet<String> {
    requirements(depends_on)
        .filter_map(|r| match r.upstream {
            Upstream::Job(job) => Some(job.to_string()),
            Upstream::Event(_) => None,
        })
        .collect()
}

/// The event keys a `depends_on` waits for, each once.
pub fn awaited_events(depends_on: &[DependencySpec]) -> BTreeSet<String> {
    requirements(depends_on)
        .filter_map(|r| match r.upstream {
            Upstream::Event(key) => Some(key.to_string()),
            Upstream::Job(_) => None,
        })
        .collect()
}

/// The most jobs [`downstream_count`] counts: a larger graph ranks as this.
pub const MAX_DOWNSTREAM: u32 = 100_000;

/// The work that waits downstream of `job`: how many distinct jobs depend on it, directly or
/// through others, each once however many paths lead to it (at most [`MAX_DOWNSTREAM`]).
/// `dependants_of` answers for a job what depends on it. What `priority: auto` ranks by.
pub fn downstream_count<E>(
    job: &str,
    mut dependants_of: impl FnMut(&str) -> Result<Vec<String>, E>,
) -> Result<u32, E> {
    let mut seen: HashSet<String> = HashSet::from([job.to_string()]);
    let mut frontier = vec![job.to_string()];
    let mut count = 0;
    while let Some(name) = frontier.pop() {
        for dependant in dependants_of(&name)? {
            if seen.insert(dependant.clone()) {
                count += 1;
                if count >= MAX_DOWNSTREAM {
                    return Ok(MAX_DOWNSTREAM);
                }
                frontier.push(dependant);
            }
        }
    }
    Ok(count)
}

/// The field of the first entry (or alternative) that names `upstream`, for an error about it.
pub fn field_naming(depends_on: &[DependencySpec], upstream: &str) -> String {
    for (i, entry) in depends_on.iter().enumerate() {
        if entry.job.as_deref() == Some(upstream) {
            return format!("depends_on[{i}].job");
        }
        for (k, alternative) in entry.any_of.iter().flatten().enumerate() {
            if alternative.job.as_deref() == Some(upstream) {
                return format!("depends_on[{i}].any_of[{k}].job");
            }
        }
    }
    "depends_on".to_string()
}

/// Checks a `depends_on` and its `deps_timeout` (fields named as the API reports them).
/// `job` is the dependant's own name: a job never waits for itself.
pub fn validate(
    job: &str,
    depends_on: &[DependencySpec],
    deps_timeout: Option<HumanDuration>,
) -> Result<(), SpecError> {
    if depends_on.len() > MAX_DEPENDENCIES {
        return Err(SpecError::new(
            "depends_on",
            format!("at most {MAX_DEPENDENCIES} entries"),
        ));
    }
    for (i, entry) in depends_on.iter().enumerate() {
        let field = format!("depends_on[{i}]");
        match (&entry.job, &entry.event, &entry.any_of) {
            (Some(_), None, None) | (None, Some(_), None) => {
                validate_requirement(job, entry).map_err(|e| e.within(&field))?
            }
            (None, None, Some(any_of)) => {
                if entry.window != Window::default() || entry.state != Awaited::default() {
                    return Err(SpecError::new(
                        format!("{field}.any_of"),
                        "an any_of group takes no window or state of its own; give them to \
                         each alternative",
                    ));
                }
                if any_of.is_empty() || any_of.len() > MAX_ALTERNATIVES {
                    return Err(SpecError::new(
                        format!("{field}.any_of"),
                        format!("must list 1 to {MAX_ALTERNATIVES} alternatives"),
                    ));
                }
                for (k, alternative) in any_of.iter().enumerate() {
                    let field = format!("{field}.any_of[{k}]");
                    if alternative.job.is_some() == alternative.event.is_some()
                        || alternative.any_of.is_some()
                    {
                        return Err(SpecError::new(
                            field,
                            "each alternative names a job or an event (any_of groups do not \
                             nest)",
                        ));
                    }
                    validate_requirement(job, alternative).map_err(|e| e.within(&field))?;
                }
            }
            _ => {
                return Err(SpecError::new(
                    field,
                    "give one of job (a job to wait for), event (an event key) or any_of \
                     (alternatives)",
                ))
            }
        }
    }
    match deps_timeout {
        Some(_) if depends_on.is_empty() => Err(SpecError::new(
            "deps_timeout",
            "applies only to a job with depends_on",
        )),
        Some(timeout) if timeout.0.is_zero() || timeout.0 > MAX_DEPS_TIMEOUT => Err(
            SpecError::new("deps_timeout", "must be between 1ms and 31 days"),
        ),
        _ => Ok(()),
    }
}

fn validate_requirement(dependant: &str, entry: &DependencySpec) -> Result<(), SpecError> {
    if let Some(key) = &entry.event {
        crate::event::validate_key("event", key)?;
        if entry.state != Awaited::default() {
            return Err(SpecError::new(
                "state",
                "an event does not end: state applies to jobs only",
            ));
        }
    } else {
        let upstream = entry.job.as_deref().unwrap_or_default();
        validate_name("job", upstream)?;
        if upstream == dependant {
            return Err(SpecError::new("job", "a job cannot depend on itself"));
        }
    }
    for (name, side) in [
        ("before", entry.window.before),
        ("after", entry.window.after),
    ] {
        if side.0 > MAX_WINDOW {
            return Err(SpecError::new(
                format!("window.{name}"),
                "must be at most 31 days",
            ));
        }
    }
    Ok(())
}

/// A chain of jobs that would wait on each other were `job` to depend on `upstreams`:
/// `[job, u, ..., job]`, each waiting for the next. `upstreams_of` answers for any other job
/// what it depends on now. Visits only the jobs `job` would (transitively) wait for.
pub fn find_cycle<E>(
    job: &str,
    upstreams: &BTreeSet<String>,
    mut upstreams_of: impl FnMut(&str) -> Result<BTreeSet<String>, E>,
) -> Result<Option<Vec<String>>, E> {
    // Depth first, with the path kept so the cycle can be named.
    let mut seen: HashSet<String> = HashSet::new();
    let mut path: Vec<String> = vec![job.to_string()];
    let mut stack: Vec<Vec<String>> = vec![upstreams.iter().rev().cloned().collect()];
    while let Some(next) = stack.last_mut() {
        let Some(name) = next.pop() else {
            stack.pop();
            path.pop();
            continue;
        };
        if name == job {
            path.push(name);
            return Ok(Some(path));
        }
        if !seen.insert(name.clone()) {
            continue;
        }
        let further = upstreams_of(&name)?;
        path.push(name);
        stack.push(further.into_iter().rev().collect());
    }
    Ok(None)
}

/// An order in which to write a set of definitions so each comes after the upstreams it names
/// among them (`jobs[i]` is a name and its upstreams); otherwise the given order. `Err` with
/// the names caught in a cycle.
pub fn write_order(jobs: &[(String, BTreeSet<String>)]) -> Result<Vec<usize>, Vec<String>> {
    let index: std::collections::HashMap<&str, usize> = jobs
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name.as_str(), i))
        .collect();
    let mut written = vec![false; jobs.len()];
    let mut order = Vec::with_capacity(jobs.len());
    // Each pass writes every definition whose upstreams in the set are written; a pass that
    // writes nothing leaves only cycles.
    while order.len() < jobs.len() {
        let before = order.len();
        for (i, (_, upstreams)) in jobs.iter().enumerate() {
            let ready = !written[i]
                && upstreams
                    .iter()
                    .all(|u| index.get(u.as_str()).is_none_or(|&k| written[k]));
            if ready {
                written[i] = true;
                order.push(i);
            }
        }
        if order.len() == before {
            return Err(jobs
                .iter()
                .zip(&written)
                .filter(|(_, done)| !**done)
                .map(|((name, _), _)| name.clone())
                .collect());
        }
    }
    Ok(order)
}

/// What the runs of one requirement's upstream job inside the window are doing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpstreamRuns {
    /// A run ended in the awaited state.
    pub satisfied: bool,
    /// A run is still waiting, queued or running, or the upstream's schedule still owes an
    /// instant inside the window: the requirement may yet be met.
    pub pending: bool,
    /// A run that ended in a state the wait does not accept, and that state.
    pub ended_otherwise: Option<(i64, RunState)>,
}

/// Whether an upstream's schedule still owes an instant inside a window ending at `to`: its
/// next instant (`next`) lies in it and comes after the latest run it recorded there
/// (`latest`). All three are ledger microseconds.
pub fn owes_instant(next: Option<i64>, latest: Option<i64>, to: i64) -> bool {
    next.is_some_and(|next| next <= to && latest.is_none_or(|latest| next > latest))
}

/// Until when a dependant run skipped because its upstream failed may be reopened by a retry
/// of that upstream: the deadline it had while waiting, `deps_timeout` from when it was
/// recorded. `None` once that has passed.
pub fn reopen_deadline(
    recorded_at: Instant,
    deps_timeout: Duration,
    now: Instant,
) -> Option<Instant> {
    let deadline =
        recorded_at.checked_add_signed(chrono::Duration::from_std(deps_timeout).ok()?)?;
    (deadline > now).then_some(deadline)
}

/// Whether a waiting run may go, must wait on, or can never go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    /// What is still missing, one line per unmet entry.
    Waiting(Vec<String>),
    /// An entry can no longer be met: an upstream run ended otherwise and nothing else in the
    /// window can meet it. Says which.
    UpstreamFailed(String),
}

/// The verdict on a run at `instant` of a job with `depends_on`, from what each requirement's
/// upstream runs are doing: `runs_of(k, requirement, window)`, where `k` is the requirement's
/// place in [`requirements`]' order.
pub fn verdict(
    depends_on: &[DependencySpec],
    instant: Instant,
    mut runs_of: impl FnMut(usize, &Requirement<'_>, (Instant, Instant)) -> UpstreamRuns,
) -> Verdict {
    let mut missing = Vec::new();
    let mut first = 0;
    for entry in depends_on {
        let mut met = false;
        let mut failed: Vec<String> = Vec::new();
        let mut wanted: Vec<String> = Vec::new();
        let alternatives = entry.alternatives();
        let base = first;
        first += alternatives.len();
        for (k, requirement) in alternatives.iter().enumerate() {
            let window = requirement.window.around(instant);
            let runs = runs_of(base + k, requirement, window);
            if runs.satisfied {
                met = true;
                break;
            }
            let want = describe(requirement, window);
            match runs.ended_otherwise {
                Some((run, state)) if !runs.pending => {
                    failed.push(format!("{want}, but its run {run} ended {state}"))
                }
                _ => wanted.push(want),
            }
        }
        if met {
            continue;
        }
        // Every alternative failed for good: the entry can never be met.
        if wanted.is_empty() && !failed.is_empty() {
            return Verdict::UpstreamFailed(failed.join("; or "));
        }
        missing.push(wanted.join(" or "));
    }
    if missing.is_empty() {
        Verdict::Ready
    } else {
        Verdict::Waiting(missing)
    }
}

/// "extract succeeded between A and B" (or "at A" for a window of no width), "event K between
/// A and B".
fn describe(requirement: &Requirement<'_>, (from, to): (Instant, Instant)) -> String {
    let at = |t: Instant| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let when = if from == to {
        format!("at {}", at(from))
    } else {
        format!("between {} and {}", at(from), at(to))
    };
    match requirement.upstream {
        Upstream::Job(job) => format!("{job} {} {when}", requirement.state.as_str()),
        Upstream::Event(key) => format!("event {key} {when}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn deps(json: serde_json::Value) -> Vec<DependencySpec> {
        serde_json::from_value(json).unwrap()
    }

    fn t(s: &str) -> Instant {
        s.parse().unwrap()
    }

    #[test]
    fn entries_are_checked_with_their_field() {
        let field = |json| validate("load", &deps(json), None).unwrap_err().field;
        assert_eq!(
            field(serde_json::json!([{"job": "load"}])),
            "depends_on[0].job"
        );
        assert_eq!(
            field(serde_json::json!([{"job": "a b"}])),
            "depends_on[0].job"
        );
        assert_eq!(field(serde_json::json!([{}])), "depends_on[0]");
        assert_eq!(
            field(serde_json::json!([{"job": "a", "any_of": [{"job": "b"}]}])),
            "depends_on[0]"
        );
        assert_eq!(
            field(serde_json::json!([{"job": "a", "window": {"before": "32d"}}])),
            "depends_on[0].window.before"
        );
        assert_eq!(
            field(serde_json::json!([{"job": "a"}, {"any_of": []}])),
            "depends_on[1].any_of"
        );
        assert_eq!(
            field(serde_json::json!([{"any_of": [{"job": "a"}, {"any_of": [{"job": "b"}]}]}])),
            "depends_on[0].any_of[1]"
        );
        let many: Vec<_> = (0..33)
            .map(|i| serde_json::json!({"job": format!("j{i}")}))
            .collect();
        assert_eq!(field(serde_json::Value::Array(many)), "depends_on");
        assert!(serde_json::from_value::<Vec<DependencySpec>>(
            serde_json::json!([{"job": "a", "colour": 1}])
        )
        .is_err());
        assert_eq!(
            validate("x", &[], Some(HumanDuration::from_secs(5)))
                .unwrap_err()
                .field,
            "deps_timeout"
        );
        let ok = deps(serde_json::json!([
            {"job": "extract", "window": {"before": "1h"}},
            {"any_of": [{"job": "a"}, {"job": "b", "state": "finished"}]}
        ]));
        validate("load", &ok, Some(HumanDuration::from_secs(7200))).unwrap();
        assert_eq!(
            upstreams(&ok).into_iter().collect::<Vec<_>>(),
            ["a", "b", "extract"]
        );
    }

    #[test]
    fn a_definition_reads_back_as_written() {
        let written = serde_json::json!([
            {"job": "extract", "window": {"before": "1h", "after": "0s"}},
            {"any_of": [{"job": "a"}, {"job": "b", "state": "finished"}]}
        ]);
        let read = deps(written);
        let again = deps(serde_json::to_value(&read).unwrap());
        assert_eq!(read, again);
    }

    fn graph(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (job, upstream) in edges {
            graph
                .entry(job.to_string())
                .or_default()
                .insert(upstream.to_string());
        }
        graph
    }

    fn cycle(edges: &[(&str, &str)], job: &str, ups: &[&str]) -> Option<Vec<String>> {
        let graph = graph(edges);
        let ups = ups.iter().map(|s| s.to_string()).collect();
        find_cycle::<()>(job, &ups, |name| {
            Ok(graph.get(name).cloned().unwrap_or_default())
        })
        .unwrap()
    }

    #[test]
    fn cycles_are_found_and_named() {
        // load -> transform -> extract; extract depending on load closes the loop.
        let chain = [("load", "transform"), ("transform", "extract")];
        assert_eq!(
            cycle(&chain, "extract", &["load"]),
            Some(vec![
                "extract".into(),
                "load".into(),
                "transform".into(),
                "extract".into()
            ])
        );
        assert_eq!(cycle(&chain, "report", &["load"]), None);
        // A diamond is not a cycle.
        let diamond = [("d", "b"), ("d", "c"), ("b", "a"), ("c", "a")];
        assert_eq!(cycle(&diamond, "e", &["d"]), None);
        assert!(cycle(&diamond, "a", &["d"]).is_some());
    }

    proptest! {
        /// A job added to an acyclic graph closes a cycle exactly when it can reach itself
        /// through its new upstreams, and the cycle named is a real path of edges.
        #[test]
        fn find_cycle_agrees_with_reachability(
            edges in proptest::collection::vec((0u8..8, 0u8..8), 0..20),
            job in 0u8..8,
            ups in proptest::collection::btree_set(0u8..8, 1..4),
        ) {
            // Acyclic by construction: edges go from higher to lower numbers.
            let edges: Vec<(String, String)> = edges
                .into_iter()
                .filter(|(a, b)| a > b && *a != job)
                .map(|(a, b)| (format!("j{a}"), format!("j{b}")))
                .collect();
            let refs: Vec<(&str, &str)> =
                edges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            let job = format!("j{job}");
            let ups: Vec<String> = ups.into_iter().map(|u| format!("j{u}")).collect();
            let up_refs: Vec<&str> = ups.iter().map(String::as_str).collect();
            let found = cycle(&refs, &job, &up_refs);
            let g = graph(&refs);
            let mut reach: BTreeSet<String> = ups.iter().cloned().collect();
            loop {
                let more: BTreeSet<String> = reach
                    .iter()
                    .flat_map(|n| g.get(n).cloned().unwrap_or_default())
                    .collect();
                let before = reach.len();
                reach.extend(more);
                if reach.len() == before { break; }
            }
            prop_assert_eq!(found.is_some(), reach.contains(&job));
            if let Some(path) = found {
                prop_assert_eq!(path.first(), Some(&job));
                prop_assert_eq!(path.last(), Some(&job));
                for pair in path.windows(2) {
                    let is_edge = (pair[0] == job && ups.contains(&pair[1]))
                        || g.get(&pair[0]).is_some_and(|u| u.contains(&pair[1]));
                    prop_assert!(is_edge, "{:?} is not an edge", pair);
                }
            }
        }

        /// A window is a pair of durations on the UTC line, whatever the zone the schedule
        /// computed its instant in: its width is before + after to the microsecond, it holds
        /// its own instant, and an upstream at U is in the window of T exactly when T is in
        /// `dependants_of(U)`.
        #[test]
        fn windows_are_durations_across_dst(
            // Around the 2026 changes of Europe/London and America/New_York.
            base in prop_oneof![Just("2026-03-29T00:30:00Z"), Just("2026-10-25T00:30:00Z"),
                                Just("2026-03-08T06:30:00Z"), Just("2026-11-01T05:30:00Z")],
            offset_s in -7200i64..7200,
            before_s in 0u64..10_800,
            after_s in 0u64..10_800,
            upstream_offset_s in -14_400i64..14_400,
        ) {
            let instant = t(base) + chrono::Duration::seconds(offset_s);
            let window = Window {
                before: HumanDuration::from_secs(before_s),
                after: HumanDuration::from_secs(after_s),
            };
            let (from, to) = window.around(instant);
            prop_assert_eq!((to - from).num_seconds(), (before_s + after_s) as i64);
            prop_assert!(from <= instant && instant <= to);
            let upstream = instant + chrono::Duration::seconds(upstream_offset_s);
            let (d_from, d_to) = window.dependants_of(upstream);
            let inside = from <= upstream && upstream <= to;
            prop_assert_eq!(inside, d_from <= instant && instant <= d_to);
        }
    }

    #[test]
    fn a_daily_window_keeps_its_length_over_the_change_to_summer_time() {
        // A 03:00 London run on the day the clocks go forward is at 02:00 UTC. The hour before
        // it is an hour of real time, from 01:00 UTC, though 02:00 local did not exist that day.
        let run = t("2026-03-29T02:00:00Z");
        let window = Window {
            before: HumanDuration::from_secs(3600),
            after: HumanDuration::default(),
        };
        assert_eq!(window.around(run), (t("2026-03-29T01:00:00Z"), run));
    }

    fn runs(satisfied: bool, pending: bool, ended: Option<RunState>) -> UpstreamRuns {
        UpstreamRuns {
            satisfied,
            pending,
            ended_otherwise: ended.map(|s| (7, s)),
        }
    }

    fn judge(json: serde_json::Value, facts: &BTreeMap<&str, UpstreamRuns>) -> Verdict {
        let spec = deps(json);
        let name = |r: &Requirement<'_>| match r.upstream {
            Upstream::Job(name) | Upstream::Event(name) => name.to_string(),
        };
        let names: Vec<String> = requirements(&spec).map(|r| name(&r)).collect();
        verdict(&spec, t("2026-11-25T02:00:00Z"), |k, r, _| {
            assert_eq!(names[k], name(r), "the index names the requirement");
            facts.get(name(r).as_str()).cloned().unwrap_or_default()
        })
    }

    #[test]
    fn the_work_downstream_counts_each_job_once() {
        let below = |edges: &[(&str, &str)], job: &str| {
            downstream_count::<()>(job, |name| {
                Ok(edges
                    .iter()
                    .filter(|(_, up)| *up == name)
                    .map(|(down, _)| down.to_string())
                    .collect())
            })
            .unwrap()
        };
        // A diamond under `a`, and a leaf `e` beside it.
        let diamond = [("b", "a"), ("c", "a"), ("d", "b"), ("d", "c"), ("e", "z")];
        assert_eq!(below(&diamond, "a"), 3);
        assert_eq!(below(&diamond, "b"), 1);
        assert_eq!(below(&diamond, "d"), 0);
        // A wide pipeline ranks above the leaf jobs it competes with.
        let wide: Vec<(String, String)> = (0..50)
            .map(|i| (format!("w{i}"), "root".to_string()))
            .collect();
        let wide: Vec<(&str, &str)> = wide.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(below(&wide, "root"), 50);
        assert!(below(&wide, "root") > below(&wide, "w0"));
        // A cycle (which writes refuse) still ends.
        assert_eq!(below(&[("x", "y"), ("y", "x")], "x"), 1);
    }

    #[test]
    fn a_skipped_dependant_reopens_only_within_its_timeout() {
        let recorded = t("2026-11-25T02:00:00Z");
        let two_hours = Duration::from_secs(7200);
        assert_eq!(
            reopen_deadline(recorded, two_hours, t("2026-11-25T03:00:00Z")),
            Some(t("2026-11-25T04:00:00Z"))
        );
        assert_eq!(
            reopen_deadline(recorded, two_hours, t("2026-11-25T04:00:00Z")),
            None
        );
    }

    #[test]
    fn events_are_awaited_like_jobs_and_named_apart() {
        let spec = serde_json::json!([
            {"job": "extract"},
            {"any_of": [{"event": "sales.ready", "window": {"before": "1h"}}, {"job": "b"}]}
        ]);
        assert!(validate("load", &deps(spec.clone()), None).is_ok());
        let parsed = deps(spec.clone());
        assert_eq!(
            upstreams(&parsed),
            BTreeSet::from(["b".into(), "extract".into()])
        );
        assert_eq!(
            awaited_events(&parsed),
            BTreeSet::from(["sales.ready".into()])
        );
        let at = t("2026-11-25T01:30:00Z");
        assert!(dependant_instants(&parsed, Upstream::Event("sales.ready"), at).is_some());
        assert!(dependant_instants(&parsed, Upstream::Job("sales.ready"), at).is_none());
        let mut facts = BTreeMap::new();
        facts.insert("extract", runs(true, false, None));
        let Verdict::Waiting(missing) = judge(spec.clone(), &facts) else {
            panic!("no event yet")
        };
        assert_eq!(
            missing,
            [
                "event sales.ready between 2026-11-25T01:00:00Z and 2026-11-25T02:00:00Z \
              or b succeeded at 2026-11-25T02:00:00Z"
            ]
        );
        facts.insert("sales.ready", runs(true, false, None));
        assert_eq!(judge(spec, &facts), Verdict::Ready);
        let field = |json| validate("load", &deps(json), None).unwrap_err().field;
        assert_eq!(
            field(serde_json::json!([{"event": "a b"}])),
            "depends_on[0].event"
        );
        assert_eq!(
            field(serde_json::json!([{"event": "k", "state": "finished"}])),
            "depends_on[0].state"
        );
        assert_eq!(
            field(serde_json::json!([{"event": "k", "job": "j"}])),
            "depends_on[0]"
        );
        assert_eq!(
            field(serde_json::json!([{"any_of": [{"event": "k", "job": "j"}]}])),
            "depends_on[0].any_of[0]"
        );
    }

    #[test]
    fn every_entry_is_needed_and_one_alternative_suffices() {
        let spec = serde_json::json!([
            {"job": "extract", "window": {"before": "1h"}},
            {"any_of": [{"job": "a"}, {"job": "b"}]}
        ]);
        let mut facts = BTreeMap::new();
        facts.insert("extract", runs(true, false, None));
        let Verdict::Waiting(missing) = judge(spec.clone(), &facts) else {
            panic!("a and b have not run")
        };
        assert_eq!(
            missing,
            ["a succeeded at 2026-11-25T02:00:00Z or b succeeded at 2026-11-25T02:00:00Z"]
        );
        facts.insert("b", runs(true, false, None));
        assert_eq!(judge(spec.clone(), &facts), Verdict::Ready);
        facts.remove("extract");
        let Verdict::Waiting(missing) = judge(spec, &facts) else {
            panic!("extract has not run")
        };
        assert_eq!(
            missing,
            ["extract succeeded between 2026-11-25T01:00:00Z and 2026-11-25T02:00:00Z"]
        );
    }

    #[test]
    fn a_failed_upstream_ends_the_wait_only_when_nothing_else_can_meet_it() {
        let spec = serde_json::json!([{"any_of": [{"job": "a"}, {"job": "b"}]}]);
        let mut facts = BTreeMap::new();
        facts.insert("a", runs(false, false, Some(RunState::Failed)));
        // b may still run.
        assert!(matches!(judge(spec.clone(), &facts), Verdict::Waiting(_)));
        // b failed too, but another run of it in the window is still queued.
        facts.insert("b", runs(false, true, Some(RunState::TimedOut)));
        assert!(matches!(judge(spec.clone(), &facts), Verdict::Waiting(_)));
        facts.insert("b", runs(false, false, Some(RunState::TimedOut)));
        let Verdict::UpstreamFailed(why) = judge(spec, &facts) else {
            panic!("both alternatives failed")
        };
        assert!(
            why.contains("a succeeded") && why.contains("ended timed_out"),
            "{why}"
        );
    }

    #[test]
    fn definitions_are_written_upstreams_first() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let jobs = vec![
            ("load".to_string(), set(&["transform"])),
            ("transform".to_string(), set(&["extract", "elsewhere"])),
            ("extract".to_string(), set(&[])),
            ("report".to_string(), set(&[])),
        ];
        assert_eq!(write_order(&jobs), Ok(vec![2, 3, 1, 0]));
        let cyclic = vec![
            ("a".to_string(), set(&["b"])),
            ("b".to_string(), set(&["a"])),
            ("c".to_string(), set(&[])),
        ];
        assert_eq!(
            write_order(&cyclic),
            Err(vec!["a".to_string(), "b".to_string()])
        );
    }

    #[test]
    fn finished_accepts_any_terminal_state() {
        assert!(Awaited::Finished.accepts(RunState::Skipped));
        assert!(!Awaited::Finished.accepts(RunState::Running));
        assert!(!Awaited::Succeeded.accepts(RunState::Failed));
    }
}

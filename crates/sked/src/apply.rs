//! `sked job apply -f FILE`: many job definitions, and the calendars they name, from one YAML
//! or JSON file.
//!
//! The whole file is checked here first (each calendar and definition, names, cycles of
//! dependencies), then sent in one request (`POST /api/v1/apply`), which checks it again with
//! the server's own rules (broker connections, the HTTP target policy, permissions, the
//! namespace's settings, upstreams, the calendars the file's calendars and jobs name) and
//! writes every calendar and then every job in one transaction, upstreams before the jobs that
//! depend on them, or none. What changed is reported. `--dry-run` sends the same request as a
//! dry run: the server makes every check and writes nothing, so it refuses exactly what
//! applying would refuse, and the changes are printed field by field. `--prune` also deletes
//! the namespace's jobs the file no longer lists, dependants before their upstreams, once the
//! file is applied; it never deletes a calendar.

use crate::client::Client;
use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::Value;
use sked_core::calendar::CalendarSpec;
use sked_core::job::JobSpec;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// How `apply` goes about it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions {
    /// Print what would change; change nothing.
    pub dry_run: bool,
    /// Delete the namespace's jobs that the file does not list.
    pub prune: bool,
}

/// What a file holds: its calendars, each with its name beside its definition's fields, in
/// the file's order, and its jobs in the order to write them.
#[derive(Debug, Default)]
pub struct ApplyFile {
    pub calendars: Vec<Value>,
    pub jobs: Vec<Value>,
}

/// The calendars and jobs of a file (a list of jobs, a `{"calendars": [...], "jobs": [...]}`
/// document, or a single job), the jobs in the order to write them: each after the jobs of
/// the file it depends on. Which calendars a job names, and what those name, the server
/// checks against the file's calendars and its own.
pub fn parse_file(text: &str) -> Result<ApplyFile> {
    // YAML is a superset of JSON, so one parser reads both.
    let doc: Value =
        serde_yaml::from_str(text).context("the file is neither valid YAML nor JSON")?;
    let list = |map: &serde_json::Map<String, Value>, key: &str| -> Result<Vec<Value>> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(_) => bail!("`{key}` must be a list"),
        }
    };
    let (calendars, jobs) = match doc {
        Value::Array(items) => (Vec::new(), items),
        Value::Object(ref map)
            if (map.contains_key("jobs") || map.contains_key("calendars"))
                && !map.contains_key("target") =>
        {
            if let Some(key) = map.keys().find(|k| *k != "jobs" && *k != "calendars") {
                bail!("a document of jobs has `calendars` and `jobs`, not `{key}`");
            }
            (list(map, "calendars")?, list(map, "jobs")?)
        }
        Value::Object(_) => (Vec::new(), vec![doc]),
        _ => bail!("expected a job, a list of jobs, or a document with a `jobs` list"),
    };
    let mut errors = check_calendars(&calendars);
    let mut names = BTreeSet::new();
    let mut upstreams = Vec::with_capacity(jobs.len());
    let now = chrono::Utc::now();
    for (i, job) in jobs.iter().enumerate() {
        let label = job["name"]
            .as_str()
            .map(|n| format!("job {n:?}"))
            .unwrap_or(format!("job #{}", i + 1));
        let spec: JobSpec = match serde_json::from_value(job.clone()) {
            Ok(spec) => spec,
            Err(e) => {
                errors.push(format!("{label}: {e}"));
                continue;
            }
        };
        match spec.validate(None, now) {
            Ok(valid) => {
                if !names.insert(valid.name.clone()) {
                    errors.push(format!("{label}: the name appears twice in the file"));
                }
                upstreams.push((
                    valid.name.clone(),
                    sked_core::dependency::upstreams(&valid.spec.depends_on),
                ));
            }
            Err(e) => errors.push(format!("{label}: {e}")),
        }
    }
    if !errors.is_empty() {
        bail!("nothing was applied:\n  {}", errors.join("\n  "));
    }
    match sked_core::dependency::write_order(&upstreams) {
        Ok(order) => Ok(ApplyFile {
            calendars,
            jobs: order.into_iter().map(|i| jobs[i].clone()).collect(),
        }),
        Err(cycle) => bail!(
            "nothing was applied: these jobs depend on each other in a cycle: {}",
            cycle.join(", ")
        ),
    }
}

/// What is wrong with the file's calendars, each alone (the names they include or except are
/// the server's to check): one line each.
fn check_calendars(calendars: &[Value]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    for (i, calendar) in calendars.iter().enumerate() {
        let Some((name, spec)) = split_calendar(calendar) else {
            errors.push(format!(
                "calendar #{}: must be a calendar with a `name`",
                i + 1
            ));
            continue;
        };
        let label = format!("calendar {name:?}");
        if let Err(e) = sked_core::job::validate_name("name", &name) {
            errors.push(format!("{label}: {e}"));
        }
        if !names.insert(name.clone()) {
            errors.push(format!("{label}: the name appears twice in the file"));
        }
        match serde_json::from_value::<CalendarSpec>(spec) {
            Ok(spec) => {
                if let Err(e) = spec.validate() {
                    errors.push(format!("{label}: {e}"));
                }
            }
            Err(e) => errors.push(format!("{label}: {e}")),
        }
    }
    errors
}

/// A calendar of the file as its name and the rest of its fields, its definition; `None`
/// when it is not an object with a string `name`.
fn split_calendar(calendar: &Value) -> Option<(String, Value)> {
    let mut fields = calendar.as_object()?.clone();
    let name = fields.remove("name")?.as_str()?.to_string();
    Some((name, Value::Object(fields)))
}

pub async fn apply(client: &Client, file: &Path, options: ApplyOptions) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let ApplyFile { calendars, jobs } = parse_file(&text)?;
    let current: BTreeMap<String, Value> = if options.dry_run || options.prune {
        client
            .get_all("/jobs", &[], "jobs")
            .await?
            .into_iter()
            .filter_map(|job| Some((job["name"].as_str()?.to_string(), job)))
            .collect()
    } else {
        BTreeMap::new()
    };
    let current_calendars: BTreeMap<String, Value> = if options.dry_run && !calendars.is_empty() {
        client
            .send(Method::GET, "/calendars", &[], None)
            .await?
            .json::<Value>()
            .await
            .context("the server's list of calendars")?["calendars"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| Some((c["name"].as_str()?.to_string(), c["spec"].clone())))
            .collect()
    } else {
        BTreeMap::new()
    };
    let listed: BTreeSet<&str> = jobs.iter().filter_map(|j| j["name"].as_str()).collect();
    let stale = if options.prune {
        deletion_order(&current, &listed)?
    } else {
        Vec::new()
    };
    // The server checks the whole file, its own rules included, and writes all of it in one
    // transaction or nothing; a dry run makes the same checks and writes nothing.
    let request = serde_json::json!({
        "calendars": calendars,
        "jobs": jobs,
        "dry_run": options.dry_run,
    });
    let answer: Value = client
        .send(Method::POST, "/apply", &[], Some(&request))
        .await
        .context("nothing was applied")?
        .json()
        .await
        .context("the server's answer to apply")?;
    let applied_calendars = answer["calendars"].as_array().cloned().unwrap_or_default();
    let applied = answer["jobs"].as_array().cloned().unwrap_or_default();
    if options.dry_run {
        print_plan("calendar ", &applied_calendars, |name| {
            let Some(stored) = current_calendars.get(name) else {
                return Ok(None);
            };
            let stored = calendar_definition(stored)?;
            let file = match calendars
                .iter()
                .filter_map(split_calendar)
                .find(|(n, _)| n == name)
            {
                Some((_, spec)) => calendar_definition(&spec)?,
                None => stored.clone(),
            };
            Ok(Some((stored, file)))
        })?;
        print_plan("", &applied, |name| {
            let Some(view) = current.get(name) else {
                return Ok(None);
            };
            let stored = stored_definition(view)?;
            let file = match jobs.iter().find(|j| j["name"].as_str() == Some(name)) {
                Some(file) => file_definition(file)?,
                None => stored.clone(),
            };
            Ok(Some((stored, file)))
        })?;
        for name in &stale {
            println!("delete    {name}");
        }
        println!(
            "dry run: nothing was changed in namespace {}",
            client.namespace
        );
        return Ok(());
    }
    for calendar in &applied_calendars {
        let name = calendar["name"].as_str().unwrap_or_default();
        let change = calendar["change"].as_str().unwrap_or("applied");
        println!("{change:<9} calendar {name}");
    }
    for job in &applied {
        let name = job["name"].as_str().unwrap_or_default();
        let change = job["change"].as_str().unwrap_or("applied");
        println!("{change:<9} {name}");
    }
    for name in &stale {
        client
            .send(
                Method::DELETE,
                &format!("/jobs/{name}"),
                &[("force", "false".to_string())],
                None,
            )
            .await
            .with_context(|| format!("pruning job {name:?}"))?;
        println!("deleted   {name}");
    }
    let with_calendars = if calendars.is_empty() {
        String::new()
    } else {
        format!(" and {} calendar(s)", calendars.len())
    };
    println!(
        "{} job(s){with_calendars} applied{} in namespace {}",
        jobs.len(),
        if options.prune {
            format!(", {} pruned", stale.len())
        } else {
            String::new()
        },
        client.namespace
    );
    Ok(())
}

/// A dry run's line for each item of `applied` (the server's answer), `label` before its
/// name: `create`, `unchanged`, or `update` followed by each field that would change, from
/// `definitions` (the stored definition and the file's, in the same form; `None` when the
/// server holds none).
fn print_plan(
    label: &str,
    applied: &[Value],
    definitions: impl Fn(&str) -> Result<Option<(Value, Value)>>,
) -> Result<()> {
    for item in applied {
        let name = item["name"].as_str().unwrap_or_default();
        match item["change"].as_str() {
            Some("created") => println!("create    {label}{name}"),
            Some("unchanged") => println!("unchanged {label}{name}"),
            _ => match definitions(name)? {
                None => println!("create    {label}{name}"),
                Some((stored, file)) => {
                    println!("update    {label}{name}");
                    for change in diff(&stored, &file) {
                        println!("    {change}");
                    }
                }
            },
        }
    }
    Ok(())
}

/// The namespace's jobs that the file does not list, each before the jobs it depends on (a job
/// with dependants is not deleted while they exist).
fn deletion_order(
    current: &BTreeMap<String, Value>,
    listed: &BTreeSet<&str>,
) -> Result<Vec<String>> {
    let stale: Vec<(String, BTreeSet<String>)> = current
        .iter()
        .filter(|(name, _)| !listed.contains(name.as_str()))
        .map(|(name, view)| {
            let spec: JobSpec = serde_json::from_value(stored_definition(view)?)
                .with_context(|| format!("job {name:?} as the server gave it"))?;
            Ok((
                name.clone(),
                sked_core::dependency::upstreams(&spec.depends_on),
            ))
        })
        .collect::<Result<_>>()?;
    match sked_core::dependency::write_order(&stale) {
        Ok(order) => Ok(order
            .into_iter()
            .rev()
            .map(|i| stale[i].0.clone())
            .collect()),
        Err(cycle) => bail!(
            "the jobs to prune depend on each other in a cycle: {}",
            cycle.join(", ")
        ),
    }
}

/// A job as the server returned it, less what the server adds to a definition, in the
/// definition's own form.
fn stored_definition(view: &Value) -> Result<Value> {
    let mut definition = view.clone();
    if let Some(object) = definition.as_object_mut() {
        for field in sked_server::api::JOB_VIEW_FIELDS {
            object.remove(*field);
        }
    }
    normalized(definition)
}

/// A job of the file in the definition's own form: defaults filled in, durations and
/// schedules as the server writes them.
fn file_definition(job: &Value) -> Result<Value> {
    normalized(job.clone())
}

/// A calendar's definition in its own form, for a diff.
fn calendar_definition(spec: &Value) -> Result<Value> {
    let spec: CalendarSpec =
        serde_json::from_value(spec.clone()).context("a calendar definition")?;
    serde_json::to_value(spec).context("a calendar definition")
}

fn normalized(definition: Value) -> Result<Value> {
    let spec: JobSpec = serde_json::from_value(definition).context("a job definition")?;
    let mut value = serde_json::to_value(spec).context("a job definition")?;
    hide_secrets(&mut value);
    Ok(value)
}

/// Replaces every secret value (given in the clear, or sealed by the server) by a marker: a
/// dry run never prints one, and a sealed value cannot be compared with a clear one.
fn hide_secrets(value: &mut Value) {
    match value {
        Value::Object(map)
            if map.len() == 1 && (map.contains_key("secret") || map.contains_key("sealed")) =>
        {
            *value = Value::String("(secret, not compared)".into());
        }
        Value::Object(map) => map.values_mut().for_each(hide_secrets),
        Value::Array(items) => items.iter_mut().for_each(hide_secrets),
        _ => {}
    }
}

/// The fields that differ between `before` and `after`, one line each: `~ path: old -> new`,
/// `+ path: new`, `- path: old`.
pub fn diff(before: &Value, after: &Value) -> Vec<String> {
    differences(before, after)
        .into_iter()
        .map(|(path, old, new)| match (old, new) {
            (Some(a), Some(b)) => format!("~ {path}: {a} -> {b}"),
            (None, Some(b)) => format!("+ {path}: {b}"),
            (Some(a), None) => format!("- {path}: {a}"),
            (None, None) => format!("  {path}"),
        })
        .collect()
}

/// The fields that differ between two stored definitions, by path, comma-separated (a change
/// of `paused` as `paused` or `resumed`); `-` for none (a rollback to an identical definition).
pub fn changed_fields(before: &Value, after: &Value) -> String {
    let (Ok(before), Ok(after)) = (normalized(before.clone()), normalized(after.clone())) else {
        return "?".to_string();
    };
    let paths: Vec<String> = differences(&before, &after)
        .into_iter()
        .map(|(path, _, new)| match path.as_str() {
            // A pause and a resume each change `paused`: say which one happened.
            "paused" if new == Some(Value::Bool(true)) => "paused".to_string(),
            "paused" => "resumed".to_string(),
            _ => path,
        })
        .collect();
    if paths.is_empty() {
        "-".to_string()
    } else {
        paths.join(", ")
    }
}

/// Each leaf that differs, by path, with its value before and after (`None`: absent).
fn differences(before: &Value, after: &Value) -> Vec<(String, Option<Value>, Option<Value>)> {
    let (mut old, mut new) = (BTreeMap::new(), BTreeMap::new());
    flatten("", before, &mut old);
    flatten("", after, &mut new);
    let paths: BTreeSet<String> = old.keys().chain(new.keys()).cloned().collect();
    paths
        .into_iter()
        .filter_map(|path| {
            let (a, b) = (old.remove(&path), new.remove(&path));
            (a != b).then_some((path, a, b))
        })
        .collect()
}

/// Every leaf of `value` by its path (`retry.max_attempts`, `depends_on[0].job`); an empty
/// object or list is a leaf of its own.
fn flatten(path: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, v) in map {
                flatten(&join(key), v, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{path}[{i}]"), v, out);
            }
        }
        _ => {
            out.insert(path.to_string(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lists_documents_and_single_jobs() {
        let yaml = "
- name: a
  schedule: {every: 1m}
  target: {shell: {command: 'true'}}
- name: b
  target: {http: {url: 'http://127.0.0.1:9/'}}
";
        assert_eq!(parse_file(yaml).unwrap().jobs.len(), 2);
        let doc = r#"{"jobs": [{"name": "a", "target": {"shell": {"command": "true"}}}]}"#;
        assert_eq!(parse_file(doc).unwrap().jobs.len(), 1);
        let single = r#"{"name": "a", "target": {"shell": {"command": "true"}}}"#;
        assert_eq!(parse_file(single).unwrap().jobs.len(), 1);
    }

    #[test]
    fn reads_calendars_beside_jobs_and_checks_each() {
        let yaml = "
calendars:
  - {name: uk, timezone: Europe/London, holidays: [{date: 2026-12-25, label: Christmas Day}]}
  - {name: london, include: [uk]}
jobs:
  - name: a
    schedule: {cron: '0 9 * * *', calendar: london}
    target: {shell: {command: 'true'}}
";
        let file = parse_file(yaml).unwrap();
        assert_eq!((file.calendars.len(), file.jobs.len()), (2, 1));
        assert_eq!(parse_file("calendars: [{name: uk}]").unwrap().jobs.len(), 0);
        let bad = "
calendars:
  - {name: uk, timezone: Mars/Olympus}
  - {name: uk}
  - {timezone: UTC}
jobs: []
";
        let err = parse_file(bad).unwrap_err().to_string();
        assert!(err.contains("nothing was applied"), "{err}");
        assert!(err.contains("calendar \"uk\": timezone"), "{err}");
        assert!(err.contains("appears twice"), "{err}");
        assert!(err.contains("calendar #3"), "{err}");
        let stray = parse_file("{jobs: [], calender: []}")
            .unwrap_err()
            .to_string();
        assert!(stray.contains("calender"), "{stray}");
    }

    #[test]
    fn upstreams_are_applied_before_their_dependants() {
        let yaml = "
- name: load
  target: {shell: {command: 'true'}}
  depends_on: [{job: transform}]
- name: transform
  target: {shell: {command: 'true'}}
  depends_on: [{job: extract}]
- name: extract
  schedule: {every: 1h}
  target: {shell: {command: 'true'}}
";
        let names: Vec<String> = parse_file(yaml)
            .unwrap()
            .jobs
            .iter()
            .map(|j| j["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["extract", "transform", "load"]);
        let cycle = "
- {name: a, target: {shell: {command: 'true'}}, depends_on: [{job: b}]}
- {name: b, target: {shell: {command: 'true'}}, depends_on: [{job: a}]}
";
        let err = parse_file(cycle).unwrap_err().to_string();
        assert!(err.contains("cycle: a, b"), "{err}");
    }

    #[test]
    fn one_bad_job_rejects_the_file() {
        let yaml = "
- name: good
  target: {shell: {command: 'true'}}
- name: bad
  schedule: {every: '-5s'}
  target: {shell: {command: 'true'}}
- name: good
  target: {shell: {command: 'true'}}
";
        let err = parse_file(yaml).unwrap_err().to_string();
        assert!(err.contains("nothing was applied"), "{err}");
        assert!(err.contains("negative"), "{err}");
        assert!(err.contains("appears twice"), "{err}");
    }

    #[test]
    fn a_diff_names_each_changed_field_and_never_a_secret() {
        let before = file_definition(&serde_json::json!({
            "name": "a",
            "schedule": {"every": "1m"},
            "target": {"shell": {"command": "true", "env": {"TOKEN": {"sealed": "v1:abc"}}}},
            "depends_on": [{"job": "x"}],
        }))
        .unwrap();
        let after = file_definition(&serde_json::json!({
            "name": "a",
            "schedule": {"every": "5m"},
            "target": {"shell": {"command": "true", "env": {"TOKEN": {"secret": "hunter2"}}}},
            "timeout": "30s",
        }))
        .unwrap();
        let changes = diff(&before, &after);
        let text = changes.join("\n");
        assert!(
            text.contains("~ schedule.every: \"1m\" -> \"5m\""),
            "{text}"
        );
        assert!(text.contains("+ timeout: \"30s\""), "{text}");
        assert!(text.contains("- depends_on[0].job: \"x\""), "{text}");
        assert!(!text.contains("hunter2") && !text.contains("abc"), "{text}");
        assert_eq!(changes.len(), 3, "{text}");
        assert!(diff(&before, &before).is_empty());
    }

    #[test]
    fn a_pause_and_a_resume_read_apart() {
        let job = |paused: bool| serde_json::json!({"name": "a", "target": {"shell": {"command": "true"}}, "paused": paused});
        assert_eq!(changed_fields(&job(false), &job(true)), "paused");
        assert_eq!(changed_fields(&job(true), &job(false)), "resumed");
        assert_eq!(changed_fields(&job(true), &job(true)), "-");
    }

    #[test]
    fn stale_jobs_are_pruned_dependants_first() {
        let view = |name: &str, upstream: Option<&str>| {
            let mut job = serde_json::json!({
                "name": name, "target": {"shell": {"command": "true"}},
                "namespace": "default", "state": "active", "rank": 0, "fired_count": 0,
                "created_at": "2026-11-26T00:00:00Z", "updated_at": "2026-11-26T00:00:00Z",
            });
            if let Some(up) = upstream {
                job["depends_on"] = serde_json::json!([{"job": up}]);
            }
            (name.to_string(), job)
        };
        let current: BTreeMap<String, Value> = [
            view("kept", None),
            view("extract", None),
            view("load", Some("transform")),
            view("transform", Some("extract")),
        ]
        .into_iter()
        .collect();
        let listed = BTreeSet::from(["kept"]);
        assert_eq!(
            deletion_order(&current, &listed).unwrap(),
            ["load", "transform", "extract"]
        );
    }
}

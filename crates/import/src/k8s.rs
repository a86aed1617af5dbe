//! `sked import k8s-cronjob`: Kubernetes CronJobs (a manifest of one or more YAML documents,
//! or the `List` that `kubectl get cronjobs -o yaml` prints) translated into container jobs.
//!
//! What it translates: `metadata.name`, `schedule` (with a `CRON_TZ=`/`TZ=` prefix, and
//! `@every`), `timeZone`, `concurrencyPolicy` (overlap), `startingDeadlineSeconds` (misfire),
//! `suspend` (paused), the Job's `activeDeadlineSeconds` (timeout) and `backoffLimit`
//! (retries, with the controller's back-off), and the pod's one container (image, command,
//! args, plain env values, working directory, user, memory and CPU limits, pull policy),
//! with the pod's network. What it reports: secrets and other `valueFrom`/`envFrom` sources,
//! other containers, init containers, volumes, and where sked's instants around a change of
//! clocks differ from the controller's. This module reads text only; it must not touch files,
//! the cluster or the server.

use crate::dst::{self, Source};
use crate::{text_of, Import, ImportError, ImportedJob};
use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sked_core::schedule::cron::CronExpr;
use sked_core::{HumanDuration, Instant};

/// How to read CronJobs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The zone of CronJobs without `timeZone`: the controller manager's own zone, UTC in
    /// most clusters. UTC when `None`.
    pub timezone: Option<Tz>,
    /// The moment from which changes of clocks and missed instants are judged (now when
    /// `None`).
    pub as_of: Option<Instant>,
}

/// Translates CronJobs, those without `timeZone` in UTC.
pub fn import(text: &str) -> Result<Import, ImportError> {
    import_with(text, &Options::default())
}

/// Kubernetes' default `backoffLimit`.
const DEFAULT_BACKOFF_LIMIT: u64 = 6;

/// Where one CronJob stands in the text: its line and the lines that are its own.
struct Place<'a> {
    lines: &'a [&'a str],
    /// 1-based line of the CronJob (its `kind: CronJob`).
    line: usize,
    /// 1-based line where the next CronJob starts (or past the end).
    end: usize,
}

impl Place<'_> {
    /// The first line of this CronJob whose text, trimmed, starts with `key`; its own line
    /// when none does.
    fn of(&self, key: &str) -> usize {
        (self.line..self.end)
            .find(|n| {
                self.lines
                    .get(n - 1)
                    .is_some_and(|l| l.trim_start().trim_start_matches("- ").starts_with(key))
            })
            .unwrap_or(self.line)
    }
}

/// Translates CronJobs as `options` say.
pub fn import_with(text: &str, options: &Options) -> Result<Import, ImportError> {
    let text = text_of(text.as_bytes())?;
    let as_of = options.as_of.unwrap_or_else(dst::now);
    let mut clocks = dst::Clocks::new(as_of);
    let mut cronjobs: Vec<(Value, Vec<String>)> = Vec::new();
    let mut import = Import::default();
    let starts = document_starts(text);
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| ImportError::Syntax {
            line: e.location().map_or(1, |l| l.line()),
            message: format!("not a YAML manifest: {e}"),
        })?;
        let start = starts.get(i).copied().unwrap_or(1);
        let comments = leading_comments(text, start);
        collect(value, comments, start, &mut cronjobs, &mut import);
    }
    let lines: Vec<&str> = text.lines().collect();
    let job_lines: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim_start().trim_start_matches("- ").trim() == "kind: CronJob")
        .map(|(i, _)| i + 1)
        .collect();
    let count = cronjobs.len();
    for (i, (cronjob, comments)) in cronjobs.into_iter().enumerate() {
        // The CronJobs come in the text's order; so do their `kind:` lines, when each has one.
        let line = if job_lines.len() == count {
            job_lines[i]
        } else {
            0
        };
        let end = job_lines.get(i + 1).copied().unwrap_or(lines.len() + 1);
        let place = Place {
            lines: &lines,
            line,
            end,
        };
        translate(
            &mut import,
            &cronjob,
            comments,
            &place,
            options,
            as_of,
            &mut clocks,
        );
    }
    Ok(import)
}

/// The 1-based line where each YAML document of `text` starts.
fn document_starts(text: &str) -> Vec<usize> {
    let mut starts = vec![1];
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("---") && i > 0 {
            starts.push(i + 2);
        } else if line.starts_with("---") {
            starts[0] = 2;
        }
    }
    starts
}

/// The comment lines that open the document starting at `start`.
fn leading_comments(text: &str, start: usize) -> Vec<String> {
    text.lines()
        .skip(start.saturating_sub(1))
        .take_while(|l| l.trim_start().starts_with('#') || l.trim().is_empty())
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(|c| c.strip_prefix(' ').unwrap_or(c).to_string())
        .collect()
}

/// The CronJobs of one document: itself, or a list's items; anything else is reported.
fn collect(
    value: Value,
    comments: Vec<String>,
    line: usize,
    cronjobs: &mut Vec<(Value, Vec<String>)>,
    import: &mut Import,
) {
    let kind = value["kind"].as_str().unwrap_or_default().to_string();
    match kind.as_str() {
        _ if value.is_null() => {}
        "CronJob" => cronjobs.push((value, comments)),
        "List" | "CronJobList" => {
            let mut first = true;
            for item in value["items"].as_array().cloned().unwrap_or_default() {
                let above = if first { comments.clone() } else { Vec::new() };
                first = false;
                collect(item, above, line, cronjobs, import);
            }
        }
        other => {
            let name = value["metadata"]["name"].as_str().unwrap_or("?");
            let what = if other.is_empty() {
                "a document without `kind`".to_string()
            } else {
                format!("a {other}")
            };
            import.skip(
                line,
                &format!("{other} {name}"),
                format!("{what}, not a CronJob"),
            );
        }
    }
}

fn translate(
    import: &mut Import,
    cronjob: &Value,
    mut comments: Vec<String>,
    place: &Place<'_>,
    options: &Options,
    as_of: Instant,
    clocks: &mut dst::Clocks,
) {
    let line = place.line;
    let name = cronjob["metadata"]["name"].as_str().unwrap_or_default();
    let label = format!("CronJob {name}");
    let spec = &cronjob["spec"];
    if let Some(ns) = cronjob["metadata"]["namespace"].as_str() {
        comments.push(format!("Kubernetes namespace {ns}"));
    }
    // The schedule and its zone.
    let Some(raw) = spec["schedule"].as_str() else {
        import.skip(line, &label, "it has no spec.schedule");
        return;
    };
    let (prefix_zone, fields) = split_zone_prefix(raw.trim());
    let zone_name = match (prefix_zone, spec["timeZone"].as_str()) {
        (Some(_), Some(_)) => {
            import.skip(
                place.of("schedule:"),
                &label,
                "it names a zone both in its schedule and in timeZone (Kubernetes refuses that)",
            );
            return;
        }
        (Some(z), None) | (None, Some(z)) => Some(z),
        (None, None) => None,
    };
    let tz = match zone_name.map(str::parse::<Tz>) {
        Some(Ok(tz)) => Some(tz),
        Some(Err(_)) => {
            import.skip(
                if prefix_zone.is_some() {
                    place.of("schedule:")
                } else {
                    place.of("timeZone:")
                },
                &label,
                format!(
                    "{:?} is not an IANA time zone",
                    zone_name.unwrap_or_default()
                ),
            );
            return;
        }
        None => {
            if options.timezone.is_none() {
                comments.push(
                    "no timeZone: the controller manager's zone applied (UTC in most \
                     clusters); it is read here in UTC (`sked import --timezone ZONE` reads it \
                     in another)"
                        .to_string(),
                );
            }
            options.timezone
        }
    };
    let mut schedule = Map::new();
    let mut expr = None;
    if let Some(every) = fields.strip_prefix("@every") {
        match every.trim().parse::<HumanDuration>() {
            Ok(period) => {
                schedule.insert("every".into(), json!(period.to_string()));
                comments.push(
                    "@every: Kubernetes counted from its controller's last run; sked counts from \
                     the moment the job is applied"
                        .to_string(),
                );
            }
            Err(e) => {
                import.skip(
                    place.of("schedule:"),
                    &label,
                    format!("schedule {raw:?}: {e}"),
                );
                return;
            }
        }
    } else {
        match CronExpr::parse(fields) {
            Ok(parsed) => expr = Some(parsed),
            Err(e) => {
                import.skip(
                    place.of("schedule:"),
                    &label,
                    format!("schedule {raw:?}: {e}"),
                );
                return;
            }
        }
        schedule.insert("cron".into(), json!(fields));
        if let Some(tz) = tz {
            schedule.insert("timezone".into(), json!(tz.name()));
        }
    }
    let mut job = Map::new();
    job.insert("name".into(), json!(name));
    job.insert("schedule".into(), Value::Object(schedule));
    let mut differences: Vec<(usize, String)> = Vec::new();
    // The pod's container.
    let pod = &spec["jobTemplate"]["spec"]["template"]["spec"];
    match container_target(import, pod, place, &label) {
        Some(target) => {
            job.insert("target".into(), json!({ "container": target }));
        }
        None => return,
    }
    // Policies.
    match spec["concurrencyPolicy"].as_str().unwrap_or("Allow") {
        "Allow" => {}
        "Forbid" => {
            job.insert("overlap".into(), json!("skip"));
        }
        "Replace" => {
            job.insert("overlap".into(), json!("cancel_running"));
        }
        other => import.skip(
            place.of("concurrencyPolicy:"),
            &label,
            format!("concurrencyPolicy {other:?} is not Allow, Forbid or Replace; sked's default (allow) is used"),
        ),
    }
    if let Some(deadline) = spec["startingDeadlineSeconds"].as_u64() {
        job.insert(
            "misfire".into(),
            json!({ "policy": "run_all", "catchup_window": format!("{deadline}s") }),
        );
        // Kubernetes starts the latest missed time within the deadline only; sked runs each:
        // the same when two instants never fit in one deadline.
        if let Some(expr) = &expr {
            if shortest_gap(expr, tz.unwrap_or(chrono_tz::UTC), as_of)
                .is_some_and(|gap| gap <= deadline)
            {
                differences.push((
                    place.of("startingDeadlineSeconds:"),
                    format!(
                        "startingDeadlineSeconds {deadline}: Kubernetes starts only the latest \
                         missed time within it; sked runs every missed instant within it"
                    ),
                ));
            }
        }
    }
    if spec["suspend"].as_bool() == Some(true) {
        job.insert("paused".into(), json!(true));
    }
    let job_spec = &spec["jobTemplate"]["spec"];
    if let Some(seconds) = job_spec["activeDeadlineSeconds"].as_u64() {
        job.insert("timeout".into(), json!(format!("{seconds}s")));
    }
    let backoff_limit = match job_spec["backoffLimit"].as_u64() {
        Some(n) => n,
        None => {
            comments.push(format!(
                "no backoffLimit: Kubernetes' default, {DEFAULT_BACKOFF_LIMIT} retries"
            ));
            DEFAULT_BACKOFF_LIMIT
        }
    };
    // The Job controller's back-off between pods: 10s, doubled, at most 6 minutes.
    job.insert(
        "retry".into(),
        json!({
            "max_attempts": backoff_limit.saturating_add(1),
            "backoff": { "initial": "10s", "max": "6m", "multiplier": 2.0, "jitter": false },
        }),
    );
    let kept = import.push_job(
        ImportedJob {
            job: Value::Object(job),
            comments,
            line,
        },
        &label,
    );
    if !kept {
        return;
    }
    if let (Some(expr), Some(tz)) = (&expr, tz) {
        if let Some(why) = clocks.difference(expr, fields, tz, Source::Kubernetes) {
            differences.push((place.of("schedule:"), why));
        }
    }
    for (at, why) in differences {
        if let Some(job) = import.jobs.last_mut() {
            job.comments.push(format!("differs from Kubernetes: {why}"));
        }
        import.differ(at, &label, why);
    }
}

/// A schedule's `CRON_TZ=zone ` or `TZ=zone ` prefix, and the rest.
fn split_zone_prefix(schedule: &str) -> (Option<&str>, &str) {
    for prefix in ["CRON_TZ=", "TZ="] {
        if let Some(rest) = schedule.strip_prefix(prefix) {
            let (zone, fields) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            return (Some(zone), fields.trim());
        }
    }
    (None, schedule)
}

/// The shortest time, in seconds, between two of the next instants of `expr`.
fn shortest_gap(expr: &CronExpr, tz: Tz, from: Instant) -> Option<u64> {
    let mut at = expr.next_after(from, tz)?;
    let mut shortest: Option<i64> = None;
    for _ in 0..500 {
        let Some(next) = expr.next_after(at, tz) else {
            break;
        };
        let gap = (next - at).num_seconds();
        shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
        at = next;
    }
    shortest.and_then(|s| u64::try_from(s).ok())
}

/// The pod's first container as a container target, reporting what does not carry over;
/// `None` (reported) when there is no container.
fn container_target(
    import: &mut Import,
    pod: &Value,
    place: &Place<'_>,
    label: &str,
) -> Option<Map<String, Value>> {
    let containers = pod["containers"].as_array().cloned().unwrap_or_default();
    let Some(container) = containers.first() else {
        import.skip(place.line, label, "its pod template has no container");
        return None;
    };
    for extra in containers.iter().skip(1) {
        let name = extra["name"].as_str().unwrap_or("?");
        import.skip(
            place.of(&format!("name: {name}")),
            label,
            format!(
                "container {name:?}: a sked job runs one container; only the first is translated"
            ),
        );
    }
    if let Some(init) = pod["initContainers"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
        import.skip(
            place.of("initContainers:"),
            label,
            format!(
                "init containers {}: sked runs no container before the job's; make them a job \
                 this one depends on (depends_on)",
                names.join(", ")
            ),
        );
    }
    if let Some(volumes) = pod["volumes"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<&str> = volumes.iter().filter_map(|v| v["name"].as_str()).collect();
        import.skip(
            place.of("volumes:"),
            label,
            format!(
                "volumes {}: a container job mounts host paths only (target.container.mounts, \
                 within the server's --mount-allow)",
                names.join(", ")
            ),
        );
    }
    let mut target = Map::new();
    let image = container["image"].as_str().unwrap_or_default();
    target.insert("image".into(), json!(image));
    // Kubernetes' `command` replaces the image's entrypoint and `args` its command; sked's
    // `entrypoint` is one program, and `command` and `args` follow it.
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().map_or_else(|| s.to_string(), str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let command = strings(&container["command"]);
    let mut argv: Vec<String> = Vec::new();
    if let Some((entrypoint, rest)) = command.split_first() {
        target.insert("entrypoint".into(), json!(entrypoint));
        argv.extend(rest.iter().cloned());
    }
    argv.extend(strings(&container["args"]));
    if let Some((program, rest)) = argv.split_first() {
        target.insert("command".into(), json!(program));
        if !rest.is_empty() {
            target.insert("args".into(), json!(rest));
        }
    }
    let mut env = Map::new();
    for var in container["env"].as_array().cloned().unwrap_or_default() {
        let name = var["name"].as_str().unwrap_or_default().to_string();
        if let Some(value) = var.get("value") {
            env.insert(name, json!(value.as_str().unwrap_or_default()));
        } else if let Some(from) = var.get("valueFrom") {
            let at = place.of(&format!("name: {name}"));
            let why = match &from["secretKeyRef"] {
                Value::Object(secret) => format!(
                    "env {name} comes from Secret {} key {}: store it as a sked secret \
                     (`sked secret set NAME`) and give it as {{secret_ref: NAME}}",
                    secret.get("name").and_then(Value::as_str).unwrap_or("?"),
                    secret.get("key").and_then(Value::as_str).unwrap_or("?"),
                ),
                _ => format!(
                    "env {name} comes from the cluster (valueFrom): give its value, or a \
                     {{secret_ref: NAME}}"
                ),
            };
            import.skip(at, label, why);
        } else {
            env.insert(name, json!(""));
        }
    }
    if container["envFrom"]
        .as_array()
        .is_some_and(|a| !a.is_empty())
    {
        import.skip(
            place.of("envFrom:"),
            label,
            "envFrom: the variables of a ConfigMap or Secret are not in the manifest; give them \
             in target.container.env",
        );
    }
    if !env.is_empty() {
        target.insert("env".into(), Value::Object(env));
    }
    if let Some(dir) = container["workingDir"].as_str() {
        target.insert("workdir".into(), json!(dir));
    }
    let security = |key: &str| {
        container["securityContext"][key]
            .as_u64()
            .or_else(|| pod["securityContext"][key].as_u64())
    };
    if let Some(uid) = security("runAsUser") {
        let user = match security("runAsGroup") {
            Some(gid) => format!("{uid}:{gid}"),
            None => uid.to_string(),
        };
        target.insert("user".into(), json!(user));
    }
    let limits = &container["resources"]["limits"];
    if let Some(memory) = limits.get("memory") {
        match quantity(memory).and_then(|q| (q.fract() == 0.0 && q >= 1.0).then_some(q as u64)) {
            Some(bytes) => {
                target.insert("memory".into(), json!(bytes));
            }
            None => import.skip(
                place.of("memory:"),
                label,
                format!("memory limit {memory} is not a quantity sked reads"),
            ),
        }
    }
    if let Some(cpu) = limits.get("cpu") {
        match quantity(cpu) {
            Some(cpus) => {
                target.insert("cpus".into(), json!(cpus));
            }
            None => import.skip(
                place.of("cpu:"),
                label,
                format!("cpu limit {cpu} is not a quantity sked reads"),
            ),
        }
    }
    match container["imagePullPolicy"].as_str() {
        Some("Always") => {
            target.insert("pull".into(), json!("always"));
        }
        Some("Never") => {
            target.insert("pull".into(), json!("never"));
        }
        _ => {}
    }
    // A pod has the cluster's network; a sked container has none unless given one.
    target.insert("network".into(), json!("bridge"));
    Some(target)
}

/// A Kubernetes quantity (`128Mi`, `1G`, `500m`, `1.5`, `2e3`) as a number.
fn quantity(value: &Value) -> Option<f64> {
    if let Some(n) = value.as_f64() {
        return Some(n);
    }
    let text = value.as_str()?.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = text.strip_suffix(suffix) {
            return number
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .map(|n| n * factor);
        }
    }
    text.parse::<f64>().ok().filter(|n| n.is_finite())
}

#[cfg(test)]
mod tests;

//! Creating, editing and cloning a job through a form.
//!
//! The form has fields for what most jobs set (schedule, a shell or HTTP target, timeout,
//! attempts, overlap) and a JSON box for the rest of the definition, so a job that uses more
//! (routing, dependencies, notifications, a broker target) is edited without losing any of it.
//! The API validates the definition; its `field` puts each refusal beside the input at fault.

use super::{namespaces, refused};
use crate::console::api::{query, segment, Failure};
use crate::console::layout;
use crate::console::{Console, Visitor};
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// What the form's inputs hold. Every field is text, as a form sends it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct JobForm {
    pub csrf: String,
    pub name: String,
    pub namespace: String,
    pub description: String,
    /// `cron`, `every`, `at`, `none`, or `other` (set in the JSON box).
    pub schedule_kind: String,
    pub cron: String,
    pub timezone: String,
    pub every: String,
    pub at: String,
    /// `shell`, `http`, or `other` (set in the JSON box).
    pub target_kind: String,
    pub command: String,
    pub http_method: String,
    pub url: String,
    pub timeout: String,
    pub max_attempts: String,
    pub overlap: String,
    /// The rest of the definition, as a JSON object.
    pub extra: String,
}

/// The schedule fields the form has inputs for.
const SCHEDULE_KINDS: [&str; 3] = ["cron", "every", "at"];
/// Schedule fields that make a kind of their own and have no input: with one of them, the
/// schedule is edited in the JSON box.
const OTHER_SCHEDULE_KINDS: [&str; 2] = ["iso8601", "event"];
const OVERLAPS: [&str; 5] = [
    "allow",
    "skip",
    "buffer_one",
    "buffer_all",
    "cancel_running",
];

/// The kind an input belongs to (`schedule_kind=cron`): `console.js` shows it only while that
/// kind is chosen. Without the script every input shows, and those of other kinds are ignored.
fn shown_with(input: &str) -> Option<&'static str> {
    match input {
        "cron" | "timezone" => Some("schedule_kind=cron"),
        "every" => Some("schedule_kind=every"),
        "at" => Some("schedule_kind=at"),
        "command" => Some("target_kind=shell"),
        "http_method" | "url" => Some("target_kind=http"),
        _ => None,
    }
}

/// An input the API's `field` names, or the JSON box for fields without one.
fn input_of(field: &str) -> &'static str {
    match field {
        "name" => "name",
        "namespace" => "namespace",
        "description" => "description",
        "schedule.cron" => "cron",
        "schedule.timezone" => "timezone",
        "schedule.every" => "every",
        "schedule.at" => "at",
        "schedule" => "schedule_kind",
        "target.shell.command" => "command",
        "target.http.url" => "url",
        "target.http.method" => "http_method",
        "target" => "target_kind",
        "timeout" => "timeout",
        "retry.max_attempts" => "max_attempts",
        "overlap" => "overlap",
        _ => "extra",
    }
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Takes `key` out of an object, if `value` is one.
fn take(value: &mut Value, key: &str) -> Option<Value> {
    value.as_object_mut()?.remove(key)
}

impl JobForm {
    /// The form for an existing definition (without the fields the API adds).
    pub fn from_definition(namespace: &str, mut spec: Value) -> JobForm {
        let mut form = JobForm {
            namespace: namespace.to_string(),
            name: text(take(&mut spec, "name").as_ref()),
            description: text(take(&mut spec, "description").as_ref()),
            timeout: text(take(&mut spec, "timeout").as_ref()),
            overlap: text(take(&mut spec, "overlap").as_ref()),
            ..JobForm::default()
        };
        if let Some(mut schedule) = take(&mut spec, "schedule") {
            let other = OTHER_SCHEDULE_KINDS
                .iter()
                .any(|k| schedule.get(k).is_some());
            form.schedule_kind = match SCHEDULE_KINDS.iter().find(|k| schedule.get(**k).is_some()) {
                Some(kind) if !other => kind.to_string(),
                _ => "other".into(),
            };
            if form.schedule_kind != "other" {
                form.cron = text(take(&mut schedule, "cron").as_ref());
                form.timezone = text(take(&mut schedule, "timezone").as_ref());
                form.every = text(take(&mut schedule, "every").as_ref());
                form.at = text(take(&mut schedule, "at").as_ref());
            }
            if schedule.as_object().is_some_and(|o| !o.is_empty()) {
                spec["schedule"] = schedule;
            }
        } else {
            form.schedule_kind = "none".into();
        }
        let mut target = take(&mut spec, "target").unwrap_or(Value::Null);
        form.target_kind = "other".into();
        if let Some(mut shell) = take(&mut target, "shell") {
            form.target_kind = "shell".into();
            form.command = text(take(&mut shell, "command").as_ref());
            target["shell"] = shell;
        } else if let Some(mut http) = take(&mut target, "http") {
            form.target_kind = "http".into();
            form.http_method = text(take(&mut http, "method").as_ref());
            form.url = text(take(&mut http, "url").as_ref());
            target["http"] = http;
        }
        // What is left of the target (env, headers, a broker target) stays in the JSON box,
        // but only when there is something left.
        let left = target.as_object().is_some_and(|o| {
            o.values()
                .any(|v| v.as_object().is_none_or(|i| !i.is_empty()))
        });
        if left {
            spec["target"] = target;
        }
        if let Some(mut retry) = take(&mut spec, "retry") {
            form.max_attempts = text(take(&mut retry, "max_attempts").as_ref());
            if retry.as_object().is_some_and(|o| !o.is_empty()) {
                spec["retry"] = retry;
            }
        }
        form.extra = match spec.as_object() {
            Some(o) if !o.is_empty() => serde_json::to_string_pretty(&spec).unwrap_or_default(),
            _ => String::new(),
        };
        form
    }

    /// The definition the form describes, or the input at fault and why.
    pub fn to_definition(&self) -> Result<Value, (&'static str, String)> {
        let mut spec = if self.extra.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            match serde_json::from_str::<Value>(&self.extra) {
                Ok(value @ Value::Object(_)) => value,
                Ok(_) => return Err(("extra", "must be a JSON object, {...}".into())),
                Err(e) => return Err(("extra", format!("is not JSON: {e}"))),
            }
        };
        let set = |spec: &mut Value, key: &str, value: &str| {
            if !value.trim().is_empty() {
                spec[key] = json!(value.trim());
            }
        };
        set(&mut spec, "name", &self.name);
        set(&mut spec, "description", &self.description);
        set(&mut spec, "timeout", &self.timeout);
        set(&mut spec, "overlap", &self.overlap);
        if !self.max_attempts.trim().is_empty() {
            let attempts: u64 = self
                .max_attempts
                .trim()
                .parse()
                .map_err(|_| ("max_attempts", "must be a whole number".to_string()))?;
            let retry = spec.get("retry").cloned().unwrap_or_else(|| json!({}));
            spec["retry"] = retry;
            spec["retry"]["max_attempts"] = json!(attempts);
        }
        match self.schedule_kind.as_str() {
            "none" => {
                take(&mut spec, "schedule");
            }
            kind @ ("cron" | "every" | "at") => {
                let mut schedule = spec.get("schedule").cloned().unwrap_or_else(|| json!({}));
                if !schedule.is_object() {
                    return Err(("extra", "schedule must be an object".into()));
                }
                for other in SCHEDULE_KINDS.iter().chain(&OTHER_SCHEDULE_KINDS) {
                    take(&mut schedule, other);
                }
                let value = match kind {
                    "cron" => &self.cron,
                    "every" => &self.every,
                    _ => &self.at,
                };
                if value.trim().is_empty() {
                    return Err((input_of(&format!("schedule.{kind}")), "is required".into()));
                }
                schedule[kind] = json!(value.trim());
                if kind == "cron" && !self.timezone.trim().is_empty() {
                    schedule["timezone"] = json!(self.timezone.trim());
                } else {
                    take(&mut schedule, "timezone");
                }
                spec["schedule"] = schedule;
            }
            _ => {}
        }
        match self.target_kind.as_str() {
            "shell" | "http" => {
                let kind = self.target_kind.as_str();
                let mut inner = spec
                    .get("target")
                    .and_then(|t| t.get(kind))
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                if kind == "shell" {
                    inner["command"] = json!(self.command);
                } else {
                    let method = self.http_method.trim();
                    inner["method"] = json!(if method.is_empty() { "GET" } else { method });
                    inner["url"] = json!(self.url.trim());
                }
                spec["target"] = json!({ kind: inner });
            }
            _ => {}
        }
        Ok(spec)
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct NewParams {
    #[serde(default)]
    namespace: String,
    /// A job of the namespace to start from.
    #[serde(default)]
    clone: String,
}

pub async fn new_form(
    State(console): State<Console>,
    visitor: Visitor,
    Query(p): Query<NewParams>,
) -> Response {
    let namespace = if p.namespace.is_empty() {
        "default".to_string()
    } else {
        p.namespace
    };
    let form = if p.clone.is_empty() {
        JobForm {
            namespace: namespace.clone(),
            schedule_kind: "cron".into(),
            target_kind: "shell".into(),
            overlap: "allow".into(),
            ..JobForm::default()
        }
    } else {
        match super::job::definition(&console, visitor.who(), &namespace, &p.clone).await {
            Ok((value, _)) => {
                let mut form = JobForm::from_definition(&namespace, super::job::spec_only(value));
                form.name = format!("{}-copy", form.name);
                form
            }
            Err(failure) => return refused(&console, &visitor, "New job", failure),
        }
    };
    let title = if p.clone.is_empty() {
        "New job".to_string()
    } else {
        format!("New job from {}", p.clone)
    };
    render(&console, &visitor, &title, None, &form, None).await
}

pub async fn edit_form(
    State(console): State<Console>,
    visitor: Visitor,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    match super::job::definition(&console, visitor.who(), &namespace, &name).await {
        Ok((value, _)) => {
            let form = JobForm::from_definition(&namespace, super::job::spec_only(value));
            render(
                &console,
                &visitor,
                &format!("Edit {name}"),
                Some(&name),
                &form,
                None,
            )
            .await
        }
        Err(failure) => refused(&console, &visitor, &name, failure),
    }
}

pub async fn create(
    State(console): State<Console>,
    visitor: Visitor,
    Form(form): Form<JobForm>,
) -> Response {
    save(console, visitor, None, form).await
}

pub async fn update(
    State(console): State<Console>,
    visitor: Visitor,
    Path((namespace, name)): Path<(String, String)>,
    Form(mut form): Form<JobForm>,
) -> Response {
    // The job's name and namespace come from its address; the form cannot move it.
    form.namespace = namespace;
    form.name = name.clone();
    save(console, visitor, Some(name), form).await
}

/// Sends the form's definition to the API: the job's page when it was taken, the form again
/// with the refusal beside its input when not.
async fn save(
    console: Console,
    visitor: Visitor,
    existing: Option<String>,
    form: JobForm,
) -> Response {
    if let Err(turned) = console.check_csrf(&visitor, &form.csrf) {
        return turned.into_response();
    }
    let title = match &existing {
        Some(name) => format!("Edit {name}"),
        None => "New job".to_string(),
    };
    let definition = match form.to_definition() {
        Ok(definition) => definition,
        Err((input, message)) => {
            let shown = (input, message);
            return render(
                &console,
                &visitor,
                &title,
                existing.as_deref(),
                &form,
                Some(shown),
            )
            .await;
        }
    };
    let namespace = form.namespace.trim();
    let ns = query(&[("namespace", namespace)]);
    let (method, path) = match &existing {
        Some(name) => (Method::PUT, format!("/api/v1/jobs/{}?{ns}", segment(name))),
        None => (Method::POST, format!("/api/v1/jobs?{ns}")),
    };
    let answer = console
        .api
        .call::<Value>(visitor.who(), method, &path, Some(definition))
        .await;
    match answer {
        Ok(job) => {
            let name = job
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or(&form.name);
            let to = super::job_href(namespace, name);
            visitor.finish(&console, Redirect::to(&to).into_response())
        }
        Err(Failure {
            status,
            message,
            field,
            ..
        }) if status == StatusCode::BAD_REQUEST
            || status == StatusCode::CONFLICT
            || status == StatusCode::UNPROCESSABLE_ENTITY =>
        {
            let (input, shown) = match field.as_deref() {
                // The API's advice (use PUT) is for API clients; here the name is at fault.
                _ if status == StatusCode::CONFLICT => (
                    "name",
                    format!(
                        "a job named {:?} already exists in this namespace",
                        form.name
                    ),
                ),
                Some(f) if input_of(f) == "extra" => ("extra", format!("{f}: {message}")),
                Some(f) => (input_of(f), message),
                None => ("extra", message),
            };
            let mut response = render(
                &console,
                &visitor,
                &title,
                existing.as_deref(),
                &form,
                Some((input, shown)),
            )
            .await;
            *response.status_mut() = status;
            response
        }
        Err(failure) => refused(&console, &visitor, &title, failure),
    }
}

/// The form, with `error` beside the input it names.
async fn render(
    console: &Console,
    visitor: &Visitor,
    title: &str,
    existing: Option<&str>,
    form: &JobForm,
    error: Option<(&'static str, String)>,
) -> Response {
    let error_for = |input: &str| -> Option<&str> {
        error
            .as_ref()
            .filter(|(at, _)| *at == input)
            .map(|(_, message)| message.as_str())
    };
    let field = |input: &'static str, label: &str, control: Markup, hint: &str| -> Markup {
        let problem = error_for(input);
        html! {
            div.field.invalid[problem.is_some()] data-shown-with=[shown_with(input)] {
                label for=(input) { (label) }
                (control)
                @if !hint.is_empty() { small.hint #{ (input) "-hint" } { (hint) } }
                @if let Some(problem) = problem {
                    p.field-error #{ (input) "-error" } role="alert" { (problem) }
                }
            }
        }
    };
    let invalid = |input: &str| error_for(input).map(|_| "true");
    let described = |input: &str| error_for(input).map(|_| format!("{input}-error"));
    let action = match existing {
        Some(name) => format!("{}/edit", super::job_href(&form.namespace, name)),
        None => "/jobs/new".to_string(),
    };
    let cancel = match existing {
        Some(name) => super::job_href(&form.namespace, name),
        None => format!("/jobs?{}", query(&[("namespace", &form.namespace)])),
    };
    let body = html! {
        form.job method="post" action=(action) novalidate {
            input type="hidden" name="csrf" value=(visitor.csrf);
            fieldset {
                legend { "Job" }
                (field("name", "Name", html! {
                    input #name name="name" value=(form.name) required maxlength="128"
                        readonly[existing.is_some()] aria-invalid=[invalid("name")] aria-describedby=[described("name")];
                }, "letters, digits, . _ -"))
                (field("namespace", "Namespace", html! {
                    @if existing.is_some() {
                        input #namespace name="namespace" value=(form.namespace) readonly;
                    } @else {
                        input #namespace name="namespace" value=(form.namespace) list="namespaces" required
                            aria-invalid=[invalid("namespace")] aria-describedby=[described("namespace")];
                    }
                }, ""))
                (field("description", "Description", html! {
                    input #description name="description" value=(form.description) maxlength="4096"
                        aria-invalid=[invalid("description")] aria-describedby=[described("description")];
                }, ""))
            }
            fieldset {
                legend { "When" }
                (field("schedule_kind", "Schedule", html! {
                    select #schedule_kind name="schedule_kind" aria-invalid=[invalid("schedule_kind")] {
                        @for (value, label) in [("cron", "cron expression"), ("every", "fixed interval"), ("at", "once, at an instant"), ("none", "only when triggered"), ("other", "as in the definition below")] {
                            option value=(value) selected[form.schedule_kind == value] { (label) }
                        }
                    }
                }, ""))
                (field("cron", "Cron", html! {
                    input #cron name="cron" value=(form.cron) placeholder="0 30 2 * * *" spellcheck="false"
                        aria-invalid=[invalid("cron")] aria-describedby=[described("cron")];
                }, "seconds minutes hours day-of-month month day-of-week"))
                (field("timezone", "Time zone", html! {
                    input #timezone name="timezone" value=(form.timezone) placeholder="UTC"
                        aria-invalid=[invalid("timezone")] aria-describedby=[described("timezone")];
                }, "IANA name, e.g. Europe/London"))
                (field("every", "Every", html! {
                    input #every name="every" value=(form.every) placeholder="5m"
                        aria-invalid=[invalid("every")] aria-describedby=[described("every")];
                }, "a duration: 90s, 5m, 2h"))
                (field("at", "At", html! {
                    input #at name="at" value=(form.at) placeholder="2026-12-01T09:00:00Z"
                        aria-invalid=[invalid("at")] aria-describedby=[described("at")];
                }, "RFC 3339"))
            }
            fieldset {
                legend { "What" }
                (field("target_kind", "Target", html! {
                    select #target_kind name="target_kind" aria-invalid=[invalid("target_kind")] {
                        @for (value, label) in [("shell", "shell command"), ("http", "HTTP request"), ("other", "as in the definition below")] {
                            option value=(value) selected[form.target_kind == value] { (label) }
                        }
                    }
                }, ""))
                (field("command", "Command", html! {
                    textarea #command name="command" rows="3" spellcheck="false"
                        aria-invalid=[invalid("command")] aria-describedby=[described("command")] { (form.command) }
                }, "run by /bin/sh -c on a worker"))
                (field("http_method", "Method", html! {
                    input #http_method name="http_method" value=(form.http_method) placeholder="GET"
                        aria-invalid=[invalid("http_method")] aria-describedby=[described("http_method")];
                }, ""))
                (field("url", "URL", html! {
                    input #url name="url" type="url" value=(form.url)
                        aria-invalid=[invalid("url")] aria-describedby=[described("url")];
                }, ""))
            }
            fieldset {
                legend { "How" }
                (field("timeout", "Timeout", html! {
                    input #timeout name="timeout" value=(form.timeout) placeholder="none"
                        aria-invalid=[invalid("timeout")] aria-describedby=[described("timeout")];
                }, "a duration"))
                (field("max_attempts", "Attempts", html! {
                    input #max_attempts name="max_attempts" inputmode="numeric" value=(form.max_attempts) placeholder="1"
                        aria-invalid=[invalid("max_attempts")] aria-describedby=[described("max_attempts")];
                }, "how many attempts may fail before the run fails"))
                (field("overlap", "Overlap", html! {
                    select #overlap name="overlap" aria-invalid=[invalid("overlap")] {
                        @for value in OVERLAPS {
                            option value=(value) selected[form.overlap == value] { (value.replace('_', " ")) }
                        }
                    }
                }, "when an instant is due while an earlier run still runs"))
                (field("extra", "Rest of the definition (JSON)", html! {
                    textarea #extra name="extra" rows="8" spellcheck="false"
                        aria-invalid=[invalid("extra")] aria-describedby=[described("extra")] { (form.extra) }
                }, "routing, depends_on, notify, env, a broker target … as in docs/JOBS.md"))
            }
            div.actions {
                button.primary type="submit" { @if existing.is_some() { "Save" } @else { "Create" } }
                a.button href=(cancel) { "Cancel" }
            }
        }
    };
    let known = namespaces(console, visitor).await;
    let body = html! {
        (body)
        datalist #namespaces { @for ns in &known { option value=(ns) {} } }
    };
    layout::page(console, visitor, title, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_survives_the_form_unchanged() {
        let spec = json!({
            "name": "nightly",
            "description": "sales report",
            "schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/London", "jitter": "5s"},
            "target": {"shell": {"command": "report.sh", "env": {"LEVEL": "full"}}},
            "timeout": "10m",
            "retry": {"max_attempts": 3, "backoff": {"initial": "1s"}},
            "overlap": "skip",
            "routing": {"labels": {"zone": "eu"}}
        });
        let form = JobForm::from_definition("default", spec.clone());
        assert_eq!(form.schedule_kind, "cron");
        assert_eq!(form.cron, "0 30 2 * * *");
        assert_eq!(form.command, "report.sh");
        assert_eq!(form.max_attempts, "3");
        let extra: Value = serde_json::from_str(&form.extra).unwrap();
        assert_eq!(extra["routing"]["labels"]["zone"], "eu");
        assert_eq!(extra["schedule"], json!({"jitter": "5s"}));
        assert_eq!(form.to_definition().unwrap(), spec);
    }

    #[test]
    fn kinds_without_inputs_stay_in_the_json_box() {
        let spec = json!({
            "name": "on-load",
            "schedule": {"event": "orders.loaded"},
            "target": {"amqp": {"exchange": "jobs"}}
        });
        let form = JobForm::from_definition("default", spec.clone());
        assert_eq!(
            (form.schedule_kind.as_str(), form.target_kind.as_str()),
            ("other", "other")
        );
        assert_eq!(form.to_definition().unwrap(), spec);
    }

    #[test]
    fn switching_kind_replaces_the_old_one() {
        let spec = json!({"name": "x", "schedule": {"cron": "0 * * * * *", "timezone": "UTC"},
                          "target": {"http": {"method": "POST", "url": "http://a/"}}});
        let mut form = JobForm::from_definition("default", spec);
        form.schedule_kind = "every".into();
        form.every = "5m".into();
        form.target_kind = "shell".into();
        form.command = "true".into();
        let out = form.to_definition().unwrap();
        assert_eq!(out["schedule"], json!({"every": "5m"}));
        assert_eq!(out["target"], json!({"shell": {"command": "true"}}));
        form.schedule_kind = "none".into();
        assert!(form.to_definition().unwrap().get("schedule").is_none());
    }

    #[test]
    fn bad_input_names_its_field() {
        let form = JobForm {
            extra: "[1]".into(),
            ..JobForm::default()
        };
        assert_eq!(form.to_definition().unwrap_err().0, "extra");
        let form = JobForm {
            max_attempts: "three".into(),
            ..JobForm::default()
        };
        assert_eq!(form.to_definition().unwrap_err().0, "max_attempts");
        let form = JobForm {
            schedule_kind: "cron".into(),
            ..JobForm::default()
        };
        assert_eq!(form.to_definition().unwrap_err().0, "cron");
        assert_eq!(input_of("schedule.cron"), "cron");
        assert_eq!(input_of("routing.labels"), "extra");
    }
}

//! `sked job apply -f FILE`: many job definitions from one YAML or JSON file.
//!
//! The whole file is checked before anything is sent, so a file with one bad job changes
//! nothing; then each job is PUT (idempotent), upstreams before the jobs that depend on them,
//! and what changed is reported.

use crate::client::Client;
use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::Value;
use sked_core::job::JobSpec;
use std::collections::BTreeSet;
use std::path::Path;

/// The jobs in a file (a list, a `{"jobs": [...]}` document, or a single job), in the order
/// to write them: each after the jobs of the file it depends on.
pub fn parse_jobs(text: &str) -> Result<Vec<Value>> {
    // YAML is a superset of JSON, so one parser reads both.
    let doc: Value =
        serde_yaml::from_str(text).context("the file is neither valid YAML nor JSON")?;
    let jobs = match doc {
        Value::Array(items) => items,
        Value::Object(ref map) if map.contains_key("jobs") && !map.contains_key("target") => {
            match &map["jobs"] {
                Value::Array(items) => items.clone(),
                _ => bail!("`jobs` must be a list of job definitions"),
            }
        }
        Value::Object(_) => vec![doc],
        _ => bail!("expected a job, a list of jobs, or a document with a `jobs` list"),
    };
    let mut names = BTreeSet::new();
    let mut upstreams = Vec::with_capacity(jobs.len());
    let mut errors = Vec::new();
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
        Ok(order) => Ok(order.into_iter().map(|i| jobs[i].clone()).collect()),
        Err(cycle) => bail!(
            "nothing was applied: these jobs depend on each other in a cycle: {}",
            cycle.join(", ")
        ),
    }
}

pub async fn apply(client: &Client, file: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let jobs = parse_jobs(&text)?;
    for job in &jobs {
        let name = job["name"].as_str().unwrap_or_default();
        let resp = client
            .send(Method::PUT, &format!("/jobs/{name}"), &[], Some(job))
            .await
            .with_context(|| format!("job {name:?}"))?;
        let change = resp
            .headers()
            .get("x-sked-change")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("applied")
            .to_string();
        println!("{change:<9} {name}");
    }
    println!(
        "{} job(s) applied in namespace {}",
        jobs.len(),
        client.namespace
    );
    Ok(())
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
        assert_eq!(parse_jobs(yaml).unwrap().len(), 2);
        let doc = r#"{"jobs": [{"name": "a", "target": {"shell": {"command": "true"}}}]}"#;
        assert_eq!(parse_jobs(doc).unwrap().len(), 1);
        let single = r#"{"name": "a", "target": {"shell": {"command": "true"}}}"#;
        assert_eq!(parse_jobs(single).unwrap().len(), 1);
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
        let names: Vec<String> = parse_jobs(yaml)
            .unwrap()
            .iter()
            .map(|j| j["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["extract", "transform", "load"]);
        let cycle = "
- {name: a, target: {shell: {command: 'true'}}, depends_on: [{job: b}]}
- {name: b, target: {shell: {command: 'true'}}, depends_on: [{job: a}]}
";
        let err = parse_jobs(cycle).unwrap_err().to_string();
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
        let err = parse_jobs(yaml).unwrap_err().to_string();
        assert!(err.contains("nothing was applied"), "{err}");
        assert!(err.contains("negative"), "{err}");
        assert!(err.contains("appears twice"), "{err}");
    }
}

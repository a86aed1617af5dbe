//! `sked job graph`: the answer of `GET /api/v1/jobs/{name}/graph` drawn as two trees (what the
//! job waits for, what waits for it) or written as Graphviz. Pure text from the JSON answer.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The edges of an answer as `(upstream, job)` names.
fn edges(graph: &Value) -> Vec<(String, String)> {
    graph["edges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["upstream"].as_str()?.to_string(),
                e["job"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The job's upstreams as a tree above it and its dependants as a tree below; a job reached
/// twice (a diamond) is drawn once and named again as "(above)".
pub fn tree(graph: &Value) -> String {
    let job = graph["job"].as_str().unwrap_or_default();
    let mut ups: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut downs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (upstream, dependant) in edges(graph) {
        ups.entry(dependant.clone())
            .or_default()
            .insert(upstream.clone());
        downs.entry(upstream).or_default().insert(dependant);
    }
    let mut out = String::new();
    if ups.contains_key(job) {
        out.push_str(&format!("{job} waits for:\n"));
        branch(&ups, job, "", &mut BTreeSet::new(), &mut out);
    }
    out.push_str(&format!("{job}\n"));
    if downs.contains_key(job) {
        out.push_str(&format!("waiting for {job}:\n"));
        branch(&downs, job, "", &mut BTreeSet::new(), &mut out);
    }
    if graph["truncated"] == Value::Bool(true) {
        out.push_str("(more jobs are within reach than the server returns)\n");
    }
    out
}

fn branch(
    next: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    indent: &str,
    drawn: &mut BTreeSet<String>,
    out: &mut String,
) {
    let children: Vec<&String> = next.get(from).into_iter().flatten().collect();
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (mark, more) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        if !drawn.insert(child.to_string()) {
            out.push_str(&format!("{indent}{mark}{child} (above)\n"));
            continue;
        }
        out.push_str(&format!("{indent}{mark}{child}\n"));
        branch(next, child, &format!("{indent}{more}"), drawn, out);
    }
}

/// Graphviz: an arrow from each upstream to the job that waits for it, the job in bold.
pub fn dot(graph: &Value) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let job = graph["job"].as_str().unwrap_or_default();
    let mut out = format!("digraph {} {{\n  rankdir=LR;\n", quote(job));
    out.push_str(&format!("  {} [style=bold];\n", quote(job)));
    for (upstream, dependant) in edges(graph) {
        out.push_str(&format!(
            "  {} -> {};\n",
            quote(&upstream),
            quote(&dependant)
        ));
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diamond() -> Value {
        json!({
            "job": "load",
            "truncated": false,
            "edges": [
                {"upstream": "extract-a", "job": "transform"},
                {"upstream": "extract-b", "job": "transform"},
                {"upstream": "transform", "job": "load"},
                {"upstream": "transform", "job": "audit"},
                {"upstream": "load", "job": "report"},
                {"upstream": "audit", "job": "report"},
            ],
        })
    }

    #[test]
    fn draws_what_the_job_waits_for_and_what_waits_for_it() {
        let text = tree(&diamond());
        assert_eq!(
            text,
            "load waits for:\n\
             └─ transform\n   \
                ├─ extract-a\n   \
                └─ extract-b\n\
             load\n\
             waiting for load:\n\
             └─ report\n"
        );
        let mut from_transform = diamond();
        from_transform["job"] = json!("transform");
        let text = tree(&from_transform);
        assert!(
            text.contains(
                "waiting for transform:\n├─ audit\n│  └─ report\n└─ load\n   └─ report (above)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn dot_quotes_names_and_draws_each_edge() {
        let text = dot(&diamond());
        assert!(text.starts_with("digraph \"load\" {"), "{text}");
        assert!(text.contains("  \"transform\" -> \"load\";\n"), "{text}");
        assert_eq!(text.matches(" -> ").count(), 6);
    }
}

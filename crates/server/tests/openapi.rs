//! The OpenAPI document (`crates/server/src/api/openapi.json`) against the code it describes:
//! it is well formed, it lists exactly the routes `api::router` registers, every route it lists is
//! served by a real handler, the server hands it out unchanged, and what the handlers really
//! answer fits the documented status codes and schemas.

mod common;

use common::Server;

use serde_json::{json, Value};
use sked_server::ServerConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const DOCUMENT: &str = include_str!("../src/api/openapi.json");

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

/// Longest any one test may take, server start included.
const TEST_LIMIT: Duration = Duration::from_secs(60);

fn document() -> Value {
    serde_json::from_str(DOCUMENT).expect("openapi.json is not valid JSON")
}

/// The document's operations: path -> methods.
fn documented_routes(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let paths = doc["paths"].as_object().expect("`paths` is an object");
    paths
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .expect("a path item is an object")
                .keys()
                .filter(|k| METHODS.contains(&k.as_str()))
                .cloned()
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

// --- the routes the router serves, from its route table ----------------------------------------

/// Every route `api::router` registers, with its methods, as the server serves them.
fn registered_routes() -> BTreeMap<String, BTreeSet<String>> {
    let mut routes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for route in sked_server::api::routes() {
        let method = route.method.as_str().to_lowercase();
        assert!(
            routes
                .entry(route.path.to_string())
                .or_default()
                .insert(method),
            "{} {} registered twice",
            route.method,
            route.path
        );
    }
    routes
}

// --- the document on its own -------------------------------------------------------------------

fn pointer<'a>(doc: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    doc.pointer(pointer)
}

fn collect_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref" {
                    out.push(v.as_str().expect("$ref is a string").to_string());
                } else {
                    collect_refs(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

#[test]
fn the_document_is_well_formed() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("`openapi` is a string");
    assert!(version.starts_with("3."), "openapi version {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    assert!(!documented_routes(&doc).is_empty(), "no paths");

    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(!refs.is_empty());
    for reference in &refs {
        assert!(
            reference.starts_with("#/components/"),
            "{reference} points outside components"
        );
        assert!(
            pointer(&doc, reference).is_some(),
            "{reference} does not resolve"
        );
    }
    // Security schemes are used by name in security requirements, not by reference.
    let mut requirements = vec![&doc["security"]];
    for item in doc["paths"].as_object().unwrap().values() {
        requirements.extend(item.as_object().unwrap().values().map(|op| &op["security"]));
    }
    for requirement in requirements.iter().filter_map(|r| r.as_array()).flatten() {
        for scheme in requirement
            .as_object()
            .expect("a security requirement")
            .keys()
        {
            refs.push(format!("#/components/securitySchemes/{scheme}"));
        }
    }
    // Nothing in components is left unused (a sign of a schema that drifted away).
    let used: BTreeSet<&str> = refs.iter().map(String::as_str).collect();
    for (kind, entries) in doc["components"].as_object().unwrap() {
        for name in entries.as_object().unwrap().keys() {
            let reference = format!("#/components/{kind}/{name}");
            assert!(used.contains(reference.as_str()), "{reference} is unused");
        }
    }

    // Operations: unique ids, responses, and path parameters that match the path's placeholders.
    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        assert!(path.starts_with('/'), "{path}");
        let placeholders: BTreeSet<String> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(str::to_string)
            .collect();
        for method in METHODS {
            let Some(op) = item.get(*method) else {
                continue;
            };
            let id = op["operationId"].as_str().expect("operationId");
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
            let responses = op["responses"].as_object().expect("responses");
            assert!(!responses.is_empty(), "{method} {path} has no responses");
            for status in responses.keys() {
                assert!(
                    status.len() == 3 && status.parse::<u16>().is_ok(),
                    "{method} {path}: status {status}"
                );
            }
            let mut in_path = BTreeSet::new();
            let mut seen = BTreeSet::new();
            for parameter in item["parameters"]
                .as_array()
                .into_iter()
                .chain(op["parameters"].as_array())
                .flatten()
            {
                let parameter = match parameter.get("$ref") {
                    Some(r) => pointer(&doc, r.as_str().unwrap()).unwrap(),
                    None => parameter,
                };
                let name = parameter["name"].as_str().expect("parameter name");
                let place = parameter["in"].as_str().expect("parameter in");
                assert!(
                    seen.insert((name, place)),
                    "{method} {path}: parameter {name} twice"
                );
                if place == "path" {
                    assert_eq!(parameter["required"], json!(true), "{path}: {name}");
                    in_path.insert(name.to_string());
                }
            }
            assert_eq!(in_path, placeholders, "{method} {path}: path parameters");
        }
    }
}

/// What the route table says of who may call a route is what the document says: open routes
/// need no token, every other one answers 401 without one and 403 outside its role.
#[test]
fn the_document_states_each_routes_permission() {
    use sked_core::auth::Permission;
    let doc = document();
    assert!(doc["security"][0]["bearer"].is_array(), "tokens by default");
    for route in sked_server::api::routes() {
        let method = route.method.as_str().to_lowercase();
        let op = &doc["paths"][route.path][&method];
        let responses = op["responses"].as_object().expect("responses");
        let what = format!("{} {}", route.method, route.path);
        match route.permission {
            Permission::Open => {
                assert_eq!(op["security"], json!([]), "{what} is open");
                assert!(!responses.contains_key("401"), "{what}");
            }
            Permission::Authenticated => assert!(responses.contains_key("401"), "{what}"),
            _ => {
                assert!(responses.contains_key("401"), "{what} documents 401");
                assert!(responses.contains_key("403"), "{what} documents 403");
            }
        }
        if !matches!(route.permission, Permission::Open | Permission::Worker) {
            assert!(
                responses.contains_key("429"),
                "{what} documents the rate limit"
            );
        }
    }
}

#[test]
fn the_document_lists_exactly_the_routes_of_the_router() {
    let registered = registered_routes();
    let documented = documented_routes(&document());
    for (path, methods) in &registered {
        let listed = documented
            .get(path)
            .unwrap_or_else(|| panic!("{path} is served but not documented"));
        for method in methods {
            assert!(
                listed.contains(method),
                "{} {path} is served but not documented",
                method.to_uppercase()
            );
        }
    }
    for (path, methods) in &documented {
        let served = registered
            .get(path)
            .unwrap_or_else(|| panic!("{path} is documented but router() does not register it"));
        for method in methods {
            assert!(
                served.contains(method),
                "{} {path} is documented but router() does not register it",
                method.to_uppercase()
            );
        }
    }
}

// --- a real server -------------------------------------------------------------------------------

/// True when the answer came from a handler: not a 405, and not a 404 from the router (its
/// fallback answers `no such endpoint`, inside `/api/v1` or not).
fn answered_by_a_handler(status: u16, body: &[u8]) -> bool {
    match status {
        405 => false,
        404 => serde_json::from_slice::<Value>(body).is_ok_and(|v| {
            v["error"]["code"] == "not_found" && v["error"]["message"] != "no such endpoint"
        }),
        _ => true,
    }
}

fn fill(path: &str) -> String {
    path.replace("{name}", "doc-check").replace("{id}", "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served_and_the_document_is_served_as_is() {
    tokio::time::timeout(TEST_LIMIT, async {
        let server = Server::start(ServerConfig::default()).await;
        let doc = document();
        for (path, methods) in documented_routes(&doc) {
            for method in methods {
                let body = match (method.as_str(), path.as_str()) {
                    (_, "/api/v1/workers/{id}/lease") => {
                        Some(("application/json", br#"{"max":1,"wait_ms":0}"#.to_vec()))
                    }
                    ("post" | "put" | "patch", _) => Some(("application/json", b"{}".to_vec())),
                    _ => None,
                };
                let (status, _, bytes) = server.send(&method, &fill(&path), body).await;
                assert!(
                    answered_by_a_handler(status, &bytes),
                    "{} {path} is documented but not served: {status} {}",
                    method.to_uppercase(),
                    String::from_utf8_lossy(&bytes)
                );
            }
        }
        // The check above does tell a missing route or method.
        for (method, path) in [
            ("get", "/api/v1/doc-check-nothing"),
            ("patch", "/api/v1/jobs"),
            ("get", "/doc-check-nothing"),
        ] {
            let (status, _, bytes) = server.send(method, path, None).await;
            assert!(
                !answered_by_a_handler(status, &bytes),
                "{method} {path} looks served: {status}"
            );
        }

        let (status, headers, bytes) = server.send("get", "/api/v1/openapi.json", None).await;
        assert_eq!(status, 200);
        assert!(headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let served: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(served, doc, "the server hands out another document");
        server.stop().await;
    })
    .await
    .expect("the test took too long");
}

// --- real answers against the documented schemas -----------------------------------------------

/// A small JSON Schema checker for the keywords the document uses (not `pattern`: there is no
/// regex engine here). `strict` also rejects object fields a schema does not declare, so an
/// undocumented field in an answer is caught.
struct Checker<'a> {
    doc: &'a Value,
}

impl<'a> Checker<'a> {
    fn resolve(&self, mut schema: &'a Value) -> &'a Value {
        while let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            schema = pointer(self.doc, reference).expect("resolvable $ref");
        }
        schema
    }

    /// Property names an object schema declares, through `allOf`; `None` when it takes any.
    fn declared(&self, schema: &'a Value) -> Option<BTreeSet<&'a str>> {
        let schema = self.resolve(schema);
        if schema.get("additionalProperties").is_some() {
            return None;
        }
        let mut names: BTreeSet<&str> = schema["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        for branch in schema["allOf"].as_array().into_iter().flatten() {
            names.extend(self.declared(branch)?);
        }
        let is_object = schema.get("properties").is_some() || schema.get("allOf").is_some();
        is_object.then_some(names)
    }

    fn errors(&self, schema: &Value, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.check(schema, value, "$", true, &mut errors);
        errors
    }

    fn check(&self, schema: &Value, value: &Value, at: &str, strict: bool, errs: &mut Vec<String>) {
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            if reference == "#/components/schemas/Duration" {
                let ok = value
                    .as_str()
                    .is_some_and(|s| s.parse::<sked_core::HumanDuration>().is_ok());
                if !ok {
                    errs.push(format!("{at}: {value} is not a duration"));
                }
            }
            let target = pointer(self.doc, reference).expect("resolvable $ref");
            return self.check(target, value, at, strict, errs);
        }
        for branch in schema["allOf"].as_array().into_iter().flatten() {
            self.check(branch, value, at, false, errs);
        }
        if let Some(branches) = schema["anyOf"].as_array() {
            let fits = branches.iter().any(|b| {
                let mut e = Vec::new();
                self.check(b, value, at, false, &mut e);
                e.is_empty()
            });
            if !fits {
                errs.push(format!("{at}: {value} fits none of the anyOf branches"));
            }
        }
        if let Some(branches) = schema["oneOf"].as_array() {
            let fits = branches
                .iter()
                .filter(|b| {
                    let mut e = Vec::new();
                    self.check(b, value, at, strict, &mut e);
                    e.is_empty()
                })
                .count();
            if fits != 1 {
                errs.push(format!("{at}: {value} fits {fits} of the oneOf branches"));
            }
        }
        if let Some(types) = schema.get("type") {
            let types: Vec<&str> = match types {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => panic!("{at}: bad type {types}"),
            };
            let fits = types.iter().any(|t| match *t {
                "null" => value.is_null(),
                "boolean" => value.is_boolean(),
                "string" => value.is_string(),
                "integer" => value.is_i64() || value.is_u64(),
                "number" => value.is_number(),
                "array" => value.is_array(),
                "object" => value.is_object(),
                other => panic!("{at}: unknown type {other}"),
            });
            if !fits {
                errs.push(format!("{at}: {value} is not {types:?}"));
                return;
            }
        }
        if let Some(allowed) = schema["enum"].as_array() {
            if !allowed.contains(value) {
                errs.push(format!("{at}: {value} is not one of {allowed:?}"));
            }
        }
        if let Some(n) = value.as_f64() {
            if schema["minimum"].as_f64().is_some_and(|min| n < min) {
                errs.push(format!("{at}: {n} is below the minimum"));
            }
            if schema["maximum"].as_f64().is_some_and(|max| n > max) {
                errs.push(format!("{at}: {n} is above the maximum"));
            }
        }
        if let Some(s) = value.as_str() {
            let length = s.chars().count() as u64;
            if schema["minLength"].as_u64().is_some_and(|min| length < min) {
                errs.push(format!("{at}: {s:?} is shorter than minLength"));
            }
            if schema["maxLength"].as_u64().is_some_and(|max| length > max) {
                errs.push(format!("{at}: {s:?} is longer than maxLength"));
            }
        }
        if let (Some(s), Some("date-time")) = (value.as_str(), schema["format"].as_str()) {
            if chrono::DateTime::parse_from_rfc3339(s).is_err() {
                errs.push(format!("{at}: {s:?} is not an RFC 3339 date-time"));
            }
        }
        if let Some(items) = value.as_array() {
            if schema["maxItems"]
                .as_u64()
                .is_some_and(|max| items.len() as u64 > max)
            {
                errs.push(format!("{at}: more than maxItems"));
            }
            if schema["minItems"]
                .as_u64()
                .is_some_and(|min| (items.len() as u64) < min)
            {
                errs.push(format!("{at}: fewer than minItems"));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    self.check(item_schema, item, &format!("{at}[{i}]"), strict, errs);
                }
            }
        }
        if let Some(object) = value.as_object() {
            for name in schema["required"].as_array().into_iter().flatten() {
                if !object.contains_key(name.as_str().unwrap()) {
                    errs.push(format!("{at}: {name} is missing"));
                }
            }
            for (name, dependent) in schema["dependentSchemas"].as_object().into_iter().flatten() {
                if object.contains_key(name) {
                    self.check(dependent, value, at, false, errs);
                }
            }
            let properties = schema["properties"].as_object();
            for (key, v) in object {
                let path = format!("{at}.{key}");
                if let Some(property) = properties.and_then(|p| p.get(key)) {
                    self.check(property, v, &path, strict, errs);
                    continue;
                }
                match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => errs.push(format!("{path} is not allowed")),
                    Some(Value::Bool(true)) => {}
                    Some(extra) => self.check(extra, v, &path, strict, errs),
                    None => {
                        let declared = || self.declared(schema);
                        if strict && declared().is_some_and(|d| !d.contains(key.as_str())) {
                            errs.push(format!("{path} is not documented"));
                        }
                    }
                }
            }
        }
    }
}

/// An answer of the API: its status, its JSON body (null for other bodies) and its headers.
struct Answer {
    status: u16,
    body: Value,
    headers: reqwest::header::HeaderMap,
}

/// Calls the API and checks the answer against the document: the status must be documented for
/// the operation, with the answer's media type, and a JSON body must fit its schema. Request
/// bodies must fit theirs too.
struct Client<'a> {
    server: &'a Server,
    doc: &'a Value,
    checker: Checker<'a>,
}

impl Client<'_> {
    /// The documented operation serving `path` (query string ignored): the path template with the
    /// most literal segments that matches.
    fn operation(&self, method: &str, path: &str) -> (&str, &Value) {
        let path = path.split('?').next().unwrap();
        let segments: Vec<&str> = path.split('/').collect();
        let mut best: Option<(usize, &str)> = None;
        for template in self.doc["paths"].as_object().unwrap().keys() {
            let parts: Vec<&str> = template.split('/').collect();
            if parts.len() != segments.len() || self.doc["paths"][template].get(method).is_none() {
                continue;
            }
            let fits = parts
                .iter()
                .zip(&segments)
                .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}') && !s.is_empty()));
            let literal = parts.iter().filter(|t| !t.starts_with('{')).count();
            if fits && best.is_none_or(|(n, _)| literal > n) {
                best = Some((literal, template));
            }
        }
        let (_, template) = best.unwrap_or_else(|| panic!("{method} {path} is not documented"));
        (template, &self.doc["paths"][template][method])
    }

    /// Errors of a request body against the documented request schema.
    fn request_errors(&self, method: &str, path: &str, body: &Value) -> Vec<String> {
        let (template, op) = self.operation(method, path);
        let schema = &op["requestBody"]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {template} takes no JSON body");
        self.checker.errors(schema, body)
    }

    /// Sends a JSON body (or none) that the document accepts.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        if let Some(body) = &body {
            let errors = self.request_errors(method, path, body);
            assert!(errors.is_empty(), "request to {method} {path}: {errors:#?}");
        }
        let bytes = body.map(|b| ("application/json", serde_json::to_vec(&b).unwrap()));
        self.send(method, path, bytes).await
    }

    /// Sends a body the document itself calls invalid; the server must refuse it with a 400.
    async fn call_invalid(&self, method: &str, path: &str, body: Value) -> Value {
        let errors = self.request_errors(method, path, &body);
        assert!(
            !errors.is_empty(),
            "the document accepts {body} for {method} {path}"
        );
        let bytes = ("application/json", serde_json::to_vec(&body).unwrap());
        let answer = self.send(method, path, Some(bytes)).await;
        assert_eq!(answer.status, 400, "{method} {path}: {}", answer.body);
        answer.body
    }

    /// Sends `method path` with `token` instead of the admin token (none: no header).
    async fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Answer {
        let authorization = token.map(|t| format!("Bearer {t}"));
        self.call_with(authorization.as_deref(), method, path, body)
            .await
    }

    /// Sends `method path` with this `Authorization` header instead of the admin token's (none:
    /// no header), from a client of its own: the harness's sends the admin token with every
    /// request.
    async fn call_with(
        &self,
        authorization: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Answer {
        let (_, op) = self.operation(method, path);
        let method_name = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let client = reqwest::Client::builder()
            .timeout(common::REQUEST_LIMIT)
            .build()
            .unwrap();
        let mut request = client.request(method_name, format!("{}{path}", self.server.base));
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap().to_vec();
        let body = self.conforms(op, method, path, status, &headers, &bytes);
        Answer {
            status,
            body,
            headers,
        }
    }

    /// Sends raw bytes (attempt output, or a body too large).
    async fn raw(&self, method: &str, path: &str, bytes: Vec<u8>) -> Answer {
        self.send(method, path, Some(("application/octet-stream", bytes)))
            .await
    }

    async fn send(&self, method: &str, path: &str, body: Option<(&str, Vec<u8>)>) -> Answer {
        let (_, op) = self.operation(method, path);
        let (status, headers, bytes) = self.server.send(method, path, body).await;
        let body = self.conforms(op, method, path, status, &headers, &bytes);
        Answer {
            status,
            body,
            headers,
        }
    }

    /// JSON pointers (`/retry/backoff/max`) of the optional fields `value` leaves out, in it and
    /// in the objects and arrays it holds (through `$ref`, `allOf` and the `oneOf` branch it
    /// fits).
    fn absent_fields(&self, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
        let schema = self.checker.resolve(schema);
        for branch in schema["allOf"].as_array().into_iter().flatten() {
            self.absent_fields(branch, value, at, out);
        }
        let branches = schema["oneOf"].as_array().into_iter().flatten();
        if let Some(fits) = branches
            .into_iter()
            .find(|b| self.checker.errors(b, value).is_empty())
        {
            self.absent_fields(fits, value, at, out);
        }
        let (Some(object), Some(properties)) =
            (value.as_object(), schema["properties"].as_object())
        else {
            return;
        };
        let required: Vec<&Value> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        for (name, property) in properties {
            let here = format!("{at}/{name}");
            match object.get(name) {
                Some(inner) if inner.is_object() => self.absent_fields(property, inner, &here, out),
                Some(Value::Array(items)) => {
                    let item_schema = &self.checker.resolve(property)["items"];
                    for (i, item) in items.iter().enumerate() {
                        self.absent_fields(item_schema, item, &format!("{here}/{i}"), out);
                    }
                }
                Some(_) => {}
                None if !required.contains(&&json!(name)) => out.push(here),
                None => {}
            }
        }
    }

    /// Sends `base` again with each optional field it leaves out set to `null`: the server must
    /// take it exactly when the document allows `null` there (as the same as leaving it out),
    /// and refuse it with a 400 otherwise.
    async fn nulls_as_documented(&self, method: &str, path: &str, base: Value) {
        let (_, op) = self.operation(method, path);
        let schema = &op["requestBody"]["content"]["application/json"]["schema"];
        let errors = self.checker.errors(schema, &base);
        assert!(errors.is_empty(), "{method} {path}: {errors:#?}");
        let mut fields = Vec::new();
        self.absent_fields(schema, &base, "", &mut fields);
        assert!(
            !fields.is_empty(),
            "{method} {path}: no optional field left out of {base}"
        );
        let mut disagreements = Vec::new();
        for field in fields {
            let (parent, name) = field.rsplit_once('/').expect("a pointer");
            let mut body = base.clone();
            body.pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .expect("the parent object")
                .insert(name.to_string(), Value::Null);
            let documented = self.checker.errors(schema, &body).is_empty();
            let bytes = ("application/json", serde_json::to_vec(&body).unwrap());
            let answer = self.send(method, path, Some(bytes)).await;
            if (200..300).contains(&answer.status) != documented {
                let says = if documented {
                    "allows"
                } else {
                    "does not allow"
                };
                disagreements.push(format!(
                    "{field}: null answered {}, the document {says} it",
                    answer.status
                ));
            }
        }
        assert!(
            disagreements.is_empty(),
            "{method} {path}: {disagreements:#?}"
        );
    }

    fn conforms(
        &self,
        op: &Value,
        method: &str,
        path: &str,
        status: u16,
        headers: &reqwest::header::HeaderMap,
        answer: &[u8],
    ) -> Value {
        let text = String::from_utf8_lossy(answer);
        let response = self.checker.resolve(&op["responses"][status.to_string()]);
        assert!(
            response.is_object(),
            "{method} {path} answered {status}, which is not documented: {text}"
        );
        let content_type = headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let media_type = content_type.split(';').next().unwrap_or_default().trim();
        let content = &response["content"];
        assert!(
            content.get(media_type).is_some() || (content.is_null() && answer.is_empty()),
            "{method} {path} {status}: {content_type:?} is not documented: {text}"
        );
        for (name, header) in response["headers"].as_object().into_iter().flatten() {
            let got = headers
                .get(name)
                .unwrap_or_else(|| panic!("{method} {path}: no {name} header"));
            let got = json!(got.to_str().unwrap());
            let errors = self.checker.errors(&header["schema"], &got);
            assert!(
                errors.is_empty(),
                "{method} {path}: header {name}: {errors:?}"
            );
        }
        if media_type != "application/json" {
            return Value::Null;
        }
        let value: Value = serde_json::from_slice(answer).unwrap();
        let errors = self.checker.errors(&content[media_type]["schema"], &value);
        assert!(
            errors.is_empty(),
            "{method} {path} {status}: {errors:#?}\n{value:#}"
        );
        value
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_fit_the_documented_statuses_and_schemas() {
    tokio::time::timeout(TEST_LIMIT, async {
        let server = Server::start(ServerConfig::default()).await;
        let doc = document();
        let api = Client {
            server: &server,
            doc: &doc,
            checker: Checker { doc: &doc },
        };
        jobs(&api).await;
        let run_id = worker_protocol(&api).await;
        runs(&api, run_id).await;
        refusals(&api).await;
        identity(&api).await;
        token_requests(&api).await;
        worker_tokens(&api).await;
        hidden_namespaces(&api, run_id).await;
        audit_trail(&api).await;
        events(&api).await;
        backfill(&api).await;
        apply_files(&api).await;
        server.stop().await;
    })
    .await
    .expect("the test took too long");
}

/// A file of jobs: a dry run, the write, a write that changes nothing, a refusal that writes
/// nothing; a dependant without a schedule says what it runs after; a short preview says why.
async fn apply_files(api: &Client<'_>) {
    let shell = json!({"shell": {"command": "true"}});
    let file = |dry_run: bool| {
        json!({"dry_run": dry_run, "calendars": [
            {"name": "doc-apply-days", "timezone": "Europe/London", "holidays": [
                {"date": "2026-12-25", "label": "Christmas Day", "yearly": true},
            ]},
        ], "jobs": [
            {"name": "doc-apply-down", "target": shell, "depends_on": [{"job": "doc-apply-up"}]},
            {"name": "doc-apply-up", "schedule": {"every": "1h", "calendar": "doc-apply-days"}, "target": shell},
        ]})
    };
    let dry = api.call("post", "/api/v1/apply", Some(file(true))).await;
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(
        dry.body["calendars"][0]["change"], "created",
        "{}",
        dry.body
    );
    assert_eq!(dry.body["jobs"][0]["name"], "doc-apply-up", "{}", dry.body);
    assert_eq!(dry.body["jobs"][0]["change"], "created", "{}", dry.body);
    let absent = api.call("get", "/api/v1/jobs/doc-apply-up", None).await;
    assert_eq!(absent.status, 404, "{}", absent.body);
    let done = api.call("post", "/api/v1/apply", Some(file(false))).await;
    assert_eq!(done.status, 200, "{}", done.body);
    let again = api.call("post", "/api/v1/apply", Some(file(false))).await;
    assert_eq!(
        again.body["jobs"][1]["change"], "unchanged",
        "{}",
        again.body
    );
    let down = api.call("get", "/api/v1/jobs/doc-apply-down", None).await;
    assert_eq!(down.body["after"]["upstreams"], json!(["doc-apply-up"]));
    assert!(
        down.body["after"]["next_fire_at"].is_string(),
        "{}",
        down.body
    );
    let bad = json!({"jobs": [
        {"name": "doc-apply-fine", "target": shell},
        {"name": "doc-apply-bad", "target": {"amqp": {"connection": "nowhere", "exchange": "x"}}},
    ]});
    let refused = api.call("post", "/api/v1/apply", Some(bad)).await;
    assert_eq!(
        (refused.status, &refused.body["error"]["field"]),
        (400, &json!("jobs[1].target.amqp.connection"))
    );
    let unwritten = api.call("get", "/api/v1/jobs/doc-apply-fine", None).await;
    assert_eq!(unwritten.status, 404, "{}", unwritten.body);
    let late = json!({"schedule": {"cron": "0 0 1 1 *"}, "from": "2199-06-01T00:00:00Z"});
    let preview = api
        .call("post", "/api/v1/schedules/preview", Some(late))
        .await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    assert!(preview.body["note"].is_string(), "{}", preview.body);
}

/// A backfill: a dry run, the runs recorded once, and its refusals.
async fn backfill(api: &Client<'_>) {
    let hourly = json!({
        "schedule": {"every": "1h", "anchor": "2026-01-01T00:00:00Z"},
        "target": {"shell": {"command": "true"}},
        "overlap": "skip"
    });
    let created = api
        .call("put", "/api/v1/jobs/doc-hourly", Some(hourly))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let path = "/api/v1/jobs/doc-hourly/backfill";
    let range = |dry_run: bool| json!({"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T04:00:00Z", "dry_run": dry_run});
    let dry = api.call("post", path, Some(range(true))).await;
    assert_eq!(dry.status, 200, "{}", dry.body);
    assert_eq!(dry.body["instants"].as_array().map(Vec::len), Some(5));
    assert_eq!(dry.body["recorded"], json!([]));
    let done = api.call("post", path, Some(range(false))).await;
    assert_eq!(done.body["recorded"].as_array().map(Vec::len), Some(5));
    let again = api.call("post", path, Some(range(false))).await;
    assert_eq!(
        (&again.body["recorded"], &again.body["existing"]),
        (&json!([]), &json!(5))
    );
    let future = json!({"from": "2026-01-01T00:00:00Z", "to": "2999-01-01T00:00:00Z"});
    let refused = api.call("post", path, Some(future)).await;
    assert_eq!(
        (refused.status, &refused.body["error"]["field"]),
        (400, &json!("to"))
    );
    let no_timer = api
        .call("post", "/api/v1/jobs/doc-up/backfill", Some(range(true)))
        .await;
    assert_eq!(
        (no_timer.status, &no_timer.body["error"]["code"]),
        (409, &json!("no_timer"))
    );
    let huge =
        json!({"from": "2025-01-01T00:00:00Z", "to": "2026-06-01T00:00:00Z", "dry_run": true});
    let refused = api.call("post", path, Some(huge)).await;
    assert_eq!(
        (refused.status, &refused.body["error"]["field"]),
        (400, &json!("from"))
    );
}

/// Events: definitions that listen, wait and emit; posts, repeats and conflicts; the
/// emitter role, which posts and reads nothing.
async fn events(api: &Client<'_>) {
    let listener = json!({
        "schedule": {"event": "doc.ready"},
        "target": {"shell": {"command": "true"}},
        "on_success": {"emit": "doc.done"}
    });
    let created = api
        .call("put", "/api/v1/jobs/doc-on-event", Some(listener.clone()))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    api.nulls_as_documented("put", "/api/v1/jobs/doc-on-event", listener)
        .await;
    let waiter = json!({
        "schedule": {"every": "1h"},
        "target": {"shell": {"command": "true"}},
        "depends_on": [{"event": "doc.ready", "window": {"before": "1h"}},
                       {"any_of": [{"event": "doc.done"}, {"job": "doc-on-event"}]}]
    });
    let created = api
        .call("put", "/api/v1/jobs/doc-waits", Some(waiter))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let event = json!({"key": "doc.ready", "id": "2026-11-24", "payload": {"rows": 3}});
    let posted = api
        .call("post", "/api/v1/events", Some(event.clone()))
        .await;
    assert_eq!(posted.status, 201, "{}", posted.body);
    assert_eq!(posted.body["started"].as_array().map(Vec::len), Some(1));
    let run = format!("/api/v1/runs/{}", posted.body["started"][0]);
    let started = api.call("get", &run, None).await;
    assert_eq!(started.body["trigger"], "event", "{}", started.body);
    assert_eq!(started.body["event_id"], "2026-11-24");
    let again = api
        .call("post", "/api/v1/events", Some(event.clone()))
        .await;
    assert_eq!((again.status, &again.body["created"]), (200, &json!(false)));
    let other = json!({"key": "doc.ready", "id": "2026-11-24", "payload": "changed"});
    let conflict = api.call("post", "/api/v1/events", Some(other)).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.body["error"]["code"], "event_conflict");
    let bad = api
        .call_invalid(
            "post",
            "/api/v1/events",
            json!({"key": "k".repeat(201), "id": "1"}),
        )
        .await;
    assert_eq!(bad["error"]["field"], "key");
    let bad = api
        .call(
            "post",
            "/api/v1/events",
            Some(json!({"key": "no spaces", "id": "1"})),
        )
        .await;
    assert_eq!(
        (bad.status, &bad.body["error"]["field"]),
        (400, &json!("key"))
    );
    let big = json!({"key": "k", "id": "1", "payload": "x".repeat(70 * 1024)});
    let refused = api.call("post", "/api/v1/events", Some(big)).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.body["error"]["field"], "payload");
    let listed = api
        .call("get", "/api/v1/events?key=doc.ready&limit=1", None)
        .await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body["events"][0]["id"], "2026-11-24");
    assert!(listed.body["next_before"].is_string(), "{}", listed.body);
    let emitter = token(
        api,
        json!({"name": "pipeline", "role": "emitter", "namespaces": ["default"]}),
    )
    .await;
    let posted = api
        .call_as(
            Some(&emitter),
            "post",
            "/api/v1/events",
            Some(json!({"key": "doc.ready", "id": "from-emitter"})),
        )
        .await;
    assert_eq!(posted.status, 201, "{}", posted.body);
    for (method, path) in [("get", "/api/v1/events"), ("get", "/api/v1/jobs")] {
        let refused = api.call_as(Some(&emitter), method, path, None).await;
        assert_eq!(refused.status, 403, "{method} {path}");
    }
    let elsewhere = api
        .call_as(
            Some(&emitter),
            "post",
            "/api/v1/events?namespace=other",
            Some(json!({"key": "k", "id": "1"})),
        )
        .await;
    assert_eq!(elsewhere.status, 403);
}

/// Tokens, the audit trail, and the refusals of a missing token, a forged one and a role
/// that does not reach a route.
async fn identity(api: &Client<'_>) {
    let request =
        json!({"name": "reader", "role": "viewer", "namespaces": ["default"], "expires": "30d"});
    let created = api
        .call("post", "/api/v1/tokens", Some(request.clone()))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let secret = created.body["token"].as_str().unwrap().to_string();
    assert_eq!(
        api.call("post", "/api/v1/tokens", Some(request))
            .await
            .status,
        409
    );
    let listed = api.call("get", "/api/v1/tokens", None).await;
    assert_eq!(listed.status, 200);
    assert!(!listed.body.to_string().contains(&secret));

    let viewer = Some(secret.as_str());
    let read = api.call_as(viewer, "get", "/api/v1/jobs", None).await;
    assert_eq!(read.status, 200);
    let job = json!({"target": {"http": {"url": "http://127.0.0.1:9/"}}});
    let refused = api
        .call_as(viewer, "put", "/api/v1/jobs/x", Some(job))
        .await;
    assert_eq!(refused.status, 403);
    let elsewhere = api
        .call_as(viewer, "get", "/api/v1/jobs?namespace=other", None)
        .await;
    assert_eq!(elsewhere.status, 403);
    let tokens = api.call_as(viewer, "get", "/api/v1/tokens", None).await;
    assert_eq!(tokens.status, 403);
    for token in [None, Some("sked_forged-token-000000000000000000")] {
        let answer = api.call_as(token, "get", "/api/v1/runs", None).await;
        assert_eq!(answer.status, 401);
        assert_eq!(answer.headers["www-authenticate"], "Bearer");
    }

    let audit = api.call("get", "/api/v1/audit?limit=5", None).await;
    assert_eq!(audit.status, 200);
    assert!(!audit.body["entries"].as_array().unwrap().is_empty());
    let since = api
        .call("get", "/api/v1/audit?since=not-an-instant", None)
        .await;
    assert_eq!(since.status, 400);
    let revoked = api.call("delete", "/api/v1/tokens/reader", None).await;
    assert_eq!(revoked.status, 200);
    assert_eq!(
        api.call("delete", "/api/v1/tokens/reader", None)
            .await
            .status,
        404
    );
    assert_eq!(
        api.call_as(viewer, "get", "/api/v1/jobs", None)
            .await
            .status,
        401
    );
}

/// Creates a token through the API and returns its secret.
async fn token(api: &Client<'_>, request: Value) -> String {
    let created = api.call("post", "/api/v1/tokens", Some(request)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    created.body["token"].as_str().unwrap().to_string()
}

/// Token requests the document refuses are refused, each naming its field; optional fields
/// sent as `null` are taken, and absent fields stay absent in the answer.
async fn token_requests(api: &Client<'_>) {
    let base = json!({"name": "doc-token", "role": "viewer", "namespaces": ["default"]});
    let with = |key: &str, value: Value| {
        let mut body = base.clone();
        body[key] = value;
        body
    };
    for (body, field) in [
        (with("name", json!("n".repeat(129))), "name"),
        (with("role", json!("root")), "role"),
        (with("namespaces", json!([])), "namespaces"),
        (with("labels", json!(["pool=a"])), "labels"),
        (with("shell", Value::Null), "shell"),
        (with("expires", json!(30)), "expires"),
        (with("scope", json!("all")), "scope"),
    ] {
        let refused = api.call_invalid("post", "/api/v1/tokens", body).await;
        assert_eq!(refused["error"]["field"], field, "{refused}");
    }
    // What the document's patterns refuse (this checker has no regex engine to tell), and an
    // expiry that is no duration (which a schema cannot tell): 400 too.
    let worker = json!({"name": "doc-token", "role": "worker", "namespaces": ["*"]});
    let with_worker = |key: &str, value: Value| {
        let mut body = worker.clone();
        body[key] = value;
        body
    };
    for (body, field) in [
        (with("name", json!("a name")), "name"),
        (with("namespaces", json!([".hidden"])), "namespaces"),
        (with_worker("labels", json!(["pool"])), "labels"),
        (with_worker("labels", json!(["=a"])), "labels"),
        (with_worker("expires", json!("soon")), "expires"),
    ] {
        let bytes = ("application/json", serde_json::to_vec(&body).unwrap());
        let refused = api.send("post", "/api/v1/tokens", Some(bytes)).await;
        assert_eq!(
            (refused.status, &refused.body["error"]["field"]),
            (400, &json!(field)),
            "{body}"
        );
    }

    let mut nulls = worker;
    nulls["labels"] = Value::Null;
    nulls["expires"] = Value::Null;
    let created = api.call("post", "/api/v1/tokens", Some(nulls)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let record = created.body.as_object().unwrap();
    for absent in ["labels", "expires_at", "last_used_at"] {
        assert!(!record.contains_key(absent), "{absent} in {}", created.body);
    }
    assert_eq!(record["shell"], json!(false));

    // An expired token is refused like an unknown one.
    let brief = token(
        api,
        json!({"name": "doc-brief", "role": "viewer", "namespaces": ["*"], "expires": "1ms"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let expired = api.call_as(Some(&brief), "get", "/api/v1/jobs", None).await;
    assert_eq!(expired.status, 401);
    assert_eq!(expired.headers["www-authenticate"], "Bearer");
    let malformed = api
        .call_with(Some("Basic dXNlcjpwYXNz"), "get", "/api/v1/jobs", None)
        .await;
    assert_eq!(malformed.status, 401);
}

/// A worker token: label rules bound what its workers claim, and only the token a worker
/// registered with speaks for it.
async fn worker_tokens(api: &Client<'_>) {
    let request = json!({
        "name": "doc-workers", "role": "worker", "namespaces": ["default"],
        "labels": ["zone=eu", "pool=*"],
    });
    let created = api.call("post", "/api/v1/tokens", Some(request)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["labels"], json!(["zone=eu", "pool=*"]));
    let token_id = created.body["id"].clone();
    let secret = created.body["token"].as_str().unwrap().to_string();
    let own = Some(secret.as_str());

    let claim = json!({"name": "doc-token-worker", "labels": {"zone": "us"}, "slots": 1});
    let refused = api
        .call_as(own, "post", "/api/v1/workers", Some(claim))
        .await;
    assert_eq!(
        (refused.status, &refused.body["error"]["code"]),
        (403, &json!("forbidden"))
    );
    let claim =
        json!({"name": "doc-token-worker", "labels": {"zone": "eu", "pool": "gpu"}, "slots": 1});
    let registered = api
        .call_as(own, "post", "/api/v1/workers", Some(claim))
        .await;
    assert_eq!(registered.status, 201, "{}", registered.body);
    let id = registered.body["worker_id"].as_str().unwrap().to_string();
    let hello = json!({"name": "doc-admin-worker", "slots": 1});
    let registered = api.call("post", "/api/v1/workers", Some(hello)).await;
    let admins = registered.body["worker_id"].as_str().unwrap().to_string();

    let beat = format!("/api/v1/workers/{id}/heartbeat");
    let answer = api.call_as(own, "post", &beat, Some(json!({}))).await;
    assert_eq!(answer.status, 200);
    // Not even an admin speaks for another token's worker, nor it for the admin's.
    let answer = api.call("post", &beat, Some(json!({}))).await;
    assert_eq!(answer.status, 403);
    let ask = json!({"max": 1, "wait_ms": 0});
    let lease = format!("/api/v1/workers/{id}/lease");
    assert_eq!(
        api.call("post", &lease, Some(ask.clone())).await.status,
        403
    );
    let complete = format!("/api/v1/workers/{id}/complete");
    let none = json!({"completions": []});
    assert_eq!(api.call("post", &complete, Some(none)).await.status, 403);
    let output = format!("/api/v1/attempts/1/log?token=1&worker={id}");
    assert_eq!(api.raw("post", &output, b"x".to_vec()).await.status, 403);
    let lease = format!("/api/v1/workers/{admins}/lease");
    let answer = api.call_as(own, "post", &lease, Some(ask)).await;
    assert_eq!(answer.status, 403);
    // A worker token reads nothing.
    let jobs = api.call_as(own, "get", "/api/v1/jobs", None).await;
    assert_eq!(jobs.status, 403);

    let workers = api.call("get", "/api/v1/workers?limit=1000", None).await;
    let listed = workers.body["workers"].as_array().unwrap();
    let mine = listed.iter().find(|w| w["id"] == json!(id)).unwrap();
    assert_eq!(
        (&mine["namespaces"], &mine["token_id"]),
        (&json!(["default"]), &token_id)
    );
    let admins = listed.iter().find(|w| w["id"] == json!(admins)).unwrap();
    assert_eq!(admins["namespaces"], json!(["*"]));
}

/// A token of another namespace: runs of `default` do not exist for it, naming `default` is
/// forbidden, and it defines shell targets only with `shell`.
async fn hidden_namespaces(api: &Client<'_>, run_id: i64) {
    let request = json!({"name": "doc-elsewhere", "role": "editor", "namespaces": ["other"]});
    let secret = token(api, request).await;
    let other = Some(secret.as_str());
    let missing = api.call_as(other, "get", "/api/v1/runs/999999", None).await;
    assert_eq!(missing.status, 404);
    for (method, path) in [
        ("get", format!("/api/v1/runs/{run_id}")),
        ("get", format!("/api/v1/runs/{run_id}/log")),
        ("post", format!("/api/v1/runs/{run_id}/cancel")),
    ] {
        let hidden = api.call_as(other, method, &path, None).await;
        assert_eq!(hidden.status, 404, "{method} {path}");
        assert_eq!(
            hidden.body["error"]["message"],
            json!(format!("run {run_id} does not exist")),
            "{method} {path}: as if there were no such run"
        );
    }
    let named = api
        .call_as(other, "get", "/api/v1/runs?namespace=default", None)
        .await;
    assert_eq!(named.status, 403);
    let grid = api
        .call_as(other, "get", "/api/v1/runs/grid?namespace=default", None)
        .await;
    assert_eq!(grid.status, 403);

    let shell = json!({"target": {"shell": {"command": "true"}}});
    let refused = api
        .call_as(
            other,
            "put",
            "/api/v1/jobs/e-job?namespace=other",
            Some(shell),
        )
        .await;
    assert_eq!(refused.status, 403);
    let http = json!({"target": {"http": {"url": "http://127.0.0.1:9/"}}});
    let put = api
        .call_as(
            other,
            "put",
            "/api/v1/jobs/e-job?namespace=other",
            Some(http),
        )
        .await;
    assert_eq!(put.status, 201);

    // Its audit trail is its namespace's.
    let audit = api.call_as(other, "get", "/api/v1/audit", None).await;
    assert_eq!(audit.status, 200);
    let entries = audit.body["entries"].as_array().unwrap();
    assert!(!entries.is_empty());
    assert!(
        entries.iter().all(|e| e["namespace"] == "other"),
        "{entries:#?}"
    );
    let elsewhere = api
        .call_as(other, "get", "/api/v1/audit?namespace=default", None)
        .await;
    assert_eq!(elsewhere.status, 403);
}

/// The audit trail a page at a time, filtered, and its refusals.
async fn audit_trail(api: &Client<'_>) {
    let first = api.call("get", "/api/v1/audit?limit=1", None).await;
    let newest = first.body["entries"][0]["id"].as_i64().unwrap();
    let cursor = first.body["next_cursor"].as_str().expect("a second page");
    let path = format!("/api/v1/audit?limit=1&cursor={cursor}");
    let second = api.call("get", &path, None).await;
    assert!(second.body["entries"][0]["id"].as_i64().unwrap() < newest);

    let path = "/api/v1/audit?namespace=other&object=e-job&actor=doc-elsewhere\
                &since=2026-01-01T00:00:00Z&limit=1000";
    let filtered = api.call("get", path, None).await;
    let entries = filtered.body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:#?}");
    assert_eq!(entries[0]["action"], "job.put");
    assert_eq!(filtered.body["next_cursor"], Value::Null);
    let tokens = api
        .call("get", "/api/v1/audit?object=doc-workers", None)
        .await;
    assert_eq!(tokens.body["entries"][0]["action"], "token.create");
    assert!(tokens.body["entries"][0].get("namespace").is_none());

    for bad in ["limit=0", "limit=1001", "cursor=zzz", "since=yesterday"] {
        let answer = api.call("get", &format!("/api/v1/audit?{bad}"), None).await;
        assert_eq!(answer.status, 400, "{bad}");
    }
}

/// Defining, listing, reading, previewing, pausing and deleting jobs.
async fn jobs(api: &Client<'_>) {
    // The document's own example, twice.
    let example = api.doc["components"]["schemas"]["Job"]["examples"][0].clone();
    let created = api
        .call("post", "/api/v1/jobs", Some(example.clone()))
        .await;
    assert_eq!(created.status, 201);
    assert_eq!(created.body["name"], "nightly-report");
    let again = api.call("post", "/api/v1/jobs", Some(example)).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.body["error"]["code"], "conflict");

    let shell = json!({
        "description": "doc check",
        "target": {"shell": {"command": "echo hi", "args": [], "env": {"A": "1"}}},
        "timeout": "1m",
        "retry": {"max_attempts": 2, "backoff": {"initial": "1s", "max": "2s"}},
    });
    let put = api
        .call("put", "/api/v1/jobs/doc-job", Some(shell.clone()))
        .await;
    assert_eq!(put.status, 201);
    assert_eq!(put.headers["x-sked-change"], "created");
    let put = api
        .call("put", "/api/v1/jobs/doc-job", Some(shell.clone()))
        .await;
    assert_eq!(put.status, 200);
    assert_eq!(put.headers["x-sked-change"], "unchanged");
    api.nulls_as_documented("put", "/api/v1/jobs/null-job?namespace=nulls", shell)
        .await;

    let http = json!({
        "schedule": {
            "every": "1h", "anchor": "2026-01-01T00:00:00Z", "max_runs": 5, "jitter": "1s",
        },
        "target": {"http": {
            "method": "post", "url": "http://127.0.0.1:9/hook", "headers": {"X": "y"},
            "body": "{}", "expected_status": [200, 202],
        }},
        "overlap": "buffer_one",
        "misfire": {"policy": "run_all", "catchup_window": "2h"},
        "priority": -3,
        "routing": {
            "labels": {"zone": "nowhere"}, "strategy": "consistent_hash", "affinity_key": "k",
        },
        "paused": true,
    });
    let every = api
        .call(
            "put",
            "/api/v1/jobs/every-job?namespace=doc",
            Some(http.clone()),
        )
        .await;
    api.nulls_as_documented("put", "/api/v1/jobs/null-job?namespace=nulls", http)
        .await;
    let cron = json!({
        "schedule": {"cron": "0 30 2 * * *", "timezone": "Europe/London"},
        "target": {"shell": {"command": "true"}},
        "retry": {"backoff": {}},
        "misfire": {},
        "routing": {},
    });
    api.nulls_as_documented("put", "/api/v1/jobs/null-job?namespace=nulls", cron)
        .await;
    assert_eq!(
        (every.status, &every.body["state"]),
        (201, &json!("paused"))
    );

    let bad_zone = json!({
        "schedule": {"cron": "* * * * *", "timezone": "Mars/Base"},
        "target": {"shell": {"command": "true"}},
    });
    let refused = api
        .call("put", "/api/v1/jobs/bad-job", Some(bad_zone))
        .await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.body["error"]["field"], "schedule.timezone");
    // The server answers before it has read the whole body, so the upload itself may be cut
    // short: try a few times for the answer.
    let mut too_big = None;
    for _ in 0..5 {
        let body = Some(("application/json", vec![b' '; 2 * 1024 * 1024]));
        if let Ok(answer) = api.server.try_send("post", "/api/v1/jobs", body).await {
            too_big = Some(answer);
            break;
        }
    }
    let (status, headers, bytes) = too_big.expect("an answer to a body over the limit");
    assert_eq!(status, 413);
    let (_, create) = api.operation("post", "/api/v1/jobs");
    api.conforms(create, "post", "/api/v1/jobs", status, &headers, &bytes);

    let first = api
        .call("get", "/api/v1/jobs?sort=name&order=desc&limit=1", None)
        .await;
    assert_eq!(first.body["jobs"][0]["name"], "nightly-report");
    let cursor = first.body["next_cursor"].as_str().expect("a second page");
    let second = format!("/api/v1/jobs?sort=name&order=desc&limit=1&cursor={cursor}");
    let second = api.call("get", &second, None).await;
    assert_eq!(second.body["jobs"][0]["name"], "doc-job");
    let none = api
        .call(
            "get",
            "/api/v1/jobs?state=completed&search=REPORT&sort=updated_at",
            None,
        )
        .await;
    assert_eq!(none.body["jobs"], json!([]));
    // With include=last_run each job carries its newest run; without it, none.
    let triggered = api
        .call("post", "/api/v1/jobs/nightly-report/trigger", None)
        .await;
    assert_eq!(triggered.status, 201);
    // Cancelled at once, so that the worker protocol below finds only its own run queued.
    let cancel = format!("/api/v1/runs/{}/cancel", triggered.body["id"]);
    assert_eq!(api.call("post", &cancel, None).await.status, 200);
    // A trigger with parameters, and its dedup: the second is the first run, answered 200.
    let dedup = json!({
        "schedule": {"every": "1h"},
        "target": {"shell": {"command": "true"}},
        "dedup": {"key": "{{params.order}}", "window": "1m"},
        "debounce": {"key": "{{params.order}}", "period": "1m"},
    });
    assert_eq!(
        api.call("put", "/api/v1/jobs/dedup-doc", Some(dedup))
            .await
            .status,
        201
    );
    let params = json!({"params": {"order": "7", "region": "eu"}});
    let first = api
        .call(
            "post",
            "/api/v1/jobs/dedup-doc/trigger",
            Some(params.clone()),
        )
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.body["params"]["order"], "7");
    let second = api
        .call("post", "/api/v1/jobs/dedup-doc/trigger", Some(params))
        .await;
    assert_eq!(
        (second.status, &second.body["id"]),
        (200, &first.body["id"])
    );
    let cancel = format!("/api/v1/runs/{}/cancel", first.body["id"]);
    assert_eq!(api.call("post", &cancel, None).await.status, 200);
    let with_runs = api
        .call("get", "/api/v1/jobs?search=nightly&include=last_run", None)
        .await;
    assert_eq!(
        with_runs.body["jobs"][0]["last_run"]["id"],
        triggered.body["id"]
    );
    let without = api.call("get", "/api/v1/jobs?search=nightly", None).await;
    assert!(without.body["jobs"][0].get("last_run").is_none());
    for bad in [
        "limit=0",
        "include=counters",
        "include=",
        "kind=hourly",
        "kind=",
        "last=done",
        "last=",
        "state=asleep",
        "sort=size",
        "order=up",
        "cursor=zzz",
        "namespace=.x",
    ] {
        let answer = api.call("get", &format!("/api/v1/jobs?{bad}"), None).await;
        assert_eq!(answer.status, 400, "{bad}");
    }

    let got = api.call("get", "/api/v1/jobs/nightly-report", None).await;
    assert_eq!(got.status, 200);
    let missing = api.call("get", "/api/v1/jobs/no-such-job", None).await;
    assert_eq!(missing.status, 404);

    let preview = api
        .call("get", "/api/v1/jobs/nightly-report/preview?count=3", None)
        .await;
    assert_eq!(preview.body["fire_times"].as_array().unwrap().len(), 3);
    let preview = api
        .call("get", "/api/v1/jobs/nightly-report/preview?count=0", None)
        .await;
    assert_eq!(preview.status, 400);
    let request = json!({
        "schedule": {"iso8601": "R2/2026-06-20T14:05:16Z/PT5M"},
        "count": 5,
        "from": "2026-01-01T00:00:00Z",
    });
    let preview = api
        .call("post", "/api/v1/schedules/preview", Some(request))
        .await;
    assert_eq!(preview.body["fire_times"].as_array().unwrap().len(), 3);
    let request = json!({"schedule": {"every": "1h"}});
    api.nulls_as_documented("post", "/api/v1/schedules/preview", request)
        .await;
    let nonsense = json!({"schedule": {"cron": "nonsense"}});
    let preview = api
        .call("post", "/api/v1/schedules/preview", Some(nonsense))
        .await;
    assert_eq!(preview.status, 400);

    let paused = api
        .call("post", "/api/v1/jobs/nightly-report/pause", None)
        .await;
    assert_eq!(paused.body["state"], "paused");
    let active = api
        .call("post", "/api/v1/jobs/nightly-report/resume", None)
        .await;
    assert_eq!(active.body["state"], "active");
    let missing = api
        .call("post", "/api/v1/jobs/no-such-job/pause", None)
        .await;
    assert_eq!(missing.status, 404);

    // Versions: pausing and resuming changed the definition twice.
    let versions = api
        .call("get", "/api/v1/jobs/nightly-report/versions", None)
        .await;
    let kept = versions.body["versions"].as_array().unwrap().len() as u64;
    assert!(kept >= 2, "{}", versions.body);
    let rolled = api
        .call(
            "post",
            "/api/v1/jobs/nightly-report/rollback",
            Some(json!({"to": 1})),
        )
        .await;
    assert_eq!(rolled.status, 200, "{}", rolled.body);
    let refused = api
        .call(
            "post",
            "/api/v1/jobs/nightly-report/rollback",
            Some(json!({"to": 999})),
        )
        .await;
    assert_eq!(refused.status, 400);
    api.call_invalid(
        "post",
        "/api/v1/jobs/nightly-report/rollback",
        json!({"to": 1, "extra": true}),
    )
    .await;
    let missing = api
        .call("get", "/api/v1/jobs/no-such-job/versions", None)
        .await;
    assert_eq!(missing.status, 404);

    let deleted = api
        .call("delete", "/api/v1/jobs/every-job?namespace=doc", None)
        .await;
    assert_eq!(
        (deleted.status, &deleted.body["name"]),
        (200, &json!("every-job"))
    );
    let gone = api
        .call("delete", "/api/v1/jobs/every-job?namespace=doc", None)
        .await;
    assert_eq!(gone.status, 404);
}

/// The worker protocol, once through: register, trigger, lease, output, heartbeat, complete (a
/// failure, so the run is queued again for its retry). Returns the run's id.
async fn worker_protocol(api: &Client<'_>) -> i64 {
    let hello = json!({"name": "doc-worker", "labels": {"zone": "eu"}, "slots": 2});
    let registered = api.call("post", "/api/v1/workers", Some(hello)).await;
    assert_eq!(registered.status, 201);
    let worker = registered.body["worker_id"].as_str().unwrap().to_string();
    let no_slots = json!({"name": "w", "slots": 0});
    let refused = api.call_invalid("post", "/api/v1/workers", no_slots).await;
    assert_eq!(refused["error"]["field"], "slots");

    let run = api.call("post", "/api/v1/jobs/doc-job/trigger", None).await;
    assert_eq!((run.status, &run.body["trigger"]), (201, &json!("manual")));
    let run_id = run.body["id"].as_i64().unwrap();
    let missing = api
        .call("post", "/api/v1/jobs/no-such-job/trigger", None)
        .await;
    assert_eq!(missing.status, 404);

    let lease = format!("/api/v1/workers/{worker}/lease");
    let mut leased = Value::Null;
    for _ in 0..10 {
        let ask = json!({"max": 2, "wait_ms": 500});
        let answer = api.call("post", &lease, Some(ask)).await;
        assert_eq!(answer.status, 200);
        if let Some(first) = answer.body["attempts"].as_array().and_then(|a| a.first()) {
            leased = first.clone();
            break;
        }
    }
    assert_eq!(
        leased["run_id"],
        json!(run_id),
        "the triggered run was leased"
    );
    let attempt = leased["attempt_id"].as_i64().unwrap();
    let token = leased["token"].as_i64().unwrap();
    let ask = json!({"max": 1, "wait_ms": 0});
    let unknown = api
        .call("post", "/api/v1/workers/no-such-worker/lease", Some(ask))
        .await;
    assert_eq!(unknown.status, 410);

    let output = format!("/api/v1/attempts/{attempt}/log?token={token}&worker={worker}");
    let kept = api.raw("post", &output, b"hello\n".to_vec()).await;
    assert_eq!((kept.status, &kept.body["kept"]), (200, &json!(6)));
    let output = format!(
        "/api/v1/attempts/{attempt}/log?token={}&worker={worker}",
        token ^ 1
    );
    let fenced = api.raw("post", &output, b"x".to_vec()).await;
    assert_eq!(
        (fenced.status, &fenced.body["error"]["code"]),
        (409, &json!("fenced"))
    );

    let beat = json!({"running": [attempt], "warm_keys": ["k"]});
    let path = format!("/api/v1/workers/{worker}/heartbeat");
    let answer = api.call("post", &path, Some(beat)).await;
    assert_eq!((answer.status, &answer.body["stop"]), (200, &json!([])));
    // serde would read an array as a struct's fields in order; the document says object.
    let refused = api.call_invalid("post", &path, json!([])).await;
    assert_eq!(refused["error"]["field"], "body");
    let array_retry = json!({"target": {"shell": {"command": "true"}}, "retry": [3]});
    let refused = api
        .call_invalid("put", "/api/v1/jobs/array-job", array_retry)
        .await;
    assert_eq!(refused["error"]["field"], "retry");
    let path = "/api/v1/workers/no-such-worker/heartbeat";
    let unknown = api.call("post", path, Some(json!({}))).await;
    assert_eq!(unknown.status, 410);

    let workers = api.call("get", "/api/v1/workers", None).await;
    assert_eq!(workers.body["workers"][0]["running"], 1);
    for bad in ["limit=1001", "cursor=zzz"] {
        let answer = api
            .call("get", &format!("/api/v1/workers?{bad}"), None)
            .await;
        assert_eq!(answer.status, 400, "{bad}");
    }

    let complete = format!("/api/v1/workers/{worker}/complete");
    let failed = json!({"completions": [{
        "attempt_id": attempt, "token": token, "outcome": "failed", "exit_code": 3, "error": "boom",
    }]});
    let answer = api.call("post", &complete, Some(failed.clone())).await;
    assert_eq!(answer.body["results"][0]["accepted"], true);
    let unknown = json!({"completions": [{"attempt_id": 0, "token": 0, "outcome": "succeeded"}]});
    api.nulls_as_documented("post", &complete, unknown).await;
    let hello = json!({"name": "null-worker", "slots": 1});
    api.nulls_as_documented("post", "/api/v1/workers", hello)
        .await;
    let beat = format!("/api/v1/workers/{worker}/heartbeat");
    api.nulls_as_documented("post", &beat, json!({})).await;
    let answer = api.call("post", &complete, Some(failed)).await;
    assert_eq!(answer.body["results"][0]["accepted"], false);
    let refused = api.call_invalid("post", &complete, json!({"x": 1})).await;
    assert_eq!(refused["error"]["field"], "x");
    let path = "/api/v1/workers/no-such-worker/complete";
    let unknown = api
        .call("post", path, Some(json!({"completions": []})))
        .await;
    assert_eq!(unknown.status, 410);
    run_id
}

/// The run, queued again after its failure: attempts, output, listings, statistics, cancel.
async fn runs(api: &Client<'_>, run_id: i64) {
    let view = api
        .call("get", &format!("/api/v1/runs/{run_id}"), None)
        .await;
    assert_eq!((view.status, &view.body["state"]), (200, &json!("queued")));
    assert_eq!(view.body["attempt_history"][0]["exit_code"], 3);
    let missing = api.call("get", "/api/v1/runs/999999", None).await;
    assert_eq!(missing.status, 404);

    let path = format!("/api/v1/runs/{run_id}/log?attempt=1");
    let (status, _, text) = api.server.send("get", &path, None).await;
    assert_eq!((status, text.as_slice()), (200, &b"hello\n"[..]));
    let latest = api
        .call("get", &format!("/api/v1/runs/{run_id}/log"), None)
        .await;
    assert_eq!(latest.status, 200);
    let path = format!("/api/v1/runs/{run_id}/log?attempt=7");
    let missing = api.call("get", &path, None).await;
    assert_eq!(missing.status, 404);

    let page = api
        .call("get", "/api/v1/runs?job=doc-job&state=queued&limit=5", None)
        .await;
    assert_eq!(page.body["runs"].as_array().unwrap().len(), 1);
    let refused = api.call("get", "/api/v1/runs?state=asleep", None).await;
    assert_eq!(refused.status, 400);
    let page = api.call("get", "/api/v1/jobs/doc-job/runs", None).await;
    assert_eq!(page.body["runs"].as_array().unwrap().len(), 1);
    let grid = api
        .call(
            "get",
            "/api/v1/runs/grid?search=doc-job&jobs=5&instants=5",
            None,
        )
        .await;
    assert_eq!(grid.status, 200);
    assert_eq!(grid.body["jobs"][0]["runs"][0]["id"], json!(run_id));
    let refused = api.call("get", "/api/v1/runs/grid?jobs=501", None).await;
    assert_eq!(refused.status, 400);
    let stats = api.call("get", "/api/v1/jobs/doc-job/stats", None).await;
    assert_eq!((stats.status, &stats.body["runs"]), (200, &json!(1)));
    let missing = api
        .call("get", "/api/v1/jobs/no-such-job/stats", None)
        .await;
    assert_eq!(missing.status, 404);
    let job = api.call("get", "/api/v1/jobs/doc-job", None).await;
    assert_eq!(job.body["last_run"]["id"], run_id);

    // Dependencies: a definition with depends_on, and the graph around it.
    let upstream = json!({"target": {"shell": {"command": "true"}}});
    let created = api.call("put", "/api/v1/jobs/doc-up", Some(upstream)).await;
    assert_eq!(created.status, 201);
    let dependant = json!({
        "target": {"shell": {"command": "true"}},
        "depends_on": [
            {"job": "doc-up", "window": {"before": "1h"}},
            {"any_of": [{"job": "doc-job", "state": "finished"}, {"job": "doc-up"}]}
        ],
        "deps_timeout": "2h"
    });
    let created = api
        .call("put", "/api/v1/jobs/doc-down", Some(dependant.clone()))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    api.nulls_as_documented("put", "/api/v1/jobs/doc-down", dependant)
        .await;
    let graph = api
        .call("get", "/api/v1/jobs/doc-down/graph?up=2&down=1", None)
        .await;
    assert_eq!(graph.status, 200);
    assert_eq!(graph.body["nodes"][0]["name"], "doc-down");
    assert_eq!(graph.body["edges"].as_array().map(Vec::len), Some(2));
    let graph = api
        .call("get", "/api/v1/jobs/doc-up/graph?up=0", None)
        .await;
    assert_eq!(graph.body["edges"][0]["job"], "doc-down");
    assert_eq!(
        graph.body["edges"][0]["requirements"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let refused = api
        .call("get", "/api/v1/jobs/doc-up/graph?down=99", None)
        .await;
    assert_eq!(refused.status, 400);
    let whole = api.call("get", "/api/v1/graph", None).await;
    assert_eq!(whole.status, 200);
    let names: Vec<&str> = whole.body["nodes"]
        .as_array()
        .map(|nodes| nodes.iter().filter_map(|n| n["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"doc-down") && names.contains(&"doc-up"),
        "{names:?}"
    );
    let refused = api.call("get", "/api/v1/graph?limit=0", None).await;
    assert_eq!(refused.status, 400);
    let missing = api
        .call("get", "/api/v1/jobs/no-such-job/graph", None)
        .await;
    assert_eq!(missing.status, 404);
    let refused = api.call("delete", "/api/v1/jobs/doc-up", None).await;
    assert_eq!(refused.status, 409);

    let cancel = format!("/api/v1/runs/{run_id}/cancel");
    let cancelled = api.call("post", &cancel, None).await;
    assert_eq!(cancelled.body["cancel"], "cancelled");
    let again = api.call("post", &cancel, None).await;
    assert_eq!(again.body["cancel"], "already_finished");
    let missing = api.call("post", "/api/v1/runs/999999/cancel", None).await;
    assert_eq!(missing.status, 404);
    // The cancelled run may run again, once; then it is queued and not retried again.
    let retry = format!("/api/v1/runs/{run_id}/retry");
    let retried = api.call("post", &retry, None).await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(retried.body["run"]["state"], "queued");
    let refused = api.call("post", &retry, None).await;
    assert_eq!(refused.status, 409);
    assert_eq!(refused.body["error"]["code"], "not_retryable");
    let missing = api.call("post", "/api/v1/runs/999999/retry", None).await;
    assert_eq!(missing.status, 404);

    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(api.call("get", path, None).await.status, 200, "{path}");
    }
}

/// Query and path values of the wrong type are refused before a handler runs; that, too, is a
/// documented 400, JSON naming the parameter. A wrong method and an unknown path are not any
/// operation's answers, but their bodies are the document's `Error` too.
async fn refusals(api: &Client<'_>) {
    for (method, path, field) in [
        ("get", "/api/v1/jobs?limit=abc", "limit"),
        ("get", "/api/v1/runs/abc", "id"),
        ("get", "/api/v1/runs/1/log?follow=maybe", "follow"),
        ("post", "/api/v1/attempts/1/log", "token"),
    ] {
        let answer = api.raw(method, path, b"x".to_vec()).await;
        assert_eq!(answer.status, 400, "{method} {path}");
        assert_eq!(
            (
                &answer.body["error"]["code"],
                &answer.body["error"]["field"]
            ),
            (&json!("invalid_request"), &json!(field)),
            "{method} {path}"
        );
    }
    let error = json!({"$ref": "#/components/schemas/Error"});
    for (method, path, status) in [
        ("patch", "/api/v1/jobs", 405),
        ("post", "/healthz", 405),
        ("get", "/api/v1/doc-check-nothing", 404),
        ("get", "/doc-check-nothing", 404),
    ] {
        let (got, headers, bytes) = api.server.send(method, path, None).await;
        assert_eq!(got, status, "{method} {path}");
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{method} {path}"
        );
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        let errors = api.checker.errors(&error, &value);
        assert!(errors.is_empty(), "{method} {path}: {errors:#?}");
    }
}

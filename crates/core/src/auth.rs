//! Who may do what: roles, the namespaces a token sees, the permission each route needs, and
//! the rules that judge a request against them.
//!
//! Pure like the rest of core: tokens are generated, hashed and looked up at the edges (the
//! server and the store); this module only defines what a token grants and decides whether a
//! request is within it.

use crate::Instant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// What a token is for. Each role is scoped to the token's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything: every namespace, tokens, the audit trail.
    Admin,
    /// Jobs, triggers, cancels in its namespaces, and reading them.
    Editor,
    /// Reading jobs, runs, workers and the audit trail of its namespaces.
    Viewer,
    /// The worker protocol only.
    Worker,
    /// Posting events in its namespaces only: the token another system (a data pipeline, a
    /// CI job) tells sked what happened with.
    Emitter,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Admin,
        Role::Editor,
        Role::Viewer,
        Role::Worker,
        Role::Emitter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Editor => "editor",
            Role::Viewer => "viewer",
            Role::Worker => "worker",
            Role::Emitter => "emitter",
        }
    }

    /// The role's name after "a" or "an", as a sentence needs it: "an editor", "a viewer".
    pub fn with_article(self) -> &'static str {
        match self {
            Role::Admin => "an admin",
            Role::Editor => "an editor",
            Role::Viewer => "a viewer",
            Role::Worker => "a worker",
            Role::Emitter => "an emitter",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether this role may call a route that needs `permission`. Namespaces are judged
    /// separately ([`Grant::sees`]).
    pub fn allows(self, permission: Permission) -> bool {
        match permission {
            Permission::Open | Permission::Authenticated => true,
            Permission::Read => matches!(self, Role::Admin | Role::Editor | Role::Viewer),
            Permission::Write => matches!(self, Role::Admin | Role::Editor),
            Permission::Worker => matches!(self, Role::Admin | Role::Worker),
            Permission::Events => matches!(self, Role::Admin | Role::Editor | Role::Emitter),
            Permission::Admin => self == Role::Admin,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a route needs of its caller. Every route of the API names one (the server's route
/// table), so no route is reachable without a decision about who may call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// No token: health, readiness and metrics; and a consumer's completion report, whose
    /// body carries its run's completion token instead.
    Open,
    /// Any valid token, whatever its role (the API document).
    Authenticated,
    /// Reading jobs, runs, workers, the cluster and the audit trail.
    Read,
    /// Changing jobs, triggering and cancelling runs.
    Write,
    /// The worker protocol: register, heartbeat, lease, output, complete.
    Worker,
    /// Posting events.
    Events,
    /// Managing tokens.
    Admin,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Open => "open",
            Permission::Authenticated => "authenticated",
            Permission::Read => "read",
            Permission::Write => "write",
            Permission::Worker => "worker",
            Permission::Events => "events",
            Permission::Admin => "admin",
        }
    }
}

/// The namespace list that means every namespace, present and future.
pub const ALL_NAMESPACES: &str = "*";

/// A label a worker token lets its workers claim: `key=value`, or `key=*` for any value of
/// `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LabelRule {
    pub key: String,
    /// `None`: any value.
    pub value: Option<String>,
}

impl LabelRule {
    pub fn allows(&self, key: &str, value: &str) -> bool {
        self.key == key && self.value.as_deref().is_none_or(|v| v == value)
    }
}

impl TryFrom<String> for LabelRule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let (key, value) = s
            .split_once('=')
            .ok_or_else(|| format!("label rule {s:?} is not key=value or key=*"))?;
        if key.is_empty() {
            return Err(format!("label rule {s:?} has no key"));
        }
        Ok(LabelRule {
            key: key.to_string(),
            value: (value != "*").then(|| value.to_string()),
        })
    }
}

impl From<LabelRule> for String {
    fn from(rule: LabelRule) -> String {
        format!("{}={}", rule.key, rule.value.as_deref().unwrap_or("*"))
    }
}

/// What a token grants: its role, namespaces, whether it may define shell targets, and, for
/// worker tokens, the labels its workers may claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub role: Role,
    /// Namespace names, or `["*"]` for all.
    pub namespaces: Vec<String>,
    /// May create or change jobs whose target is a shell command (code execution on the
    /// workers). Admin tokens always may.
    #[serde(default)]
    pub shell: bool,
    /// Worker tokens: the labels a worker registering with this token may claim; `None`
    /// allows any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<LabelRule>>,
}

/// Why a request was refused. The server turns `Forbidden` into 403; `Hidden` into 404, so a
/// token learns nothing of objects outside its namespaces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Hidden(String),
}

impl Grant {
    /// What an open development server grants every request made without a token.
    pub fn open() -> Grant {
        Grant {
            role: Role::Admin,
            namespaces: vec![ALL_NAMESPACES.to_string()],
            shell: true,
            labels: None,
        }
    }

    pub fn all_namespaces(&self) -> bool {
        self.role == Role::Admin || self.namespaces.iter().any(|n| n == ALL_NAMESPACES)
    }

    /// Whether objects of `namespace` exist for this token.
    pub fn sees(&self, namespace: &str) -> bool {
        self.all_namespaces() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Whether this token sees anything a worker with `worker` namespaces may run: a worker
    /// that may run a namespace's jobs is visible to that namespace.
    pub fn sees_any(&self, namespaces: &[String]) -> bool {
        self.all_namespaces()
            || namespaces
                .iter()
                .any(|n| n == ALL_NAMESPACES || self.sees(n))
    }

    pub fn permits(&self, permission: Permission) -> Result<(), Denied> {
        if self.role.allows(permission) {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{} token may not do this (it needs {} permission)",
                self.role.with_article(),
                permission.as_str()
            )))
        }
    }

    /// Naming `namespace` in a request (a list, a job path): refused when the token does not
    /// see it.
    pub fn enter(&self, namespace: &str) -> Result<(), Denied> {
        if self.sees(namespace) {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "this token does not see namespace {namespace:?}"
            )))
        }
    }

    /// Reaching an object by id (a run, its log): one in a namespace the token does not see
    /// does not exist for it.
    pub fn reach(&self, namespace: &str, what: &str) -> Result<(), Denied> {
        if self.sees(namespace) {
            Ok(())
        } else {
            Err(Denied::Hidden(format!("{what} does not exist")))
        }
    }

    /// Defining a job whose target is a shell command needs `shell`.
    pub fn may_define(&self, runs_commands: bool) -> Result<(), Denied> {
        if !runs_commands || self.role == Role::Admin || self.shell {
            Ok(())
        } else {
            Err(Denied::Forbidden(
                "shell and container targets run commands on the workers: this token was not \
                 created with shell permission (sked token create --shell)"
                    .to_string(),
            ))
        }
    }

    /// A worker registering with this token may claim these labels.
    pub fn may_claim(&self, labels: &BTreeMap<String, String>) -> Result<(), Denied> {
        let Some(rules) = &self.labels else {
            return Ok(());
        };
        match labels
            .iter()
            .find(|(k, v)| !rules.iter().any(|rule| rule.allows(k, v)))
        {
            None => Ok(()),
            Some((k, v)) => Err(Denied::Forbidden(format!(
                "this token's workers may not claim label {k}={v}"
            ))),
        }
    }

    /// The namespaces a worker registered with this token runs jobs of.
    pub fn worker_namespaces(&self) -> Vec<String> {
        if self.all_namespaces() {
            vec![ALL_NAMESPACES.to_string()]
        } else {
            self.namespaces.clone()
        }
    }
}

/// Whether a worker that may run `worker_namespaces` may take a run of `namespace`. An entry
/// `!name` refuses that namespace whatever else the list holds (names never start with `!`):
/// the server's publisher passes over a namespace that holds its part of its slots this way.
pub fn worker_serves(worker_namespaces: &[String], namespace: &str) -> bool {
    let mut serves = false;
    for n in worker_namespaces {
        if n.strip_prefix('!') == Some(namespace) {
            return false;
        }
        serves |= n == ALL_NAMESPACES || n == namespace;
    }
    serves
}

/// A token's secret as clients hold it. `Debug` prints no part of it, so a configuration that
/// is logged does not leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The `Authorization` header value that carries it.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A stored token, as the API lists it: never its secret, which is only shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: i64,
    pub name: String,
    #[serde(flatten)]
    pub grant: Grant,
    pub created_at: Instant,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Instant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<Instant>,
    /// Console sessions of this token made at or before this instant are over (a logout).
    #[serde(skip)]
    pub sessions_ended_at: Option<Instant>,
}

impl TokenRecord {
    pub fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// A token name: what audit entries and `sked token revoke` call it, and a path segment
/// (`/tokens/{name}`), so the rule of job and namespace names (no `.` or `..`).
pub fn validate_token_name(name: &str) -> Result<(), String> {
    crate::job::validate_name("name", name).map_err(|e| e.message)
}

/// Checks a grant as a token is created: a known namespace list, label rules only on worker
/// tokens.
pub fn validate_grant(grant: &Grant) -> Result<(), (&'static str, String)> {
    if grant.namespaces.is_empty() {
        return Err((
            "namespaces",
            "must name at least one namespace, or \"*\" for all".into(),
        ));
    }
    if grant.namespaces.len() > 100 {
        return Err(("namespaces", "at most 100 namespaces".into()));
    }
    for ns in &grant.namespaces {
        if ns != ALL_NAMESPACES {
            crate::job::validate_name("namespaces", ns).map_err(|e| ("namespaces", e.message))?;
        }
    }
    if grant.labels.is_some() && grant.role != Role::Worker {
        return Err(("labels", "only worker tokens restrict labels".into()));
    }
    if grant.labels.as_ref().is_some_and(|l| l.len() > 100) {
        return Err(("labels", "at most 100 label rules".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(role: Role, namespaces: &[&str]) -> Grant {
        Grant {
            role,
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            shell: false,
            labels: None,
        }
    }

    #[test]
    fn each_role_reaches_exactly_its_permissions() {
        use Permission::*;
        let table = [
            (Role::Admin, [true, true, true, true, true, true, true]),
            (Role::Editor, [true, true, true, true, false, true, false]),
            (Role::Viewer, [true, true, true, false, false, false, false]),
            (Role::Worker, [true, true, false, false, true, false, false]),
            (
                Role::Emitter,
                [true, true, false, false, false, true, false],
            ),
        ];
        for (role, expected) in table {
            let got =
                [Open, Authenticated, Read, Write, Worker, Events, Admin].map(|p| role.allows(p));
            assert_eq!(got, expected, "{role}");
        }
    }

    #[test]
    fn a_refusal_names_the_role_with_its_article() {
        let refused = |role| match grant(role, &["a"]).permits(Permission::Admin) {
            Err(Denied::Forbidden(message)) => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(Role::Editor),
            "an editor token may not do this (it needs admin permission)"
        );
        assert!(refused(Role::Viewer).starts_with("a viewer token"));
        assert!(refused(Role::Emitter).starts_with("an emitter token"));
        assert!(refused(Role::Worker).starts_with("a worker token"));
    }

    #[test]
    fn a_token_sees_its_namespaces_only_unless_admin_or_star() {
        let a = grant(Role::Editor, &["a"]);
        assert!(a.sees("a"));
        assert!(!a.sees("b"));
        assert_eq!(
            a.reach("b", "run 7"),
            Err(Denied::Hidden("run 7 does not exist".into()))
        );
        assert!(matches!(a.enter("b"), Err(Denied::Forbidden(_))));
        assert!(grant(Role::Viewer, &["*"]).sees("b"));
        assert!(grant(Role::Admin, &["a"]).sees("b"));
    }

    #[test]
    fn shell_targets_need_the_shell_flag_except_for_admins() {
        let mut editor = grant(Role::Editor, &["a"]);
        assert!(editor.may_define(false).is_ok());
        assert!(editor.may_define(true).is_err());
        editor.shell = true;
        assert!(editor.may_define(true).is_ok());
        assert!(grant(Role::Admin, &["*"]).may_define(true).is_ok());
    }

    #[test]
    fn a_refused_namespace_is_not_served_even_under_all() {
        let list = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(worker_serves(&list(&["*"]), "team-a"));
        assert!(!worker_serves(&list(&["*", "!team-a"]), "team-a"));
        assert!(worker_serves(&list(&["*", "!team-a"]), "team-b"));
        assert!(!worker_serves(&list(&["team-b"]), "team-a"));
    }

    #[test]
    fn label_rules_bound_what_a_worker_claims() {
        let mut worker = grant(Role::Worker, &["a"]);
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(worker.may_claim(&labels(&[("pool", "secure")])).is_ok());
        worker.labels = Some(vec![
            LabelRule::try_from("pool=general".to_string()).unwrap(),
            LabelRule::try_from("zone=*".to_string()).unwrap(),
        ]);
        assert!(worker
            .may_claim(&labels(&[("pool", "general"), ("zone", "eu")]))
            .is_ok());
        assert!(worker.may_claim(&labels(&[("pool", "secure")])).is_err());
        assert!(worker.may_claim(&labels(&[("gpu", "yes")])).is_err());
        assert!(worker.may_claim(&BTreeMap::new()).is_ok());
    }

    #[test]
    fn label_rules_read_and_write_as_strings() {
        for text in ["pool=secure", "zone=*"] {
            let rule = LabelRule::try_from(text.to_string()).unwrap();
            assert_eq!(String::from(rule), text);
        }
        assert!(LabelRule::try_from("pool".to_string()).is_err());
        assert!(LabelRule::try_from("=x".to_string()).is_err());
    }

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("sked_hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert_eq!(secret.bearer(), "Bearer sked_hunter2");
    }

    #[test]
    fn workers_serve_their_namespaces() {
        assert!(worker_serves(&["*".into()], "a"));
        assert!(worker_serves(&["a".into(), "b".into()], "b"));
        assert!(!worker_serves(&["a".into()], "b"));
        let viewer = grant(Role::Viewer, &["b"]);
        assert!(viewer.sees_any(&["*".into()]));
        assert!(viewer.sees_any(&["a".into(), "b".into()]));
        assert!(!viewer.sees_any(&["a".into()]));
    }

    #[test]
    fn grants_are_checked_as_tokens_are_created() {
        assert!(validate_grant(&grant(Role::Viewer, &[])).is_err());
        assert!(validate_grant(&grant(Role::Viewer, &["*"])).is_ok());
        assert!(validate_grant(&grant(Role::Viewer, &["bad name"])).is_err());
        let mut editor = grant(Role::Editor, &["a"]);
        editor.labels = Some(vec![]);
        assert_eq!(validate_grant(&editor).unwrap_err().0, "labels");
        assert!(validate_token_name("ci-deploy").is_ok());
        assert!(validate_token_name("").is_err());
        assert!(validate_token_name("a b").is_err());
        assert!(
            validate_token_name("..").is_err(),
            "a path segment of its own"
        );
    }
}

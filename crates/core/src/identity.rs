//! People who log in through an identity provider (OpenID Connect): which of their groups give
//! which grant, and the name their console token goes by.
//!
//! Pure: the provider is spoken to at the edge (`sked_server::oidc`), and what a grant allows
//! is `crate::auth`'s. This module only turns the groups a provider vouched for into one
//! [`Grant`], by the rules in the server's config.

use crate::auth::{validate_grant, Grant, Role, ALL_NAMESPACES};
use std::fmt;
use std::str::FromStr;

/// Most groups looked at per person: a provider that sends more is cut off there, so a person
/// in thousands of groups costs no more to judge than one in 256.
pub const MAX_GROUPS: usize = 256;
/// Longest group name looked at; longer ones match no rule.
pub const MAX_GROUP_LEN: usize = 256;

/// One mapping of the server's config: members of `group` get `role` in `namespaces`
/// (`--oidc-group GROUP=ROLE:NS[,NS...][:shell]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRule {
    pub group: String,
    pub role: Role,
    pub namespaces: Vec<String>,
    /// May define shell targets (admins always may).
    pub shell: bool,
}

impl FromStr for GroupRule {
    type Err = String;

    fn from_str(text: &str) -> Result<GroupRule, String> {
        let shape = "use GROUP=ROLE:NAMESPACE[,NAMESPACE...][:shell], such as \
                     ops=editor:payments,billing or sre=admin:*";
        let (group, rest) = text
            .rsplit_once('=')
            .ok_or_else(|| format!("{text:?} has no '=': {shape}"))?;
        if group.is_empty() || group.len() > MAX_GROUP_LEN {
            return Err(format!(
                "{text:?}: the group must be 1 to {MAX_GROUP_LEN} bytes"
            ));
        }
        let mut parts = rest.split(':');
        let role_text = parts.next().unwrap_or_default();
        let role = Role::parse(role_text)
            .filter(|role| matches!(role, Role::Admin | Role::Editor | Role::Viewer))
            .ok_or_else(|| {
                format!(
                    "{text:?}: {role_text:?} is not a role a person logs in with (admin, \
                     editor or viewer)"
                )
            })?;
        let namespaces: Vec<String> = parts
            .next()
            .ok_or_else(|| format!("{text:?} names no namespace: {shape}"))?
            .split(',')
            .map(str::to_string)
            .collect();
        let shell = match parts.next() {
            None => false,
            Some("shell") => true,
            Some(other) => return Err(format!("{text:?}: {other:?} is not `shell`: {shape}")),
        };
        if parts.next().is_some() {
            return Err(format!("{text:?} has too many ':': {shape}"));
        }
        let rule = GroupRule {
            group: group.to_string(),
            role,
            namespaces,
            shell,
        };
        validate_grant(&rule.grant()).map_err(|(_, message)| format!("{text:?}: {message}"))?;
        Ok(rule)
    }
}

impl fmt::Display for GroupRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={}:{}{}",
            self.group,
            self.role,
            self.namespaces.join(","),
            if self.shell { ":shell" } else { "" }
        )
    }
}

impl GroupRule {
    fn grant(&self) -> Grant {
        Grant {
            role: self.role,
            namespaces: self.namespaces.clone(),
            shell: self.shell,
            labels: None,
        }
    }
}

/// How strong a role is among those a person may hold.
fn rank(role: Role) -> u8 {
    match role {
        Role::Admin => 3,
        Role::Editor => 2,
        Role::Viewer => 1,
        Role::Worker | Role::Emitter => 0,
    }
}

/// The grant a person in `groups` gets, or `None` when no rule names any of their groups.
///
/// A grant is one role over a set of namespaces, so when several rules match, the strongest
/// role wins, over the namespaces of every matching rule of that role, with `shell` when any of
/// those rules gives it. (Weaker rules add nothing: an editor of `payments` who is also a
/// viewer of `billing` is an editor of `payments`; map a group to what its members need.)
pub fn grant_for<'a>(
    rules: &[GroupRule],
    groups: impl IntoIterator<Item = &'a str>,
) -> Option<Grant> {
    let groups: Vec<&str> = groups
        .into_iter()
        .take(MAX_GROUPS)
        .filter(|g| g.len() <= MAX_GROUP_LEN)
        .collect();
    let matching: Vec<&GroupRule> = rules
        .iter()
        .filter(|rule| groups.contains(&rule.group.as_str()))
        .collect();
    let strongest = matching
        .iter()
        .map(|rule| rule.role)
        .max_by_key(|r| rank(*r))?;
    let mut grant = Grant {
        role: strongest,
        namespaces: Vec::new(),
        shell: false,
        labels: None,
    };
    for rule in matching.iter().filter(|rule| rule.role == strongest) {
        grant.shell |= rule.shell;
        for namespace in &rule.namespaces {
            if !grant.namespaces.contains(namespace) {
                grant.namespaces.push(namespace.clone());
            }
        }
    }
    if grant.namespaces.iter().any(|n| n == ALL_NAMESPACES) {
        grant.namespaces = vec![ALL_NAMESPACES.to_string()];
    }
    // Each rule is within the bound; their union may not be.
    validate_grant(&grant).ok()?;
    Some(grant)
}

/// The start of the token names of a person's console sessions: `sso-` and their login made
/// a valid name (letters, digits, '.', '_', '-'; anything else becomes '-'), at most 41
/// characters, so a random suffix still fits the name limit.
pub fn token_prefix(login: &str) -> String {
    let slug: String = login
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(36)
        .collect();
    format!("sso-{slug}-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(text: &str) -> GroupRule {
        text.parse().unwrap()
    }

    #[test]
    fn a_rule_reads_as_written_and_says_what_is_wrong() {
        let ops = rule("ops=editor:payments,billing");
        assert_eq!(ops.group, "ops");
        assert_eq!(ops.role, Role::Editor);
        assert_eq!(ops.namespaces, ["payments", "billing"]);
        assert!(!ops.shell);
        assert_eq!(ops.to_string(), "ops=editor:payments,billing");
        assert!(rule("sre=admin:*:shell").shell);
        // A group may hold '=' itself (LDAP names do): the last one separates.
        assert_eq!(
            rule("cn=ops,dc=example=viewer:*").group,
            "cn=ops,dc=example"
        );
        for (bad, says) in [
            ("ops", "no '='"),
            ("=viewer:*", "1 to"),
            ("ops=worker:*", "not a role"),
            ("ops=emitter:*", "not a role"),
            ("ops=root:*", "not a role"),
            ("ops=viewer", "names no namespace"),
            ("ops=viewer:", "not a valid name"),
            ("ops=viewer:a b", "not a valid name"),
            ("ops=viewer:*:sudo", "not `shell`"),
            ("ops=viewer:*:shell:x", "too many"),
        ] {
            let error = bad.parse::<GroupRule>().unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_strongest_matching_role_wins_with_its_namespaces() {
        let rules = [
            rule("readers=viewer:*"),
            rule("payments=editor:payments"),
            rule("billing=editor:billing:shell"),
            rule("sre=admin:*"),
        ];
        assert_eq!(grant_for(&rules, ["marketing"]), None);
        assert_eq!(grant_for(&rules, []), None);
        let viewer = grant_for(&rules, ["readers", "marketing"]).unwrap();
        assert_eq!(
            (viewer.role, viewer.namespaces),
            (Role::Viewer, vec!["*".into()])
        );
        let editor = grant_for(&rules, ["readers", "payments", "billing"]).unwrap();
        assert_eq!(editor.role, Role::Editor);
        assert_eq!(editor.namespaces, ["payments", "billing"]);
        assert!(editor.shell);
        let admin = grant_for(&rules, ["payments", "sre"]).unwrap();
        assert_eq!(
            (admin.role, admin.namespaces),
            (Role::Admin, vec!["*".into()])
        );
        // Group names are compared whole and exactly.
        assert_eq!(grant_for(&rules, ["SRE", "sre-team", "payments "]), None);
    }

    #[test]
    fn token_names_of_any_login_are_valid() {
        assert_eq!(token_prefix("alice"), "sso-alice-");
        assert_eq!(
            token_prefix("Alice Smith@example.com"),
            "sso-alice-smith-example.com-"
        );
    }

    proptest! {
        /// Whatever the groups, the grant is no more than one matching rule's role, and only
        /// over namespaces some matching rule of that role names.
        #[test]
        fn a_grant_never_exceeds_the_rules_that_matched(
            picks in proptest::collection::vec((0usize..6, 0usize..3, 0usize..4, any::<bool>()), 0..8),
            groups in proptest::collection::vec(0usize..8, 0..8),
        ) {
            let names = ["a", "b", "c", "d", "e", "f"];
            let namespaces = ["*", "x", "y", "z"];
            let roles = [Role::Viewer, Role::Editor, Role::Admin];
            let rules: Vec<GroupRule> = picks.iter().map(|&(g, r, n, shell)| GroupRule {
                group: names[g].to_string(),
                role: roles[r],
                namespaces: vec![namespaces[n].to_string()],
                shell,
            }).collect();
            // Two of the groups held ("g", "h") are named by no rule.
            let held: Vec<String> = groups
                .iter()
                .map(|&g| ["a", "b", "c", "d", "e", "f", "g", "h"][g].to_string())
                .collect();
            let grant = grant_for(&rules, held.iter().map(String::as_str));
            let matching: Vec<&GroupRule> = rules.iter().filter(|r| held.contains(&r.group)).collect();
            match grant {
                None => prop_assert!(matching.is_empty()),
                Some(grant) => {
                    prop_assert!(matching.iter().all(|r| rank(r.role) <= rank(grant.role)));
                    let same: Vec<&&GroupRule> = matching.iter().filter(|r| r.role == grant.role).collect();
                    prop_assert!(!same.is_empty());
                    for ns in &grant.namespaces {
                        prop_assert!(same.iter().any(|r| r.namespaces.contains(ns)));
                    }
                    prop_assert_eq!(grant.shell, same.iter().any(|r| r.shell));
                }
            }
        }
    }
}

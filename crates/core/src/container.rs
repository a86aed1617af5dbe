//! The container target: an image run by the worker's container engine, with its command,
//! environment, resources, network and mounts; and the operator's policy over images and
//! mounts (`sked server --image-allow`, `--mount-allow`).
//!
//! Definitions and pure checks only: how an engine is called is the worker's business
//! (`worker::executor::container`), and this module must not know an engine's flags.

use crate::error::SpecError;
use crate::limits::{check_account, check_resources, ByteSize, Cpus};
use crate::target::{no_nul, TargetValue};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Longest image reference.
pub const MAX_IMAGE_LEN: usize = 512;
/// Most mounts of one container.
pub const MAX_MOUNTS: usize = 16;
/// Longest path of a mount, a workdir or an entrypoint.
pub const MAX_PATH_LEN: usize = 1024;

/// An image run once per attempt: `podman run` (or `docker run`) with sked's labels, the
/// run's `SKED_*` variables and the job's env, removed when it ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerTarget {
    /// `registry.example.com/team/app:1.4`, `localhost/tool`, `app@sha256:...`.
    pub image: String,
    /// The program, replacing the image's command; `args` follow it. Without either the
    /// image's own command runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Replaces the image's entrypoint (`""` clears it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
    /// Passed through the engine's environment, never on its command line.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, TargetValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The user inside the container: `name`, `uid` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Cpus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    #[serde(default, skip_serializing_if = "Network::is_none")]
    pub network: Network,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Pull::is_missing")]
    pub pull: Pull,
}

/// The container's network: `none` (the default: no network at all), `host` (the worker's
/// own), `bridge`, or a network the engine knows by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Network {
    #[default]
    None,
    Host,
    Bridge,
    Named(String),
}

impl Network {
    pub fn is_none(&self) -> bool {
        *self == Network::None
    }

    pub fn as_str(&self) -> &str {
        match self {
            Network::None => "none",
            Network::Host => "host",
            Network::Bridge => "bridge",
            Network::Named(name) => name,
        }
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "none" => Network::None,
            "host" => Network::Host,
            "bridge" => Network::Bridge,
            name => {
                crate::job::validate_name("network", name).map_err(|e| e.message)?;
                // Never read as an option of the engine.
                if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                    return Err(format!(
                        "network {name:?} must be none, host, bridge or a name starting with \
                         a letter or digit"
                    ));
                }
                Network::Named(name.to_string())
            }
        })
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Network {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// When the engine pulls the image: `missing` (the default), `always`, or `never` (the
/// image must already be on the worker's host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pull {
    Never,
    #[default]
    Missing,
    Always,
}

impl Pull {
    pub fn is_missing(&self) -> bool {
        *self == Pull::Missing
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Pull::Never => "never",
            Pull::Missing => "missing",
            Pull::Always => "always",
        }
    }
}

/// A path of the worker's host seen inside the container; read-only unless `writable` (and
/// the operator allows writing there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub source: String,
    pub target: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable: bool,
}

impl ContainerTarget {
    /// The argument vector replacing the image's command: `command` then `args`.
    pub fn argv(&self) -> Vec<&str> {
        self.command
            .iter()
            .map(String::as_str)
            .chain(self.args.iter().map(String::as_str))
            .collect()
    }

    /// Checks what serde cannot; fields are named under `target.container`.
    pub fn validate(&self) -> Result<(), SpecError> {
        let field = |name: &str| format!("target.container.{name}");
        check_image(&field("image"), &self.image)?;
        if let Some(command) = &self.command {
            if command.trim().is_empty() {
                return Err(SpecError::new(field("command"), "must not be empty"));
            }
            no_nul(&field("command"), command)?;
        }
        for arg in &self.args {
            no_nul(&field("args"), arg)?;
        }
        if let Some(entrypoint) = &self.entrypoint {
            no_nul(&field("entrypoint"), entrypoint)?;
            if entrypoint.len() > MAX_PATH_LEN {
                return Err(SpecError::new(field("entrypoint"), "is too long"));
            }
        }
        crate::target::check_env(&field("env"), &self.env)?;
        if let Some(workdir) = &self.workdir {
            absolute_path(&field("workdir"), workdir)?;
        }
        if let Some(user) = &self.user {
            let (name, group) = user.split_once(':').unwrap_or((user, ""));
            check_account(&field("user"), name)?;
            if !group.is_empty() {
                check_account(&field("user"), group)?;
            }
        }
        check_resources("target.container", self.memory, self.cpus, self.pids)?;
        if self.mounts.len() > MAX_MOUNTS {
            return Err(SpecError::new(
                field("mounts"),
                format!("at most {MAX_MOUNTS} mounts"),
            ));
        }
        for (i, mount) in self.mounts.iter().enumerate() {
            absolute_path(&field(&format!("mounts[{i}].source")), &mount.source)?;
            absolute_path(&field(&format!("mounts[{i}].target")), &mount.target)?;
        }
        Ok(())
    }
}

/// An image reference: registry, path, tag or digest characters only, so it can never be
/// read as an option of the engine.
fn check_image(field: &str, image: &str) -> Result<(), SpecError> {
    let valid = !image.is_empty()
        && image.len() <= MAX_IMAGE_LEN
        && image.starts_with(|c: char| c.is_ascii_alphanumeric())
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b));
    if !valid {
        return Err(SpecError::new(
            field,
            format!(
                "{image:?} is not an image reference (letters, digits and ._-/:@, starting \
                 with a letter or digit, at most {MAX_IMAGE_LEN})"
            ),
        ));
    }
    Ok(())
}

/// An absolute path without `..`, `,` or `:` (which an engine's mount syntax would split on)
/// and without NUL: what a mount or a workdir may name.
fn absolute_path(field: &str, path: &str) -> Result<(), SpecError> {
    no_nul(field, path)?;
    if !path.starts_with('/') || path.len() > MAX_PATH_LEN {
        return Err(SpecError::new(
            field,
            format!("{path:?} is not an absolute path (at most {MAX_PATH_LEN} bytes)"),
        ));
    }
    if path.split('/').any(|part| part == "..") || path.contains([',', ':']) {
        return Err(SpecError::new(
            field,
            format!("{path:?} must not contain '..', ',' or ':'"),
        ));
    }
    Ok(())
}

/// One `--image-allow` line: images beginning with `prefix` may be run, by `namespace` or by
/// every namespace. Written `PREFIX` or `NS=PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageAllowance {
    pub namespace: Option<String>,
    pub prefix: String,
}

impl FromStr for ImageAllowance {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespace, prefix) = split_namespace(s)?;
        if prefix != "*" {
            check_image("--image-allow", prefix).map_err(|e| e.message)?;
        }
        Ok(ImageAllowance {
            namespace,
            prefix: prefix.to_string(),
        })
    }
}

/// One `--mount-allow` line: host paths under `path` may be mounted, read-only unless
/// `writable`, by `namespace` or by every namespace. Written `[NS=]PATH[:rw]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountAllowance {
    pub namespace: Option<String>,
    pub path: String,
    pub writable: bool,
}

impl FromStr for MountAllowance {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (namespace, rest) = split_namespace(s)?;
        let (path, writable) = match rest.strip_suffix(":rw") {
            Some(path) => (path, true),
            None => (rest.strip_suffix(":ro").unwrap_or(rest), false),
        };
        absolute_path("--mount-allow", path).map_err(|e| e.message)?;
        Ok(MountAllowance {
            namespace,
            path: path.trim_end_matches('/').to_string(),
            writable,
        })
    }
}

fn split_namespace(s: &str) -> Result<(Option<String>, &str), String> {
    match s.trim().split_once('=') {
        Some((namespace, rest)) => {
            crate::job::validate_name("namespace", namespace).map_err(|e| e.message)?;
            Ok((Some(namespace.to_string()), rest))
        }
        None => Ok((None, s.trim())),
    }
}

/// The operator's rules for container targets, checked when a job is written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerPolicy {
    /// Every image is allowed (`sked dev`); otherwise only those `images` allow.
    pub any_image: bool,
    pub images: Vec<ImageAllowance>,
    pub mounts: Vec<MountAllowance>,
}

impl ContainerPolicy {
    /// Whether `namespace` may run `target` as written: its image is allowed, and each mount
    /// is under an allowed path, writable only where writing is allowed.
    pub fn check(&self, namespace: &str, target: &ContainerTarget) -> Result<(), SpecError> {
        let applies = |ns: &Option<String>| ns.as_deref().is_none_or(|ns| ns == namespace);
        let image_allowed = self.any_image
            || self.images.iter().any(|a| {
                applies(&a.namespace) && (a.prefix == "*" || target.image.starts_with(&a.prefix))
            });
        if !image_allowed {
            return Err(SpecError::new(
                "target.container.image",
                format!(
                    "image {:?} is not allowed for namespace {namespace:?}: the server allows \
                     only images beginning with a prefix it was given (sked server \
                     --image-allow [NS=]PREFIX){}",
                    target.image,
                    self.allowed_prefixes(namespace)
                ),
            ));
        }
        for (i, mount) in target.mounts.iter().enumerate() {
            let under = |a: &&MountAllowance| {
                applies(&a.namespace)
                    && (mount.source == a.path
                        || a.path.is_empty()
                        || mount.source.starts_with(&format!("{}/", a.path)))
            };
            let field = format!("target.container.mounts[{i}].source");
            match self.mounts.iter().filter(under).max_by_key(|a| a.writable) {
                None => {
                    return Err(SpecError::new(
                        field,
                        format!(
                            "{:?} is not under a host path the server allows namespace \
                             {namespace:?} to mount (sked server --mount-allow [NS=]PATH[:rw])",
                            mount.source
                        ),
                    ))
                }
                Some(allowed) if mount.writable && !allowed.writable => {
                    return Err(SpecError::new(
                        field,
                        format!(
                            "{:?} may be mounted read-only only: the server allows writing \
                             under a path given as --mount-allow PATH:rw",
                            mount.source
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn allowed_prefixes(&self, namespace: &str) -> String {
        let prefixes: Vec<&str> = self
            .images
            .iter()
            .filter(|a| a.namespace.as_deref().is_none_or(|ns| ns == namespace))
            .map(|a| a.prefix.as_str())
            .collect();
        if prefixes.is_empty() {
            "; it allows this namespace none".to_string()
        } else {
            format!("; it allows this namespace {}", prefixes.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(json: serde_json::Value) -> ContainerTarget {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_container_target_reads_and_writes_back_as_given() {
        let json = serde_json::json!({
            "image": "localhost/tool:1", "command": "/bin/sh", "args": ["-c", "env"],
            "env": {"A": "1", "TOKEN": {"sealed": "x"}}, "workdir": "/work", "user": "1000:1000",
            "memory": "64MiB", "cpus": 0.5, "pids": 32, "network": "host",
            "mounts": [{"source": "/srv/data", "target": "/data"}], "pull": "never",
            "entrypoint": ""
        });
        let t = target(json.clone());
        assert_eq!(t.validate(), Ok(()));
        assert_eq!(t.argv(), vec!["/bin/sh", "-c", "env"]);
        assert_eq!(serde_json::to_value(&t).unwrap(), json);
        let minimal = target(serde_json::json!({"image": "busybox"}));
        assert_eq!(minimal.network, Network::None);
        assert_eq!(minimal.pull, Pull::Missing);
        assert_eq!(
            serde_json::to_value(&minimal).unwrap(),
            serde_json::json!({"image": "busybox"})
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let field = |json: serde_json::Value| target(json).validate().unwrap_err().field;
        assert_eq!(
            field(serde_json::json!({"image": "--privileged"})),
            "target.container.image"
        );
        assert_eq!(
            field(serde_json::json!({"image": "a", "workdir": "rel"})),
            "target.container.workdir"
        );
        assert_eq!(
            field(
                serde_json::json!({"image": "a", "mounts": [{"source": "/a/../etc", "target": "/x"}]})
            ),
            "target.container.mounts[0].source"
        );
        assert_eq!(
            field(
                serde_json::json!({"image": "a", "mounts": [{"source": "/a", "target": "/x:rw"}]})
            ),
            "target.container.mounts[0].target"
        );
        assert_eq!(
            field(serde_json::json!({"image": "a", "memory": "1K"})),
            "target.container.memory"
        );
        assert_eq!(
            field(serde_json::json!({"image": "a", "user": "a b"})),
            "target.container.user"
        );
        assert_eq!(
            field(serde_json::json!({"image": "a", "env": {"A=B": "1"}})),
            "target.container.env"
        );
        // No way to ask for privileges: the field does not exist.
        assert!(serde_json::from_value::<ContainerTarget>(
            serde_json::json!({"image": "a", "privileged": true})
        )
        .is_err());
        assert!(serde_json::from_value::<ContainerTarget>(
            serde_json::json!({"image": "a", "network": "--x"})
        )
        .is_err());
    }

    #[test]
    fn the_policy_allows_images_by_prefix_and_mounts_by_path() {
        let policy = ContainerPolicy {
            any_image: false,
            images: vec![
                "registry.example.com/".parse().unwrap(),
                "ops=localhost/".parse().unwrap(),
            ],
            mounts: vec![
                "/srv/shared".parse().unwrap(),
                "ops=/var/cache/ops:rw".parse().unwrap(),
            ],
        };
        let run = |ns: &str, json: serde_json::Value| policy.check(ns, &target(json));
        assert_eq!(
            run(
                "app",
                serde_json::json!({"image": "registry.example.com/app:1"})
            ),
            Ok(())
        );
        assert_eq!(
            run("app", serde_json::json!({"image": "localhost/tool"}))
                .unwrap_err()
                .field,
            "target.container.image"
        );
        assert_eq!(
            run("ops", serde_json::json!({"image": "localhost/tool"})),
            Ok(())
        );
        let mount = |source: &str, writable: bool| {
            serde_json::json!({"image": "localhost/t", "mounts": [
                {"source": source, "target": "/m", "writable": writable}]})
        };
        assert_eq!(run("ops", mount("/srv/shared/data", false)), Ok(()));
        assert_eq!(
            run("ops", mount("/srv/shared/data", true))
                .unwrap_err()
                .field,
            "target.container.mounts[0].source"
        );
        assert_eq!(run("ops", mount("/var/cache/ops/x", true)), Ok(()));
        // A prefix of a name is not a parent directory.
        assert!(run("ops", mount("/srv/sharedother", false)).is_err());
        assert!(run("ops", mount("/etc", false)).is_err());
        let any = ContainerPolicy {
            any_image: true,
            ..ContainerPolicy::default()
        };
        assert_eq!(
            any.check("x", &target(serde_json::json!({"image": "a"}))),
            Ok(())
        );
        assert!(any.check("x", &target(mount("/srv", false))).is_err());
    }

    #[test]
    fn allowances_parse_or_say_why_not() {
        let m: MountAllowance = "ops=/data/:rw".parse().unwrap();
        assert_eq!(
            m,
            MountAllowance {
                namespace: Some("ops".into()),
                path: "/data".into(),
                writable: true
            }
        );
        assert!("relative".parse::<MountAllowance>().is_err());
        assert!("/a/../b".parse::<MountAllowance>().is_err());
        assert!("-x".parse::<ImageAllowance>().is_err());
        assert_eq!(
            "*".parse::<ImageAllowance>().unwrap().prefix,
            "*".to_string()
        );
    }
}

//! What a job's processes may use, and as whom they run: `limits` and `run_as` of shell
//! targets, and the resource fields of container targets (`crate::container`).
//!
//! Plain values and their bounds only. How a worker enforces them (cgroups, rlimits, the
//! container engine's flags) is the worker's business; this module must not know it.

use crate::error::SpecError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The reason an attempt's error begins with when the kernel killed one of its processes
/// over its memory limit.
pub const OUT_OF_MEMORY: &str = "out_of_memory";

/// Smallest memory limit: below it even a shell does not start.
pub const MIN_MEMORY: u64 = 6 * 1024 * 1024;
/// Largest memory limit accepted (1 TiB): beyond it a typo, not a limit.
pub const MAX_MEMORY: u64 = 1 << 40;
/// Bounds of `cpus`, in thousandths of a CPU.
pub const MIN_MILLICPUS: u32 = 10;
pub const MAX_MILLICPUS: u32 = 1024 * 1000;
/// Most processes a limit may allow.
pub const MAX_PIDS: u32 = 1_000_000;
/// Bounds of `open_files`: below 16 the dynamic loader itself fails.
pub const MIN_OPEN_FILES: u32 = 16;
pub const MAX_OPEN_FILES: u32 = 1 << 20;
/// Bounds of `max_output`.
pub const MIN_OUTPUT: u64 = 1024;
pub const MAX_OUTPUT: u64 = 1 << 30;

/// A size in bytes, written `64MiB`, `512M`, `1G`, `4096` (K, M, G and T are powers of 1024,
/// with or without `iB` or `B`, as container engines read them). Serialized as `64MiB` when
/// it is a whole number of a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(format!("{s:?} is not a size like 64MiB, 512M or 1G")),
        };
        let number: u64 = digits
            .parse()
            .map_err(|_| format!("{s:?} is not a size like 64MiB, 512M or 1G"))?;
        number
            .checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            let size = 1u64 << shift;
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u64),
            Text(String),
        }
        match Written::deserialize(d)? {
            Written::Bytes(n) => Ok(ByteSize(n)),
            Written::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A share of CPU time: `0.5` is half a CPU, `2` two CPUs. Kept in thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cpus(pub u32);

impl Cpus {
    pub fn millis(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}", f64::from(self.0) / 1000.0)
        }
    }
}

impl Serialize for Cpus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(f64::from(self.0) / 1000.0)
    }
}

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let cpus = f64::deserialize(d)?;
        if !cpus.is_finite() || cpus <= 0.0 || cpus > f64::from(MAX_MILLICPUS) / 1000.0 {
            return Err(serde::de::Error::custom(format!(
                "{cpus} is not a number of CPUs between 0.01 and {}",
                MAX_MILLICPUS / 1000
            )));
        }
        Ok(Cpus((cpus * 1000.0).round() as u32))
    }
}

/// What a shell job's whole process tree may use. Every field is optional; a worker says on
/// each attempt how it enforced them (a cgroup of the attempt's own, or rlimits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory of the whole tree; over it the kernel kills a process, and the attempt ends
    /// `failed` with reason `out_of_memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Cpus>,
    /// Processes and threads of the tree at once: a fork bomb stops here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// Open files per process (RLIMIT_NOFILE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u32>,
    /// Output kept in the run's log; the rest is dropped, with a marker saying how much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<ByteSize>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// Checks each bound; `field` is where the limits are (`target.shell.limits`), for
    /// errors such as `target.shell.limits.memory`.
    pub fn validate(&self, field: &str) -> Result<(), SpecError> {
        check_resources(field, self.memory, self.cpus, self.pids)?;
        if let Some(files) = self.open_files {
            if !(MIN_OPEN_FILES..=MAX_OPEN_FILES).contains(&files) {
                return Err(SpecError::new(
                    format!("{field}.open_files"),
                    format!("must be between {MIN_OPEN_FILES} and {MAX_OPEN_FILES}"),
                ));
            }
        }
        if let Some(output) = self.max_output {
            if !(MIN_OUTPUT..=MAX_OUTPUT).contains(&output.0) {
                return Err(SpecError::new(
                    format!("{field}.max_output"),
                    format!(
                        "must be between {} and {}",
                        ByteSize(MIN_OUTPUT),
                        ByteSize(MAX_OUTPUT)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether enforcing them needs more than cutting output (which any worker does).
    pub fn binds_processes(&self) -> bool {
        self.memory.is_some()
            || self.cpus.is_some()
            || self.pids.is_some()
            || self.open_files.is_some()
    }
}

/// The bounds of memory, CPUs and processes, shared by shell limits and container targets.
pub(crate) fn check_resources(
    field: &str,
    memory: Option<ByteSize>,
    cpus: Option<Cpus>,
    pids: Option<u32>,
) -> Result<(), SpecError> {
    let at = |name: &str| {
        if field.is_empty() {
            name.to_string()
        } else {
            format!("{field}.{name}")
        }
    };
    if let Some(memory) = memory {
        if !(MIN_MEMORY..=MAX_MEMORY).contains(&memory.0) {
            return Err(SpecError::new(
                at("memory"),
                format!(
                    "must be between {} and {}",
                    ByteSize(MIN_MEMORY),
                    ByteSize(MAX_MEMORY)
                ),
            ));
        }
    }
    if let Some(cpus) = cpus {
        if !(MIN_MILLICPUS..=MAX_MILLICPUS).contains(&cpus.0) {
            return Err(SpecError::new(
                at("cpus"),
                format!("must be between 0.01 and {}", MAX_MILLICPUS / 1000),
            ));
        }
    }
    if let Some(pids) = pids {
        if !(1..=MAX_PIDS).contains(&pids) {
            return Err(SpecError::new(
                at("pids"),
                format!("must be between 1 and {MAX_PIDS}"),
            ));
        }
    }
    Ok(())
}

/// The OS user (and group) a shell job runs as, by name or number. Only a worker running as
/// root can switch to it; the others do not take such runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAs {
    pub user: String,
    /// The user's primary group when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl RunAs {
    pub fn validate(&self, field: &str) -> Result<(), SpecError> {
        check_account(&format!("{field}.user"), &self.user)?;
        if let Some(group) = &self.group {
            check_account(&format!("{field}.group"), group)?;
        }
        if self.user == "0" || self.user == "root" {
            return Err(SpecError::new(
                format!("{field}.user"),
                "must not be root: leave run_as out to run as the worker's own user",
            ));
        }
        Ok(())
    }
}

/// A user or group name as POSIX allows it (letters, digits, `.`, `_`, `-`, not leading
/// `-`), or a number.
pub(crate) fn check_account(field: &str, name: &str) -> Result<(), SpecError> {
    let valid = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !valid {
        return Err(SpecError::new(
            field,
            format!(
                "{name:?} is not a user or group name (letters, digits, '.', '_', '-'; at most 32)"
            ),
        ));
    }
    Ok(())
}

/// What a worker can execute beyond plain shell and HTTP targets: it says so with every
/// lease request, and the dispatcher hands it only runs it can execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// It has a container engine (`sked worker --container-runtime`).
    Container,
    /// It runs as root, so it can start a job as another user.
    RunAs,
    /// It can bind a job's processes (cgroups, or at least rlimits).
    Limits,
}

string_enum!(Capability {
    Container => "container",
    RunAs => "run_as",
    Limits => "limits",
});

impl Capability {
    /// What a worker without it lacks, for a waiting run's reason.
    pub fn missing(self) -> &'static str {
        match self {
            Capability::Container => "a container engine (sked worker --container-runtime)",
            Capability::RunAs => "root, to run a job as another user (run_as)",
            Capability::Limits => "process limits (limits)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_powers_of_1024_and_print_back() {
        for (text, bytes) in [
            ("64MiB", 64 << 20),
            ("64M", 64 << 20),
            ("64mb", 64 << 20),
            ("1G", 1 << 30),
            ("4096", 4096),
            ("10 KiB", 10 << 10),
        ] {
            let size: ByteSize = text.parse().unwrap();
            assert_eq!(size.0, bytes, "{text}");
            assert_eq!(size.to_string().parse::<ByteSize>().unwrap(), size);
        }
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1500).to_string(), "1500");
        for bad in ["", "MiB", "-1M", "1.5G", "12 parsecs", "99999999999999T"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_out_of_bounds_name_their_field() {
        let limits = |json: serde_json::Value| serde_json::from_value::<Limits>(json).unwrap();
        let field = |l: Limits| l.validate("target.shell.limits").unwrap_err().field;
        assert_eq!(
            field(limits(serde_json::json!({"memory": "1M"}))),
            "target.shell.limits.memory"
        );
        assert_eq!(
            field(limits(serde_json::json!({"pids": 0}))),
            "target.shell.limits.pids"
        );
        assert_eq!(
            field(limits(serde_json::json!({"open_files": 3}))),
            "target.shell.limits.open_files"
        );
        assert_eq!(
            field(limits(serde_json::json!({"max_output": 10}))),
            "target.shell.limits.max_output"
        );
        assert!(serde_json::from_value::<Limits>(serde_json::json!({"cpus": -1})).is_err());
        assert!(serde_json::from_value::<Limits>(serde_json::json!({"swap": 1})).is_err());
        let fine = limits(
            serde_json::json!({"memory": "64MiB", "cpus": 0.5, "pids": 64,
            "open_files": 256, "max_output": "1MiB"}),
        );
        assert_eq!(fine.validate("limits"), Ok(()));
        assert_eq!(fine.cpus, Some(Cpus(500)));
        assert_eq!(
            serde_json::to_value(fine).unwrap(),
            serde_json::json!({"memory": "64MiB", "cpus": 0.5, "pids": 64,
                "open_files": 256, "max_output": "1MiB"})
        );
    }

    #[test]
    fn run_as_takes_names_and_numbers_but_not_root() {
        let run_as = |user: &str, group: Option<&str>| RunAs {
            user: user.into(),
            group: group.map(Into::into),
        };
        assert_eq!(run_as("nobody", Some("nogroup")).validate("r"), Ok(()));
        assert_eq!(run_as("65534", None).validate("r"), Ok(()));
        assert_eq!(
            run_as("root", None).validate("r").unwrap_err().field,
            "r.user"
        );
        assert_eq!(run_as("0", None).validate("r").unwrap_err().field, "r.user");
        assert_eq!(
            run_as("a b", None).validate("r").unwrap_err().field,
            "r.user"
        );
        assert_eq!(
            run_as("-x", None).validate("r").unwrap_err().field,
            "r.user"
        );
        assert_eq!(
            run_as("ok", Some("x;y")).validate("r").unwrap_err().field,
            "r.group"
        );
    }
}

//! How a shell attempt is bound: which of its limits a cgroup enforces, which rlimits do, and
//! which nothing can on this worker ([`plan`], a pure decision, with the line it writes to the
//! output); and who the job runs as ([`resolve`], read from the user database).
//!
//! Owns these decisions only: it must not create cgroups, start processes or set limits.
//! The shell executor applies a [`Plan`] through the [`supervisor`](super::supervisor).

use sked_core::limits::{Limits, RunAs};

use super::cgroup::Bounds;

/// One rlimit the job's processes start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rlimit {
    /// RLIMIT_AS: address space, memory's stand-in without a cgroup.
    AddressSpace(u64),
    /// RLIMIT_NPROC: processes of the job's user (not of the job).
    Processes(u32),
    /// RLIMIT_NOFILE.
    OpenFiles(u32),
}

/// What applies to one attempt's processes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The attempt's cgroup, when one is made.
    pub cgroup: Option<Bounds>,
    pub rlimits: Vec<Rlimit>,
    /// The limits nothing enforces here, each with why.
    pub unenforced: Vec<&'static str>,
    /// The line the attempt's output starts with; `None` when no limit binds processes.
    pub line: Option<String>,
}

/// Decides how `limits` apply. `cgroups` names the worker's cgroups (`cgroup v1`) when it can
/// make one for the attempt; `user` is the run_as user, who alone RLIMIT_NPROC can bind (it
/// counts the processes of a user, and root is above it).
pub fn plan(limits: &Limits, cgroups: Option<&str>, user: Option<&str>) -> Plan {
    let mut plan = Plan::default();
    let mut by_cgroup = Vec::new();
    let mut by_rlimit = Vec::new();
    let wants_group = limits.memory.is_some() || limits.cpus.is_some() || limits.pids.is_some();
    match cgroups {
        Some(_) if wants_group => {
            plan.cgroup = Some(Bounds {
                memory: limits.memory,
                cpus: limits.cpus,
                pids: limits.pids,
            });
            if let Some(memory) = limits.memory {
                by_cgroup.push(format!("memory {memory}"));
            }
            if let Some(cpus) = limits.cpus {
                by_cgroup.push(format!("cpus {cpus}"));
            }
            if let Some(pids) = limits.pids {
                by_cgroup.push(format!("pids {pids}"));
            }
        }
        _ => {
            if let Some(memory) = limits.memory {
                plan.rlimits.push(Rlimit::AddressSpace(memory.0));
                by_rlimit.push(format!("memory {memory} (address space, per process)"));
            }
            if let Some(pids) = limits.pids {
                match user {
                    Some(user) => {
                        plan.rlimits.push(Rlimit::Processes(pids));
                        by_rlimit.push(format!("pids {pids} (all processes of user {user})"));
                    }
                    None => plan
                        .unenforced
                        .push("pids (an rlimit binds only a run_as user)"),
                }
            }
            if limits.cpus.is_some() {
                plan.unenforced.push("cpus");
            }
        }
    }
    if let Some(files) = limits.open_files {
        plan.rlimits.push(Rlimit::OpenFiles(files));
        by_rlimit.push(format!("open files {files}"));
    }
    let mut parts = Vec::new();
    if let (Some(name), false) = (cgroups, by_cgroup.is_empty()) {
        parts.push(format!("limits by {name}: {}", by_cgroup.join(", ")));
    }
    if !by_rlimit.is_empty() {
        let lead = if parts.is_empty() { "limits by" } else { "by" };
        parts.push(format!("{lead} rlimit: {}", by_rlimit.join(", ")));
    }
    if !plan.unenforced.is_empty() {
        let lead = if parts.is_empty() { "limits " } else { "" };
        parts.push(format!(
            "{lead}not enforced without a cgroup: {}",
            plan.unenforced.join(", ")
        ));
    }
    if !parts.is_empty() {
        plan.line = Some(format!("[sked-worker: {}]\n", parts.join("; ")));
    }
    plan
}

/// The account a job runs as, resolved on this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The user as the job named it, for messages and `USER`.
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// Resolves `run_as` to ids: names through the user and group databases, numbers as they
/// are. A number without an entry needs its group given. Never root, whatever the name.
pub fn resolve(run_as: &RunAs) -> Result<Account, String> {
    use nix::unistd::{Group, Uid, User};
    let user = &run_as.user;
    let entry = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(user),
    }
    .map_err(|e| format!("run_as: cannot look up user {user:?}: {e}"))?;
    let (uid, primary, home, name) = match (entry, user.parse::<u32>()) {
        (Some(u), _) => (u.uid.as_raw(), Some(u.gid.as_raw()), u.dir, u.name),
        (None, Ok(uid)) => (uid, None, "/".into(), user.clone()),
        (None, Err(_)) => return Err(format!("run_as: user {user:?} does not exist here")),
    };
    if uid == 0 {
        return Err(format!("run_as: user {user:?} is root here"));
    }
    let gid = match &run_as.group {
        None => primary.ok_or_else(|| {
            format!("run_as: user {user:?} has no entry here, so its group must be given")
        })?,
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => Group::from_name(group)
                .map_err(|e| format!("run_as: cannot look up group {group:?}: {e}"))?
                .map(|g| g.gid.as_raw())
                .ok_or_else(|| {
                    format!("run_as: group {group:?} of user {user:?} does not exist here")
                })?,
        },
    };
    Ok(Account {
        name,
        uid,
        gid,
        home: home.to_string_lossy().into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sked_core::limits::{ByteSize, Cpus};

    fn limits(
        memory: Option<u64>,
        cpus: Option<u32>,
        pids: Option<u32>,
        files: Option<u32>,
    ) -> Limits {
        Limits {
            memory: memory.map(|m| ByteSize(m << 20)),
            cpus: cpus.map(Cpus),
            pids,
            open_files: files,
            max_output: None,
        }
    }

    #[test]
    fn a_cgroup_takes_memory_cpus_and_pids_and_rlimits_open_files() {
        let plan = plan(
            &limits(Some(64), Some(500), Some(32), Some(256)),
            Some("cgroup v1"),
            None,
        );
        assert_eq!(
            plan.cgroup,
            Some(Bounds {
                memory: Some(ByteSize(64 << 20)),
                cpus: Some(Cpus(500)),
                pids: Some(32)
            })
        );
        assert_eq!(plan.rlimits, vec![Rlimit::OpenFiles(256)]);
        assert!(plan.unenforced.is_empty());
        assert_eq!(
            plan.line.as_deref(),
            Some("[sked-worker: limits by cgroup v1: memory 64MiB, cpus 0.5, pids 32; by rlimit: open files 256]\n")
        );
    }

    #[test]
    fn without_a_cgroup_memory_is_address_space_and_cpus_are_not_enforced() {
        let plan = plan(
            &limits(Some(64), Some(2000), Some(32), Some(256)),
            None,
            None,
        );
        assert_eq!(plan.cgroup, None);
        assert_eq!(
            plan.rlimits,
            vec![Rlimit::AddressSpace(64 << 20), Rlimit::OpenFiles(256)]
        );
        assert_eq!(
            plan.line.as_deref(),
            Some("[sked-worker: limits by rlimit: memory 64MiB (address space, per process), open files 256; not enforced without a cgroup: pids (an rlimit binds only a run_as user), cpus]\n")
        );
    }

    #[test]
    fn pids_become_nproc_only_for_a_run_as_user() {
        let plan = plan(&limits(None, None, Some(32), None), None, Some("nobody"));
        assert_eq!(plan.rlimits, vec![Rlimit::Processes(32)]);
        assert_eq!(
            plan.line.as_deref(),
            Some("[sked-worker: limits by rlimit: pids 32 (all processes of user nobody)]\n")
        );
    }

    #[test]
    fn open_files_alone_needs_no_cgroup_and_no_limit_says_nothing() {
        let plan = plan(&limits(None, None, None, Some(64)), Some("cgroup v1"), None);
        assert_eq!(plan.cgroup, None);
        assert_eq!(plan.rlimits, vec![Rlimit::OpenFiles(64)]);
        assert_eq!(
            plan.line.as_deref(),
            Some("[sked-worker: limits by rlimit: open files 64]\n")
        );
        let none = super::plan(&Limits::default(), Some("cgroup v1"), None);
        assert_eq!(none, Plan::default());
        let only_cpus = super::plan(&limits(None, Some(100), None, None), None, None);
        assert_eq!(
            only_cpus.line.as_deref(),
            Some("[sked-worker: limits not enforced without a cgroup: cpus]\n")
        );
    }

    #[test]
    fn run_as_resolves_names_and_numbers_and_refuses_root_and_strangers() {
        let run_as = |user: &str, group: Option<&str>| RunAs {
            user: user.into(),
            group: group.map(Into::into),
        };
        // Every Linux system this runs on has `nobody`; its ids vary.
        let nobody = resolve(&run_as("nobody", None)).expect("nobody exists");
        assert_ne!(nobody.uid, 0);
        let by_number = resolve(&run_as(&nobody.uid.to_string(), None)).expect("by number");
        assert_eq!((by_number.uid, by_number.gid), (nobody.uid, nobody.gid));
        assert_eq!(
            resolve(&run_as("nobody", Some("4242"))).map(|a| a.gid),
            Ok(4242)
        );
        let stranger = resolve(&run_as("no-such-user-here", None)).unwrap_err();
        assert!(
            stranger.contains("\"no-such-user-here\" does not exist"),
            "{stranger}"
        );
        let group = resolve(&run_as("nobody", Some("no-such-group-here"))).unwrap_err();
        assert!(group.contains("\"no-such-group-here\""), "{group}");
        assert!(resolve(&run_as("root", None))
            .unwrap_err()
            .contains("is root"));
        assert!(resolve(&run_as("4243", None))
            .unwrap_err()
            .contains("its group must be given"));
        assert_eq!(
            resolve(&run_as("4243", Some("4244"))).map(|a| (a.uid, a.gid)),
            Ok((4243, 4244))
        );
    }
}

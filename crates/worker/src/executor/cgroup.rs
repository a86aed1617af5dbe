//! One cgroup per attempt (cgroup v1, or the v2 unified hierarchy) holding the attempt's
//! whole process tree, with its memory, CPU and process limits: what a worker running as
//! root binds a job with. A shell attempt's processes join it before the job is executed; a
//! container's engine makes it the container's parent.
//!
//! Owns the cgroup files only: creating an attempt's group, setting its limits, reading
//! whether the kernel killed in it for memory, removing it, and removing what a worker killed
//! before could not. It must not start or signal processes.

use sked_core::limits::{ByteSize, Cpus};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The cgroup filesystem.
const ROOT: &str = "/sys/fs/cgroup";
/// The group under each hierarchy that holds sked's attempts.
const SKED: &str = "sked";
/// The CPU quota's period (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

/// What one attempt's group binds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    pub memory: Option<ByteSize>,
    pub cpus: Option<Cpus>,
    pub pids: Option<u32>,
}

/// How this host's cgroups are laid out: v1 with one hierarchy per controller, or v2 with
/// one for all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// `memory`, `pids` and `cpu` directories under the cgroup root.
    V1,
    /// The unified hierarchy at the cgroup root.
    V2,
}

/// Where this worker can make attempt groups: found once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    hierarchy: Hierarchy,
    root: PathBuf,
}

impl Cgroups {
    /// The cgroups this process may create groups in, or `None` (not root, a read-only
    /// cgroup filesystem, no memory controller): then limits fall back to rlimits.
    pub fn detect() -> Option<Cgroups> {
        let root = PathBuf::from(ROOT);
        let candidates = [
            Cgroups {
                hierarchy: Hierarchy::V2,
                root: root.clone(),
            },
            Cgroups {
                hierarchy: Hierarchy::V1,
                root,
            },
        ];
        candidates.into_iter().find(|c| c.usable())
    }

    fn usable(&self) -> bool {
        let marker = match self.hierarchy {
            Hierarchy::V2 => self.root.join("cgroup.controllers"),
            Hierarchy::V1 => self.root.join("memory/memory.limit_in_bytes"),
        };
        if !marker.exists() {
            return false;
        }
        if self.hierarchy == Hierarchy::V2 {
            // Controllers must be handed down to our group for its children to use them.
            let _ = std::fs::create_dir_all(self.root.join(SKED));
            let _ = std::fs::write(
                self.root.join("cgroup.subtree_control"),
                "+memory +pids +cpu",
            );
            let _ = std::fs::write(
                self.root.join(SKED).join("cgroup.subtree_control"),
                "+memory +pids +cpu",
            );
        }
        self.bases()
            .iter()
            .all(|(_, base)| std::fs::create_dir_all(base).is_ok())
    }

    /// `sked`'s group in each hierarchy it uses, with the controller it is for (v1).
    fn bases(&self) -> Vec<(&'static str, PathBuf)> {
        match self.hierarchy {
            Hierarchy::V2 => vec![("", self.root.join(SKED))],
            Hierarchy::V1 => ["memory", "pids", "cpu"]
                .into_iter()
                .map(|c| (c, self.root.join(c).join(SKED)))
                .collect(),
        }
    }

    /// What the worker reports of how limits are enforced.
    pub fn describe(&self) -> &'static str {
        match self.hierarchy {
            Hierarchy::V1 => "cgroup v1",
            Hierarchy::V2 => "cgroup v2",
        }
    }

    /// Creates the group of attempt `attempt_id` with `bounds`. The name carries this
    /// worker's pid too: attempt ids are unique in one deployment only, and two deployments'
    /// workers on one host must not share (and remove) each other's groups.
    pub fn create(&self, attempt_id: i64, bounds: Bounds) -> std::io::Result<AttemptGroup> {
        let name = format!("attempt-{attempt_id}-{}", std::process::id());
        let dirs = self
            .bases()
            .into_iter()
            .map(|(controller, base)| (controller, base.join(&name)))
            .collect();
        let group = AttemptGroup {
            hierarchy: self.hierarchy.clone(),
            relative: format!("/{SKED}/{name}"),
            dirs,
            memory: bounds.memory,
        };
        for (_, dir) in &group.dirs {
            std::fs::create_dir_all(dir)?;
        }
        if let Err(e) = group.bind(bounds) {
            group.remove();
            return Err(e);
        }
        Ok(group)
    }

    /// Removes the attempt groups nobody is in any more: those of attempts a worker killed
    /// with SIGKILL could not remove. Groups with processes, and those of a worker still
    /// running (whose job may not have joined its new group yet), are left alone.
    pub fn reap_orphans(&self) -> usize {
        let mut removed = 0;
        for (_, base) in self.bases() {
            let Ok(entries) = std::fs::read_dir(&base) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if path.is_dir()
                    && name.starts_with("attempt-")
                    && !of_a_live_worker(&name)
                    && remove_tree(&path)
                {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// One attempt's group, in each hierarchy. Removed by [`AttemptGroup::remove`] once the
/// attempt's processes are gone.
#[derive(Debug)]
pub struct AttemptGroup {
    hierarchy: Hierarchy,
    /// `/sked/attempt-N`: the group's path inside each hierarchy, as an engine's
    /// `--cgroup-parent` takes it.
    relative: String,
    /// The group's directory for each controller (one, named `""`, under v2).
    dirs: Vec<(&'static str, PathBuf)>,
    memory: Option<ByteSize>,
}

impl AttemptGroup {
    /// The directory holding `controller`'s files.
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| c.is_empty() || *c == controller)
            .map(|(_, dir)| dir.as_path())
    }

    fn bind(&self, bounds: Bounds) -> std::io::Result<()> {
        let file = |controller: &str, name: &str| -> std::io::Result<PathBuf> {
            self.dir(controller)
                .map(|d| d.join(name))
                .ok_or_else(|| std::io::Error::other(format!("no {controller} controller")))
        };
        if let Some(memory) = bounds.memory {
            match self.hierarchy {
                Hierarchy::V2 => {
                    write(&file("memory", "memory.max")?, memory.0)?;
                    // No swap past the limit: over it is out of memory, not slow.
                    let _ = write(&file("memory", "memory.swap.max")?, 0);
                }
                Hierarchy::V1 => {
                    write(&file("memory", "memory.limit_in_bytes")?, memory.0)?;
                    // Only where swap accounting is on.
                    let _ = write(&file("memory", "memory.memsw.limit_in_bytes")?, memory.0);
                }
            }
        }
        if let Some(pids) = bounds.pids {
            write(&file("pids", "pids.max")?, pids)?;
        }
        if let Some(cpus) = bounds.cpus {
            let quota = u64::from(cpus.millis()) * CPU_PERIOD_US / 1000;
            match self.hierarchy {
                Hierarchy::V2 => {
                    write(&file("cpu", "cpu.max")?, format!("{quota} {CPU_PERIOD_US}"))?
                }
                Hierarchy::V1 => {
                    write(&file("cpu", "cpu.cfs_period_us")?, CPU_PERIOD_US)?;
                    write(&file("cpu", "cpu.cfs_quota_us")?, quota)?;
                }
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files a process writes its pid to (or `0`, itself) to join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, dir)| dir.join("cgroup.procs"))
            .collect()
    }

    /// The group's path inside the hierarchy, for a container engine's `--cgroup-parent`.
    pub fn relative(&self) -> &str {
        &self.relative
    }

    /// Whether the kernel killed a process of the group because the group was out of memory.
    /// `through_child` says the attempt's main process was SIGKILLed from a group under this
    /// one (a container's): under cgroup v1 the kernel then counts the kill in neither group,
    /// and only this group's peak at its limit shows it. A peak alone proves nothing otherwise
    /// (page cache fills a limit too), so it is not read for a shell job's group.
    pub fn out_of_memory(&self, through_child: bool) -> bool {
        let Some(limit) = self.memory else {
            return false;
        };
        let Some(dir) = self.dir("memory") else {
            return false;
        };
        let counted = |file: &str, key: &str| {
            std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|text| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        match self.hierarchy {
            Hierarchy::V2 => counted("memory.events", "oom_kill ") > 0,
            Hierarchy::V1 if !through_child => counted("memory.oom_control", "oom_kill ") > 0,
            Hierarchy::V1 => {
                let peak = std::fs::read_to_string(dir.join("memory.max_usage_in_bytes"))
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                counted("memory.oom_control", "oom_kill ") > 0 || peak >= limit.0
            }
        }
    }

    /// Removes the group once its processes are gone; what cannot be removed yet (a process
    /// still exiting) is left to the next start's [`Cgroups::reap_orphans`].
    pub fn remove(&self) {
        for (_, dir) in &self.dirs {
            for _ in 0..50 {
                if remove_tree(dir) || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// Whether group `name` (`attempt-<id>-<pid>`) was made by a worker that still runs: another
/// one on this host (this one has made none yet when it reaps).
fn of_a_live_worker(name: &str) -> bool {
    name.rsplit_once('-')
        .and_then(|(_, pid)| pid.parse::<u32>().ok())
        .is_some_and(|pid| pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes `dir` and the groups under it, deepest first; false if one still holds a process.
fn remove_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.path().is_dir() && !remove_tree(&entry.path()) {
                return false;
            }
        }
    }
    std::fs::remove_dir(dir).is_ok() || !dir.exists()
}

fn write(path: &Path, value: impl std::fmt::Display) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(value.to_string().as_bytes())
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

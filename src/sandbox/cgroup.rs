//! Cgroups per worker. A pids cgroup caps the processes and threads a run
//! can make (`RLIMIT_NPROC` counts per user and does not bind root); a
//! memory cgroup caps what a worker and its run hold together (`RLIMIT_AS`
//! bounds the address space of one process, not its subprocesses, shared
//! memory or kernel memory). Each cgroup also counts what the kernel refused
//! or killed, which tells a run that hit a limit from one that failed.
//!
//! Detected, never assumed: `/proc/self/mountinfo` names the mounted
//! hierarchies and `/proc/self/cgroup` the server's place in each. For each
//! controller the v2 hierarchy is used when it offers the controller, else
//! the v1 hierarchy that has it. The server makes one directory under its
//! own cgroup in every hierarchy it uses, and in each of those one directory
//! per worker; the launcher moves itself into all of the worker's
//! ([`join`]) before anything else.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which kind of hierarchy holds a controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// A controller workers are placed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Pids,
    Memory,
}

impl Controller {
    const ALL: [Controller; 2] = [Controller::Pids, Controller::Memory];

    fn name(self) -> &'static str {
        match self {
            Controller::Pids => "pids",
            Controller::Memory => "memory",
        }
    }
}

/// The server's own directory in one hierarchy; removed on drop.
#[derive(Debug)]
struct Hierarchy {
    dir: PathBuf,
    version: CgroupVersion,
    /// The controllers the workers get from this hierarchy.
    controllers: Vec<Controller>,
}

impl Drop for Hierarchy {
    fn drop(&mut self) {
        remove_when_empty(self.dir.clone());
    }
}

/// The server's directories of worker cgroups, one per hierarchy used.
#[derive(Debug)]
pub struct CgroupRoot {
    hierarchies: Vec<Hierarchy>,
}

impl CgroupRoot {
    /// Remove the worker directories left (their workers have exited) and
    /// then the server's own, waiting at most `wait` for the last processes
    /// to leave them. Called at shutdown: the process may exit right after,
    /// so this does not leave the work to a thread.
    pub fn remove_all(&self, wait: Duration) {
        let deadline = std::time::Instant::now() + wait;
        for h in &self.hierarchies {
            loop {
                if remove_server_dir(&h.dir) || !h.dir.exists() {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    tracing::warn!(cgroup = %h.dir.display(), "could not remove the server's cgroup");
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The name of a server's directory: its pid and its pid namespace, so that
/// a pid is only ever judged in the namespace it belongs to.
fn server_dir_name(pid: u32, pid_namespace: u64) -> String {
    format!("code-executor-{pid}-{pid_namespace}")
}

/// The server a directory named by [`server_dir_name`] belongs to, as
/// (pid, pid namespace); anything may follow a `.` after the name (the
/// random part of a temporary directory's).
fn server_of(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix("code-executor-")?;
    let (pid, ns) = rest.split_once('-')?;
    let ns = ns.split_once('.').map_or(ns, |(ns, _)| ns);
    Some((pid.parse().ok()?, ns.parse().ok()?))
}

/// Whether a directory named `name` belongs to a server of this pid
/// namespace that is no longer running.
pub(crate) fn is_stale_server_dir(name: &str) -> bool {
    server_of(name).is_some_and(|(pid, ns)| {
        ns == own_pid_namespace()
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
    })
}

/// The name this server gives its directories (a cgroup per hierarchy, its
/// temporary directory): pid and pid namespace, so that the next server can
/// tell which ones were left by a server that is gone.
pub(crate) fn own_server_dir_name() -> String {
    server_dir_name(std::process::id(), own_pid_namespace())
}

/// This process's pid namespace (the inode of `/proc/self/ns/pid`).
fn own_pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Remove the directories that servers no longer running left in `base`
/// (a server killed with SIGKILL cannot clean up): those of this pid
/// namespace whose pid is gone. Only empty cgroups can be removed, so
/// nothing that still holds a process is touched.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(is_stale_server_dir) {
            continue;
        }
        let dir = entry.path();
        if remove_server_dir(&dir) {
            tracing::info!(cgroup = %dir.display(), "removed the cgroup of a server that is gone");
        }
    }
}

/// `rmdir` a server's directory after its worker directories; only cgroups
/// without processes go. Whether the server's directory is gone.
fn remove_server_dir(dir: &Path) -> bool {
    if let Ok(workers) = std::fs::read_dir(dir) {
        for worker in workers.flatten() {
            if worker.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir(worker.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok()
}

/// What one worker's cgroups allow.
#[derive(Debug, Clone, Copy)]
pub struct WorkerLimits {
    /// Tasks (processes and threads) of the worker while it starts, before
    /// [`WorkerCgroup::calibrate`] counts its own.
    pub pids_max: u64,
    /// Tasks a run may have (its main thread included).
    pub run_processes: u64,
    /// Bytes the worker and its run may hold together; `None`: no cap.
    pub memory_max: Option<u64>,
}

impl CgroupRoot {
    /// Make the server's directory in each writable hierarchy that offers a
    /// controller workers use; `None` when no hierarchy does.
    pub fn create() -> Option<CgroupRoot> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let name = server_dir_name(std::process::id(), own_pid_namespace());
        let places = own_places(&mountinfo, &own);
        // Off the start's path: the first worker need not wait for it.
        let bases: Vec<PathBuf> = places.iter().map(|p| p.base.clone()).collect();
        let _ = std::thread::Builder::new()
            .name("stale-cgroups".into())
            .spawn(move || bases.iter().for_each(|b| remove_stale(b)));
        let mut hierarchies: Vec<Hierarchy> = Vec::new();
        for controller in Controller::ALL {
            // v2 first: one hierarchy for every controller it offers.
            let mut candidates: Vec<&Place> = places
                .iter()
                .filter(|p| match p.version {
                    CgroupVersion::V2 => true,
                    CgroupVersion::V1 => p.controllers.iter().any(|c| c == controller.name()),
                })
                .collect();
            candidates.sort_by_key(|p| p.version == CgroupVersion::V1);
            for place in candidates {
                let dir = place.base.join(&name);
                if let Some(h) = hierarchies.iter_mut().find(|h| h.dir == dir) {
                    if enable(&h.dir, h.version, controller) {
                        h.controllers.push(controller);
                        break;
                    }
                    continue;
                }
                if !(std::fs::create_dir(&dir).is_ok() || dir.is_dir()) {
                    continue;
                }
                let mut hierarchy = Hierarchy {
                    dir,
                    version: place.version,
                    controllers: Vec::new(),
                };
                if enable(&hierarchy.dir, hierarchy.version, controller) {
                    hierarchy.controllers.push(controller);
                    hierarchies.push(hierarchy);
                    break;
                }
                // Dropping it removes the directory again.
            }
        }
        (!hierarchies.is_empty()).then_some(CgroupRoot { hierarchies })
    }

    /// The kind of hierarchy that caps `controller` for workers, if any.
    pub fn version(&self, controller: Controller) -> Option<CgroupVersion> {
        self.hierarchies
            .iter()
            .find(|h| h.controllers.contains(&controller))
            .map(|h| h.version)
    }

    /// The cgroups of one worker, one per hierarchy, with `limits` set.
    pub fn worker(&self, name: &str, limits: &WorkerLimits) -> std::io::Result<WorkerCgroup> {
        let mut cgroup = WorkerCgroup {
            dirs: Vec::new(),
            pids_events: None,
            oom_events: None,
            seen: LimitCounters::default(),
            due: false,
            pids_max: None,
            run_processes: limits.run_processes,
            own_tasks: None,
            tasks_now: limits.pids_max,
        };
        for h in &self.hierarchies {
            let dir = h.dir.join(name);
            std::fs::create_dir(&dir)?;
            cgroup.dirs.push(dir.clone());
            for controller in &h.controllers {
                match controller {
                    Controller::Pids => {
                        std::fs::write(dir.join("pids.max"), limits.pids_max.to_string())?;
                        // Not every pids controller counts refusals (gVisor's
                        // has no pids.events): without it, none are seen.
                        cgroup.pids_events = CounterFile::open(&dir.join("pids.events"));
                        cgroup.pids_max = Some(dir.join("pids.max"));
                    }
                    Controller::Memory => {
                        let events = set_memory(&dir, h.version, limits.memory_max)?;
                        cgroup.oom_events = CounterFile::open(&events);
                    }
                }
            }
        }
        cgroup.seen = cgroup.counters();
        Ok(cgroup)
    }
}

/// Where the server's own cgroup is in one mounted hierarchy.
#[derive(Debug, PartialEq)]
struct Place {
    /// The server's cgroup directory in that hierarchy.
    base: PathBuf,
    version: CgroupVersion,
    /// Controllers of a v1 hierarchy (its mount options).
    controllers: Vec<String>,
}

/// Join `/proc/self/cgroup` (`ID:CONTROLLERS:PATH`, `0::PATH` for v2) with
/// the cgroup mounts of `/proc/self/mountinfo` (`... ROOT MOUNTPOINT ... -
/// FSTYPE SOURCE OPTIONS`).
fn own_places(mountinfo: &str, own: &str) -> Vec<Place> {
    let mut places = Vec::new();
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let tail: Vec<&str> = after.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (fields.get(3), fields.get(4), tail.first())
        else {
            continue;
        };
        if point.contains('\\') {
            continue; // escaped characters: not a cgroup mount anyone makes
        }
        let (version, controllers): (CgroupVersion, Vec<String>) = match *fstype {
            "cgroup2" => (CgroupVersion::V2, Vec::new()),
            "cgroup" => (
                CgroupVersion::V1,
                tail.get(2)
                    .map(|o| o.split(',').map(str::to_string).collect())
                    .unwrap_or_default(),
            ),
            _ => continue,
        };
        let path = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            let matches = match version {
                CgroupVersion::V2 => names.is_empty(),
                CgroupVersion::V1 => {
                    !names.is_empty()
                        && names.split(',').all(|n| controllers.iter().any(|c| c == n))
                }
            };
            matches.then_some(path)
        });
        // The mount shows the hierarchy from `root` down; the server's
        // cgroup must lie beneath it.
        let Some(relative) = path.and_then(|p| {
            let rest = p.strip_prefix(root.trim_end_matches('/'))?;
            (rest.is_empty() || rest.starts_with('/')).then_some(rest)
        }) else {
            continue;
        };
        places.push(Place {
            base: Path::new(point).join(relative.trim_start_matches('/')),
            version,
            controllers,
        });
    }
    places
}

/// Let workers under `dir` have `controller`: a v2 directory must offer it
/// and pass it on to its children; a v1 one only needs its files.
fn enable(dir: &Path, version: CgroupVersion, controller: Controller) -> bool {
    if !dir.join("cgroup.procs").exists() {
        return false;
    }
    match version {
        CgroupVersion::V1 => true,
        CgroupVersion::V2 => {
            let name = controller.name();
            let offered = std::fs::read_to_string(dir.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == name));
            offered
                && std::fs::write(dir.join("cgroup.subtree_control"), format!("+{name}")).is_ok()
                && std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == name))
        }
    }
}

/// Cap memory (and swap, where the hierarchy accounts it) at `max`; returns
/// the file that counts OOM kills.
fn set_memory(dir: &Path, version: CgroupVersion, max: Option<u64>) -> std::io::Result<PathBuf> {
    let write_if_present = |file: &str, value: String| {
        let path = dir.join(file);
        if path.exists() {
            std::fs::write(path, value)
        } else {
            Ok(())
        }
    };
    match version {
        CgroupVersion::V2 => {
            if let Some(max) = max {
                std::fs::write(dir.join("memory.max"), max.to_string())?;
                // Memory pushed to swap would not count against memory.max.
                write_if_present("memory.swap.max", "0".into())?;
            }
            Ok(dir.join("memory.events"))
        }
        CgroupVersion::V1 => {
            if let Some(max) = max {
                std::fs::write(dir.join("memory.limit_in_bytes"), max.to_string())?;
                // Memory + swap: the same cap, so nothing escapes into swap.
                write_if_present("memory.memsw.limit_in_bytes", max.to_string())?;
            }
            Ok(dir.join("memory.oom_control"))
        }
    }
}

/// Events a worker's cgroups counted, as totals since they were made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitCounters {
    /// Forks refused at `pids.max` (`pids.events` `max`).
    pub pids_max: u64,
    /// Processes the OOM killer killed in the memory cgroup (`oom_kill`).
    pub oom_kill: u64,
}

/// What a worker's cgroups counted since the last look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitEvents {
    /// A fork or thread was refused because the pids cgroup was full.
    pub pids_max: bool,
    /// The OOM killer killed a process in the memory cgroup.
    pub oom_kill: bool,
}

/// One worker's cgroups; removed (once its processes are gone) on drop.
#[derive(Debug)]
pub struct WorkerCgroup {
    /// One directory per hierarchy; the launcher joins each.
    dirs: Vec<PathBuf>,
    /// `pids.events` (v1 and v2), with a pids cgroup.
    pids_events: Option<CounterFile>,
    /// `memory.events` (v2) or `memory.oom_control` (v1), with a memory cgroup.
    oom_events: Option<CounterFile>,
    /// The counters at the last look, to tell what is new.
    seen: LimitCounters,
    /// A run that went well has ended since the last look: the counters
    /// are read before the next run (see [`WorkerCgroup::defer`]).
    due: bool,
    /// `pids.max`, with a pids cgroup.
    pids_max: Option<PathBuf>,
    /// Tasks a run may have as configured (its main thread included).
    run_processes: u64,
    /// Tasks of the worker itself besides its run (launcher, worker and its
    /// threads), counted once it is ready.
    own_tasks: Option<u64>,
    /// `pids.max` as last written.
    tasks_now: u64,
}

impl WorkerCgroup {
    /// The directories to join.
    pub fn paths(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Count the worker's own tasks and cap the cgroup at those plus the
    /// configured `processes` of a run. Called when the worker is ready: the
    /// cgroup then holds the worker's tasks and the one child waiting for
    /// the first run, which becomes that run's main thread.
    pub fn calibrate(&mut self) -> std::io::Result<()> {
        let Some(file) = &self.pids_max else {
            return Ok(());
        };
        let current = std::fs::read_to_string(file.with_file_name("pids.current"))?;
        let current: u64 = current.trim().parse().map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "unreadable pids.current")
        })?;
        self.own_tasks = Some(current.saturating_sub(1));
        self.set_run_processes(None)
    }

    /// Let the next runs have `processes` tasks (never more than
    /// configured), or with `None` the configured number. Writes only when
    /// the value changes.
    pub fn set_run_processes(&mut self, processes: Option<u64>) -> std::io::Result<()> {
        let (Some(file), Some(own)) = (&self.pids_max, self.own_tasks) else {
            return Ok(());
        };
        let wanted = own + processes.map_or(self.run_processes, |p| p.min(self.run_processes));
        if wanted != self.tasks_now {
            std::fs::write(file, wanted.to_string())?;
            self.tasks_now = wanted;
        }
        Ok(())
    }

    /// The counters now (a missing file or line counts as zero).
    pub fn counters(&self) -> LimitCounters {
        let read = |file: &Option<CounterFile>, key: &str| {
            file.as_ref().and_then(|f| f.read(key)).unwrap_or(0)
        };
        LimitCounters {
            pids_max: read(&self.pids_events, "max"),
            oom_kill: read(&self.oom_events, "oom_kill"),
        }
    }

    /// What the counters added since the last call (or since the cgroups
    /// were made).
    pub fn take_events(&mut self) -> LimitEvents {
        let now = self.counters();
        let events = LimitEvents {
            pids_max: now.pids_max > self.seen.pids_max,
            oom_kill: now.oom_kill > self.seen.oom_kill,
        };
        self.seen = now;
        self.due = false;
        events
    }

    /// A run went well, so nothing it made the counters add is told: they
    /// may be read later ([`WorkerCgroup::settle`]), out of its answer's
    /// way, but always before the next run starts.
    pub fn defer(&mut self) {
        self.due = true;
    }

    /// Read the counters if a run left them unread, so that what it
    /// caused is never laid at the next run's door.
    pub fn settle(&mut self) {
        if self.due {
            self.take_events();
        }
    }
}

impl Drop for WorkerCgroup {
    fn drop(&mut self) {
        // Closed before the directories go.
        self.pids_events = None;
        self.oom_events = None;
        for dir in self.dirs.drain(..) {
            remove_when_empty(dir);
        }
    }
}

/// A flat-keyed cgroup file kept open: it is read after every run, and a
/// `pread` at offset 0 renders it anew without walking its path again.
#[derive(Debug)]
struct CounterFile(std::fs::File);

impl CounterFile {
    /// `None` where the file is missing or unreadable: its events then
    /// count as none.
    fn open(path: &Path) -> Option<CounterFile> {
        std::fs::File::open(path).ok().map(CounterFile)
    }

    /// The value of `key` now; `None` if the file cannot be read or lacks it.
    fn read(&self, key: &str) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        // These files hold a handful of short lines.
        let mut buf = [0u8; 1024];
        let n = self.0.read_at(&mut buf, 0).ok()?;
        counter(std::str::from_utf8(&buf[..n]).ok()?, key)
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `rmdir` a cgroup, retrying for a while: killed processes take a moment to
/// leave it.
fn remove_when_empty(dir: PathBuf) {
    if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
        return;
    }
    std::thread::spawn(move || {
        for _ in 0..250 {
            std::thread::sleep(Duration::from_millis(20));
            if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                return;
            }
        }
        tracing::warn!(cgroup = %dir.display(), "could not remove a worker cgroup");
    });
}

/// The process list of the cgroup at `dir`, opened for [`move_into`]; it can
/// be opened ahead, while the path is in sight.
pub(crate) fn procs_file(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))
}

/// Move process `pid` into the cgroup whose [`procs_file`] is `procs`: one
/// `write` of the pid (the kernel reads each `write` as one pid).
pub(crate) fn move_into(mut procs: &std::fs::File, pid: u32) -> std::io::Result<()> {
    use std::io::Write;
    procs.write_all(pid.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const HYBRID_OWN: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/api/abc
2:cpu,cpuacct:/
0::/
";

    #[test]
    fn hybrid_hierarchies_are_found_where_the_server_is() {
        let places = own_places(HYBRID_MOUNTS, HYBRID_OWN);
        let base = |p: &str| places.iter().find(|x| x.base == Path::new(p));
        assert_eq!(
            base("/sys/fs/cgroup/memory/api/abc").unwrap().version,
            CgroupVersion::V1
        );
        assert!(base("/sys/fs/cgroup/pids").is_some());
        assert!(base("/sys/fs/cgroup/cpu,cpuacct").is_some());
        assert_eq!(
            base("/sys/fs/cgroup/unified").unwrap().version,
            CgroupVersion::V2
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_joined_below_its_root() {
        let mounts = "50 1 0:40 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let own = "0::/kubepods/pod1/ctr\n";
        let places = own_places(mounts, own);
        assert_eq!(places[0].base, Path::new("/sys/fs/cgroup/ctr"));
        // A cgroup outside the mounted subtree cannot be reached through it.
        assert!(own_places(mounts, "0::/elsewhere\n").is_empty());
    }

    #[test]
    fn a_counter_file_is_read_anew_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pids.events");
        std::fs::write(&path, "max 0\n").unwrap();
        let file = CounterFile::open(&path).expect("the file opens");
        assert!(CounterFile::open(&dir.path().join("missing")).is_none());
        assert_eq!(file.read("max"), Some(0));
        std::fs::write(&path, "max 17\n").unwrap();
        assert_eq!(file.read("max"), Some(17));
        assert_eq!(file.read("oom_kill"), None);
    }

    #[test]
    fn counters_are_read_by_key() {
        assert_eq!(
            counter("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(counter("max 12\n", "max"), Some(12));
        assert_eq!(
            counter("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n", "max"),
            Some(4)
        );
        assert_eq!(counter("", "max"), None);
    }
}

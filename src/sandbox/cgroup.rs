//! A pids cgroup per worker: caps the processes and threads a run can make
//! (`RLIMIT_NPROC` counts per user and does not bind root). Detected, never
//! assumed: the v2 hierarchy when it offers the `pids` controller, else the
//! v1 `pids` hierarchy. The server makes one directory under its own cgroup
//! and one child per worker; the launcher moves itself into the worker's.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which hierarchy holds the pids controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The server's own directory of worker cgroups; removed on drop.
#[derive(Debug)]
pub struct CgroupRoot {
    dir: PathBuf,
    pub version: CgroupVersion,
}

impl CgroupRoot {
    /// Make the server's directory in a writable pids hierarchy, if any.
    pub fn create() -> Option<CgroupRoot> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let name = format!("code-executor-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let candidates = own.lines().filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let path = path.trim_start_matches('/');
            if controllers.is_empty() {
                let offered = std::fs::read_to_string(v2).ok()?;
                offered
                    .split_whitespace()
                    .any(|c| c == "pids")
                    .then(|| (Path::new("/sys/fs/cgroup").join(path), CgroupVersion::V2))
            } else if controllers.split(',').any(|c| c == "pids") {
                Some((
                    Path::new("/sys/fs/cgroup/pids").join(path),
                    CgroupVersion::V1,
                ))
            } else {
                None
            }
        });
        let mut found: Vec<_> = candidates.collect();
        // Prefer v2 when it has the controller.
        found.sort_by_key(|(_, v)| *v == CgroupVersion::V1);
        for (parent, version) in found {
            let dir = parent.join(&name);
            if std::fs::create_dir(&dir).is_ok() || dir.is_dir() {
                if version == CgroupVersion::V2 {
                    // Children need the controller enabled here.
                    let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+pids");
                }
                if dir.join("cgroup.procs").exists() {
                    return Some(CgroupRoot { dir, version });
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
        None
    }

    /// A cgroup for one worker, capped at `pids_max` tasks.
    pub fn worker(&self, name: &str, pids_max: u64) -> std::io::Result<WorkerCgroup> {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir)?;
        let cgroup = WorkerCgroup { dir };
        std::fs::write(cgroup.dir.join("pids.max"), pids_max.to_string())?;
        Ok(cgroup)
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        remove_when_empty(self.dir.clone());
    }
}

/// One worker's cgroup; removed (once its processes are gone) on drop.
#[derive(Debug)]
pub struct WorkerCgroup {
    dir: PathBuf,
}

impl WorkerCgroup {
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for WorkerCgroup {
    fn drop(&mut self) {
        remove_when_empty(self.dir.clone());
    }
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

/// Join the cgroup at `dir` (called by the launcher on itself).
pub fn join(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
}

//! Signalling a worker's process tree. Workers lead their own process group;
//! each run they fork leads another one, so killing a worker means killing
//! its group and the groups of its direct children.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Send `signal` to the process group led by `pid`.
pub(super) fn signal_group(pid: u32, signal: Signal) {
    if pid > 0 {
        let _ = killpg(Pid::from_raw(pid as i32), signal);
    }
}

/// SIGKILL the worker's group and the group of every child it has forked
/// (its current run and the child it keeps ready), read from
/// `/proc/<pid>/task/*/children` before the worker itself is killed.
pub(crate) fn kill_process_tree(pid: u32) {
    if pid == 0 {
        return;
    }
    let children = children_of(pid);
    signal_group(pid, Signal::SIGKILL);
    for child in children {
        signal_group(child, Signal::SIGKILL);
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

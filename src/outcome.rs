//! How a run ended, computed once from the worker's report: which limit
//! stopped it, the signal that killed it and the errno it failed with.
//!
//! Every reader takes it from here: `ExecResult.limit`, the verdicts of
//! `/grade`, the `outcome` label of the metrics and the MCP status line.

use std::str::FromStr;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::worker::RunOutput;

/// A limit that stopped a run.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The wall-clock timeout.
    Timeout,
    /// The CPU-time limit (`SIGXCPU`).
    Cpu,
    /// The memory limit: an allocation failed, or the kernel killed the run
    /// at its cgroup's cap.
    Memory,
    /// The cap on processes and threads.
    Processes,
    /// The largest file a run may write (`SIGXFSZ`, `EFBIG`).
    FileSize,
    /// The scratch quota (`ENOSPC`, or `limits.disk_bytes`).
    Disk,
    /// A stream cut at the output cap.
    Output,
    /// A cap of the egress proxy (connections or bytes per run) refused or
    /// cut a connection of a run that then failed.
    Network,
}

impl Limit {
    /// The name the API and the metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Timeout => "timeout",
            Limit::Cpu => "cpu",
            Limit::Memory => "memory",
            Limit::Processes => "processes",
            Limit::FileSize => "file_size",
            Limit::Disk => "disk",
            Limit::Output => "output",
            Limit::Network => "network",
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A peak resident set at least this fraction of the memory limit makes a
/// run killed by a crash signal a memory failure: the address space holds
/// more than the resident pages, so a run at its limit never shows an RSS
/// equal to it.
const NEAR_LIMIT: f64 = 0.5;

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The limit that stopped the run, if one did.
    pub limit: Option<Limit>,
    /// The signal that killed the run's process, if one did.
    pub signal: Option<Signal>,
    /// The errno of the exception that ended the run, as the worker reported it.
    pub errno: Option<Errno>,
    /// The run failed: non-zero exit, uncaught exception or a signal.
    pub failed: bool,
}

impl Outcome {
    /// Classify a run from its report and the memory limit it ran under
    /// (`limits.memory_bytes` as applied). In this order:
    ///
    /// 1. The wall clock: [`Limit::Timeout`], unless the pids cgroup refused
    ///    a fork or a thread during the run. Then [`Limit::Processes`]: a
    ///    fork bomb that catches its errors and retries until the deadline is
    ///    stopped by the timeout, but what to fix is the number of processes.
    /// 2. The run went past its `limits.disk_bytes` (the worker killed it,
    ///    or it ended over it): [`Limit::Disk`]. A resource signal:
    ///    `SIGXCPU` is [`Limit::Cpu`], `SIGXFSZ` [`Limit::FileSize`].
    /// 3. An OOM kill in the worker's memory cgroup: [`Limit::Memory`].
    /// 4. The errno of the exception that ended the run: `ENOMEM`
    ///    (`MemoryError` and its subclasses), `EFBIG`, `ENOSPC` (the scratch
    ///    tmpfs or `/dev/shm`), `EAGAIN` (a fork or thread refused).
    /// 5. No exception was reported (reporting it failed, or a child process
    ///    printed it) but stderr ends with `MemoryError`; or a crash signal
    ///    (`SIGKILL`, `SIGSEGV`, `SIGABRT`, `SIGBUS`: C code that does not
    ///    check its allocations) with a peak resident set near the limit.
    /// 6. Any other failure while the pids cgroup refused a fork:
    ///    [`Limit::Processes`].
    /// 7. A run that failed after an egress cap refused or cut one of its
    ///    connections: [`Limit::Network`].
    /// 8. A stream cut at the output cap: [`Limit::Output`].
    pub fn of(out: &RunOutput, memory_limit: Option<u64>) -> Outcome {
        // A signal nix has no name for (a real-time one) is no limit's.
        let signal = out
            .signal
            .as_deref()
            .and_then(|name| Signal::from_str(name).ok());
        let errno = out
            .error
            .as_ref()
            .and_then(|e| e.errno)
            .map(Errno::from_raw);
        let failed = out.exit_code != 0 || out.error.is_some() || out.signal.is_some();
        let limit = classify(out, signal, errno, memory_limit);
        Outcome {
            limit,
            signal,
            errno,
            failed,
        }
    }
}

fn classify(
    out: &RunOutput,
    signal: Option<Signal>,
    errno: Option<Errno>,
    memory_limit: Option<u64>,
) -> Option<Limit> {
    if out.timed_out {
        return Some(if out.cgroup.pids_max {
            Limit::Processes
        } else {
            Limit::Timeout
        });
    }
    if out.disk_exceeded {
        return Some(Limit::Disk);
    }
    match signal {
        Some(Signal::SIGXCPU) => return Some(Limit::Cpu),
        Some(Signal::SIGXFSZ) => return Some(Limit::FileSize),
        _ => {}
    }
    if out.cgroup.oom_kill {
        return Some(Limit::Memory);
    }
    match errno {
        Some(Errno::ENOMEM) => return Some(Limit::Memory),
        Some(Errno::EFBIG) => return Some(Limit::FileSize),
        Some(Errno::ENOSPC | Errno::EDQUOT) => return Some(Limit::Disk),
        Some(Errno::EAGAIN) => return Some(Limit::Processes),
        _ => {}
    }
    let unreported_memory_error = out.error.is_none()
        && out.exit_code != 0
        && String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.starts_with("MemoryError"));
    let near_limit = match (memory_limit, out.peak_rss_kb) {
        (Some(limit), Some(rss)) => (rss as f64) * 1024.0 >= limit as f64 * NEAR_LIMIT,
        _ => false,
    };
    let crash = matches!(
        signal,
        Some(Signal::SIGKILL | Signal::SIGSEGV | Signal::SIGABRT | Signal::SIGBUS)
    );
    if unreported_memory_error || (crash && near_limit) {
        return Some(Limit::Memory);
    }
    if out.cgroup.pids_max {
        return Some(Limit::Processes);
    }
    let failed = out.exit_code != 0 || out.error.is_some();
    if failed && out.network.as_ref().is_some_and(|n| n.capped) {
        return Some(Limit::Network);
    }
    if out.stdout_truncated || out.stderr_truncated {
        return Some(Limit::Output);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::WireError;
    use crate::sandbox::cgroup::LimitEvents;

    fn failed(exit_code: i32, signal: Option<&str>, cgroup: LimitEvents) -> RunOutput {
        RunOutput {
            exit_code,
            signal: signal.map(str::to_string),
            duration_ms: 1.0,
            cgroup,
            ..RunOutput::default()
        }
    }

    fn raised(kind: &str, errno: Option<Errno>) -> RunOutput {
        RunOutput {
            exit_code: 1,
            error: Some(WireError {
                kind: kind.into(),
                message: "any text at all".into(),
                traceback: String::new(),
                line: None,
                errno: errno.map(|e| e as i32),
            }),
            ..RunOutput::default()
        }
    }

    const PIDS_MAX: LimitEvents = LimitEvents {
        pids_max: true,
        oom_kill: false,
    };
    const OOM_KILL: LimitEvents = LimitEvents {
        pids_max: false,
        oom_kill: true,
    };

    fn limit(out: &RunOutput) -> Option<Limit> {
        Outcome::of(out, Some(1 << 30)).limit
    }

    #[test]
    fn a_timeout_at_the_pids_cap_is_a_process_limit() {
        let mut out = failed(-9, Some("SIGKILL"), LimitEvents::default());
        out.timed_out = true;
        assert_eq!(limit(&out), Some(Limit::Timeout));
        out.cgroup = PIDS_MAX;
        assert_eq!(limit(&out), Some(Limit::Processes));
        // An OOM kill of some process does not explain a run that was still
        // running at its deadline.
        out.cgroup = OOM_KILL;
        assert_eq!(limit(&out), Some(Limit::Timeout));
    }

    #[test]
    fn an_oom_kill_is_a_memory_limit() {
        let out = failed(-9, Some("SIGKILL"), LimitEvents::default());
        assert_eq!(limit(&out), None);
        let out = failed(-9, Some("SIGKILL"), OOM_KILL);
        assert_eq!(limit(&out), Some(Limit::Memory));
        // A kernel resource signal names its own limit.
        let out = failed(-24, Some("SIGXCPU"), OOM_KILL);
        assert_eq!(limit(&out), Some(Limit::Cpu));
    }

    #[test]
    fn a_failure_at_the_pids_cap_is_a_process_limit() {
        let out = failed(1, None, PIDS_MAX);
        assert_eq!(limit(&out), Some(Limit::Processes));
        let mut out = failed(1, None, LimitEvents::default());
        assert_eq!(limit(&out), None);
        out.stdout_truncated = true;
        assert_eq!(limit(&out), Some(Limit::Output));
    }

    #[test]
    fn the_errno_names_the_limit_whatever_the_message() {
        assert_eq!(
            limit(&raised("MemoryError", Some(Errno::ENOMEM))),
            Some(Limit::Memory)
        );
        assert_eq!(
            limit(&raised(
                "numpy.core._exceptions._ArrayMemoryError",
                Some(Errno::ENOMEM)
            )),
            Some(Limit::Memory)
        );
        assert_eq!(
            limit(&raised("OSError", Some(Errno::EFBIG))),
            Some(Limit::FileSize)
        );
        assert_eq!(
            limit(&raised("OSError", Some(Errno::ENOSPC))),
            Some(Limit::Disk)
        );
        assert_eq!(
            limit(&raised("BlockingIOError", Some(Errno::EAGAIN))),
            Some(Limit::Processes)
        );
        // A message that merely reads like a limit is not one.
        assert_eq!(limit(&raised("OSError", Some(Errno::ENOENT))), None);
        assert_eq!(limit(&raised("ValueError", None)), None);
    }

    #[test]
    fn a_crash_near_the_memory_limit_is_a_memory_limit() {
        let mut out = failed(-11, Some("SIGSEGV"), LimitEvents::default());
        out.peak_rss_kb = Some(900 << 10);
        assert_eq!(limit(&out), Some(Limit::Memory));
        out.peak_rss_kb = Some(100 << 10);
        assert_eq!(limit(&out), None);
        let outcome = Outcome::of(&out, Some(1 << 30));
        assert_eq!(outcome.signal, Some(Signal::SIGSEGV));
        assert!(outcome.failed);
    }
}

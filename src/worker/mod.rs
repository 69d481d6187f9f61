//! One long-lived Python worker process (`python/worker.py`) and the pipes to it.
//!
//! A [`Worker`] is spawned with its own process group, handshakes (`ready`),
//! then runs one request at a time. Anything that goes wrong mid-request
//! leaves it poisoned: the pool never hands it out again.

mod channel;
mod code_cache;
mod direct;
mod process;

pub(crate) use code_cache::CodeCache;
pub(crate) use code_cache::{default_dir as default_cache_dir, prepare_dir as prepare_cache_dir};

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

use crate::error::WorkerError;
use crate::protocol::{self, PROTOCOL_VERSION};
use crate::sandbox::cgroup::{LimitEvents, WorkerCgroup, WorkerLimits};

pub(crate) use process::kill_process_tree;

/// Bytes of a worker's stderr kept to explain a failed start.
const STDERR_TAIL_BYTES: usize = 4096;

/// Runs and session calls in flight in this process, on every worker.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// One run or session call counted in [`RUNNING`] while it lives.
struct Running;

impl Running {
    fn enter() -> Running {
        RUNNING.fetch_add(1, Ordering::Relaxed);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether the run or call asking is the only one in flight in this
/// process: nothing else of the server's wants a CPU for a run.
fn running_alone() -> bool {
    RUNNING.load(Ordering::Relaxed) <= 1
}
/// Tasks a starting worker may have besides a run's: the launcher, the
/// interpreter, the threads its preloads start and its first child. Its
/// cgroup is narrowed to what it really has once it is ready.
const STARTUP_TASKS: u64 = 1024;

/// What the interpreter runs (`python -I -B -u -c LAUNCH worker.py CODE
/// SCRATCH PRELOAD`): the bootstrap's code executed as `__main__`, read from
/// `CODE` (see [`CodeCache`]) when that holds code of this interpreter's
/// bytecode magic (its code objects then take this start's `worker.py` path,
/// which tracebacks show and the bootstrap tells its own frames by), else
/// compiled from `worker.py` and then also left in
/// `__bootstrap_code__` for the `ready` frame to carry to the server. Run as
/// a script instead, its whole syntax tree (~3.5 MB of heap) would stay
/// alive for as long as its top level runs, that is the worker's life, and
/// every fork would copy the page tables that map it and every exit tear
/// them down. Compiled here, that memory is free once `compile` returns, and
/// the bootstrap hands it back to the OS before it forks (see `main` in
/// `python/worker.py`).
///
/// With `CODE_EXECUTOR_CGROUP_FD` set (the launcher's `--join-async`), it
/// leaves that pipe in `__cgroup_barrier__` (and the variable out of the
/// environment): the bootstrap waits there for the launcher's word that it
/// is in its cgroups, a join that runs while the interpreter starts and
/// waits out an RCU grace period, before it imports a preload or forks
/// anything (see `join_cgroups` in `python/worker.py`). Every run and every
/// process a run starts is then in them; the memory taken meanwhile stays
/// charged where the server's is.
pub(crate) const LAUNCH: &str = "\
import io, marshal, os, sys
__cgroup_barrier__ = os.environ.pop('CODE_EXECUTOR_CGROUP_FD', None)
from _frozen_importlib_external import MAGIC_NUMBER as m
p = sys.argv.pop(1); k = sys.argv.pop(1); sys.argv[0] = __file__ = p; c = None
try:
    with io.open_code(k) as f:
        b = f.read()
    if b[:4] == m:
        c = marshal.loads(memoryview(b)[4:])
        if c.co_filename != p:
            def r(o):
                return o.replace(co_filename=p, co_consts=tuple(
                    r(x) if type(x) is type(o) else x for x in o.co_consts))
            c = r(c)
            del r
    del b
except Exception:
    c = None
if c is None:
    with io.open_code(p) as f:
        c = compile(f.read(), p, 'exec')
    __bootstrap_code__ = m + marshal.dumps(c)
del k, m
exec(c)
";

/// A worker's egress proxy settings.
#[derive(Debug, Clone)]
pub struct EgressSpec {
    /// What the environment's proxies share.
    pub(crate) ctx: Arc<crate::egress::ProxyContext>,
    /// The environment's allow-list.
    pub(crate) policy: Arc<crate::egress::Policy>,
}

/// How a worker process is started: everything but the per-run request.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Interpreter to run (`<prefix>/bin/python`).
    pub python: PathBuf,
    /// The bootstrap script file.
    pub script: PathBuf,
    /// Directory under which each worker gets its own scratch root.
    pub scratch_parent: PathBuf,
    /// The complete environment of the worker (nothing is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Modules imported before `ready`.
    pub preload: Vec<String>,
    /// Bound on spawn + handshake.
    pub start_timeout: Duration,
    /// Between the termination steps (close stdin, SIGTERM, SIGKILL).
    pub grace_period: Duration,
    /// Start the interpreter through the sandbox launcher; `None`: directly.
    pub sandbox: Option<crate::sandbox::SandboxPlan>,
    /// Owner (uid, gid) given the scratch root when workers run as another user.
    pub owner: Option<(u32, u32)>,
    /// The environment's egress proxy and the allow-list its runs start
    /// with, when it has `allowed_hosts`: each worker gets a listener in its
    /// network namespace.
    pub egress: Option<EgressSpec>,
    /// Tasks (processes and threads) one run may have, its main thread
    /// included; the worker's pids cgroup allows these plus the worker's own.
    pub run_processes: u64,
    /// Bytes the worker's memory cgroup allows: one run's memory limit plus
    /// the worker's own; `None`: no cap.
    pub memory_max: Option<u64>,
    /// Where the bootstrap's compiled code is read and kept; `None`: every
    /// worker compiles it.
    pub code_cache: Option<CodeCache>,
}

/// What the worker reported in its `ready` frame.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    pub pid: u32,
    pub python_version: String,
    pub executable: String,
}

/// The outcome of one run, as the worker reported it.
#[derive(Debug, Default)]
pub struct RunOutput {
    /// Standard output, capped at the exec frame's `max_output`.
    pub stdout: Vec<u8>,
    /// Standard error, capped alike.
    pub stderr: Vec<u8>,
    /// Exit status; `-N` when killed by signal N.
    pub exit_code: i32,
    /// Name of the signal that ended the run (`"SIGKILL"`), if one did.
    pub signal: Option<String>,
    /// Killed at the run's wall-clock timeout.
    pub timed_out: bool,
    /// stdout was cut at the cap.
    pub stdout_truncated: bool,
    /// stderr was cut at the cap.
    pub stderr_truncated: bool,
    /// Wall time of the run inside the worker.
    pub duration_ms: f64,
    /// Repr of the last expression statement, if any.
    pub result: Option<String>,
    /// The uncaught exception, if any.
    pub error: Option<protocol::WireError>,
    /// Files the run created or changed.
    pub artifacts: Vec<protocol::WireArtifact>,
    /// There were more than `artifacts` lists (see `protocol::WorkerFrame`).
    pub artifacts_cut: bool,
    /// CPU time (user + system) of the run's process: measured by the run
    /// before it reported (when it did), or from reaping it when the exec
    /// frame asked for `rusage`.
    pub cpu_ms: Option<f64>,
    /// Peak resident set of the run's process in KiB (as `cpu_ms`).
    pub peak_rss_kb: Option<u64>,
    /// What the run did through the egress proxy (environments with
    /// `allowed_hosts`).
    pub network: Option<crate::api::NetworkUsage>,
    /// Session mode: why the session child is gone after this run.
    pub session_lost: Option<String>,
    /// Session mode: the call's input files could not be written, and its
    /// code did not run.
    pub refused: Option<protocol::WireRefusal>,
    /// The run went over its `limits.disk_bytes`: killed, or ended over it.
    pub disk_exceeded: bool,
    /// The JSON of the value its `call` returned (grading's function mode).
    pub returned: Option<String>,
    /// That JSON's size, when it was over `max_artifact_bytes` and left out.
    pub returned_size: Option<u64>,
    /// What the worker's cgroups counted during a run that failed or timed
    /// out (not looked at after a run that succeeded).
    pub cgroup: LimitEvents,
}

/// Which stream a chunk of streamed output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A chunk of output sent while the run is going (streaming requests only).
#[derive(Debug)]
pub struct OutputChunk {
    /// Which stream.
    pub stream: OutputStream,
    /// The bytes, as written.
    pub data: Vec<u8>,
}

/// Where a streaming request's output chunks go.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<OutputChunk>;

/// The worker's frames, read off its stdout.
type Frames = FramedRead<ChildStdout, tokio_util::codec::LengthDelimitedCodec>;

/// A running worker process.
pub struct Worker {
    info: WorkerInfo,
    child: Child,
    /// Requests go here (the worker's stdin, one end of a Unix socket pair,
    /// over which the worker also hands over a direct session's pipes);
    /// dropping it tells the worker to exit.
    stdin: Option<channel::Channel>,
    /// Frames from the worker, with the protocol's maximum frame size.
    frames: Frames,
    /// The worker's private scratch root; removed when the worker is dropped.
    scratch: Option<tempfile::TempDir>,
    /// The worker's pids and memory cgroups (cap a run's processes, threads
    /// and memory, and count when they did); removed once the worker's
    /// processes are gone.
    cgroup: Option<WorkerCgroup>,
    /// Set while a request is in flight; still set after a dropped or failed
    /// request, which makes the worker unusable (poisoned).
    in_flight: bool,
    /// Set once the request in flight was written whole: a dropped request
    /// can then be cancelled (see [`Worker::cancel`]).
    sent: bool,
    runs: u64,
    terminated: bool,
    /// The worker's egress proxy (environments with `allowed_hosts`).
    proxy: Option<Arc<crate::egress::WorkerProxy>>,
    /// In session mode, the session child's pipes: its calls are written to
    /// it and answered by it directly (see [`Worker::attach_session`]).
    session: Option<direct::DirectSession>,
    /// The last run's answer said `cleaning`: the worker clears what it
    /// left and reads no request before its `cleaned` frame (see
    /// [`Worker::await_cleaned`]).
    cleaning: bool,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("pid", &self.info.pid)
            .field("runs", &self.runs)
            .field("poisoned", &self.in_flight)
            .finish()
    }
}

impl Worker {
    /// Spawn a worker and wait for its `ready` frame. `exited` receives the
    /// worker's pid when its process ends, whatever the reason.
    pub async fn create(
        spec: &WorkerSpec,
        exited: Option<mpsc::UnboundedSender<u32>>,
    ) -> Result<Worker, WorkerError> {
        let scratch = tempfile::Builder::new()
            .prefix("worker-")
            .tempdir_in(&spec.scratch_parent)
            .map_err(WorkerError::Io)?;
        if let Some((uid, gid)) = spec.owner {
            nix::unistd::chown(scratch.path(), Some(uid.into()), Some(gid.into()))
                .map_err(|e| WorkerError::Io(e.into()))?;
        }
        let args: Vec<OsString> = vec![
            "-I".into(),
            // No bytecode written, which `-I` keeps PYTHONDONTWRITEBYTECODE
            // from saying: not into the environment, nor a run's modules'
            // into its directory (their `__pycache__` as artifacts).
            "-B".into(),
            "-u".into(),
            "-c".into(),
            LAUNCH.into(),
            spec.script.clone().into(),
            spec.code_cache
                .as_ref()
                .map(|c| c.staged.clone().into_os_string())
                .unwrap_or_default(),
            scratch.path().into(),
            spec.preload.join(",").into(),
        ];
        // The worker's stdin is a socket, not a pipe: the one channel that
        // can also carry descriptors from the worker (a direct session's).
        let (channel, theirs) = std::os::unix::net::UnixStream::pair().map_err(WorkerError::Io)?;
        channel.set_nonblocking(true).map_err(WorkerError::Io)?;
        let channel = channel::Channel::new(channel).map_err(WorkerError::Io)?;
        let mut cgroup = None;
        let mut cmd = match &spec.sandbox {
            Some(plan) => {
                if let Some(root) = &plan.cgroups {
                    let name = scratch.path().file_name().unwrap_or_default();
                    let limits = WorkerLimits {
                        // Room for a preload's threads until `calibrate`.
                        pids_max: spec.run_processes + STARTUP_TASKS,
                        run_processes: spec.run_processes,
                        memory_max: spec.memory_max,
                    };
                    cgroup = Some(
                        root.worker(&name.to_string_lossy(), &limits)
                            .map_err(WorkerError::Io)?,
                    );
                }
                let mut cmd = Command::new(&plan.launcher);
                cmd.args(plan.command(
                    &spec.python,
                    &args,
                    scratch.path(),
                    cgroup.as_ref().map_or(&[], |c| c.paths()),
                ));
                cmd
            }
            None => {
                let mut cmd = Command::new(&spec.python);
                cmd.args(&args);
                cmd
            }
        };
        cmd.env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("HOME", scratch.path())
            .env("TMPDIR", scratch.path())
            .current_dir(scratch.path())
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let spawned = cmd.spawn();
        // The worker's end of the socket is the worker's alone from here.
        drop(cmd);
        let mut child = spawned.map_err(|source| WorkerError::Spawn {
            python: spec.python.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let stdin = Some(channel);
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let tail = Arc::new(Mutex::new(String::new()));
        let drained = tokio::spawn(drain_stderr(stderr, pid, tail.clone(), exited));

        let mut worker = Worker {
            info: WorkerInfo {
                pid,
                python_version: String::new(),
                executable: String::new(),
            },
            child,
            stdin,
            frames: FramedRead::new(stdout, protocol::codec()),
            scratch: Some(scratch),
            cgroup,
            in_flight: false,
            sent: false,
            runs: 0,
            terminated: false,
            proxy: None,
            session: None,
            cleaning: false,
        };
        let handshake = tokio::time::timeout(spec.start_timeout, worker.frames.next()).await;
        let failure = match handshake {
            Err(_) => WorkerError::StartTimeout(spec.start_timeout),
            Ok(Some(Ok(body))) => match protocol::decode_frame(&body) {
                Ok(frame) if frame.t == "ready" => {
                    let found = frame.protocol.unwrap_or(0);
                    if found != PROTOCOL_VERSION {
                        WorkerError::Version {
                            python: spec.python.clone(),
                            found,
                            expected: PROTOCOL_VERSION,
                        }
                    } else {
                        worker.info.python_version = frame.python.unwrap_or_default();
                        worker.info.executable = frame.executable.unwrap_or_default();
                        if let (Some(cache), Some(code)) = (&spec.code_cache, frame.code) {
                            // Off the start's path: the worker is ready now.
                            let cache = cache.clone();
                            tokio::task::spawn_blocking(move || cache.store(&code));
                        }
                        if let Some(cgroup) = &mut worker.cgroup
                            && let Err(e) = cgroup.calibrate()
                        {
                            worker.kill();
                            return Err(WorkerError::Io(e));
                        }
                        if let Some(egress) = &spec.egress {
                            // The launcher (the child) made the namespace.
                            let started =
                                crate::egress::listen_in_namespace_of(pid).and_then(|listener| {
                                    crate::egress::WorkerProxy::start(
                                        listener,
                                        egress.ctx.clone(),
                                        egress.policy.clone(),
                                    )
                                });
                            match started {
                                Ok(proxy) => worker.proxy = Some(proxy),
                                Err(e) => {
                                    worker.kill();
                                    return Err(WorkerError::Egress(e));
                                }
                            }
                        }
                        tracing::debug!(
                            pid,
                            python = %worker.info.python_version,
                            "worker ready"
                        );
                        return Ok(worker);
                    }
                }
                Ok(frame) if frame.t == "error" => {
                    if let Some(traceback) = frame.traceback.as_deref().filter(|t| !t.is_empty()) {
                        tracing::debug!(python = %spec.python.display(), "worker start failed:\n{traceback}");
                    }
                    WorkerError::Startup {
                        python: spec.python.clone(),
                        detail: frame.message.unwrap_or_default(),
                    }
                }
                Ok(frame) => WorkerError::Startup {
                    python: spec.python.clone(),
                    detail: format!("expected a ready frame, got {:?}", frame.t),
                },
                Err(e) => WorkerError::Protocol(e),
            },
            Ok(Some(Err(e))) => WorkerError::Startup {
                python: spec.python.clone(),
                detail: format!("unreadable handshake: {e}"),
            },
            Ok(None) => {
                // The process ended before its handshake: its stderr says why.
                let _ = tokio::time::timeout(Duration::from_secs(2), drained).await;
                let status = worker.child.try_wait().ok().flatten();
                let text = tail.lock().trim().to_string();
                WorkerError::Startup {
                    python: spec.python.clone(),
                    detail: match (text.is_empty(), status) {
                        (false, _) => text,
                        (true, Some(s)) => format!("exited with {s} before its handshake"),
                        (true, None) => "closed its pipes before its handshake".into(),
                    },
                }
            }
        };
        worker.kill();
        Err(failure)
    }

    /// Pid, Python version and executable, from the handshake.
    pub fn info(&self) -> &WorkerInfo {
        &self.info
    }

    /// Set the allow-list of the runs from now on (a request's own, or a
    /// session's); without a proxy there is nothing to set.
    pub(crate) fn set_egress_policy(&self, policy: Arc<crate::egress::Policy>) {
        if let Some(proxy) = &self.proxy {
            proxy.set_policy(policy);
        }
    }

    /// The worker process's pid.
    pub fn pid(&self) -> u32 {
        self.info.pid
    }

    /// Runs completed by this worker.
    pub fn runs(&self) -> u64 {
        self.runs
    }

    /// A request failed or was abandoned mid-way: never reuse this worker.
    pub fn is_poisoned(&self) -> bool {
        self.in_flight || self.terminated
    }

    /// Whether the process is still running (reaps it if it is not).
    pub fn is_alive(&mut self) -> bool {
        !self.terminated && matches!(self.child.try_wait(), Ok(None))
    }

    /// Let the worker's next runs have `processes` tasks in its pids cgroup
    /// (never more than configured); `None` returns to the configured
    /// number. Without a pids cgroup this does nothing (the run's
    /// `RLIMIT_NPROC` still applies).
    pub fn set_run_processes(&mut self, processes: Option<u64>) -> std::io::Result<()> {
        match &mut self.cgroup {
            Some(cgroup) => cgroup.set_run_processes(processes),
            None => Ok(()),
        }
    }

    /// Send one pre-encoded `exec` frame (see [`encode_exec`]) and wait for its
    /// result, at most `deadline`. Any failure poisons the worker; so does
    /// dropping the returned future before it completes, and in that case
    /// the worker's process tree is killed at once.
    pub async fn execute(
        &mut self,
        frame: &[u8],
        deadline: Duration,
        output: Option<&OutputSink>,
    ) -> Result<RunOutput, WorkerError> {
        self.run(frame, deadline, output, true).await
    }

    /// [`Worker::execute`], except that dropping the future leaves the
    /// worker poisoned but running: its owner then [cancels](Worker::cancel)
    /// the run or kills the worker.
    pub async fn execute_cancellable(
        &mut self,
        frame: &[u8],
        deadline: Duration,
        output: Option<&OutputSink>,
    ) -> Result<RunOutput, WorkerError> {
        self.run(frame, deadline, output, false).await
    }

    async fn run(
        &mut self,
        frame: &[u8],
        deadline: Duration,
        output: Option<&OutputSink>,
        kill_on_drop: bool,
    ) -> Result<RunOutput, WorkerError> {
        if self.is_poisoned() {
            return Err(WorkerError::Poisoned);
        }
        if self.cleaning {
            self.await_cleaned(deadline).await?;
        }
        self.settle();
        self.in_flight = true;
        self.sent = false;
        let _running = Running::enter();
        let guard = KillOnDrop {
            pid: self.info.pid,
            armed: kill_on_drop,
        };
        if let Some(proxy) = &self.proxy {
            proxy.begin();
        }
        let mut result = if self.session.is_some() {
            self.direct_call(frame, deadline, output).await
        } else {
            self.round_trip(frame, deadline, output).await
        };
        guard.disarm();
        let network = self.proxy.as_ref().and_then(|p| p.end());
        if let Ok(out) = &mut result {
            out.network = network;
            self.finish_run();
            // Only a run that failed can have been stopped by a cgroup: its
            // counters are read now. After one that went well they are
            // read before the next run, or sooner (see [`Worker::settle`]).
            if let Some(cgroup) = &mut self.cgroup {
                let failed = out.timed_out
                    || out.exit_code != 0
                    || out.signal.is_some()
                    || out.error.is_some();
                if failed {
                    out.cgroup = cgroup.take_events();
                } else {
                    cgroup.defer();
                }
            }
        }
        result
    }

    /// Whether the worker is still clearing what its last run left (see
    /// [`Worker::await_cleaned`]).
    pub fn is_cleaning(&self) -> bool {
        self.cleaning
    }

    /// Wait, at most `within`, for the `cleaned` frame that ends the heavy
    /// clean-up the last run's answer announced (`cleaning`); at once when
    /// it announced none. A clean-up that left something gives
    /// [`WorkerError::Retired`]; on any error the worker is to be replaced.
    pub async fn await_cleaned(&mut self, within: Duration) -> Result<(), WorkerError> {
        if !self.cleaning {
            return Ok(());
        }
        let body = match tokio::time::timeout(within, self.frames.next()).await {
            Err(_) => return Err(WorkerError::Unresponsive(within)),
            Ok(None) => return Err(self.died()),
            Ok(Some(Err(e))) => return Err(WorkerError::Protocol(protocol::FrameError::Read(e))),
            Ok(Some(Ok(body))) => body,
        };
        let frame = protocol::decode_frame(&body).map_err(WorkerError::Protocol)?;
        match frame.t.as_str() {
            "cleaned" if frame.retire => {
                Err(WorkerError::Retired(frame.message.unwrap_or_default()))
            }
            "cleaned" => {
                self.cleaning = false;
                Ok(())
            }
            other => Err(WorkerError::Protocol(protocol::FrameError::UnexpectedType(
                other.to_string(),
            ))),
        }
    }

    /// Read the cgroup counters a run that went well left unread. Every
    /// run does this first; an owner that has answered the last run can do
    /// it meanwhile, out of the next run's way.
    pub fn settle(&mut self) {
        if let Some(cgroup) = &mut self.cgroup {
            cgroup.settle();
        }
    }

    /// A run is over: the worker may take the next request.
    fn finish_run(&mut self) {
        self.in_flight = false;
        self.runs += 1;
    }

    /// Whether the request in flight (of a dropped
    /// [`Worker::execute_cancellable`]) can be cancelled: it was written
    /// whole, and the worker is alive.
    pub fn can_cancel(&self) -> bool {
        self.in_flight && self.sent && !self.terminated
    }

    /// Cancel the run in flight: the worker kills it at once and answers its
    /// result, which is read and dropped here. Waits at most `within`; on
    /// success the worker serves again, on failure it stays poisoned.
    pub async fn cancel(&mut self, within: Duration) -> Result<(), WorkerError> {
        if !self.can_cancel() {
            return Err(WorkerError::NoRunToCancel);
        }
        let frame = protocol::encode_frame(&protocol::Cancel { t: "cancel" })
            .map_err(WorkerError::Protocol)?;
        // The run's answer (and any output before it) comes as to any
        // request; the output goes nowhere.
        self.round_trip(&frame, within, None).await?;
        if let Some(cgroup) = &mut self.cgroup {
            cgroup.take_events();
        }
        self.finish_run();
        Ok(())
    }

    async fn round_trip(
        &mut self,
        frame: &[u8],
        deadline: Duration,
        output: Option<&OutputSink>,
    ) -> Result<RunOutput, WorkerError> {
        let started = Instant::now();
        let stdin = self
            .stdin
            .as_ref()
            .ok_or(WorkerError::Crashed { exited: None })?;
        let write = stdin.write_all(frame);
        match tokio::time::timeout(deadline, write).await {
            Err(_) => return Err(WorkerError::Unresponsive(deadline)),
            Ok(Err(_)) => return Err(self.died()),
            Ok(Ok(())) => self.sent = true,
        }
        loop {
            let remaining = deadline.saturating_sub(started.elapsed());
            let body = match tokio::time::timeout(remaining, self.frames.next()).await {
                Err(_) => return Err(WorkerError::Unresponsive(deadline)),
                Ok(None) => return Err(self.died()),
                Ok(Some(Err(e))) => {
                    return Err(WorkerError::Protocol(protocol::FrameError::Read(e)));
                }
                Ok(Some(Ok(body))) => body,
            };
            let frame = protocol::decode_frame(&body).map_err(WorkerError::Protocol)?;
            match frame.t.as_str() {
                "output" => {
                    let stream = match frame.stream.as_deref() {
                        Some("stderr") => OutputStream::Stderr,
                        _ => OutputStream::Stdout,
                    };
                    if let Some(sink) = output {
                        // A closed sink means the client left; the run goes on
                        // until the caller drops this future.
                        let _ = sink.send(OutputChunk {
                            stream,
                            data: frame.data,
                        });
                    }
                }
                "result" => {
                    self.cleaning = frame.cleaning;
                    return Ok(RunOutput {
                        stdout: frame.stdout,
                        stderr: frame.stderr,
                        exit_code: frame.exit_code,
                        signal: frame.signal.map(signal_name),
                        timed_out: frame.timed_out,
                        stdout_truncated: frame.stdout_truncated,
                        stderr_truncated: frame.stderr_truncated,
                        duration_ms: frame.duration_ms,
                        result: frame.result,
                        error: frame.error,
                        artifacts: frame.artifacts,
                        artifacts_cut: frame.artifacts_cut,
                        cpu_ms: frame.cpu_ms,
                        peak_rss_kb: frame.peak_rss_kb,
                        session_lost: frame.session_lost,
                        refused: frame.refused,
                        network: None,
                        disk_exceeded: frame.disk_exceeded,
                        returned: frame.returned,
                        returned_size: frame.returned_size,
                        cgroup: LimitEvents::default(),
                    });
                }
                "error" if frame.retire => {
                    return Err(WorkerError::Retired(frame.message.unwrap_or_default()));
                }
                "error" => {
                    // The request's error carries the message; the worker's
                    // own traceback is for the operator.
                    if let Some(traceback) = frame.traceback.as_deref().filter(|t| !t.is_empty()) {
                        tracing::error!(pid = self.info.pid, "worker fault:\n{traceback}");
                    }
                    return Err(WorkerError::Internal(frame.message.unwrap_or_default()));
                }
                other => {
                    return Err(WorkerError::Protocol(protocol::FrameError::UnexpectedType(
                        other.to_string(),
                    )));
                }
            }
        }
    }

    /// How the worker went away, for the caller's error: its exit status
    /// when it is already reaped (a write or read failed because it is gone).
    fn died(&mut self) -> WorkerError {
        WorkerError::Crashed {
            exited: self.child.try_wait().ok().flatten(),
        }
    }

    /// Send an `echo` frame and return the worker's re-encoded answer body.
    pub async fn echo_raw(&mut self, frame: &[u8]) -> Result<bytes::BytesMut, WorkerError> {
        if self.cleaning {
            self.await_cleaned(Duration::from_secs(10)).await?;
        }
        let stdin = self
            .stdin
            .as_ref()
            .ok_or(WorkerError::Crashed { exited: None })?;
        stdin.write_all(frame).await.map_err(WorkerError::Io)?;
        match self.frames.next().await {
            Some(Ok(body)) => Ok(body),
            Some(Err(e)) => Err(WorkerError::Io(e)),
            None => Err(self.died()),
        }
    }

    /// The ordered termination path: close stdin (the worker exits on EOF and
    /// kills its run) -> wait `grace` -> SIGTERM the group -> wait `grace` ->
    /// SIGKILL the tree -> reap.
    pub async fn terminate(mut self, grace: Duration) {
        self.stdin.take();
        let pid = self.info.pid;
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            process::signal_group(pid, nix::sys::signal::Signal::SIGTERM);
            if tokio::time::timeout(grace, self.child.wait())
                .await
                .is_err()
            {
                kill_process_tree(pid);
                let _ = self.child.wait().await;
            }
        }
        // Runs forked by the worker die with it (parent-death signal); make
        // sure of it for any that are left.
        kill_process_tree(pid);
        self.terminated = true;
    }

    /// Kill the whole process tree now (no grace); reaping happens in the
    /// background through tokio.
    pub fn kill(&mut self) {
        if !self.terminated {
            kill_process_tree(self.info.pid);
            self.terminated = true;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
        // The scratch root goes once the processes that wrote into it are gone.
        drop(self.scratch.take());
        drop(self.cgroup.take());
    }
}

/// Kills the worker's tree if a request future is dropped mid-flight.
struct KillOnDrop {
    pid: u32,
    armed: bool,
}

impl KillOnDrop {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.armed {
            kill_process_tree(self.pid);
        }
    }
}

/// The name of signal `number` as results give it (`"SIGKILL"`); a number
/// without a name here (a real-time signal) reads `"SIG<n>"`.
fn signal_name(number: i32) -> String {
    nix::sys::signal::Signal::try_from(number)
        .map_or_else(|_| format!("SIG{number}"), |s| s.as_str().to_string())
}

/// Forward the worker's stderr (bootstrap diagnostics) to tracing at debug,
/// keep a tail of it for startup errors, and report the worker's exit.
async fn drain_stderr(
    stderr: tokio::process::ChildStderr,
    pid: u32,
    tail: Arc<Mutex<String>>,
    exited: Option<mpsc::UnboundedSender<u32>>,
) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::debug!(worker_pid = pid, "{line}");
        let mut tail = tail.lock();
        if tail.len() < STDERR_TAIL_BYTES {
            tail.push_str(&line);
            tail.push('\n');
        }
    }
    if let Some(tx) = exited {
        let _ = tx.send(pid);
    }
}

/// Build the worker environment from scratch: `base` (activation variables
/// and the allowlisted parts of the server's environment) plus the worker's
/// own settings. `HOME` and `TMPDIR` are set per worker to its scratch root.
pub(crate) fn worker_env(base: &HashMap<String, String>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = base
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "HOME" | "TMPDIR"))
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    for (k, v) in [
        ("PYTHONUNBUFFERED", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MPLBACKEND", "Agg"),
    ] {
        env.retain(|(key, _)| key != k);
        env.push((k.into(), v.into()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::{LAUNCH, Ordering, RUNNING, Running, running_alone, signal_name};
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::process::{Child, Stdio};
    use std::time::{Duration, Instant};

    /// LAUNCH run on a script that shows what it sees, with the pipe of the
    /// launcher's `--join-async` in its environment.
    #[test]
    fn the_launch_code_hands_the_cgroup_pipe_to_the_bootstrap() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("worker.py");
        std::fs::write(
            &script,
            "import os\nprint('ran', os.environ.get('CODE_EXECUTOR_CGROUP_FD'), __cgroup_barrier__)\n",
        )
        .unwrap();
        let out = std::process::Command::new("/usr/bin/python3.11")
            .args(["-I", "-u", "-c", LAUNCH])
            .arg(&script)
            .args(["", "", ""])
            .env("CODE_EXECUTOR_CGROUP_FD", "7")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // The variable is gone before the worker's own code runs.
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran None 7\n");
    }

    /// The real bootstrap, started as the launcher starts it with
    /// `--join-async`: the write end of its cgroup pipe, not written yet.
    fn bootstrap_before_the_join() -> (Child, OwnedFd, tempfile::TempDir) {
        let scratch = tempfile::tempdir().unwrap();
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        crate::sys::inherit_fd(read.as_raw_fd()).unwrap();
        let child = std::process::Command::new("/usr/bin/python3.11")
            .args(["-I", "-u", "-c", LAUNCH])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python/worker.py"))
            .arg("")
            .arg(scratch.path())
            .arg("")
            .env("CODE_EXECUTOR_CGROUP_FD", read.as_raw_fd().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(read);
        (child, write, scratch)
    }

    /// Processes whose parent is `pid`.
    fn children_of(pid: u32) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                // pid (comm) state ppid ...: comm may hold spaces, not ')'.
                let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
                after.split_whitespace().nth(1) == Some(pid.to_string().as_str())
            })
            .collect()
    }

    #[test]
    fn the_bootstrap_forks_nothing_until_it_is_in_its_cgroups() {
        let (mut child, write, _scratch) = bootstrap_before_the_join();
        let mut stdout = child.stdout.take().unwrap();
        // Long enough for the bootstrap to get as far as it goes (~20 ms).
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(child.try_wait().unwrap(), None, "it waits");
        assert_eq!(children_of(child.id()), Vec::<u32>::new(), "no fork yet");
        std::fs::File::from(write).write_all(b"1").unwrap();
        // Told, it starts its zygote and first child and says it is ready.
        let mut header = [0u8; 4];
        stdout.read_exact(&mut header).unwrap();
        // All of it (it carries the compiled bootstrap): a frame left unread
        // would block the worker's write.
        let mut frame = vec![0u8; u32::from_be_bytes(header) as usize];
        stdout.read_exact(&mut frame).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while children_of(child.id()).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!children_of(child.id()).is_empty(), "it forked once told");
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn the_bootstrap_stops_when_the_cgroups_could_not_be_joined() {
        let (child, write, _scratch) = bootstrap_before_the_join();
        drop(write);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert_eq!(out.stdout, b"", "no ready frame");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("could not join its cgroups"), "{stderr}");
    }

    /// What `python/worker.py`'s C calls print, run by `body` after the
    /// bootstrap is imported as `w` (it doubles as a module).
    fn bootstrap_c_calls(body: &str) -> String {
        let code = format!(
            "import sys\nsys.path.insert(0, {:?})\nimport worker as w\n{body}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/python")
        );
        let out = std::process::Command::new("/usr/bin/python3.11")
            .args(["-I", "-c", &code])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// prctl(PR_GET_DUMPABLE) after each setting, and the errno of a refused
    /// call: the calls the bootstrap makes are made, and failures raise.
    const DUMPABLE_ROUND_TRIP: &str = "\
print(w.load_libc())
w.set_dumpable(False); print(w._libc.prctl(3, 0, 0, 0, 0))
w.set_dumpable(True); print(w._libc.prctl(3, 0, 0, 0, 0))
try:
    w.prctl(999, 0)
except OSError as exc:
    print(exc.errno)
print('ctypes' in sys.modules)
";

    #[test]
    fn the_bootstrap_calls_c_without_the_ctypes_package() {
        assert_eq!(
            bootstrap_c_calls(DUMPABLE_ROUND_TRIP),
            "None\n0\n1\n22\nFalse\n"
        );
    }

    #[test]
    fn the_bootstrap_falls_back_to_the_ctypes_package() {
        let body = format!(
            "def missing():\n    raise AttributeError('no CFuncPtr')\nw._bare_ctypes = missing\n{DUMPABLE_ROUND_TRIP}"
        );
        assert_eq!(bootstrap_c_calls(&body), "None\n0\n1\n22\nTrue\n");
    }

    #[test]
    fn a_run_is_alone_until_another_is_in_flight() {
        assert!(running_alone());
        let first = Running::enter();
        assert!(running_alone(), "the asking run itself");
        let second = Running::enter();
        assert!(!running_alone());
        drop(second);
        assert!(running_alone());
        drop(first);
        assert_eq!(RUNNING.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn signals_are_named_from_their_numbers() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(24), "SIGXCPU");
        assert_eq!(signal_name(40), "SIG40");
    }
}

//! Session calls the server answers itself: it writes a call to the session
//! child (what the child needs of its `exec` frame, pickled: see
//! [`SessionCall`]), drains the child's stdout and stderr and reads its
//! report, so that the worker is not on the call's path. The worker forked the
//! child and handed over its ends of the child's pipes when the session
//! started; it still interrupts a call at its timeout, and kills the child and
//! says how the session was lost when a call cannot end by a report (see
//! "Sessions" in `python/worker.py`).

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::{OutputChunk, OutputSink, OutputStream, RunOutput, Worker};
use crate::error::WorkerError;
use crate::protocol::{self, WireArtifact, WireError, WireRefusal};

/// Characters a result's repr may have past `max_result_chars`: the note
/// that says it was cut, and how long it was (see `value_repr` in
/// `python/worker.py`).
const TRUNCATION_NOTE: u64 = 64;

/// Reads of the child's pipes take at most this much at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Room in a report beyond its artifacts' bytes: the result's repr, the
/// error and its traceback, the artifacts' names (all capped far below).
const REPORT_ROOM: u64 = 32 << 20;

/// Most artifacts one report may list (as the worker's own cap).
const MAX_ARTIFACTS: usize = 1000;

/// Most characters of an error's message and of its traceback (as the
/// worker's own cap).
const MAX_ERROR_CHARS: usize = 64 * 1024;

/// Most bytes one drain of a pipe takes once the call is over: a process
/// the call left writing must not keep a runtime thread reading.
const DRAIN_BYTES: usize = 1 << 20;

/// How long a call runs before the runtime watches the child's stdout and
/// stderr (see [`Output`]). A call that fills a pipe (64 KiB) sooner waits
/// at most this long for it to be read.
const QUIET: Duration = Duration::from_millis(2);

/// How long the server waits for a quick call's report without sleeping
/// (see [`await_report_awake`]). A warm `print(2+2)` call's report comes
/// ~60 us after the call is written.
const SPIN: Duration = Duration::from_micros(200);

/// A call not awaited awake that is answered within this long makes the
/// session's next call awaited awake again: asleep, a call that would have
/// been answered within [`SPIN`] awake takes up to a wake-up longer (a
/// warm `print(2+2)` ~200-250 us against ~170), so that one slow call
/// (a harness's setup) does not leave every later quick call asleep.
const QUICK_ASLEEP: Duration = Duration::from_micros(400);

/// A session keeps the buffer its calls are pickled into while it is no
/// larger than this (a call with megabytes of files does not pin them).
const CALL_KEPT: usize = 64 * 1024;

/// The server's ends of a session child's pipes.
#[derive(Debug)]
pub(super) struct DirectSession {
    /// Calls (`exec` frames) are written here.
    request: pipe::Sender,
    stdout: Output,
    stderr: Output,
    /// One report per call (a length-prefixed msgpack map); user code can
    /// write here too, so nothing read from it is trusted.
    report: pipe::Receiver,
    /// How long a call has to stop after its interrupt before the child is
    /// killed and the session lost.
    grace: Duration,
    /// Readable once the session child has ended (a pidfd, where the
    /// worker's Python has `os.pidfd_open`): a process it forked may keep
    /// its pipes open after it died.
    ended: Option<AsyncFd<OwnedFd>>,
    /// Read buffers for the three pipes, made once for the session's life.
    buffers: [Vec<u8>; 3],
    /// The call being sent, pickled (see [`SessionCall`]).
    call: Vec<u8>,
    /// Whether the last call was answered within [`SPIN`] awake or
    /// [`QUICK_ASLEEP`] asleep (true before the first): the next call's
    /// report is then awaited awake.
    quick: bool,
}

impl DirectSession {
    /// The session of a child whose request, stdout, stderr and report
    /// pipes are `pipes` (the server's ends), `ended` readable once it has
    /// ended, with `grace` for a call to stop after its interrupt.
    fn new(
        pipes: [OwnedFd; 4],
        ended: Option<AsyncFd<OwnedFd>>,
        grace: Duration,
    ) -> std::io::Result<DirectSession> {
        let [request, stdout, stderr, report] = pipes;
        Ok(DirectSession {
            request: pipe::Sender::from_owned_fd(request)?,
            stdout: Output::new(stdout)?,
            stderr: Output::new(stderr)?,
            report: pipe::Receiver::from_owned_fd(report)?,
            ended,
            grace,
            buffers: [
                vec![0; READ_CHUNK],
                vec![0; READ_CHUNK],
                vec![0; READ_CHUNK],
            ],
            call: Vec::new(),
            quick: true,
        })
    }
}

/// What the server and the session child need to know of a call, read
/// from its `exec` frame (borrowing its code, input and files).
#[derive(Deserialize)]
struct CallParams<'a> {
    id: u64,
    code: &'a str,
    #[serde(borrow)]
    stdin: Option<&'a Bytes>,
    #[serde(borrow)]
    files: Vec<(&'a str, &'a Bytes)>,
    #[serde(borrow)]
    argv: Vec<&'a str>,
    limits: CallLimits,
    timeout: f64,
    max_output: u64,
    max_artifact_bytes: u64,
    max_artifacts_bytes: u64,
    max_result_chars: u64,
    artifacts: Selection,
}

/// The one limit a session child applies per call (the others are the
/// session's).
#[derive(Deserialize)]
struct CallLimits {
    cpu_seconds: Option<u64>,
}

/// A call as the session child reads it: a pickled tuple (the C unpickler
/// makes one in ~1 us; the `exec` frame's map, with its keys, took ~6 us
/// of the child's time on every call). Its order is the one `session_main`
/// in `python/worker.py` unpacks, and the protocol's header lists.
#[derive(Serialize)]
struct SessionCall<'a>(
    u64,
    &'a str,
    Option<&'a Bytes>,
    &'a [(&'a str, &'a Bytes)],
    &'a [&'a str],
    Option<u64>,
    &'a Selection,
    u64,
    u64,
    u64,
    f64,
);

impl<'a> SessionCall<'a> {
    /// `interrupt_at`: when the call's interrupt is due, in seconds of
    /// `CLOCK_MONOTONIC` (the child's `time.monotonic()`).
    fn of(params: &'a CallParams<'a>, interrupt_at: f64) -> SessionCall<'a> {
        SessionCall(
            params.id,
            params.code,
            params.stdin,
            &params.files,
            &params.argv,
            params.limits.cpu_seconds,
            &params.artifacts,
            params.max_artifact_bytes,
            params.max_artifacts_bytes,
            params.max_result_chars,
            interrupt_at,
        )
    }
}

/// Seconds of `CLOCK_MONOTONIC`, the clock `Instant` and Python's
/// `time.monotonic()` read (0 if it cannot be read, which makes an early
/// interrupt the call's at once).
fn monotonic_secs() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

/// The `artifacts` field of an `exec` frame.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum Selection {
    All(bool),
    Globs(Vec<String>),
}

/// The session child's report of one call, as read. Numbers are read as
/// any number and checked later; a report on this call that cannot be read
/// at all reads as an empty one (status 0, nothing else).
#[derive(Default, Deserialize)]
#[serde(default)]
struct Report {
    /// The call it reports on (user code may have written others).
    id: Option<u64>,
    status: f64,
    result: Option<String>,
    error: Option<ReportError>,
    cpu_ms: Option<f64>,
    peak_rss_kb: Option<f64>,
    /// The first [`MAX_ARTIFACTS`] with plain paths and types, decoded one
    /// at a time (see [`plain_artifacts`]).
    #[serde(deserialize_with = "plain_artifacts")]
    artifacts: Vec<WireArtifact>,
    /// The child's listing of the call's files was cut.
    artifacts_cut: bool,
    /// The call's input files could not be written; its code did not run.
    refused: Option<WireRefusal>,
    /// The call's interrupt came as it was set up, and was raised in place
    /// of its code once its time had come.
    timed_out: bool,
}

/// A report's artifacts: the first [`MAX_ARTIFACTS`] whose paths are plain
/// relative paths and whose types are plain, each decoded and dropped in
/// turn; the rest skipped undecoded. A report user code forged may list
/// millions (an empty map is one byte, an artifact with its defaults ~90):
/// the server never holds more than it keeps.
fn plain_artifacts<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<WireArtifact>, D::Error> {
    struct Plain;
    impl<'de> serde::de::Visitor<'de> for Plain {
        type Value = Vec<WireArtifact>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of artifacts")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut kept = Vec::new();
            while kept.len() < MAX_ARTIFACTS {
                match seq.next_element::<WireArtifact>()? {
                    Some(a) if plain_relative(&a.path) && plain_mime(&a.mime) => kept.push(a),
                    Some(_) => {}
                    None => return Ok(kept),
                }
            }
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(kept)
        }
    }
    deserializer.deserialize_seq(Plain)
}

/// Just the call a report is on.
#[derive(Default, Deserialize)]
#[serde(default)]
struct ReportId {
    id: Option<u64>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ReportError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    traceback: String,
    line: Option<f64>,
    errno: Option<f64>,
}

/// The `interrupt` frame: SIGINT to the session child (a call's timeout).
#[derive(Serialize)]
struct Interrupt {
    t: &'static str,
}

/// The `end` frame: kill the session child and say how the session was lost.
#[derive(Serialize)]
struct End<'a> {
    t: &'static str,
    id: u64,
    /// `timeout` (it did not stop within the grace), `exit` (it ended, or
    /// closed its report pipe), `flood` (it sent more than a report may
    /// hold) or `unsent` (it could not be written to).
    ended: &'static str,
    timeout: f64,
    /// The call's artifacts are the files written since `since` (seconds
    /// since the epoch, when it was sent), input files (`inputs`) aside.
    artifacts: &'a Selection,
    since: f64,
    inputs: Vec<&'a str>,
    max_artifact_bytes: u64,
    max_artifacts_bytes: u64,
}

/// A session child's stdout or stderr. The runtime watches it only while a
/// call streams its output or has run for [`QUIET`]: a short call's output
/// is read once its report has come, when all of it is in the pipe. Were
/// the pipe watched, the call's first write would wake a runtime thread
/// for the few bytes of a `print`, and its report wake it again.
#[derive(Debug)]
struct Output {
    /// The pipe while the runtime does not watch it.
    idle: Option<OwnedFd>,
    /// The pipe while it does.
    watched: Option<AsyncFd<OwnedFd>>,
}

impl Output {
    fn new(fd: OwnedFd) -> std::io::Result<Output> {
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL)?;
        let flags = nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        Ok(Output {
            idle: Some(fd),
            watched: None,
        })
    }

    fn is_watched(&self) -> bool {
        self.watched.is_some()
    }

    /// Have the runtime watch the pipe, so that [`Output::read`] can wait.
    fn watch(&mut self) -> std::io::Result<()> {
        if let Some(fd) = self.idle.take() {
            self.watched = Some(crate::sys::watch_readable(fd)?);
        }
        Ok(())
    }

    /// Stop watching (a call is over).
    fn unwatch(&mut self) {
        if let Some(watched) = self.watched.take() {
            self.idle = Some(watched.into_inner());
        }
    }

    /// What the pipe holds now, without waiting (`WouldBlock`: nothing).
    fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        let fd = match (&self.idle, &self.watched) {
            (Some(fd), _) => fd.as_fd(),
            (None, Some(watched)) => watched.get_ref().as_fd(),
            (None, None) => return Ok(0),
        };
        Ok(nix::unistd::read(fd, buf)?)
    }

    /// Wait for the pipe to hold something and read it; a pipe not watched
    /// never does (see [`Output::watch`]).
    async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(watched) = &self.watched else {
            return std::future::pending().await;
        };
        loop {
            let mut ready = watched.readable().await?;
            match ready.try_io(|fd| Ok(nix::unistd::read(fd.get_ref(), buf)?)) {
                Ok(read) => return read,
                Err(_would_block) => continue,
            }
        }
    }
}

/// One captured stream, keeping at most `cap` bytes.
struct Capture {
    data: Vec<u8>,
    cap: usize,
    truncated: bool,
    open: bool,
}

impl Capture {
    fn new(cap: u64) -> Capture {
        Capture {
            data: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            truncated: false,
            open: true,
        }
    }

    /// Keep what fits of `chunk`; return the part kept.
    fn feed<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let room = self.cap - self.data.len();
        let kept = if chunk.len() > room {
            self.truncated = true;
            &chunk[..room]
        } else {
            chunk
        };
        self.data.extend_from_slice(kept);
        kept
    }

    /// Take `n` bytes read into `buf` (0: the pipe closed), streaming what
    /// is kept to `sink`.
    fn take(&mut self, buf: &[u8], n: usize, stream: OutputStream, sink: Option<&OutputSink>) {
        if n == 0 {
            self.open = false;
            return;
        }
        let kept = self.feed(&buf[..n]);
        if let Some(sink) = sink.filter(|_| !kept.is_empty()) {
            // A closed sink means the client left; the call goes on.
            let _ = sink.send(OutputChunk {
                stream,
                data: kept.to_vec(),
            });
        }
    }

    /// Read what `pipe` holds now, up to [`DRAIN_BYTES`], without waiting
    /// (the call is over).
    fn drain(
        &mut self,
        pipe: &Output,
        buf: &mut [u8],
        stream: OutputStream,
        sink: Option<&OutputSink>,
    ) {
        let mut taken = 0;
        while self.open && taken < DRAIN_BYTES {
            match pipe.try_read(buf) {
                Ok(n) => {
                    taken += n;
                    self.take(buf, n, stream, sink);
                    // A pipe reads short only once it is empty.
                    if n < buf.len() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => self.open = false,
            }
        }
    }
}

/// How a call ended, as the server saw it.
enum Ended {
    Report(Box<Report>),
    /// It did not stop within the grace after its interrupt.
    Timeout,
    /// The child ended, or closed its report pipe.
    Exit,
    /// It sent more than a report may hold.
    Flood,
    /// The call could not be written to the child.
    Unsent,
    /// Its timeout came: the worker is to interrupt it (then it goes on).
    Interrupt,
}

impl Worker {
    /// End the session (it was closed) and make the worker ready for
    /// another, within `within`: the server's ends of the child's pipes are
    /// closed, the worker kills the child and what it left and clears its
    /// scratch root and `/dev/shm` (a `release` frame), and the session's
    /// cap on processes is lifted. On an error the worker is to be
    /// terminated.
    pub(crate) async fn release_session(&mut self, within: Duration) -> Result<(), WorkerError> {
        if self.session.take().is_none() {
            return Err(WorkerError::Internal(
                "the worker serves no session to release".into(),
            ));
        }
        let frame = protocol::encode_frame(&protocol::Release {
            t: "release",
            id: 0,
        })
        .map_err(WorkerError::Protocol)?;
        self.execute(&frame, within, None).await?;
        self.set_run_processes(None).map_err(WorkerError::Io)
    }

    /// Take the session child's pipes, which the worker sends (over its
    /// channel) before it answers a `session` frame that asked for
    /// `direct`: from now on [`Worker::execute`] answers calls itself.
    pub(crate) async fn attach_session(
        &mut self,
        grace: Duration,
        within: Duration,
    ) -> Result<(), WorkerError> {
        let channel = self
            .stdin
            .as_ref()
            .ok_or(WorkerError::Crashed { exited: None })?;
        let received = tokio::time::timeout(within, async {
            loop {
                channel.readable().await?;
                match channel.try_read(|| crate::sys::recv_fds(channel.as_fd(), 5)) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    other => return other,
                }
            }
        })
        .await
        .map_err(|_| WorkerError::Unresponsive(within))?
        .map_err(WorkerError::Io)?;
        let count = received.len();
        let mut received = received.into_iter();
        let (Some(request), Some(stdout), Some(stderr), Some(report), pidfd, None) = (
            received.next(),
            received.next(),
            received.next(),
            received.next(),
            received.next(),
            received.next(),
        ) else {
            return Err(WorkerError::Internal(format!(
                "the worker handed over {count} descriptors for its session, not 4 or 5"
            )));
        };
        let ended = pidfd
            .map(crate::sys::watch_readable)
            .transpose()
            .map_err(WorkerError::Io)?;
        self.session = Some(
            DirectSession::new([request, stdout, stderr, report], ended, grace)
                .map_err(WorkerError::Io)?,
        );
        Ok(())
    }

    /// One session call (an encoded `exec` frame) answered by the session
    /// child itself, within `deadline` (the call's timeout, the interrupt's
    /// grace and slack).
    pub(super) async fn direct_call(
        &mut self,
        frame: &[u8],
        deadline: Duration,
        output: Option<&OutputSink>,
    ) -> Result<RunOutput, WorkerError> {
        let params: CallParams = rmp_serde::from_slice(frame.get(4..).unwrap_or_default())
            .map_err(|e| WorkerError::Protocol(protocol::FrameError::Decode(e)))?;
        let session = self.session.as_mut().expect("a direct session");
        let started = Instant::now();
        let since = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let hard = started + deadline;
        let mut out = Capture::new(params.max_output);
        let mut err = Capture::new(params.max_output);
        let mut timed_out = false;
        // Whatever user code wrote to the report pipe after the last call's
        // report is no report of this call. Read from the pipe itself: the
        // runtime may not have seen it become readable (a report awaited
        // awake was read past it).
        let mut stale = [0u8; 4096];
        for _ in 0..16 {
            if !matches!(nix::unistd::read(session.report.as_fd(), &mut stale), Ok(n) if n > 0) {
                break;
            }
        }
        // The child tells an interrupt that comes before its code runs by
        // this time (see `session_call` in python/worker.py).
        let interrupt_at =
            monotonic_secs() + params.timeout.max(0.0) - started.elapsed().as_secs_f64();
        protocol::pickle_into(&SessionCall::of(&params, interrupt_at), &mut session.call)
            .map_err(WorkerError::Protocol)?;
        // A child that has ended takes no call. A process it forked may
        // still hold the request pipe open: a call larger than the pipe
        // holds would then wait for the hard deadline, so the write also
        // ends with the child.
        let DirectSession {
            request,
            call,
            ended,
            ..
        } = &mut *session;
        let gone = ended
            .as_ref()
            .is_some_and(|pidfd| pidfd.readable().now_or_never().is_some());
        let write = if gone {
            Ok(Ok(false))
        } else {
            tokio::time::timeout_at(hard.into(), async {
                tokio::select! {
                    biased;
                    written = request.write_all(call) => written.map(|()| true),
                    () = child_ended(ended) => Ok(false),
                }
            })
            .await
        };
        if session.call.capacity() > CALL_KEPT {
            session.call = Vec::new();
        }
        let mut awake = false;
        let ended = match write {
            Err(_) => return Err(WorkerError::Unresponsive(deadline)),
            Ok(Err(_) | Ok(false)) => Ended::Unsent,
            Ok(Ok(true)) => {
                let cap = params
                    .max_artifacts_bytes
                    .saturating_add(REPORT_ROOM)
                    .min(protocol::MAX_FRAME_BYTES as u64);
                let interrupt_at = started + Duration::from_secs_f64(params.timeout.max(0.0));
                let listen_at = if output.is_some() {
                    started
                } else {
                    started + QUIET
                };
                let mut kill_at: Option<Instant> = None;
                let mut report = Vec::new();
                let session = self.session.as_mut().expect("a direct session");
                awake = output.is_none() && session.quick && super::running_alone();
                let mut early = if awake {
                    await_report_awake(session, params.id, cap, &mut report, started + SPIN)
                } else {
                    None
                };
                loop {
                    if let Some(ended) = early.take() {
                        break ended;
                    }
                    let session = self.session.as_mut().expect("a direct session");
                    let ended = watch(
                        session,
                        &params,
                        cap,
                        &mut report,
                        &mut out,
                        &mut err,
                        output,
                        listen_at,
                        kill_at.unwrap_or(interrupt_at).min(hard),
                    )
                    .await;
                    if !matches!(ended, Ended::Interrupt) {
                        break ended;
                    }
                    let now = Instant::now();
                    if now >= hard {
                        return Err(WorkerError::Unresponsive(deadline));
                    }
                    if kill_at.is_some() {
                        break Ended::Timeout;
                    }
                    timed_out = true;
                    kill_at = Some(now + session.grace);
                    // Answered once the signal is sent: no later call can
                    // get it.
                    let interrupt = protocol::encode_frame(&Interrupt { t: "interrupt" })
                        .map_err(WorkerError::Protocol)?;
                    self.round_trip(&interrupt, hard.saturating_duration_since(now), None)
                        .await?;
                }
            }
        };
        let session = self.session.as_mut().expect("a direct session");
        let took = started.elapsed();
        let quick_within = if awake { SPIN } else { QUICK_ASLEEP };
        session.quick = matches!(ended, Ended::Report(_)) && took <= quick_within;
        let duration_ms = took.as_secs_f64() * 1e3;
        let mut result = match ended {
            Ended::Report(report) => {
                // Output written before the report is in the pipes now.
                let buf = &mut session.buffers[0];
                out.drain(&session.stdout, buf, OutputStream::Stdout, output);
                err.drain(&session.stderr, buf, OutputStream::Stderr, output);
                session.stdout.unwatch();
                session.stderr.unwatch();
                report_output(*report, &params)
            }
            how => {
                let ended = match how {
                    Ended::Timeout => "timeout",
                    Ended::Unsent => "unsent",
                    Ended::Flood => "flood",
                    _ => "exit",
                };
                let end = protocol::encode_frame(&End {
                    t: "end",
                    id: params.id,
                    ended,
                    timeout: params.timeout,
                    artifacts: &params.artifacts,
                    since,
                    inputs: params.files.iter().map(|(path, _)| *path).collect(),
                    max_artifact_bytes: params.max_artifact_bytes,
                    max_artifacts_bytes: params.max_artifacts_bytes,
                })
                .map_err(WorkerError::Protocol)?;
                let remaining = hard.saturating_duration_since(Instant::now());
                let answer = self.round_trip(&end, remaining, None).await?;
                let session = self.session.as_mut().expect("a direct session");
                let buf = &mut session.buffers[0];
                out.drain(&session.stdout, buf, OutputStream::Stdout, output);
                err.drain(&session.stderr, buf, OutputStream::Stderr, output);
                // The child is gone: the session's pipes go with it.
                self.session = None;
                answer
            }
        };
        result.stdout = out.data;
        result.stderr = err.data;
        result.stdout_truncated = out.truncated;
        result.stderr_truncated = err.truncated;
        result.timed_out |= timed_out;
        result.duration_ms = duration_ms;
        Ok(result)
    }
}

/// Resolves once the session child has ended (`ended`, its pidfd); never
/// without one.
async fn child_ended(ended: &Option<AsyncFd<OwnedFd>>) {
    match ended {
        Some(pidfd) => drop(pidfd.readable().await),
        None => std::future::pending().await,
    }
}

/// Wait for the report on call `id` without sleeping, until `until`: read
/// the report pipe and yield the CPU in turns, gathering what comes in
/// `report`. The call's end, if it came (`None`: not yet, or the pipe
/// closed or failed, which [`watch`] then sees).
///
/// A call that ends within [`SPIN`] (a quick call sent back to back, as a
/// harness or a grader sends them) is answered sooner this way: a runtime thread that
/// sleeps until the report comes must be woken for it, and waking a thread
/// on an idle CPU of a VM costs tens of microseconds. The thread yields
/// between reads, so that a session child queued on its CPU can run; it is
/// done only while no other run or call is in flight (see [`direct_call`]),
/// so the CPU it keeps busy is one no run wants. Other requests (a
/// `GET /health`) queued on this thread may wait for it, at most [`SPIN`].
///
/// [`direct_call`]: Worker::direct_call
fn await_report_awake(
    session: &mut DirectSession,
    id: u64,
    cap: u64,
    report: &mut Vec<u8>,
    until: Instant,
) -> Option<Ended> {
    let DirectSession {
        report: pipe,
        buffers: [_, _, rbuf],
        ..
    } = session;
    // A closed pipe is left to the call's watch.
    read_report_until(pipe, rbuf, id, cap, report, until).filter(|e| !matches!(e, Ended::Exit))
}

/// Read the report pipe `pipe` into `report` through `rbuf` until the end
/// of call `id` is whole (see [`await_report_awake`]; `Ended::Exit`: the
/// pipe closed), or `until` has come (`None`): an `until` passed reads the
/// pipe once. Bounded by `until` even while user code keeps the pipe full
/// (of reports on other calls, which are dropped). `None` too when the read
/// fails.
fn read_report_until(
    pipe: &pipe::Receiver,
    rbuf: &mut [u8],
    id: u64,
    cap: u64,
    report: &mut Vec<u8>,
    until: Instant,
) -> Option<Ended> {
    loop {
        match nix::unistd::read(pipe.as_fd(), rbuf) {
            Ok(0) => return Some(Ended::Exit),
            Ok(n) => {
                if let Some(ended) = gather_report(report, &rbuf[..n], id, cap) {
                    return Some(ended);
                }
            }
            Err(nix::errno::Errno::EAGAIN) => {}
            Err(_) => return None,
        }
        if Instant::now() >= until {
            return None;
        }
        let _ = nix::sched::sched_yield();
    }
}

/// Watch a call until it ends or `wake` comes (`Ended::Interrupt`):
/// drain its output into `out` and `err` (streamed to `output`) from
/// `listen_at` on (see [`Output`]), gather its report in `report`, see the
/// child end.
#[allow(clippy::too_many_arguments)]
async fn watch(
    session: &mut DirectSession,
    params: &CallParams<'_>,
    cap: u64,
    report: &mut Vec<u8>,
    out: &mut Capture,
    err: &mut Capture,
    output: Option<&OutputSink>,
    listen_at: Instant,
    wake: Instant,
) -> Ended {
    let [obuf, ebuf, rbuf] = &mut session.buffers;
    let mut listening = session.stdout.is_watched();
    let child_ended = child_ended(&session.ended);
    tokio::pin!(child_ended);
    loop {
        tokio::select! {
            n = session.stdout.read(obuf), if out.open => {
                out.take(obuf, n.unwrap_or(0), OutputStream::Stdout, output);
            }
            n = session.stderr.read(ebuf), if err.open => {
                err.take(ebuf, n.unwrap_or(0), OutputStream::Stderr, output);
            }
            n = session.report.read(rbuf) => {
                let n = n.unwrap_or(0);
                if n == 0 {
                    return Ended::Exit;
                }
                if let Some(ended) = gather_report(report, &rbuf[..n], params.id, cap) {
                    return ended;
                }
            }
            () = &mut child_ended => return Ended::Exit,
            () = tokio::time::sleep_until(if listening { wake } else { wake.min(listen_at) }.into()) => {
                if listening || wake <= listen_at {
                    // A report that came as the time ran out ends the
                    // call (`select!` may have picked this branch over
                    // it), as a report pipe that closed does.
                    let now = Instant::now();
                    return read_report_until(&session.report, rbuf, params.id, cap, report, now)
                        .unwrap_or(Ended::Interrupt);
                }
                listening = true;
                let watched = session.stdout.watch().and_then(|()| session.stderr.watch());
                if let Err(e) = watched {
                    // The output is still read once the report has come.
                    tracing::warn!(error = %e, "cannot watch a session's output");
                }
            }
        }
    }
}

/// Add `chunk`, read from the report pipe, to `report`: the call's end once
/// its report is whole (see [`take_report`]), `None` until then.
fn gather_report(report: &mut Vec<u8>, chunk: &[u8], id: u64, cap: u64) -> Option<Ended> {
    report.extend_from_slice(chunk);
    match take_report(report, id, cap)? {
        Ok(done) => Some(Ended::Report(Box::new(done))),
        Err(()) => Some(Ended::Flood),
    }
}

/// The report on call `id` in `buf` once it is whole: `Some(Ok)`, or
/// `Some(Err)` when a report announces more than `cap` bytes; `None` while
/// it is incomplete. Whole reports on other calls (written by user code, or
/// one that came after user code forged its call's) are dropped from the
/// front of `buf`.
fn take_report(buf: &mut Vec<u8>, id: u64, cap: u64) -> Option<Result<Report, ()>> {
    let mut at = 0;
    let found = loop {
        let Some(head) = buf.get(at..at + 4) else {
            break None;
        };
        let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as u64;
        if len > cap {
            break Some(Err(()));
        }
        let end = at + 4 + len as usize;
        let Some(body) = buf.get(at + 4..end) else {
            break None;
        };
        // The id alone first: another call's report is skipped unread.
        let on = rmp_serde::from_slice::<ReportId>(body).map_or(None, |r| r.id);
        if on == Some(id) {
            break Some(Ok(rmp_serde::from_slice(body).unwrap_or_else(|_| Report {
                id: on,
                ..Report::default()
            })));
        }
        at = end;
    };
    buf.drain(..at);
    found
}

/// A call's result from its report, trusting nothing in it: values out of
/// their ranges are dropped, artifacts with paths that are not plain
/// relative paths are dropped, and contents past `max_total` bytes in all
/// are omitted.
fn report_output(report: Report, params: &CallParams<'_>) -> RunOutput {
    let max_total = params.max_artifacts_bytes;
    let error = report.error.map(|e| WireError {
        kind: first_chars(e.kind, 1024),
        message: first_chars(e.message, MAX_ERROR_CHARS),
        traceback: first_chars(e.traceback, MAX_ERROR_CHARS),
        line: e
            .line
            .and_then(|v| whole_in(v, 0.0, f64::from(u32::MAX)))
            .map(|v| v as u32),
        errno: e
            .errno
            .and_then(|v| whole_in(v, 0.0, f64::from(i32::MAX)))
            .map(|v| v as i32),
    });
    let mut total = 0u64;
    let artifacts = report
        .artifacts
        .into_iter()
        .map(|mut a| {
            if let Some(data) = &a.data {
                // What the report says of its size counts for nothing
                // where its content is here.
                a.size = data.len() as u64;
                total = total.saturating_add(data.len() as u64);
                if total > max_total {
                    a.data = None;
                    a.omitted = true;
                }
            }
            a
        })
        .collect();
    RunOutput {
        refused: report.refused.map(|r| WireRefusal {
            code: first_chars(r.code, 64),
            message: first_chars(r.message, MAX_ERROR_CHARS),
        }),
        exit_code: whole_in(report.status, -255.0, 255.0).map_or(0, |v| v as i32),
        // Past the cap, the child cut the repr and said so after it.
        result: report.result.map(|r| {
            first_chars(
                r,
                usize::try_from(params.max_result_chars.saturating_add(TRUNCATION_NOTE))
                    .unwrap_or(usize::MAX),
            )
        }),
        error,
        artifacts,
        artifacts_cut: report.artifacts_cut,
        cpu_ms: report
            .cpu_ms
            .filter(|v| v.is_finite() && (0.0..1e15).contains(v)),
        peak_rss_kb: report
            .peak_rss_kb
            .and_then(|v| whole_in(v, 0.0, 1e18))
            .map(|v| v as u64),
        timed_out: report.timed_out,
        ..RunOutput::default()
    }
}

/// `value` if it is a whole number from `low` to `high`.
fn whole_in(value: f64, low: f64, high: f64) -> Option<f64> {
    (value.fract() == 0.0 && (low..=high).contains(&value)).then_some(value)
}

/// The first `max` characters of `text`.
fn first_chars(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => text[..cut].to_string(),
        None => text,
    }
}

/// Whether `mime` can be a `Content-Type`: printable ASCII, at most 255.
fn plain_mime(mime: &str) -> bool {
    mime.len() <= 255 && mime.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
}

/// Whether `path` names a file below a directory: relative, with no empty,
/// `.` or `..` component and no NUL.
fn plain_relative(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 4096
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's pipes with nothing behind them, and the write end of
    /// its report pipe.
    fn session_with_report_pipe() -> (DirectSession, OwnedFd) {
        let (pipes, report_w) = session_pipes();
        let session = DirectSession::new(pipes, None, Duration::from_secs(1)).unwrap();
        (session, report_w)
    }

    /// The server's ends of a session's pipes, as [`DirectSession::new`]
    /// takes them, and the write end of its report pipe.
    fn session_pipes() -> ([OwnedFd; 4], OwnedFd) {
        let pipe = || nix::unistd::pipe().unwrap();
        let (request_r, request_w) = pipe();
        let (stdout, _) = pipe();
        let (stderr, _) = pipe();
        let (report, report_w) = pipe();
        drop(request_r);
        ([request_w, stdout, stderr, report], report_w)
    }

    /// `report` in msgpack, after its length.
    fn framed(report: &impl Serialize) -> Vec<u8> {
        let body = rmp_serde::to_vec_named(report).unwrap();
        let mut framed = (body.len() as u32).to_be_bytes().to_vec();
        framed.extend(body);
        framed
    }

    /// A framed report on call `id` with `status`.
    fn report_on(id: u64, status: u8) -> Vec<u8> {
        #[derive(Serialize)]
        struct Bare {
            id: u64,
            status: u8,
        }
        framed(&Bare { id, status })
    }

    /// The parameters of call `id` as JSON (artifacts up to 1 MiB in all).
    fn call_params(id: u64) -> String {
        format!(
            r#"{{"id": {id}, "code": "", "files": [], "argv": [],
                "limits": {{"cpu_seconds": null}}, "timeout": 0.0, "max_output": 1024,
                "max_artifact_bytes": 1048576, "max_artifacts_bytes": 1048576,
                "max_result_chars": 0, "artifacts": true}}"#
        )
    }

    /// An artifact as a session child reports it.
    #[derive(Serialize)]
    struct Listed<'a> {
        path: &'a str,
        size: u64,
        mime: &'a str,
        #[serde(with = "serde_bytes")]
        data: Option<&'a [u8]>,
    }

    /// A framed report on call `id` listing `artifacts`.
    fn report_listing(id: u64, artifacts: &[Listed<'_>]) -> Vec<u8> {
        #[derive(Serialize)]
        struct Listing<'a> {
            id: u64,
            status: u8,
            artifacts: &'a [Listed<'a>],
        }
        framed(&Listing {
            id,
            status: 0,
            artifacts,
        })
    }

    #[test]
    fn a_forged_list_of_artifacts_is_read_one_at_a_time_and_cut_at_the_cap() {
        let plain = Listed {
            path: "out/a.txt",
            size: 1,
            mime: "text/plain",
            data: None,
        };
        let outside = Listed {
            path: "../a.txt",
            ..plain
        };
        let mut listed = vec![outside];
        listed.extend((0..5 * MAX_ARTIFACTS).map(|_| Listed { ..plain }));
        let mut buf = report_listing(9, &listed);
        let cap = buf.len() as u64;
        let Some(Ok(report)) = take_report(&mut buf, 9, cap) else {
            panic!("no report");
        };
        // Kept as read: the plain ones, up to the cap; none past it held.
        assert_eq!(report.artifacts.len(), MAX_ARTIFACTS);
        assert!(report.artifacts.iter().all(|a| a.path == "out/a.txt"));
        // Not a list at all: the report reads as an empty one.
        #[derive(Serialize)]
        struct NotAList {
            id: u64,
            status: u8,
            artifacts: u8,
        }
        let mut buf = framed(&NotAList {
            id: 9,
            status: 3,
            artifacts: 7,
        });
        let Some(Ok(report)) = take_report(&mut buf, 9, cap) else {
            panic!("no report");
        };
        assert_eq!((report.status, report.artifacts.len()), (0.0, 0));
    }

    #[test]
    fn an_artifacts_size_is_its_contents_not_what_its_report_says() {
        let json = call_params(9);
        let params: CallParams<'_> = serde_json::from_str(&json).unwrap();
        let listed = [
            Listed {
                path: "a.bin",
                size: 0,
                mime: "application/octet-stream",
                data: Some(&[7; 300]),
            },
            Listed {
                path: "big.bin",
                size: 1 << 40,
                mime: "application/octet-stream",
                data: None,
            },
        ];
        let mut buf = report_listing(9, &listed);
        let Some(Ok(report)) = take_report(&mut buf, 9, 1 << 20) else {
            panic!("no report");
        };
        let out = report_output(report, &params);
        let sizes: Vec<_> = out
            .artifacts
            .iter()
            .map(|a| (a.path.as_str(), a.size))
            .collect();
        // One whose contents are not here keeps its stated size.
        assert_eq!(sizes, [("a.bin", 300), ("big.bin", 1 << 40)]);
    }

    fn status_of(ended: Option<Ended>) -> Option<f64> {
        match ended {
            Some(Ended::Report(report)) => Some(report.status),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_report_written_in_parts_while_awaited_awake_is_read_whole() {
        let (mut session, report_w) = session_with_report_pipe();
        let framed = report_on(9, 3);
        let tail = framed[5..].to_vec();
        nix::unistd::write(&report_w, &framed[..5]).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(50));
            nix::unistd::write(&report_w, &tail).unwrap();
            report_w
        });
        let mut report = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        let ended = await_report_awake(&mut session, 9, 1 << 20, &mut report, until);
        assert_eq!(status_of(ended), Some(3.0));
        drop(writer.join().unwrap());
    }

    #[tokio::test]
    async fn a_report_on_another_call_is_skipped_while_awaited_awake() {
        let (mut session, report_w) = session_with_report_pipe();
        let mut both = report_on(8, 7);
        both.extend(report_on(9, 0));
        nix::unistd::write(&report_w, &both).unwrap();
        let mut report = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        let ended = await_report_awake(&mut session, 9, 1 << 20, &mut report, until);
        assert_eq!(status_of(ended), Some(0.0));
    }

    #[tokio::test]
    async fn awaiting_awake_gives_up_at_its_deadline_and_keeps_what_came() {
        let (mut session, report_w) = session_with_report_pipe();
        let framed = report_on(9, 0);
        nix::unistd::write(&report_w, &framed[..6]).unwrap();
        let mut report = Vec::new();
        let started = Instant::now();
        let ended = await_report_awake(
            &mut session,
            9,
            1 << 20,
            &mut report,
            started + Duration::from_millis(2),
        );
        assert!(ended.is_none());
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(2) && waited < Duration::from_millis(500),
            "{waited:?}"
        );
        // The part that came is kept for the call's watch to complete.
        assert_eq!(report, framed[..6]);
        drop(report_w);
    }

    #[test]
    fn a_report_in_the_pipe_when_the_time_runs_out_ends_the_call() {
        // `select!` picks among ready branches at random: with the time
        // already out and the report already in, every round must still
        // read the report.
        let within = Duration::from_secs(20);
        for _ in 0..64 {
            let (pipes, report_w) = session_pipes();
            nix::unistd::write(&report_w, &report_on(9, 4)).unwrap();
            assert_eq!(status_of(watch_past_deadline(pipes, 9, within)), Some(4.0));
        }
        // With no report, the time running out interrupts the call.
        let (pipes, _report_w) = session_pipes();
        let ended = watch_past_deadline(pipes, 9, within);
        assert!(matches!(ended, Some(Ended::Interrupt)));
    }

    /// A call's [`watch`] with its time already out, in a runtime of its
    /// own on a thread of its own: what it ended with, if it did within
    /// `within`.
    fn watch_past_deadline(pipes: [OwnedFd; 4], id: u64, within: Duration) -> Option<Ended> {
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut session = DirectSession::new(pipes, None, Duration::from_secs(1)).unwrap();
                let json = call_params(id);
                let params: CallParams<'_> = serde_json::from_str(&json).unwrap();
                session.stdout.watch().unwrap();
                session.stderr.watch().unwrap();
                let (mut out, mut err) = (Capture::new(1024), Capture::new(1024));
                let past = Instant::now() - Duration::from_millis(1);
                let ended = watch(
                    &mut session,
                    &params,
                    1 << 20,
                    &mut Vec::new(),
                    &mut out,
                    &mut err,
                    None,
                    past,
                    past,
                )
                .await;
                let _ = done.send(ended);
            });
        });
        ended.recv_timeout(within).ok()
    }

    /// Fill the pipe `w` writes to (non-blocking by now) with reports on
    /// no call: how many bytes went in.
    fn fill_with_junk(w: &OwnedFd) -> usize {
        let junk = [0u8, 0, 0, 1, 0xc0].repeat(4096);
        let mut written = 0;
        while let Ok(n) = nix::unistd::write(w, &junk) {
            written += n;
        }
        written
    }

    #[test]
    fn a_report_pipe_kept_full_by_user_code_does_not_hold_off_the_interrupt() {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let (pipes, report_w) = session_pipes();
        // A pipe of 16 reads' worth, full of reports on no call. User code
        // can keep it full for ever: at its deadline the watch reads it
        // once, not until it is empty.
        fcntl(
            report_w.as_fd(),
            FcntlArg::F_SETPIPE_SZ(16 * READ_CHUNK as i32),
        )
        .unwrap();
        fcntl(report_w.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        assert!(fill_with_junk(&report_w) >= 16 * READ_CHUNK);
        // Open still once the session is dropped, for the count below.
        let _read_end = pipes[3].try_clone().unwrap();
        let ended = watch_past_deadline(pipes, 9, Duration::from_secs(20));
        let ended = ended.expect("the watch never ended");
        assert!(matches!(ended, Ended::Interrupt));
        // One read at the deadline (a few more if `select!` took the
        // report's branch first), not sixteen.
        let read = fill_with_junk(&report_w);
        assert!(read > 0 && read <= 4 * READ_CHUNK, "read {read} bytes");
    }

    #[test]
    fn a_report_pipe_closed_when_the_time_runs_out_ends_the_call_as_an_exit() {
        for _ in 0..16 {
            let (pipes, report_w) = session_pipes();
            drop(report_w);
            let ended = watch_past_deadline(pipes, 9, Duration::from_secs(20));
            let ended = ended.expect("the watch never ended");
            assert!(matches!(ended, Ended::Exit));
        }
    }

    #[tokio::test]
    async fn a_closed_or_flooded_report_pipe_ends_awaiting_awake() {
        let until = || Instant::now() + Duration::from_secs(5);
        let (mut session, report_w) = session_with_report_pipe();
        drop(report_w);
        let ended = await_report_awake(&mut session, 9, 1 << 20, &mut Vec::new(), until());
        assert!(ended.is_none(), "a closed pipe is left to the call's watch");
        let (mut session, report_w) = session_with_report_pipe();
        nix::unistd::write(&report_w, &0xFFFF_FFF0u32.to_be_bytes()).unwrap();
        let ended = await_report_awake(&mut session, 9, 1 << 20, &mut Vec::new(), until());
        assert!(matches!(ended, Some(Ended::Flood)));
    }
}

//! Session calls the server answers itself: it writes a call's `exec` frame
//! to the session child, drains the child's stdout and stderr and reads its
//! report, so that the worker is not on the call's path. The worker forked
//! the child and handed over its ends of the child's pipes when the session
//! started; it still interrupts a call at its timeout, and kills the child
//! and says how the session was lost when a call cannot end by a report
//! (see "Sessions" in `python/worker.py`).

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::unix::pipe;

use super::{OutputChunk, OutputSink, OutputStream, RunOutput, Worker};
use crate::error::WorkerError;
use crate::protocol::{self, WireArtifact, WireError};

/// Reads of the child's pipes take at most this much at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Room in a report beyond its artifacts' bytes: the result's repr, the
/// error and its traceback, the artifacts' names (all capped far below).
const REPORT_ROOM: u64 = 32 << 20;

/// Most artifacts one report may list (as the worker's own cap).
const MAX_ARTIFACTS: usize = 1000;

/// The server's ends of a session child's pipes.
#[derive(Debug)]
pub(super) struct DirectSession {
    /// Calls (`exec` frames) are written here.
    request: pipe::Sender,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    /// One report per call (a length-prefixed msgpack map); user code can
    /// write here too, so nothing read from it is trusted.
    report: pipe::Receiver,
    /// How long a call has to stop after its interrupt before the child is
    /// killed and the session lost.
    grace: Duration,
    /// Read buffers for the three pipes, made once for the session's life.
    buffers: [Vec<u8>; 3],
}

/// What the server needs to know of a call, read from its `exec` frame.
#[derive(Deserialize)]
struct CallParams {
    id: u64,
    timeout: f64,
    max_output: u64,
    max_artifacts_bytes: u64,
}

/// The session child's report of one call, as read. Anything that is not
/// a well-formed report reads as an empty one (status 0, nothing else).
#[derive(Default, Deserialize)]
#[serde(default)]
struct Report {
    /// The call it reports on (user code may have written others).
    id: Option<u64>,
    status: i64,
    result: Option<String>,
    error: Option<ReportError>,
    cpu_ms: Option<f64>,
    peak_rss_kb: Option<u64>,
    artifacts: Vec<WireArtifact>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ReportError {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    traceback: String,
    line: Option<i64>,
    errno: Option<i64>,
}

/// The `interrupt` frame: SIGINT to the session child (a call's timeout).
#[derive(Serialize)]
struct Interrupt {
    t: &'static str,
}

/// The `end` frame: kill the session child and say how the session was lost.
#[derive(Serialize)]
struct End {
    t: &'static str,
    id: u64,
    /// `timeout` (it did not stop within the grace), `exit` (it closed its
    /// report pipe: it died or was killed) or `unsent` (it could not be
    /// written to).
    ended: &'static str,
    timeout: f64,
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

    /// Read what `pipe` holds now, without waiting (the call is over).
    fn drain(
        &mut self,
        pipe: &pipe::Receiver,
        buf: &mut [u8],
        stream: OutputStream,
        sink: Option<&OutputSink>,
    ) {
        while self.open {
            match pipe.try_read(buf) {
                Ok(n) => self.take(buf, n, stream, sink),
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
    /// The child closed its report pipe (it died) or sent more than a
    /// report may hold.
    Exit,
    /// The call could not be written to the child.
    Unsent,
}

impl Worker {
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
                match channel.try_io(Interest::READABLE, || {
                    crate::sys::recv_fds(channel.as_fd(), 4)
                }) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    other => return other,
                }
            }
        })
        .await
        .map_err(|_| WorkerError::Unresponsive(within))?
        .map_err(WorkerError::Io)?;
        let count = received.len();
        let [request, stdout, stderr, report]: [OwnedFd; 4] =
            received.try_into().map_err(|_| {
                WorkerError::Internal(format!(
                    "the worker handed over {count} descriptors for its session, not 4"
                ))
            })?;
        self.session = Some(DirectSession {
            request: pipe::Sender::from_owned_fd(request).map_err(WorkerError::Io)?,
            stdout: pipe::Receiver::from_owned_fd(stdout).map_err(WorkerError::Io)?,
            stderr: pipe::Receiver::from_owned_fd(stderr).map_err(WorkerError::Io)?,
            report: pipe::Receiver::from_owned_fd(report).map_err(WorkerError::Io)?,
            grace,
            buffers: [
                vec![0; READ_CHUNK],
                vec![0; READ_CHUNK],
                vec![0; READ_CHUNK],
            ],
        });
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
        let hard = started + deadline;
        let mut out = Capture::new(params.max_output);
        let mut err = Capture::new(params.max_output);
        let mut timed_out = false;
        // Whatever user code wrote to the report pipe after the last call's
        // report is no report of this call.
        let mut stale = [0u8; 4096];
        while matches!(session.report.try_read(&mut stale), Ok(n) if n > 0) {}
        let write = tokio::time::timeout_at(hard.into(), session.request.write_all(frame)).await;
        let ended = match write {
            Err(_) => return Err(WorkerError::Unresponsive(deadline)),
            Ok(Err(_)) => Ended::Unsent,
            Ok(Ok(())) => {
                let cap = params
                    .max_artifacts_bytes
                    .saturating_add(REPORT_ROOM)
                    .min(protocol::MAX_FRAME_BYTES as u64);
                let interrupt_at = started + Duration::from_secs_f64(params.timeout.max(0.0));
                let mut kill_at: Option<Instant> = None;
                let mut report = Vec::new();
                let [obuf, ebuf, rbuf] = &mut session.buffers;
                loop {
                    let wake = kill_at.unwrap_or(interrupt_at).min(hard);
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
                                break Ended::Exit;
                            }
                            report.extend_from_slice(&rbuf[..n]);
                            match take_report(&mut report, params.id, cap) {
                                Some(Ok(done)) => break Ended::Report(Box::new(done)),
                                Some(Err(())) => break Ended::Exit,
                                None => {}
                            }
                        }
                        () = tokio::time::sleep_until(wake.into()) => {
                            let now = Instant::now();
                            if now >= hard {
                                return Err(WorkerError::Unresponsive(deadline));
                            }
                            if kill_at.is_some() {
                                break Ended::Timeout;
                            }
                            timed_out = true;
                            kill_at = Some(now + session.grace);
                            interrupt(self.stdin.as_mut()).await?;
                        }
                    }
                }
            }
        };
        let session = self.session.as_mut().expect("a direct session");
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut result = match ended {
            Ended::Report(report) => {
                // Output written before the report is in the pipes now.
                let buf = &mut session.buffers[0];
                out.drain(&session.stdout, buf, OutputStream::Stdout, output);
                err.drain(&session.stderr, buf, OutputStream::Stderr, output);
                report_output(*report, params.max_artifacts_bytes)
            }
            how => {
                let ended = match how {
                    Ended::Timeout => "timeout",
                    Ended::Unsent => "unsent",
                    _ => "exit",
                };
                let end = protocol::encode_frame(&End {
                    t: "end",
                    id: params.id,
                    ended,
                    timeout: params.timeout,
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

/// Send `interrupt` to the worker (the call's timeout).
async fn interrupt(channel: Option<&mut tokio::net::UnixStream>) -> Result<(), WorkerError> {
    let channel = channel.ok_or(WorkerError::Crashed { exited: None })?;
    let frame =
        protocol::encode_frame(&Interrupt { t: "interrupt" }).map_err(WorkerError::Protocol)?;
    channel
        .write_all(&frame)
        .await
        .map_err(|_| WorkerError::Crashed { exited: None })
}

/// The report on call `id` in `buf` once it is whole: `Some(Ok)`, or
/// `Some(Err)` when a report announces more than `cap` bytes; `None` while
/// it is incomplete. Whole reports on other calls (written by user code, or
/// one that came after user code forged its call's) are dropped from the
/// front of `buf`.
fn take_report(buf: &mut Vec<u8>, id: u64, cap: u64) -> Option<Result<Report, ()>> {
    loop {
        let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as u64;
        if len > cap {
            return Some(Err(()));
        }
        let end = 4 + len as usize;
        let report: Report = rmp_serde::from_slice(buf.get(4..end)?).unwrap_or_default();
        if report.id == Some(id) {
            return Some(Ok(report));
        }
        buf.drain(..end);
    }
}

/// A call's result from its report, trusting nothing in it: values out of
/// their ranges are dropped, artifacts with paths that are not plain
/// relative paths are dropped, and contents past `max_total` bytes in all
/// are omitted.
fn report_output(report: Report, max_total: u64) -> RunOutput {
    let error = report.error.map(|e| WireError {
        kind: e.kind,
        message: e.message,
        traceback: e.traceback,
        line: e.line.and_then(|v| u32::try_from(v).ok()),
        errno: e
            .errno
            .and_then(|v| i32::try_from(v).ok())
            .filter(|v| *v >= 0),
    });
    let mut total = 0u64;
    let artifacts = report
        .artifacts
        .into_iter()
        .filter(|a| plain_relative(&a.path) && a.mime.len() <= 255)
        .take(MAX_ARTIFACTS)
        .map(|mut a| {
            if let Some(data) = &a.data {
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
        exit_code: i32::try_from(report.status)
            .ok()
            .filter(|s| (-255..=255).contains(s))
            .unwrap_or(0),
        result: report.result,
        error,
        artifacts,
        cpu_ms: report
            .cpu_ms
            .filter(|v| v.is_finite() && (0.0..1e15).contains(v)),
        peak_rss_kb: report.peak_rss_kb.filter(|v| *v < 1 << 63),
        ..RunOutput::default()
    }
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

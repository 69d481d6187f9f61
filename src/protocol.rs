//! The wire protocol between the server and `python/worker.py`.
//!
//! Every frame is a 4-byte big-endian unsigned length followed by that many
//! bytes of one msgpack map (a clean run's `exec` frame excepted: see below).
//! The map's `t` key names the frame type. Every field listed is in every
//! frame of its type, except those marked optional.
//!
//! | direction        | `t`       | fields                                                        |
//! |------------------|-----------|---------------------------------------------------------------|
//! | worker -> server | `ready`   | `protocol`, `python` (version), `executable`, `pid`: once,    |
//! |                  |           | after preloading and forking the first child; optional:       |
//! |                  |           | `code` (bin: bytecode magic + the marshalled bootstrap, when  |
//! |                  |           | the worker compiled it rather than read it)                   |
//! | worker -> server | `result`  | `id`, `stdout`, `stderr` (bin), `exit_code` (-N: killed by    |
//! |                  |           | signal N), `signal` (its number, or nil), `timed_out`,        |
//! |                  |           | `stdout_truncated`, `stderr_truncated`, `duration_ms`,        |
//! |                  |           | `result` (repr or nil), `error` (nil, or the exception that   |
//! |                  |           | ended the run: `type`, `message`, `traceback`, `line` (int    |
//! |                  |           | or nil), `errno` (int or nil)), `artifacts` (maps of `path`,  |
//! |                  |           | `size`, `mime`, and `data` (bin) or `omitted`: true);         |
//! |                  |           | optional: `cpu_ms`, `peak_rss_kb` (the run's CPU time and     |
//! |                  |           | peak RSS, KiB: as its process measured them just before it    |
//! |                  |           | reported, if it did; with `rusage`, from reaping it),         |
//! |                  |           | `disk_exceeded` (true: killed over `limits.disk_bytes`, or    |
//! |                  |           | ended over it);                                               |
//! |                  |           | `artifacts_cut` (true: there were more files than listed);    |
//! |                  |           | `returned` (str: the JSON of the value `call` returned) or    |
//! |                  |           | `returned_size` (its bytes, when over `max_artifact_bytes`);  |
//! |                  |           | in session mode `session_lost` (a reason, or nil) and         |
//! |                  |           | `refused` (`code`, `message`: the call's input files could    |
//! |                  |           | not be written, and its code did not run);                    |
//! |                  |           | `cleaning` (true: the run left many files; the worker reads   |
//! |                  |           | no request before its `cleaned` frame)                        |
//! | worker -> server | `result`  | `id`, `exit_code` (0), `pid`: the answer to `session`, with   |
//! |                  |           | the session child's pid                                       |
//! | worker -> server | `output`  | `id`, `stream` (`stdout`/`stderr`), `data` (bin): output of a |
//! |                  |           | run whose `exec` asked for `stream`, as it comes              |
//! | worker -> server | `error`   | `id` (nil at startup), `message`, `traceback`: a fault of the |
//! |                  |           | worker itself; optional `retire`: true when it ran nothing    |
//! |                  |           | (its scratch root could not be cleared)                       |
//! | worker -> server | `cleaned` | after a `result` with `cleaning`, once the scratch root is    |
//! |                  |           | clear; optional `retire` (true) and `message`: something      |
//! |                  |           | stayed, and the worker refuses every request from now on      |
//! | worker -> server | `echo`    | `value`, `repr`: the answer to `echo`                         |
//! | server -> worker | `exec`    | `id`, `code`, `stdin` (bin or nil), `files` ([path, bin]      |
//! |                  |           | pairs), `argv`, `timeout` (s), `max_output` (bytes per        |
//! |                  |           | stream), `limits`, `stream` (send `output` frames),           |
//! |                  |           | `artifacts` (true, false or globs), `max_artifact_bytes`,     |
//! |                  |           | `max_artifacts_bytes`, `max_result_chars`; optional:          |
//! |                  |           | `rusage` (true: reap the run before answering, and report     |
//! |                  |           | its rusage), `int_max_str_digits` (the run's int/str digit    |
//! |                  |           | limit), `max_image_pixels` (the largest plot saved), `call`   |
//! |                  |           | (`entry`, `args`: JSON text or nil; once the code has run,    |
//! |                  |           | call its function `entry` with `args`, a list as positional   |
//! |                  |           | arguments, a map as keywords, nil as none, else as the one    |
//! |                  |           | argument, and report the JSON of its value as `returned`),    |
//! |                  |           | `compile` (paths of `files`: Python modules the worker        |
//! |                  |           | compiles, as it compiles the code, for the code to find in    |
//! |                  |           | its global `__compiled__`: path -> (code object, the names    |
//! |                  |           | of the functions its top-level expression statements call);   |
//! |                  |           | the code is then a harness that runs them, whose frames a     |
//! |                  |           | traceback leaves out, and an error's `line` is theirs),       |
//! |                  |           | `paused` (true: the run came after a pause, with no other run |
//! |                  |           | in flight; the next child forked warms up at once, unless the |
//! |                  |           | run has `rusage` or the next request is already waiting)      |
//! | server -> worker | `session` | `id`, `limits`, `grace` (s): switch the worker to session     |
//! |                  |           | mode; optional `direct` (true: before its answer the worker   |
//! |                  |           | hands the server its ends of the session child's request,     |
//! |                  |           | stdout, stderr and report pipes, and a pidfd of the child     |
//! |                  |           | where it can, in one message of 4 or 5 fds (SCM_RIGHTS) over  |
//! |                  |           | its stdin, a Unix socket; see below)                          |
//! | server -> worker | `cancel`  | kill the run in flight (its client went away) and answer its  |
//! |                  |           | `result` at once; ignored when that run has already answered, |
//! |                  |           | and by session calls                                          |
//! | server -> worker | `interrupt` | direct session: SIGINT to the session child (a call's       |
//! |                  |           | timeout), answered by a bare `result` once it is sent         |
//! | server -> worker | `end`     | `id`, `ended` (`timeout`, `exit`, `flood` or `unsent`),       |
//! |                  |           | `timeout` (s), `artifacts`, `max_artifact_bytes`,             |
//! |                  |           | `max_artifacts_bytes`, `since` (s since the epoch), `inputs`  |
//! |                  |           | (paths): direct session: the call cannot end by a report; the |
//! |                  |           | worker kills the session child and answers `result` with      |
//! |                  |           | `exit_code`, `signal`, `timed_out`, `session_lost` and the    |
//! |                  |           | files written since `since` (inputs aside) as `artifacts`,    |
//! |                  |           | and `artifacts_cut`                                           |
//! | server -> worker | `release` | `id`: end the session (it was closed): kill its child and     |
//! |                  |           | what it left, clear the scratch root and a private /dev/shm,  |
//! |                  |           | and answer a bare `result` (or `error` with `retire` when     |
//! |                  |           | something stayed); the worker then serves a next `session`    |
//! | server -> worker | `echo`    | `value`: codec check, answered with the value re-encoded      |
//!
//! `limits` maps any of `cpu_seconds`, `memory_bytes`, `file_size_bytes`,
//! `open_files` and `processes` (the run's rlimits) and `disk_bytes` (a clean
//! run is killed once the scratch filesystem holds that much more than before
//! it).
//! `errno` is the `OSError`'s own, `ENOMEM` for a `MemoryError` and `EAGAIN`
//! for a thread the system would not start.
//!
//! In session mode `exec` frames run in the session child's persistent
//! namespace (their `limits.cpu_seconds` is a budget per call), and their
//! `result` frame carries `session_lost` when the session child died or was
//! killed during the call.
//!
//! A direct session's calls bypass the worker: the server writes each call to
//! the session child's request pipe and reads its stdout and stderr itself. On
//! that pipe a call is a pickle (protocol 3, after the 4-byte length) of what
//! the child needs of its `exec` frame, as a tuple: `id`, `code`, `stdin`,
//! `files` (a list of (path, bytes) tuples), `argv`, `limits.cpu_seconds`,
//! `artifacts`, `max_artifact_bytes`, `max_artifacts_bytes`,
//! `max_result_chars` and when its interrupt is due (seconds of the system's
//! `CLOCK_MONOTONIC`: the call's start plus its timeout). The C unpickler reads it in about a microsecond, where
//! the frame's map takes several and the pure-Python msgpack decoder about
//! twenty. Only the server writes that pipe (user code could write its own
//! process's request pipe, but it runs in that process already). The child
//! answers on its report pipe with a 4-byte length and a msgpack map of `id`
//! (the call's), `status`, `result`, `error`, `artifacts` (as in `result`) and
//! optional `cpu_ms`, `peak_rss_kb`, `artifacts_cut`, `refused` (as in
//! `result`) and `timed_out` (true: the call's interrupt came as it was set
//! up, and was raised in place of its code once due). User code can write to
//! that pipe too: the server skips reports of other calls and trusts no field.
//!
//! The server sends a clean run's `exec` frame in Python's marshal format
//! rather than msgpack: a `dict` (its first byte `{` 0x7b, or 0xfb as Python
//! marks one, which begins no msgpack map) of the same fields, holding only
//! `None`, booleans, `int`, `float`, `str`, `bytes`, `list`, `tuple` and
//! `dict`. The worker reads it with the C reader every interpreter has
//! loaded, in a few microseconds, where its pure-Python msgpack decoder
//! takes twenty or more. A session call's `exec` frame stays msgpack: for
//! a direct session the server reads it first.
//!
//! The worker speaks on private duplicates of its original stdin and stdout;
//! user code never writes to them (see the header of `python/worker.py`).
//! A `ready` frame whose `protocol` differs from [`PROTOCOL_VERSION`] is a
//! startup error. Frames larger than [`MAX_FRAME_BYTES`] are protocol errors.

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use tokio_util::codec::LengthDelimitedCodec;

/// Version carried in the `ready` handshake; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 8;

/// Largest frame either side accepts: outputs are capped far below this.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// The codec both directions use: 4-byte big-endian length, then the body.
pub(crate) fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// Per-run resource limits the worker applies in the forked child (rlimits),
/// as the `exec` and `session` frames carry them: the server's configured
/// limits, narrowed by a request's own ([`crate::api::RunLimits`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WireLimits {
    #[serde(skip_serializing_if = "Option::is_none")]
    /// `RLIMIT_CPU`, seconds.
    pub cpu_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// `RLIMIT_AS`, bytes.
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// `RLIMIT_FSIZE`, bytes.
    pub file_size_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// `RLIMIT_NOFILE`.
    pub open_files: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Processes and threads (`RLIMIT_NPROC` for non-root runs; the pids cgroup).
    pub processes: Option<u64>,
    /// Bytes the run may have in its directories at once (below the env's
    /// `disk_bytes`, the size of the worker's scratch tmpfs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
}

/// One input file: a relative path and its bytes, sent as a 2-element array.
#[derive(Debug, Serialize)]
pub struct FileEntry<'a>(pub &'a str, #[serde(with = "serde_bytes")] pub &'a [u8]);

/// The `exec` frame, borrowing everything from the request it came from.
// Each field is described in the protocol table at the top of this file.
#[allow(missing_docs)]
#[derive(Debug, Serialize)]
pub struct ExecFrame<'a> {
    pub t: &'static str,
    pub id: u64,
    pub code: &'a str,
    #[serde(with = "serde_bytes")]
    pub stdin: Option<&'a [u8]>,
    pub files: Vec<FileEntry<'a>>,
    pub argv: &'a [String],
    pub timeout: f64,
    pub max_output: u64,
    pub limits: &'a WireLimits,
    pub stream: bool,
    pub artifacts: WireSelection<'a>,
    pub max_artifact_bytes: u64,
    pub max_artifacts_bytes: u64,
    pub max_result_chars: u64,
    /// Reap the run with `os.wait4` before answering and report its CPU time
    /// and peak RSS. Off by default: the plain path answers before reaping.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rusage: bool,
    /// `sys.set_int_max_str_digits` in the run's child (0: no limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub int_max_str_digits: Option<u32>,
    /// Plots are saved at no more than this many pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_image_pixels: Option<u64>,
    /// Once the code has run, call one of its functions (grading's
    /// function mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<&'a EntryCall>,
    /// Input files the worker compiles as Python modules for the run's code
    /// (grading's test-code mode). The code is then their harness: a
    /// traceback leaves its frames out, and an error's `line` is theirs.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub compile: &'a [String],
}

/// The `call` of an `exec` frame: a function the run's code defines, called
/// once the code has run, whose value comes back as JSON (`returned`).
#[derive(Debug, Clone, Serialize)]
pub struct EntryCall {
    /// The function's name.
    pub entry: String,
    /// The arguments as JSON text: a list is positional, a map keywords,
    /// anything else the one argument; `None`: no argument.
    pub args: Option<String>,
}

/// The `session` frame: switch a worker into session mode (see
/// `python/worker.py`, "Sessions").
#[derive(Debug, Serialize)]
pub(crate) struct SessionFrame<'a> {
    pub t: &'static str,
    pub id: u64,
    /// Limits fixed for the session's life (`cpu_seconds` is per call).
    pub limits: &'a WireLimits,
    /// Seconds a call may take to stop after its interrupt before the
    /// session child is killed.
    pub grace: f64,
    /// The server speaks to the session child itself: the worker hands it
    /// the child's pipes (see `worker/direct.rs`).
    pub direct: bool,
}

/// The `release` frame: end the worker's session and make it ready for
/// another.
#[derive(Debug, Serialize)]
pub(crate) struct Release {
    pub t: &'static str,
    pub id: u64,
}

/// The `cancel` frame: kill the run in flight and answer its result now.
#[derive(Debug, Serialize)]
pub(crate) struct Cancel {
    pub t: &'static str,
}

/// Artifact selection on the wire: a bool or a list of globs.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum WireSelection<'a> {
    /// All new or changed files (`true`), or none.
    All(bool),
    /// Those matching one of the globs.
    Globs(&'a [String]),
}

/// One artifact as the worker reports it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WireArtifact {
    pub path: String,
    pub size: u64,
    pub mime: String,
    #[serde(with = "serde_bytes")]
    pub data: Option<Vec<u8>>,
    pub omitted: bool,
}

/// An uncaught exception as the worker reports it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WireError {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    pub traceback: String,
    pub line: Option<u32>,
    /// The errno the exception carries (see `python/worker.py`), if any.
    #[serde(default)]
    pub errno: Option<i32>,
}

/// Why a session call did not run: its input files could not be written
/// (a directory or link of the session's where one goes, its disk full).
/// `code` is the error code the client gets, `conflict` or `too_large`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WireRefusal {
    pub code: String,
    pub message: String,
}

/// Any frame the worker sends. One flat shape instead of a tagged enum, so
/// that large `stdout`/`stderr` payloads are decoded straight into their
/// buffers without an intermediate copy.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct WorkerFrame {
    pub t: String,
    // ready
    pub protocol: Option<u32>,
    pub python: Option<String>,
    pub executable: Option<String>,
    pub pid: Option<u32>,
    /// The bootstrap's compiled code, when the worker had to compile it.
    #[serde(with = "serde_bytes")]
    pub code: Option<Vec<u8>>,
    // result / error
    pub id: Option<u64>,
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    pub exit_code: i32,
    /// Number of the signal that ended the run, if one did.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: f64,
    pub message: Option<String>,
    pub traceback: Option<String>,
    pub result: Option<String>,
    pub error: Option<WireError>,
    pub artifacts: Vec<WireArtifact>,
    /// The run left more files than `artifacts` lists: the worker's walk
    /// stopped at its entry budget, or more than its most artifacts matched.
    pub artifacts_cut: bool,
    /// User + system CPU time of the run's process (see the table).
    pub cpu_ms: Option<f64>,
    /// Peak resident set of the run's process, KiB (see the table).
    pub peak_rss_kb: Option<u64>,
    /// Session mode: why the session child is gone after this call.
    pub session_lost: Option<String>,
    /// Session mode: the call's input files could not be written in the
    /// session's directory, and its code did not run.
    pub refused: Option<WireRefusal>,
    /// The run went over its `limits.disk_bytes`: killed, or ended over it.
    pub disk_exceeded: bool,
    /// The JSON of the value the `exec` frame's `call` returned.
    pub returned: Option<String>,
    /// That JSON's size in bytes, when it was over `max_artifact_bytes` and
    /// left out.
    pub returned_size: Option<u64>,
    /// An `error` frame answering a request the worker refused to run: its
    /// scratch root could not be cleared after the previous run. Nothing ran;
    /// the request may go to another worker. On a `cleaned` frame: that
    /// clean-up left something, and the worker refuses every request.
    pub retire: bool,
    /// A `result` whose run left many files: the worker clears them before
    /// it reads another request, and says so with a `cleaned` frame.
    pub cleaning: bool,
    // output
    pub stream: Option<String>,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Error decoding or encoding a frame body.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("malformed frame from worker")]
    Decode(#[source] rmp_serde::decode::Error),
    /// The length prefix or the read of a frame failed (an announced length
    /// over [`MAX_FRAME_BYTES`] among them).
    #[error("error reading a frame from worker")]
    Read(#[source] std::io::Error),
    #[error("unexpected frame type {0:?} from worker")]
    UnexpectedType(String),
    #[error("error encoding frame")]
    Encode(#[source] rmp_serde::encode::Error),
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge(usize),
    #[error("error pickling frame")]
    Pickle(#[source] serde_pickle::Error),
    /// What cannot be written in marshal, said as [`crate::marshal`] says it.
    #[error("error marshalling frame: {0}")]
    Marshal(String),
}

/// Encode `value` as a msgpack map, prefixed with its 4-byte length: one
/// buffer, ready for a single `write_all`.
pub fn encode_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = Vec::with_capacity(256);
    frame_into(&mut buf, |out| {
        rmp_serde::encode::write_named(out, value).map_err(FrameError::Encode)
    })?;
    Ok(buf)
}

/// `out` emptied, then a body `write` appends, after its 4-byte length.
fn frame_into(
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), FrameError>,
) -> Result<(), FrameError> {
    out.clear();
    out.extend_from_slice(&[0; 4]);
    write(out)?;
    let len = out.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// `value` in Python's marshal format, prefixed with its 4-byte length: how
/// a clean run's `exec` frame goes to the worker (see the header).
pub fn encode_marshal_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = Vec::with_capacity(256);
    frame_into(&mut buf, |out| {
        crate::marshal::to_writer(out, value).map_err(|e| FrameError::Marshal(e.to_string()))
    })?;
    Ok(buf)
}

/// Add `key: True` to a frame from [`encode_marshal_frame`] whose value is a
/// map (a marshal dict, ended by `0`), in place: a fact known only when the
/// run is handed to a worker (`paused`, see `executor/pace.rs`). Returns
/// whether it could: a frame that is not a dict is left as it is. (The
/// entry's 12 bytes are not held to `MAX_FRAME_BYTES`: a request's own
/// caps keep a frame far below it.)
pub(crate) fn add_marshal_flag(frame: &mut Vec<u8>, key: &str) -> bool {
    if frame.len() < 6 || frame[4] != b'{' || frame.last() != Some(&b'0') {
        return false;
    }
    frame.pop();
    if crate::marshal::to_writer(frame, key).is_err() {
        frame.push(b'0');
        return false;
    }
    frame.extend_from_slice(b"T0");
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    true
}

/// `value` as a pickle (protocol 3), prefixed with its 4-byte length, into
/// `out`: what a direct session's child reads (see the header).
pub(crate) fn pickle_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<(), FrameError> {
    frame_into(out, |out| {
        serde_pickle::to_writer(out, value, serde_pickle::SerOptions::new())
            .map_err(FrameError::Pickle)
    })
}

/// Decode one frame body (without its length prefix).
pub fn decode_frame(body: &BytesMut) -> Result<WorkerFrame, FrameError> {
    rmp_serde::from_slice(body).map_err(FrameError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_added_to_a_marshal_frame_is_one_more_entry() {
        #[derive(Serialize)]
        struct Map {
            t: &'static str,
            n: u8,
        }
        #[derive(Serialize)]
        struct Flagged {
            t: &'static str,
            n: u8,
            paused: bool,
        }
        let mut frame = encode_marshal_frame(&Map { t: "exec", n: 1 }).unwrap();
        assert!(add_marshal_flag(&mut frame, "paused"));
        let expected = encode_marshal_frame(&Flagged {
            t: "exec",
            n: 1,
            paused: true,
        })
        .unwrap();
        assert_eq!(frame, expected);
        // Not a dict: left alone.
        let mut list = encode_marshal_frame(&[1u8, 2]).unwrap();
        let before = list.clone();
        assert!(!add_marshal_flag(&mut list, "paused"));
        assert_eq!(list, before);
    }

    #[test]
    fn frame_carries_big_endian_length() {
        #[derive(Serialize)]
        struct Echo {
            t: &'static str,
            value: u8,
        }
        let frame = encode_frame(&Echo {
            t: "echo",
            value: 1,
        })
        .unwrap();
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
    }

    #[test]
    fn result_frame_decodes_binary_outputs() {
        #[derive(Serialize)]
        struct R<'a> {
            t: &'a str,
            id: u64,
            #[serde(with = "serde_bytes")]
            stdout: &'a [u8],
            exit_code: i32,
            signal: Option<i32>,
        }
        let frame = encode_frame(&R {
            t: "result",
            id: 7,
            stdout: b"4\n\xff",
            exit_code: -9,
            signal: Some(9),
        })
        .unwrap();
        let decoded = decode_frame(&BytesMut::from(&frame[4..])).unwrap();
        assert_eq!(decoded.t, "result");
        assert_eq!(decoded.id, Some(7));
        assert_eq!(decoded.stdout, b"4\n\xff");
        assert_eq!(decoded.exit_code, -9);
        assert_eq!(decoded.signal, Some(9));
        assert!(decoded.stderr.is_empty());
    }

    #[test]
    fn the_worker_header_carries_this_wire_format_text() {
        // From "Every frame" up to the paragraph that differs between the two.
        let ours: Vec<&str> = include_str!("protocol.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| l.trim_start_matches("//!").trim())
            .skip_while(|l| !l.starts_with("Every frame is"))
            .take_while(|l| !l.starts_with("The worker speaks on private duplicates"))
            .collect();
        assert!(ours.len() > 40, "{ours:?}");
        let worker: Vec<&str> = include_str!("../python/worker.py")
            .lines()
            .map(str::trim)
            .collect();
        let found = worker.windows(ours.len()).any(|w| w == ours.as_slice());
        assert!(
            found,
            "python/worker.py's header must carry the wire format text of this module, line for line"
        );
    }

    #[test]
    fn a_pickle_keeps_every_value_and_its_type() {
        use serde_pickle::Value as V;
        #[derive(Serialize)]
        struct Call<'a>(
            &'a str,
            Option<&'a serde_bytes::Bytes>,
            &'a [FileEntry<'a>],
            &'a [&'a str],
            u64,
            i64,
            f64,
            bool,
            Option<u64>,
        );
        let files = [FileEntry("data.bin", b"\x00\xff")];
        let call = Call(
            "print('\u{e9}')",
            Some(serde_bytes::Bytes::new(b"in")),
            &files,
            &["a", "b"],
            u64::MAX,
            -5,
            30.5,
            false,
            None,
        );
        let mut out = vec![1, 2, 3];
        pickle_into(&call, &mut out).unwrap();
        let len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 4);
        let value = serde_pickle::value_from_slice(&out[4..], Default::default()).unwrap();
        assert_eq!(
            value,
            V::Tuple(vec![
                V::String("print('\u{e9}')".into()),
                V::Bytes(b"in".to_vec()),
                V::List(vec![V::Tuple(vec![
                    V::String("data.bin".into()),
                    V::Bytes(b"\x00\xff".to_vec())
                ])]),
                V::List(vec![V::String("a".into()), V::String("b".into())]),
                V::Int(u64::MAX.into()),
                V::I64(-5),
                V::F64(30.5),
                V::Bool(false),
                V::None,
            ])
        );
    }

    #[test]
    fn garbage_is_a_decode_error() {
        let err = decode_frame(&BytesMut::from(&b"\xc1\xc1"[..])).unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)));
    }
}

"""code-executor worker bootstrap.

Started by the server as ``<prefix>/bin/python -I -B -u -c LAUNCH worker.py SCRATCH
[PRELOAD,...]``, where LAUNCH (``src/worker/mod.rs``) compiles this file and runs it
as ``__main__``: run as a script, its syntax tree would stay in memory for the
worker's life.  Standard library only; runs on CPython 3.8 and later.

Wire format (the same text heads ``src/protocol.rs``; a test keeps them equal)
------------------------------------------------------------------------------
Every frame is a 4-byte big-endian unsigned length followed by that many
bytes of one msgpack map (a clean run's `exec` frame excepted: see below).
The map's `t` key names the frame type. Every field listed is in every
frame of its type, except those marked optional.

| direction        | `t`       | fields                                                        |
|------------------|-----------|---------------------------------------------------------------|
| worker -> server | `ready`   | `protocol`, `python` (version), `executable`, `pid`: once,    |
|                  |           | after preloading and forking the first child; optional:       |
|                  |           | `code` (bin: bytecode magic + the marshalled bootstrap, when  |
|                  |           | the worker compiled it rather than read it)                   |
| worker -> server | `result`  | `id`, `stdout`, `stderr` (bin), `exit_code` (-N: killed by    |
|                  |           | signal N), `signal` (its number, or nil), `timed_out`,        |
|                  |           | `stdout_truncated`, `stderr_truncated`, `duration_ms`,        |
|                  |           | `result` (repr or nil), `error` (nil, or the exception that   |
|                  |           | ended the run: `type`, `message`, `traceback`, `line` (int    |
|                  |           | or nil), `errno` (int or nil)), `artifacts` (maps of `path`,  |
|                  |           | `size`, `mime`, and `data` (bin) or `omitted`: true);         |
|                  |           | optional: `cpu_ms`, `peak_rss_kb` (the run's CPU time and     |
|                  |           | peak RSS, KiB: as its process measured them just before it    |
|                  |           | reported, if it did; with `rusage`, from reaping it),         |
|                  |           | `disk_exceeded` (true: killed over `limits.disk_bytes`, or    |
|                  |           | ended over it);                                               |
|                  |           | `artifacts_cut` (true: there were more files than listed);    |
|                  |           | `returned` (str: the JSON of the value `call` returned) or    |
|                  |           | `returned_size` (its bytes, when over `max_artifact_bytes`);  |
|                  |           | in session mode `session_lost` (a reason, or nil) and         |
|                  |           | `refused` (`code`, `message`: the call's input files could    |
|                  |           | not be written, and its code did not run);                    |
|                  |           | `cleaning` (true: the run left many files; the worker reads   |
|                  |           | no request before its `cleaned` frame)                        |
| worker -> server | `result`  | `id`, `exit_code` (0), `pid`: the answer to `session`, with   |
|                  |           | the session child's pid                                       |
| worker -> server | `output`  | `id`, `stream` (`stdout`/`stderr`), `data` (bin): output of a |
|                  |           | run whose `exec` asked for `stream`, as it comes              |
| worker -> server | `error`   | `id` (nil at startup), `message`, `traceback`: a fault of the |
|                  |           | worker itself; optional `retire`: true when it ran nothing    |
|                  |           | (its scratch root could not be cleared)                       |
| worker -> server | `cleaned` | after a `result` with `cleaning`, once the scratch root is    |
|                  |           | clear; optional `retire` (true) and `message`: something      |
|                  |           | stayed, and the worker refuses every request from now on      |
| worker -> server | `echo`    | `value`, `repr`: the answer to `echo`                         |
| server -> worker | `exec`    | `id`, `code`, `stdin` (bin or nil), `files` ([path, bin]      |
|                  |           | pairs), `argv`, `timeout` (s), `max_output` (bytes per        |
|                  |           | stream), `limits`, `stream` (send `output` frames),           |
|                  |           | `artifacts` (true, false or globs), `max_artifact_bytes`,     |
|                  |           | `max_artifacts_bytes`, `max_result_chars`; optional:          |
|                  |           | `rusage` (true: reap the run before answering, and report     |
|                  |           | its rusage), `int_max_str_digits` (the run's int/str digit    |
|                  |           | limit), `max_image_pixels` (the largest plot saved), `call`   |
|                  |           | (`entry`, `args`: JSON text or nil; once the code has run,    |
|                  |           | call its function `entry` with `args`, a list as positional   |
|                  |           | arguments, a map as keywords, nil as none, else as the one    |
|                  |           | argument, and report the JSON of its value as `returned`),    |
|                  |           | `compile` (paths of `files`: Python modules the worker        |
|                  |           | compiles, as it compiles the code, for the code to find in    |
|                  |           | its global `__compiled__`: path -> (code object, the names    |
|                  |           | of the functions its top-level expression statements call);   |
|                  |           | the code is then a harness that runs them, whose frames a     |
|                  |           | traceback leaves out, and an error's `line` is theirs),       |
|                  |           | `paused` (true: the run came after a pause, with no other run |
|                  |           | in flight; the next child forked warms up at once, unless the |
|                  |           | run has `rusage` or the next request is already waiting)      |
| server -> worker | `session` | `id`, `limits`, `grace` (s): switch the worker to session     |
|                  |           | mode; optional `direct` (true: before its answer the worker   |
|                  |           | hands the server its ends of the session child's request,     |
|                  |           | stdout, stderr and report pipes, and a pidfd of the child     |
|                  |           | where it can, in one message of 4 or 5 fds (SCM_RIGHTS) over  |
|                  |           | its stdin, a Unix socket; see below)                          |
| server -> worker | `cancel`  | kill the run in flight (its client went away) and answer its  |
|                  |           | `result` at once; ignored when that run has already answered, |
|                  |           | and by session calls                                          |
| server -> worker | `interrupt` | direct session: SIGINT to the session child (a call's       |
|                  |           | timeout), answered by a bare `result` once it is sent         |
| server -> worker | `end`     | `id`, `ended` (`timeout`, `exit`, `flood` or `unsent`),       |
|                  |           | `timeout` (s), `artifacts`, `max_artifact_bytes`,             |
|                  |           | `max_artifacts_bytes`, `since` (s since the epoch), `inputs`  |
|                  |           | (paths): direct session: the call cannot end by a report; the |
|                  |           | worker kills the session child and answers `result` with      |
|                  |           | `exit_code`, `signal`, `timed_out`, `session_lost` and the    |
|                  |           | files written since `since` (inputs aside) as `artifacts`,    |
|                  |           | and `artifacts_cut`                                           |
| server -> worker | `release` | `id`: end the session (it was closed): kill its child and     |
|                  |           | what it left, clear the scratch root and a private /dev/shm,  |
|                  |           | and answer a bare `result` (or `error` with `retire` when     |
|                  |           | something stayed); the worker then serves a next `session`    |
| server -> worker | `echo`    | `value`: codec check, answered with the value re-encoded      |

`limits` maps any of `cpu_seconds`, `memory_bytes`, `file_size_bytes`,
`open_files` and `processes` (the run's rlimits) and `disk_bytes` (a clean
run is killed once the scratch filesystem holds that much more than before
it).
`errno` is the `OSError`'s own, `ENOMEM` for a `MemoryError` and `EAGAIN`
for a thread the system would not start.

In session mode `exec` frames run in the session child's persistent
namespace (their `limits.cpu_seconds` is a budget per call), and their
`result` frame carries `session_lost` when the session child died or was
killed during the call.

A direct session's calls bypass the worker: the server writes each call to
the session child's request pipe and reads its stdout and stderr itself. On
that pipe a call is a pickle (protocol 3, after the 4-byte length) of what
the child needs of its `exec` frame, as a tuple: `id`, `code`, `stdin`,
`files` (a list of (path, bytes) tuples), `argv`, `limits.cpu_seconds`,
`artifacts`, `max_artifact_bytes`, `max_artifacts_bytes`,
`max_result_chars` and when its interrupt is due (seconds of the system's
`CLOCK_MONOTONIC`: the call's start plus its timeout). The C unpickler reads it in about a microsecond, where
the frame's map takes several and the pure-Python msgpack decoder about
twenty. Only the server writes that pipe (user code could write its own
process's request pipe, but it runs in that process already). The child
answers on its report pipe with a 4-byte length and a msgpack map of `id`
(the call's), `status`, `result`, `error`, `artifacts` (as in `result`) and
optional `cpu_ms`, `peak_rss_kb`, `artifacts_cut`, `refused` (as in
`result`) and `timed_out` (true: the call's interrupt came as it was set
up, and was raised in place of its code once due). User code can write to
that pipe too: the server skips reports of other calls and trusts no field.

The server sends a clean run's `exec` frame in Python's marshal format
rather than msgpack: a `dict` (its first byte `{` 0x7b, or 0xfb as Python
marks one, which begins no msgpack map) of the same fields, holding only
`None`, booleans, `int`, `float`, `str`, `bytes`, `list`, `tuple` and
`dict`. The worker reads it with the C reader every interpreter has
loaded, in a few microseconds, where its pure-Python msgpack decoder
takes twenty or more. A session call's `exec` frame stays msgpack: for
a direct session the server reads it first.

The protocol channel lives on private duplicates of the original stdin and
stdout.  Descriptors 0 and 1 of the worker are then pointed at /dev/null and
stderr, so a stray ``print`` can never corrupt a frame; each run's child gets
fresh pipes for its fds 0, 1 and 2.

Runs
----
For every ``exec`` the worker hands the request to a child forked ahead of
time, with the code compiled where it can (``precompile``).  The child lives
in its own process group with a fresh ``__main__``, an empty working directory
(SCRATCH/run, emptied and made anew between runs) and the request's resource
limits; its stdout and stderr are captured at the file-descriptor level.  The
worker supervises it (``supervise``: it drains both pipes, keeping at most
``max_output`` bytes of each, and enforces the deadline by killing the child's
process group), answers with ``result`` and then, off the request path, has
the next child forked, which warms up while no client waits: at once when
the server marked the run ``paused`` (it came after a pause, with nothing
else in flight), else if its request has not come within ``WARM_AFTER_MS``.
Children are
forked by the worker's zygote (see "The zygote"), so that the worker's own
pages are never shared copy-on-write with a child.  Session calls are
supervised by the same loop (see "Sessions").

Each wake-up of the worker costs CPU on the run's path, so a run wakes it as
few times as it can: its output pipes are watched only once it has run
``QUIET`` (or from the start when streamed), so that a short run's output is
read after its report, not before; and the zygote's answer to a fork (the new
child's pid) is read when the next request needs that child, by then long
there, not waited for.  What a run leaves is found with as few calls: an
empty run directory is removed rather than listed for artifacts, and on a
tmpfs the scratch root's size tells that it holds nothing once the run's two
directories are removed (``clear_scratch``). """

import errno
import gc
import marshal
import os
import select
import _signal
import stat
import struct
import sys
import time
import types

PROTOCOL_VERSION = 8
MAX_FRAME = 1 << 30
RUN_FILENAME = "<code>"
READ_CHUNK = 1 << 16
MAX_ERROR_CHARS = 64 * 1024
MAX_ARTIFACTS = 1000
# The most entries (files, directories, anything) one walk of a run's or
# session's directory reads: past it the walk stops and its listing says it
# was cut. The scratch tmpfs holds that many inodes by default (one per
# 4 KiB of disk_bytes, some the worker's own); a larger disk_bytes holds
# more, and without the tmpfs a run can leave millions: reading them all
# would hold the worker for seconds after the run's own deadline.
WALK_ENTRIES = 1 << 16
# A run that leaves more entries than this to clear (files, directories,
# anything: ~10 ms of clean-up) has its answer say ``cleaning``: the server
# then sends the worker nothing until its ``cleaned`` frame, and runs the
# next request on another worker meanwhile (see heavy_cleanup).
HEAVY_CLEANUP = 2048
# The same for a filesystem that does not count its inodes (btrfs): a
# directory of the run's that grew by this many bytes holds about that many
# entries (~20 bytes each).
HEAVY_DIR_BYTES = 64 * 1024
# Room in a report beyond its value's repr, a returned value and artifacts
# (see report_cap): the error's message and traceback (MAX_ERROR_CHARS
# each, up to 4 bytes a character), the imported names, the numbers.
REPORT_ROOM = 1 << 20
# The most containers and items a report the worker reads decodes into: one
# holds under a hundred (its fields, its error's, up to LEARN_REPORTED
# imported names). User code can write its own report, and a frame of empty
# maps, one byte each, would make a Python object of every byte.
REPORT_ITEMS = 1 << 16
TOO_MANY_ITEMS = "msgpack data holds too many items"
# The most reads of one pipe per wake-up: a run whose processes keep a pipe
# full does not hold its worker off its deadline; what is left is read on
# the next one. After the run the same number reads a pipe of the largest
# size an unprivileged process can give it (1 MiB, pipe-max-size's default)
# to its end.
PIPE_READS = 17
# How long a run that does not stream goes before its worker watches its
# stdout and stderr: a short run's output is read once it has reported, so
# its print does not wake the worker first. A run that fills a pipe (64 KiB)
# sooner waits at most this long for it to be read.
QUIET = 0.002
# How long a child waits for its request before it warms up (see rehearse),
# unless the server said its last run came after a pause (``paused``: then
# at once). A request that comes sooner comes from a client sending its
# runs back to back, or nearly: the machine is busy and its CPU is what runs
# cost, so the child spends none of it ahead of the request. With runs taken
# in turns by a pool of four, a child's request comes three runs after its
# fork, ~5 ms back to back; a client that pauses gets its request handled by
# a child that warmed up while it waited.
WARM_AFTER_MS = 20
# A worker that has had no request for this long since its start (a spare
# in its pool) has its zygote prepare for later runs (prepare_later_runs)
# then, before any run.
PREPARE_IDLE_MS = 100
# A request like the server's, for warming up the request path ahead of time.
# Its code ends in an expression, as many do: the value's path is warmed too.
WARM_REQUEST = {"t": "exec", "id": 0, "code": "_ = [str(i) for i in range(8)]\nlen(_) + 1",
                "stdin": None, "files": [], "argv": [], "timeout": 1.0, "max_output": 1,
                "limits": {"cpu_seconds": 1, "memory_bytes": 1 << 31, "file_size_bytes": 1 << 30,
                           "open_files": 1024, "processes": 64},
                "stream": False, "artifacts": True, "max_artifact_bytes": 1 << 20,
                "max_artifacts_bytes": 1 << 25, "max_result_chars": 10000}
resource = None  # imported by main(); the module is absent on non-Unix builds

# ---------------------------------------------------------------------------
# msgpack codec: the subset the protocol needs (nil, bool, int up to 64 bits,
# float, str, bin, array, map).  The ``msgpack`` package is used instead when
# it is importable, unless CODE_EXECUTOR_PURE_CODEC is set.
# ---------------------------------------------------------------------------

_pack_be = struct.pack
_unpack_from = struct.unpack_from
_BYTE = [bytes((i,)) for i in range(256)]
# Encoded short str map keys, most of them the protocol's own names: each is
# encoded once.  Bounded, since maps may carry other keys too.
_KEYS = {}
_MAX_KEYS = 512


def _encode(obj, out):
    t = type(obj)
    if t is str:
        try:
            data = obj.encode("utf-8")
        except UnicodeEncodeError:
            data = utf8_escaped(obj)
        n = len(data)
        if n < 32:
            out.append(_BYTE[0xA0 | n])
        else:
            _size(out, n, 0xD9, 0xDA, 0xDB)
        out.append(data)
    elif t is int:
        if 0 <= obj < 0x80:
            out.append(_BYTE[obj])
        else:
            _encode_int(obj, out)
    elif obj is None:
        out.append(b"\xc0")
    elif t is bool:
        out.append(b"\xc3" if obj else b"\xc2")
    elif t is dict:
        n = len(obj)
        if n < 16:
            out.append(_BYTE[0x80 | n])
        else:
            _size(out, n, None, 0xDE, 0xDF)
        keys = _KEYS
        for key, value in obj.items():
            encoded = keys.get(key) if type(key) is str else None
            if encoded is None:
                start = len(out)
                _encode(key, out)
                if type(key) is str and len(key) < 32 and len(keys) < _MAX_KEYS:
                    keys[key] = b"".join(out[start:])
            else:
                out.append(encoded)
            _encode(value, out)
    elif t is float:
        out.append(_pack_be("!Bd", 0xCB, obj))
    elif t is bytes or t is bytearray or t is memoryview:
        _encode_bin(obj, out)
    elif t is list or t is tuple:
        _encode_array(obj, out)
    else:
        _encode_other(obj, out)


def _encode_int(obj, out):
    if -32 <= obj < 0:
        out.append(_BYTE[obj & 0xFF])
    elif 0 <= obj <= 0xFF:
        out.append(_pack_be("!BB", 0xCC, obj))
    elif 0 <= obj <= 0xFFFF:
        out.append(_pack_be("!BH", 0xCD, obj))
    elif 0 <= obj <= 0xFFFFFFFF:
        out.append(_pack_be("!BI", 0xCE, obj))
    elif 0 <= obj <= 0xFFFFFFFFFFFFFFFF:
        out.append(_pack_be("!BQ", 0xCF, obj))
    elif -0x80 <= obj < 0:
        out.append(_pack_be("!Bb", 0xD0, obj))
    elif -0x8000 <= obj < 0:
        out.append(_pack_be("!Bh", 0xD1, obj))
    elif -0x80000000 <= obj < 0:
        out.append(_pack_be("!Bi", 0xD2, obj))
    elif -0x8000000000000000 <= obj < 0:
        out.append(_pack_be("!Bq", 0xD3, obj))
    else:
        raise OverflowError("integer out of msgpack range")


def _size(out, n, code8, code16, code32):
    """The type byte and length of a str, bin, array or map too long for
    the one-byte forms (``code8`` None: the type has no 8-bit length)."""
    if code8 is not None and n <= 0xFF:
        out.append(_pack_be("!BB", code8, n))
    elif n <= 0xFFFF:
        out.append(_pack_be("!BH", code16, n))
    else:
        out.append(_pack_be("!BI", code32, n))


def _encode_bin(obj, out):
    _size(out, len(obj) if type(obj) is not memoryview else obj.nbytes, 0xC4, 0xC5, 0xC6)
    out.append(obj)


def _encode_array(obj, out):
    n = len(obj)
    if n < 16:
        out.append(_BYTE[0x90 | n])
    else:
        _size(out, n, None, 0xDC, 0xDD)
    for item in obj:
        _encode(item, out)


def _encode_other(obj, out):
    """Subclasses of the protocol's types (an IntEnum, a str subclass), as
    their base type's value: a subclass's own methods are not called (a
    run's value may be one, and its ``__str__`` is the user's code)."""
    if isinstance(obj, bool):
        out.append(b"\xc3" if obj else b"\xc2")
    elif isinstance(obj, int):
        _encode(int.__int__(obj), out)
    elif isinstance(obj, float):
        _encode(float.__float__(obj), out)
    elif isinstance(obj, str):
        _encode(str.__str__(obj), out)
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        _encode_bin(obj, out)
    elif isinstance(obj, (list, tuple)):
        _encode_array(obj, out)
    elif isinstance(obj, dict):
        _encode(dict(dict.items(obj)), out)
    else:
        raise TypeError("cannot encode %s" % type(obj).__name__)


def utf8_escaped(text):
    """``text``, which holds lone surrogates that UTF-8 cannot carry, as
    UTF-8 with each escaped: an undecodable byte of a file name (``\\udcff``,
    as ``os.fsdecode`` makes it) as ``\\xff``, any other as ``\\ud800``.
    The server takes only valid UTF-8 for a string (a file a run names
    ``b"\\xff"``, an exception's message, a ``__repr__``'s value)."""
    try:
        return (text.encode("utf-8", "surrogateescape")
                .decode("utf-8", "backslashreplace").encode("utf-8"))
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def pure_packb(obj):
    out = []
    _encode(obj, out)
    return b"".join(out)


_FIXED = {
    0xCC: ("!B", 1), 0xCD: ("!H", 2), 0xCE: ("!I", 4), 0xCF: ("!Q", 8),
    0xD0: ("!b", 1), 0xD1: ("!h", 2), 0xD2: ("!i", 4), 0xD3: ("!q", 8),
    0xCA: ("!f", 4), 0xCB: ("!d", 8),
}
_WIDTH = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}


def _decode(buf, pos):
    b = buf[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xA0:
        if b <= 0xBF:
            end = pos + (b & 0x1F)
            if end > len(buf):
                raise ValueError("truncated msgpack data")
            return buf[pos:end].decode("utf-8", "surrogateescape"), end
        if b >= 0xE0:
            return b - 0x100, pos
    elif b <= 0x8F:
        return _decode_map(buf, pos, b & 0x0F)
    elif b <= 0x9F:
        return _decode_array(buf, pos, b & 0x0F)
    if b == 0xC0:
        return None, pos
    if b == 0xC2:
        return False, pos
    if b == 0xC3:
        return True, pos
    fixed = _FIXED.get(b)
    if fixed is not None:
        return _unpack_from(fixed[0], buf, pos)[0], pos + fixed[1]
    width = _WIDTH.get(b)
    if width is not None:
        n = int.from_bytes(buf[pos:pos + width], "big")
        pos += width
        end = pos + n
        if end > len(buf):
            raise ValueError("truncated msgpack data")
        if b >= 0xD9:
            return buf[pos:end].decode("utf-8", "surrogateescape"), end
        return bytes(memoryview(buf)[pos:end]), end
    if b in (0xDC, 0xDD):
        width = 2 if b == 0xDC else 4
        n = int.from_bytes(buf[pos:pos + width], "big")
        return _decode_array(buf, pos + width, n)
    if b in (0xDE, 0xDF):
        width = 2 if b == 0xDE else 4
        n = int.from_bytes(buf[pos:pos + width], "big")
        return _decode_map(buf, pos + width, n)
    raise ValueError("unsupported msgpack type byte 0x%02x" % b)


# How many more containers and items a decoding may make (see
# report_unpackb): a budget for reports, none for the server's frames.
_items = [float("inf")]


def _decode_array(buf, pos, n):
    _items[0] -= n + 1
    if _items[0] < 0:
        raise ValueError(TOO_MANY_ITEMS)
    items = []
    for _ in range(n):
        item, pos = _decode(buf, pos)
        items.append(item)
    return items, pos


def _decode_map(buf, pos, n):
    _items[0] -= 2 * n + 1
    if _items[0] < 0:
        raise ValueError(TOO_MANY_ITEMS)
    result = {}
    for _ in range(n):
        b = buf[pos]
        if 0xA0 <= b <= 0xBF:  # the usual key: a short str
            start = pos + 1
            pos = start + (b & 0x1F)
            if pos > len(buf):
                raise ValueError("truncated msgpack data")
            key = buf[start:pos].decode("utf-8", "surrogateescape")
        else:
            key, pos = _decode(buf, pos)
        b = buf[pos]
        if b <= 0x7F:
            result[key] = b
            pos += 1
        else:
            result[key], pos = _decode(buf, pos)
    return result, pos


def pure_unpackb(data):
    # bytes and bytearray index and slice fast; anything else becomes bytes.
    buf = data if type(data) is bytes or type(data) is bytearray else bytes(data)
    try:
        value, pos = _decode(buf, 0)
    except (IndexError, struct.error):
        raise ValueError("truncated msgpack data")
    if pos != len(buf):
        raise ValueError("extra bytes after msgpack value")
    return value


def pure_report_unpackb(data):
    _items[0] = REPORT_ITEMS
    try:
        return pure_unpackb(data)
    finally:
        _items[0] = float("inf")


packb, unpackb, report_unpackb = pure_packb, pure_unpackb, pure_report_unpackb
if not os.environ.get("CODE_EXECUTOR_PURE_CODEC"):
    try:
        import msgpack as _msgpack

        def packb(obj):
            try:
                return _msgpack.packb(obj, use_bin_type=True)
            except UnicodeEncodeError:  # a lone surrogate (see utf8_escaped)
                return pure_packb(obj)

        def unpackb(data):
            return _msgpack.unpackb(data, raw=False, strict_map_key=False)

        def report_unpackb(data):
            # Each container counted as the pure decoder counts it, once it
            # is made (none is longer than REPORT_ITEMS): what is made stays
            # within a few times the budget. A map's pairs, not its dict,
            # which repeated keys would make short.
            left = [REPORT_ITEMS]

            def counted(items):
                left[0] -= len(items) + 1
                if left[0] < 0:
                    raise ValueError(TOO_MANY_ITEMS)
                return items

            def counted_pairs(pairs):
                left[0] -= len(pairs)  # a key and a value each
                return dict(counted(pairs))

            return _msgpack.unpackb(data, raw=False, strict_map_key=False,
                                    max_array_len=REPORT_ITEMS, max_map_len=REPORT_ITEMS,
                                    object_pairs_hook=counted_pairs, list_hook=counted)
    except Exception:
        pass


# ---------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------

class ChannelClosed(Exception):
    """The peer closed the channel cleanly, between two frames."""


def read_exact(fileobj, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = fileobj.readinto(view[got:])
        if not k:
            if got == 0:
                return None
            raise EOFError("channel closed inside a frame")
        got += k
    return buf


def read_frame(fileobj):
    head = read_exact(fileobj, 4)
    if head is None:
        raise ChannelClosed()
    (n,) = struct.unpack("!I", head)
    if n > MAX_FRAME:
        raise ValueError("frame of %d bytes exceeds the limit" % n)
    body = read_exact(fileobj, n)
    if body is None and n:
        raise EOFError("channel closed inside a frame")
    return body or bytearray()


class FrameReader:
    """Frames read from the pipe ``fd``, each in one ``read`` when it holds
    all of it (``read_frame`` reads the length, then the body: two). What a
    read brings beyond a frame is kept for the next."""

    __slots__ = ("fd", "rest")

    CHUNK = 16 * 1024

    def __init__(self, fd):
        self.fd = fd
        self.rest = b""

    def read(self):
        """The next frame's body; ChannelClosed at the pipe's end between
        frames, EOFError inside one."""
        buf = self.rest
        while len(buf) < 4:
            more = os.read(self.fd, self.CHUNK)
            if not more:
                if buf:
                    raise EOFError("channel closed inside a frame")
                raise ChannelClosed()
            buf += more
        (n,) = _unpack_from("!I", buf)
        if n > MAX_FRAME:
            raise ValueError("frame of %d bytes exceeds the limit" % n)
        end = 4 + n
        if len(buf) >= end:
            self.rest = buf[end:]
            return buf[4:end]
        # A large frame: read into one buffer of its size.
        self.rest = b""
        whole = bytearray(n)
        have = len(buf) - 4
        whole[:have] = memoryview(buf)[4:]
        del buf
        view = memoryview(whole)
        while have < n:
            k = os.readv(self.fd, [view[have:]])
            if not k:
                raise EOFError("channel closed inside a frame")
            have += k
        view.release()
        return whole


def server_frame(body):
    """A frame's body from the server, decoded: marshal (a clean run's
    ``exec``) or msgpack (see the header)."""
    if body[:1] in (b"{", b"\xfb"):
        return marshal.loads(body)
    return unpackb(body)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        k = os.write(fd, view)
        view = view[k:]


def framed(body):
    """``body`` after its 4-byte length: one frame, for one ``write_all``."""
    return struct.pack("!I", len(body)) + body


def write_frame(fd, obj):
    write_all(fd, framed(packb(obj)))


def hand_off(msg):
    """A decoded request framed for a child: the worker wrote it, so it is
    trusted, and ``marshal`` (C, same interpreter on both ends) costs a child
    far less than decoding msgpack in Python."""
    return framed(marshal.dumps(msg))


def write_error(fd, request_id, message, exc=None):
    """An ``error`` frame: a fault of the worker, not of the run; with
    ``exc`` (being handled) its type and traceback are added."""
    trace = ""
    if exc is not None:
        traceback = stdlib_traceback()
        message = "%s%s: %s" % (message, type(exc).__name__, exc)
        trace = traceback.format_exc()
    write_frame(fd, {"t": "error", "id": request_id, "message": message, "traceback": trace})


# ---------------------------------------------------------------------------
# Linux calls through ctypes: prctl, Landlock, malloc_trim
# ---------------------------------------------------------------------------
#
# The only code that calls C directly.  ``load_libc`` (in main, before any
# fork) loads the C library; each call checks its result and raises OSError
# with the errno, except where a failure is deliberately tolerated, which the
# code says.  Without ctypes (a Python built without it) ``prctl`` does
# nothing: runs then do not die with their worker by themselves (the server
# kills the worker's whole tree, and the sandbox's pid namespace ends with
# it), the worker stays dumpable, and runs are not scoped by Landlock.

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

# Landlock (Linux 6.12+, ABI 6): a domain that scopes signals keeps its
# processes from signalling any process outside it.  Syscalls numbered from
# 403 up have the same number on every architecture but alpha.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_ACCESS_FS_REFER = 1 << 13
LANDLOCK_SCOPE_SIGNAL = 1 << 1
LANDLOCK_RULE_PATH_BENEATH = 1

_ctypes = None  # what of ctypes the calls use, once load_libc found it
_libc = None  # the C library
_restrict_self = None  # landlock_restrict_self(fd, flags), set by signal_scope


def load_libc():
    """Load the C library; None, or why it could not be (no ctypes)."""
    global _ctypes, _libc
    try:
        _ctypes, _libc = _bare_ctypes()
    except (ImportError, AttributeError, OSError):
        # Not the C module this Python usually has: the package itself.
        try:
            import ctypes
        except ImportError as exc:
            return "no ctypes: %s" % exc
        _ctypes = ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    return None


def _bare_ctypes():
    """What of ctypes the calls below use, made from its C module alone: the
    ``ctypes`` package would add ~1 ms to every worker's start (its module,
    ``ctypes._endian`` and the classes they define). The same C types
    underneath, so a call costs what it does through ``ctypes.CDLL``."""
    import _ctypes as c

    def simple(name, code):
        return type(c._SimpleCData)(name, (c._SimpleCData,), {"_type_": code})

    c_int = simple("c_int", "i")

    class Function(c.CFuncPtr):
        _flags_ = c.FUNCFLAG_CDECL | c.FUNCFLAG_USE_ERRNO
        _restype_ = c_int

    class Library:
        """The process's own symbols (``dlopen(NULL)``), as attributes;
        AttributeError for one it lacks, as with ``ctypes.CDLL``."""
        _handle = c.dlopen(None, os.RTLD_NOW)

        def __getattr__(self, name):
            function = Function((name, self))
            setattr(self, name, function)
            return function

    module = types.SimpleNamespace(
        get_errno=c.get_errno, byref=c.byref, sizeof=c.sizeof, Structure=c.Structure,
        c_int=c_int, c_int32=c_int,
        c_long=simple("c_long", "l"), c_size_t=simple("c_ulong", "L"),
        c_uint32=simple("c_uint", "I"), c_uint64=simple("c_ulonglong", "Q"))
    return module, Library()


def _failed(call):
    """The OSError of the C call ``call`` that just failed."""
    err = _ctypes.get_errno()
    return OSError(err, "%s: %s" % (call, os.strerror(err)))


def prctl(option, value):
    """``prctl(option, value)``; raises OSError if the kernel refuses."""
    if _libc is not None and _libc.prctl(option, value, 0, 0, 0) != 0:
        raise _failed("prctl(%d, %d)" % (option, value))


def die_with_parent():
    """Have the kernel SIGKILL this process when its parent dies."""
    prctl(PR_SET_PDEATHSIG, _SIGKILL)


def set_dumpable(dumpable):
    """Whether a process of the same user may read this one's memory
    (``/proc/<pid>/mem``) or attach to it."""
    prctl(PR_SET_DUMPABLE, 1 if dumpable else 0)


def become_subreaper():
    """Make processes a run leaves behind (double forks, ``setsid``) our
    children when their parent dies, so that ``kill_descendants`` finds them."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def trim_heap():
    """Hand the heap memory freed so far back to the OS (glibc's
    ``malloc_trim``).  Tolerated when absent: it saves memory and page-table
    copies on fork, nothing depends on it (musl has no such call), and its
    result says whether memory was released, not whether it failed."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


MADV_COLLAPSE = 25  # Linux 6.1
HUGE_PAGE = 2 << 20
_PAGEMAP_PRESENT = 1 << 63
# Whether the zygote maps its memory with huge pages (the server's
# ``huge_pages``): fewer page-table entries for every fork to copy and every
# exit to tear down, for more memory (see collapse_heap).
HUGE_PAGES = os.environ.get("CODE_EXECUTOR_HUGE_PAGES") == "1"


def collapse_heap():
    """Map the zygote's anonymous memory (the heap and unnamed mappings)
    with transparent huge pages where whole 2 MiB pages of it are in use
    (``MADV_COLLAPSE``), once its own set-up is done: each fork then copies
    one page-table entry for 2 MiB instead of 512, and each exit tears down
    one. A process that writes into such a page gets it split, for itself
    only, and copies 4 KiB as before; the pages no one writes stay huge in
    the zygote and in every child it forks. The price is memory: a
    collapsed page is the zygote's own copy, no longer shared with its
    worker, and stays so when the zygote's own writes split it later.

    Only ranges with at least 7/8 of their pages present are collapsed (a
    collapse fills the rest), so reserved but unused memory (a BLAS buffer)
    stays unused. A refusal (kernels before 6.1, transparent huge pages set
    to ``never``, no huge page free) leaves the range as it was: what runs
    see is the same either way. Returns the bytes collapsed."""
    madvise = getattr(_libc, "madvise", None)
    if madvise is None:
        return 0
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = f.read().splitlines()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return 0
    size_t = _ctypes.c_size_t
    page = os.sysconf("SC_PAGE_SIZE")
    pages = HUGE_PAGE // page
    collapsed = 0
    try:
        for line in maps:
            fields = line.split()
            if len(fields) < 5 or fields[1] != b"rw-p" or fields[5:] not in ([], [b"[heap]"]):
                continue
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            for chunk in range(-(-start // HUGE_PAGE) * HUGE_PAGE, end - HUGE_PAGE + 1, HUGE_PAGE):
                entries = memoryview(os.pread(pagemap, pages * 8, chunk // page * 8)).cast("Q")
                present = sum(1 for entry in entries if entry & _PAGEMAP_PRESENT)
                if present * 8 >= pages * 7 and madvise(
                        size_t(chunk), size_t(HUGE_PAGE), MADV_COLLAPSE) == 0:
                    collapsed += HUGE_PAGE
    except OSError:
        pass
    finally:
        os.close(pagemap)
    return collapsed


def signal_scope():
    """A Landlock ruleset fd that scopes signals, or None, with a line on
    stderr saying why, where the kernel cannot: no Landlock, an ABI below 6,
    or a policy that refuses it.  Tolerated: without the scope a run can
    signal its zygote, and the worker ends every run before answering it
    (see ``exposed`` in main)."""
    global _restrict_self
    if _libc is None:
        return None
    ctypes = _ctypes
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    # A layer that handles no filesystem access would refuse every rename or
    # link across directories (EXDEV: Landlock's ABI 1 compatibility): it
    # handles REFER and grants it everywhere.
    attr = (ctypes.c_uint64 * 3)(LANDLOCK_ACCESS_FS_REFER, 0, LANDLOCK_SCOPE_SIGNAL)
    fd = syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                 ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return _no_scope(_failed("landlock_create_ruleset"))

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    root = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        rule = PathBeneath(LANDLOCK_ACCESS_FS_REFER, root)
        if syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(fd),
                   ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                   ctypes.c_uint32(0)) != 0:
            error = _failed("landlock_add_rule")
            os.close(fd)
            return _no_scope(error)
    finally:
        os.close(root)
    # Built here, once: what a child calls is then one closure and one
    # foreign call.
    number = ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF)

    def restrict(ruleset, flags):
        return syscall(number, ruleset, flags)

    # Entering the domain can still fail (a filter that allows only part of
    # Landlock, the nesting limit): try it once in a throwaway child, whose
    # exit status is the errno. (Not a throwaway thread, though a domain is
    # the calling thread's alone: glibc would give that thread an arena of
    # its own, 64 MiB of address space every run's limit would then count.)
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if restrict(fd, 0) == 0 else (ctypes.get_errno() & 0xFF or 1))
        finally:
            os._exit(1)
    status = os.waitpid(pid, 0)[1]
    if status != 0:
        os.close(fd)
        err = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0
        return _no_scope(OSError(err, "landlock_restrict_self: %s" % os.strerror(err)))
    _restrict_self = restrict
    return fd


def _no_scope(error):
    sys.stderr.write("code-executor: runs are not scoped by Landlock: %s\n" % error)
    return None


def scope_signals(ruleset):
    """Enter a Landlock domain of ``ruleset`` (from ``signal_scope``): no
    process of this run can signal its zygote or its worker.  Needs
    no_new_privs, which the sandbox's launcher set."""
    if _restrict_self(ruleset, 0) != 0:
        raise _failed("landlock_restrict_self")


# ---------------------------------------------------------------------------
# The child: one run
# ---------------------------------------------------------------------------

_LIMITS = {
    "cpu_seconds": "RLIMIT_CPU",
    "memory_bytes": "RLIMIT_AS",
    "file_size_bytes": "RLIMIT_FSIZE",
    "open_files": "RLIMIT_NOFILE",
    "processes": "RLIMIT_NPROC",
}


def apply_limits(limits):
    """Set the run's rlimits, soft and hard: the run cannot raise them."""
    for res, soft, hard in planned_limits(limits):
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            pass


def planned_limits(limits):
    """(resource, soft, hard) of each rlimit in ``limits``, never above the
    hard limit already in place."""
    plan = []
    if not limits or resource is None:
        return plan
    for key, name in _LIMITS.items():
        value = limits.get(key)
        res = getattr(resource, name, None)
        if value is None or res is None:
            continue
        if name == "RLIMIT_NPROC" and os.getuid() == 0:
            # Root's RLIMIT_NPROC counts every process root has on the host
            # (capabilities are dropped, so the kernel no longer exempts it):
            # a root run's processes are capped by its pids cgroup instead.
            continue
        soft, hard = resource.getrlimit(res)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        # The hard CPU limit sits one second above the soft one so that
        # SIGXCPU arrives first and reads as a CPU limit, not as SIGKILL.
        new_hard = value + 1 if name == "RLIMIT_CPU" else value
        if hard != resource.RLIM_INFINITY:
            new_hard = min(new_hard, hard)
        plan.append((res, value, new_hard))
    return plan


def path_parts(rel):
    """The names in a request's relative file path ``rel``, below the run's
    directory; ValueError for a path that is not one."""
    if not rel or rel.startswith("/") or "\0" in rel:
        raise ValueError("file path %r is not a relative path" % rel)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise ValueError("file path %r leaves the working directory" % rel)
    return parts


def safe_join(root, rel):
    return os.path.join(root, *path_parts(rel))


def write_files(root, files, replace=False):
    """Write the request's input files under ``root``; a clean run's files are
    all new (O_EXCL), a session call may replace what an earlier call left."""
    mode = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if replace else os.O_EXCL)
    for rel, data in files:
        path = safe_join(root, rel)
        parent = os.path.dirname(path)
        if parent != root:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, mode, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)


class FilesRefused(Exception):
    """A session call's input files that its directory cannot take as they
    are: ``code`` (the server's error code, ``conflict`` or ``too_large``)
    and why, naming the file as the request does."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def check_session_files(root, files):
    """Refuse (FilesRefused) a session call's ``files`` that the session's
    directory under ``root`` cannot take as they are, before any is
    written: a directory, symbolic link or other non-file where a file
    goes, or a file where a directory of its path goes (a link to a
    directory there is followed, as ``os.makedirs`` follows it)."""
    for rel, _ in files:
        parts = path_parts(rel)
        at = root
        for depth, part in enumerate(parts, 1):
            at = os.path.join(at, part)
            try:
                mode = os.lstat(at).st_mode
            except FileNotFoundError:
                break
            if depth < len(parts):
                if not (stat.S_ISDIR(mode) or (stat.S_ISLNK(mode) and os.path.isdir(at))):
                    raise FilesRefused("conflict", "file %s cannot be written: %s in its path "
                                       "is not a directory in the session; the call did not run"
                                       % (quoted(rel), quoted("/".join(parts[:depth]))))
            elif not stat.S_ISREG(mode):
                raise FilesRefused("conflict", "file %s cannot be written: the session has %s "
                                   "there; the call did not run" % (quoted(rel), kind_of(mode)))


def kind_of(mode):
    """What a file of ``mode`` that is not a regular file is, in words."""
    return ("a directory" if stat.S_ISDIR(mode)
            else "a symbolic link" if stat.S_ISLNK(mode)
            else "a named pipe" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device file")


def write_session_files(root, files):
    """Write a session call's input ``files`` (checked first: see
    check_session_files), each replacing what an earlier call left only
    once it is whole: it is written under a new name beside it and renamed
    over it, so a write that fails (the quota full) leaves the earlier file
    as it was, and a named pipe put there meanwhile is never opened. A
    write the system refuses is the call's FilesRefused, not an exception
    of its code."""
    most = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if resource is not None else -1
    for number, (rel, data) in enumerate(files):
        if 0 <= most < len(data):  # past it, the write would be SIGXFSZ
            raise FilesRefused("too_large", "file %s is %d bytes, over the session's "
                               "file_size_bytes of %d; the call did not run%s"
                               % (quoted(rel), len(data), most, written_before(number)))
        path = safe_join(root, rel)
        parent = os.path.dirname(path)
        new = os.path.join(parent, ".%s.%d.new" % (os.path.basename(path), os.getpid()))
        made = False
        try:
            if parent != root:
                os.makedirs(parent, exist_ok=True)
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            made = True
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            os.replace(new, path)
        except OSError as exc:
            if made:  # never a file of that name the session had
                try:
                    os.unlink(new)
                except OSError:
                    pass
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            raise FilesRefused("too_large" if full else "conflict",
                               "file %s could not be written: %s; the call did not run%s"
                               % (quoted(rel), os.strerror(exc.errno) if exc.errno
                                  else type(exc).__name__, written_before(number)))


def written_before(number):
    """What a refusal of a call's file ``number`` adds: the files before it
    were written."""
    return " (the files before it in the request were written)" if number else ""


def quoted(text):
    """``text`` in double quotes, as the server quotes a path in a message."""
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def set_stdin(data):
    """Make fd 0 read ``data``; without data it stays on /dev/null."""
    if not data:
        return
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("stdin", 0)
    else:
        import tempfile

        fd, path = tempfile.mkstemp()
        os.unlink(path)
    write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)


def exit_code_of(exc):
    """The process exit status ``python script.py`` gives for a SystemExit."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def user_traceback(exc, modules=()):
    """Print ``exc`` to stderr as the interpreter would, without this file's
    frames, and describe it for the result's ``error`` field. ``modules``:
    the run's code is the server's harness that runs these files (an
    ``exec`` frame's ``compile``), whose frames are not shown either; the
    error's line is then the innermost of theirs."""
    traceback = stdlib_traceback()
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    # The harness's frames come first, as this file's do: the files' own
    # are below them.
    while modules and tb is not None and tb.tb_frame.f_code.co_filename == RUN_FILENAME:
        tb = tb.tb_next
    # An interrupt raised by a session child's handler: the interpreter's own
    # handler would show no frame of its own, so neither does this one.
    last, end = None, tb
    while end is not None and end.tb_next is not None:
        last, end = end, end.tb_next
    if end is not None and end.tb_frame.f_code is interrupt_call.__code__:
        if last is None:
            tb = None
        else:
            last.tb_next = None
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:
        text = "%s: %s\n" % (type(exc).__name__, exc)
    try:
        sys.stderr.write(text)
    except Exception:
        pass
    line = None
    users = modules or (RUN_FILENAME,)
    if isinstance(exc, SyntaxError) and exc.filename in users:
        line = exc.lineno
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in users:
            line = tb.tb_lineno
        tb = tb.tb_next
    cls = type(exc)
    name = cls.__qualname__
    if cls.__module__ not in ("builtins", "__main__"):
        name = "%s.%s" % (cls.__module__, name)
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable %s>" % name
    return {
        "type": name,
        "message": message[:MAX_ERROR_CHARS],
        "traceback": text[-MAX_ERROR_CHARS:],
        "line": line,
        "errno": errno_of(exc),
    }


def errno_of(exc):
    """The errno of an exception that ended a run, so that the server tells
    limits apart by number, not by message: an OSError's own (EFBIG past the
    file size limit, ENOSPC past the disk quota), ENOMEM for a MemoryError
    (the address-space limit) and EAGAIN for a thread the process limit kept
    from starting; None for anything else."""
    if isinstance(exc, OSError):
        code = exc.errno
        return code if type(code) is int else None
    if isinstance(exc, MemoryError):
        return errno.ENOMEM
    # threading raises a plain RuntimeError when the thread cannot be made
    # (pthread_create's EAGAIN, its errno not kept): its text, the only one
    # matched here, is fixed in CPython's _threadmodule.c.
    if type(exc) is RuntimeError and exc.args == ("can't start new thread",):
        return errno.EAGAIN
    return None


def restart_logging_clock():
    """A run (a session) that finds logging imported (the zygote learned a
    module that imports it, as asyncio does) counts its records'
    ``relativeCreated`` from its own start, as a fresh interpreter would."""
    logging = sys.modules.get("logging")
    if logging is not None:
        try:
            # Seconds as a float, or nanoseconds as an int from 3.13 on.
            started = logging._startTime
            logging._startTime = time.time_ns() if type(started) is int else time.time()
        except Exception:
            pass


def fresh_main():
    """Install a new, empty ``__main__`` module and return it."""
    import builtins

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    return main


def value_repr(value, cap):
    try:
        text = repr(value)
    except BaseException as exc:  # a broken __repr__ is the user's, not ours
        text = "<repr failed: %s: %s>" % (type(exc).__name__, exc)
    if len(text) > cap:
        text = "%s... [truncated, %d characters in all]" % (text[:cap], len(text))
    return text


class RunOutcome:
    __slots__ = ("status", "result", "error", "returned")

    def __init__(self):
        self.status = 0
        self.result = None
        self.error = None
        self.returned = None  # the JSON of what ``call``'s entry returned


def compile_body(code):
    """``code`` parsed and compiled as a run runs it: the code of its body,
    and its final expression statement (a syntax tree, compiled once the body
    has run; None if the code ends otherwise), whose value is kept."""
    import _ast as ast  # the C module: what compile() needs, without ast.py

    tree = compile(code, RUN_FILENAME, "exec", ast.PyCF_ONLY_AST)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
        last = tree.body.pop()
    return compile(tree, RUN_FILENAME, "exec"), last


def compile_last(last):
    import _ast as ast

    return compile(ast.Expression(last.value), RUN_FILENAME, "eval")


def compile_run(code):
    """``code`` compiled whole: the code objects of its body and of its final
    expression (or None)."""
    body, last = compile_body(code)
    return body, (None if last is None else compile_last(last))


def compile_module(source, path):
    """``source`` compiled as the module file ``path``, and the names of the
    functions its top-level expression statements call (a test file's
    ``check(candidate)``)."""
    import _ast as ast

    tree = compile(source, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    calls = tuple(node.value.func.id for node in tree.body
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and isinstance(node.value.func, ast.Name))
    return compile(tree, path, "exec", dont_inherit=True), calls


# WARM_REQUEST's code compiled: the rehearsal runs compiled code, as most
# children do (see precompile).
WARM_COMPILED = compile_run(WARM_REQUEST["code"])


# Source -> what ``precompile`` made of it (None: the child compiles it).
_precompiled = {}
# The longest source the worker compiles for a child, and how many it keeps.
PRECOMPILE_MAX_CHARS = 1 << 16
PRECOMPILED_KEPT = 8


def precompile(code, digits, path=None, here=False):
    """``code`` compiled by the worker for the child that runs it, as
    ``(body, last)`` code objects (see compile_body), or as the module file
    ``path`` (see compile_module), or None when the child
    should compile it itself, as it always can: code that does not compile
    cleanly (an error, or a warning, which belongs on the run's stderr) or
    is longer than PRECOMPILE_MAX_CHARS.

    A child that compiles touches pages of the parser and compiler it shares
    with its zygote: each costs a copy-on-write fault, ~0.2 ms of CPU in all
    for ``print(2+2)`` and ~0.8 ms for a 40-line program, against ~0.02 and
    ~0.3 ms compiled here, in a warm process that keeps its pages. The last
    PRECOMPILED_KEPT results are kept, so the many runs of one program (the
    cases of a ``/grade`` call) compile it once. ``digits`` is the run's
    ``int_max_str_digits``, which bounds the integer literals that compile.
    ``here``: the code runs in this very process (a session's), whose own
    warning filters then decide what a compile shows, and stay untouched
    (see quiet_warnings)."""
    if len(code) > PRECOMPILE_MAX_CHARS:
        return None
    key = (code, digits, path)
    if key in _precompiled:
        # The most recently used stay: a /grade call's harness and submission
        # outlive the test code of its cases.
        compiled = _precompiled.pop(key)
        _precompiled[key] = compiled
        return compiled
    import warnings

    compiled = None
    set_digits = getattr(sys, "set_int_max_str_digits", None)
    before = sys.get_int_max_str_digits() if set_digits and digits is not None else None
    try:
        if before is not None:
            set_digits(digits)
        if here:
            with quiet_warnings(warnings) as caught:
                compiled = compile_run(code) if path is None else compile_module(code, path)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                compiled = compile_run(code) if path is None else compile_module(code, path)
        if caught:
            compiled = None
    except Exception:
        pass
    finally:
        if before is not None:
            set_digits(before)
    if len(_precompiled) >= PRECOMPILED_KEPT:
        del _precompiled[next(iter(_precompiled))]
    _precompiled[key] = compiled
    return compiled


class quiet_warnings:
    """The warnings a compile would show, kept instead of shown (a list),
    with the filters left as they are. ``catch_warnings`` changes them, and
    any change makes every warning this process showed once per place show
    again; a session's calls must see what one interpreter shows. A warning
    kept here is shown by the compile that follows (precompile returns
    None), so a "once" filter's record of it is taken back."""

    def __init__(self, warnings):
        self.warnings = warnings
        self.shown = []
        self.show = None

    def __enter__(self):
        self.show = self.warnings._showwarnmsg
        self.warnings._showwarnmsg = self.shown.append
        return self.shown

    def __exit__(self, *exc):
        self.warnings._showwarnmsg = self.show
        for msg in self.shown:
            self.warnings.onceregistry.pop((str(msg.message), msg.category), None)


def precompile_files(files, paths, digits):
    """The input files named in ``paths`` that compile cleanly as Python
    modules (see precompile): path -> (its precompile key, (code object,
    names called at top level)). A file left out is compiled by the code
    that runs it, as it would be anyway, its errors its own."""
    compiled = {}
    for path, data in files:
        if path in paths:
            try:
                source = bytes(data).decode("utf-8")  # compile() reads \r\n as \n
            except UnicodeDecodeError:
                continue
            module = precompile(source, digits, path)
            if module is not None:
                compiled[path] = ((source, digits, path), module)
    return compiled


# Programs held by the zygote (the server's ``hold_programs``, off by
# default). A child loads the code objects of its run from its request
# (``marshal``): creating them, and interning every name they hold in the
# interpreter's table of names, which the child shares with its zygote,
# costs each child copy-on-write faults (~120 and ~0.4 ms of CPU for
# HumanEval/0's submission and test, against ~30 for ``print(2+2)``). A
# program that runs again (the cases of a ``/grade`` call, one test code
# graded against many submissions) is worth loading once in the zygote
# instead: the worker has it hold a program once two runs used it
# (Worker.hold_repeats), and the children forked from then on find it in
# HELD, their request naming it by its id (Zygote.hold). It holds at most
# HELD_PROGRAMS, the most recently used, each at most HELD_MAX_BYTES
# marshalled. What a run does to its copy (the interpreter's own
# specialization included) stays in its process, but every run's process
# holds what its zygote holds: other runs' programs, which it can read.
# Hence off by default: for a server whose clients may read each other's
# code (one grading backend). The worker's record of what its zygote holds
# has digests (program_key), not sources.
HOLD_PROGRAMS = os.environ.get("CODE_EXECUTOR_HOLD_PROGRAMS") == "1"
HELD_PROGRAMS = 4
HELD_MAX_BYTES = 1 << 17
# Distinct programs the worker remembers having run once.
SEEN_PROGRAMS = 16
# id -> what ``precompile`` made of a program, in the zygote and its children.
HELD = {}


def program_key(source, digits, path):
    """What names a program to hold (see HELD): a digest of its source and
    of what it was compiled with."""
    from _blake2 import blake2b

    digest = blake2b(source.encode("utf-8", "surrogatepass"), digest_size=16)
    digest.update(repr((digits, path)).encode("utf-8", "surrogatepass"))
    return digest.digest()


def look_up_held(compiled):
    """``compiled`` from a run's request: what ``precompile`` made of a
    program, or the id of one the zygote held (None if it did not: the code
    that runs it compiles it then)."""
    return HELD.get(compiled) if type(compiled) is int else compiled


def look_up_held_files(files):
    """A request's ``compiled_files`` (see precompile_files) with the held
    programs looked up; one missing is left out."""
    found = {}
    for path, compiled in files.items():
        compiled = look_up_held(compiled)
        if compiled is not None:
            found[path] = compiled
    return found


def run_user_code(code, argv, main=None, result_cap=10000, compiled=None, call=None,
                  modules=()):
    """Run ``code`` as ``python script.py`` would, in ``main``. The value of a
    final expression statement is kept (its repr), as a notebook cell shows it.
    ``compiled``: the code already compiled (see precompile). ``call``: the
    ``exec`` frame's, made once the code has run (see call_entry).
    ``modules``: the ``exec`` frame's ``compile``, the files the code is a
    harness for (see user_traceback)."""
    if main is None:
        main = fresh_main()
    sys.argv = [RUN_FILENAME] + list(argv or ())
    # The source, for tracebacks to show its lines. A worker's first child
    # may run before linecache is imported (see prepare_later_runs): the
    # entry is then added when it is.
    lines = code.splitlines(True)
    if len(lines) != code.count("\n") + (code[-1:] != "\n") or "\r" in code:
        # Breaks other than "\n": the lines as the compiler and a file's
        # reader count them, on "\n", "\r\n" and "\r" only (splitlines also
        # breaks on "\f", "\x85", U+2028 and others), each ended by "\n".
        import io

        lines = io.StringIO(code, None).readlines()
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"  # as linecache reads a file's last line
    entry = (len(code), None, lines, RUN_FILENAME)
    linecache = _LINECACHE if _LINECACHE is not None else sys.modules.get("linecache")
    if linecache is not None:
        linecache.cache[RUN_FILENAME] = entry
    else:
        _run_source[0] = entry
        if _on_import.get("linecache") is not _cache_run_source:  # once, not every call
            on_import("linecache", _cache_run_source)
    outcome = RunOutcome()
    ns = main.__dict__
    try:
        body, last = compile_body(code) if compiled is None else compiled
        exec(body, ns)
        if last is not None:
            if type(last) is not types.CodeType:
                last = compile_last(last)
            value = eval(last, ns)
            # With a call its value is what counts: the last one's repr is not
            # made (its __repr__ neither runs nor costs the run's time).
            if value is not None and call is None:
                outcome.result = value_repr(value, result_cap)
        if call is not None:
            outcome.returned = call_entry(ns, call)
    except SystemExit as exc:
        outcome.status = exit_code_of(exc)
    except BaseException as exc:  # noqa: B902 - the run's own failure
        outcome.error = user_traceback(exc, modules)
        outcome.status = 1
    return outcome


def end_run(collections):
    """What the interpreter does as ``python script.py`` ends, once the
    run's code has (its caller holds ``__main__`` no more): figures saved,
    non-daemon threads joined, atexit handlers run, what only ``__main__``
    held freed (see free_main), the streams flushed. ``collections``:
    run_collections() as the run began."""
    save_figures()
    # With no thread but this one there is nothing to join, and _shutdown
    # would write to pages this child still shares with its zygote (tens of
    # microseconds of copy-on-write faults on every run).
    threading = sys.modules.get("threading")
    if threading is not None and hasattr(threading, "_shutdown"):
        try:
            if threading.active_count() > 1:
                threading._shutdown()
        except BaseException:
            pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    try:
        free_main(collections)
    except BaseException:  # a __del__'s own failure is reported as it runs
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def free_main(collections, name="__main__"):
    """Free what the run's code left in ``__main__``, as the interpreter does
    as it exits (``os._exit`` would skip it): the module leaves
    ``sys.modules``; the files its names reach are flushed; then what only
    it held is freed, by a collection that runs every finalizer (a
    ``__del__``, a file's close) before it frees anything, so that a
    ``__del__`` sees the module's globals. Flushing first keeps what a file
    holds: a collection may close a file's buffer before the text layer on
    it has written its last characters into it. A run that bound no name of
    its own leaves nothing to free. ``collections``: generations 1 and 2's
    counts of collections as the run began (see run_collections); when one
    moved, the run's objects may be in the oldest generation, which only a
    full collection (~0.1 ms) looks at. What a thread still running or
    another module holds stays (the interpreter, which stops daemon threads
    first, then sets the names of such modules to None), its files flushed."""
    main = sys.modules.pop(name, None)
    names = getattr(main, "__dict__", None)
    del main
    if type(names) is not dict or all(k[:2] == "__" == k[-2:] for k in names if type(k) is str):
        return
    try:
        flush_files(names)
    except Exception:
        pass
    del names
    # 3.14's collector is incremental: its generation 1 is not 3.11's.
    full = run_collections() != collections or sys.version_info >= (3, 14)
    gc.collect(2 if full else 1)


def run_collections():
    """How many collections of generations 1 and 2 this process has made."""
    stats = gc.get_stats()
    return stats[1]["collections"], stats[-1]["collections"]


# What flush_files does not look into: it looks for the run's own files.
_NOT_HOLDERS = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                types.CodeType, types.MethodType, str, bytes, int, float, complex)


def flush_files(names, budget=10000, wide=1000):
    """Flush the files ``names`` (a run's globals) reach, nearest first: its
    values, what they refer to (attributes, items, a bound method's object),
    the attributes of its classes, what its functions' closures and defaults
    hold; at most ``budget`` objects looked at, none inside a module, a
    function or class defined elsewhere or anything that refers to over
    ``wide`` others. A file is a text or binary writer of the io module's
    own on a file of the file system: a pipe's or a socket's could block,
    and a class of the run's own is its code's to flush. Types are read with
    ``type()``, so that no object runs code of its own (a proxy's
    ``__class__``, a ``__len__``)."""
    import _io

    text, writers = _io.TextIOWrapper, (_io.BufferedWriter, _io.BufferedRandom)
    function, method, builtin = types.FunctionType, types.MethodType, types.BuiltinMethodType
    shared = vars(sys.modules["builtins"])
    class_dict = type.__dict__["__dict__"].__get__
    seen = set()
    todo = list(names.values())
    at = 0
    while at < len(todo) and at < budget:
        obj = todo[at]
        at += 1
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj)
        try:
            if kind is text or kind in writers:
                flush_file(obj, kind is text, writers, _io.FileIO)
                continue
            if kind is function:
                # Not its globals (``names``), builtins, code or names: the
                # tuples of its closure's cells and defaults, and the dicts
                # of its keyword defaults and attributes, those it has.
                if obj.__globals__ is not names:
                    continue
                refs = [r for r in gc.get_referents(obj)
                        if r and type(r) in (tuple, dict) and r is not names
                        and r is not shared]
            elif kind is method or kind is builtin:
                # A module's function is a builtin whose object is the module.
                refs = [obj.__self__]
            elif issubclass(kind, _NOT_HOLDERS):
                continue
            elif issubclass(kind, type):
                attributes = class_dict(obj)
                if attributes.get("__module__") != "__main__":
                    continue
                refs = list(attributes.values())
            else:
                refs = gc.get_referents(obj)
            if len(refs) <= wide and len(todo) < budget:
                todo.extend(refs)
        except Exception:  # an object the search cannot look into
            pass


def flush_file(f, is_text, writers, file_io):
    """Flush ``f`` (a TextIOWrapper when ``is_text``, else one of
    ``writers``) when it writes to a ``file_io`` and is open."""
    buffer = f.buffer if is_text else f
    if type(buffer) in writers and type(buffer.raw) is file_io and not f.closed:
        f.flush()


# The linecache entry of the code run last, while linecache is not imported
# (see run_user_code).
_run_source = [None]


def _cache_run_source(linecache):
    # Not a run's own linecache.py, which its code imported first.
    if _run_source[0] is not None and from_stdlib(linecache):
        linecache.cache[RUN_FILENAME] = _run_source[0]


# The standard library's traceback and linecache, once the zygote imported
# them (see prepare_later_runs): a run's own ``traceback.py`` is its code's,
# never what prints its traceback.
_TRACEBACK = _LINECACHE = None


def import_bootstrap_traceback():
    """Import traceback and linecache, the bootstrap's, whatever modules of
    those names a run or call sends: in the zygote as it prepares
    (prepare_later_runs), or in a session's process forked before that."""
    global _TRACEBACK, _LINECACHE
    import linecache, traceback  # noqa: E401

    _TRACEBACK, _LINECACHE = traceback, linecache


def stdlib_traceback():
    """The traceback module that formats a run's traceback: the zygote's,
    else imported now (before the zygote prepared; a run's own file of that
    name that its code imported is then what it finds)."""
    if _TRACEBACK is not None:
        return _TRACEBACK
    import traceback

    return traceback


# The standard library's json, as prepare_later_runs or import_harness_json
# imported it: a case that sends its own json.py (which its code then
# imports, see shadowed_by_files) does not change how call_entry reads its
# arguments and writes its value.
_JSON = None


def import_harness_json():
    """Import json for call_entry in a run's process forked before its
    zygote had (see prepare_later_runs): the standard library's (the run's
    directory is out of imports until just before the run's code, see
    child_main), as if the zygote had imported it, so that a run whose files
    hold its own json still imports that (see shadowed_by_files)."""
    global _JSON
    before = set(sys.modules)
    import json

    _JSON = json
    note_zygote_modules(set(sys.modules) - before)


class imports_apart_from:
    """A ``with`` block whose imports never look in ``dir``: nothing of it
    is imported, and the import system keeps no listing of it (taken before
    files are written there, with the same mtime, it could hide them from
    later imports). A run's directory is kept out so by the worker's own
    entry for it (see child_main); a session's, by this."""

    def __init__(self, dir):
        self.dir = dir

    def __enter__(self):
        sys.path_importer_cache[self.dir] = None

    def __exit__(self, *exc):
        sys.path_importer_cache.pop(self.dir, None)


def call_entry(ns, call):
    """Grading's function mode: call the function ``call["entry"]`` that the
    run's code defined with the JSON ``call["args"]`` (a list: positional
    arguments; a map: keywords; nil: none; else the one argument) and
    return the JSON of its value. In the run's process, after its code: no
    files carry the input or the value."""
    json = _JSON
    entry = call["entry"]
    fn = ns.get(entry)
    if not callable(fn):
        raise NameError("the submission defines no function named %s" % entry)
    args = call["args"]
    args = None if args is None else json.loads(args)
    if args is None:
        value = fn()
    elif isinstance(args, list):
        value = fn(*args)
    elif isinstance(args, dict):
        value = fn(**args)
    else:
        value = fn(args)
    if isinstance(value, types.CoroutineType):
        # An `async def` entry: closed, its coroutine that never ran does
        # not warn of it (from here) when it is freed.
        value.close()
        raise TypeError(
            "%s() is an async def function: grading calls it and does not"
            " await the coroutine it returns" % entry
        )
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError("%s() returned a value that is not JSON: %s" % (entry, exc)) from None


def returned_fields(returned, cap):
    """The report's (and the result frame's) field for ``returned``, a
    call's JSON: itself, or only its size when it is over ``cap`` bytes, as
    an artifact's content would be (ASCII, see sane_report: a character is
    a byte)."""
    if len(returned) > cap:
        return {"returned_size": len(returned)}
    return {"returned": returned}


def private_tmp(rundir):
    """The run's own temporary directory, beside (not inside) its run
    directory so that its files are not artifacts; removed with the run."""
    return rundir + ".tmp"


TMP_VARS = ("TMPDIR", "TEMP", "TMP")


def set_run_dir(rundir, tmp_env, previous=None):
    """Make ``rundir`` what code sees as its place: ``PWD``, the first
    import path (in place of ``previous``, set before), where plots go; the
    temporary directory is ``tmp_env`` (name to value, None to unset)."""
    os.environ["PWD"] = rundir
    for name, value in tmp_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None
    if previous is not None and previous in sys.path:
        sys.path.remove(previous)
    sys.path.insert(0, rundir)
    install_plot_capture(rundir)


# The C-level signal calls: the ``signal`` module's enum wrappers cost a
# child more than the calls themselves.
_SIGCHLD, _SIGINT, _SIGTERM, _SIGKILL = (int(s) for s in (_signal.SIGCHLD, _signal.SIGINT,
                                                        _signal.SIGTERM, _signal.SIGKILL))


def enter_run(worker_pid, rundir, out_w, err_w, parent_fds, on_sigint):
    """What every forked child does first: its own process group and signal
    handlers, death with its worker, none of the worker's fds, output to its
    capture pipes, and its run directory as cwd."""
    os.setpgid(0, 0)
    _signal.set_wakeup_fd(-1)
    _signal.signal(_SIGCHLD, _signal.SIG_DFL)
    _signal.signal(_SIGINT, on_sigint)
    _signal.signal(_SIGTERM, _signal.SIG_DFL)
    # Die with the parent (``worker_pid``: the worker or its zygote), and be
    # dumpable again (the worker is not; see main).
    die_with_parent()
    set_dumpable(True)
    if os.getppid() != worker_pid:  # the parent died before that was set
        os._exit(70)
    for fd in parent_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    os.chdir(rundir)


def rehearse(request_fd=None, wait=WARM_AFTER_MS):
    """One pass over the request path with WARM_REQUEST, its output unused.
    With ``request_fd``, it first waits up to ``wait`` ms for a request
    there, and does nothing if one comes; it stops as soon as a request is
    readable there: a rehearsal moves work ahead of a request, never in front
    of one (under load, when requests come back to back, it would only add
    CPU)."""
    if request_fd is not None:
        poller = select.poll()
        poller.register(request_fd, select.POLLIN)
        if poller.poll(wait):
            return
    rehearsal = marshal.loads(marshal.dumps(dict(WARM_REQUEST, compiled=WARM_COMPILED)))
    planned_limits(rehearsal["limits"])
    if request_fd is not None and poller.poll(0):
        return
    outcome = run_user_code(rehearsal["code"], rehearsal["argv"],
                            types.ModuleType("__warm__"),
                            compiled=rehearsal["compiled"])
    packb({"status": outcome.status, "result": outcome.result, "error": outcome.error})


def specialize_request_path(passes=10):
    """Rehearse the request path a few times in the process that forks the
    runs (see prepare_later_runs). CPython 3.11+ specializes a function's
    bytecode once it has run a few times, writing into its code object;
    children that inherit the specialized code neither redo that work nor
    copy the pages it writes, on every run."""
    argv = sys.argv
    try:
        for _ in range(passes):
            rehearse()
            # And how a run's module is freed as it ends (a module of no
            # names of its own, as most runs leave).
            sys.modules["__warm__"] = types.ModuleType("__warm__")
            free_main(run_collections(), "__warm__")
    finally:
        sys.argv = argv
        _on_import.pop("linecache", None)
        linecache = sys.modules.get("linecache")
        if linecache is not None:
            linecache.cache.pop(RUN_FILENAME, None)


def prepare_later_runs():
    """Import what runs often need (linecache, traceback and what they
    import; json, which user code often imports and every graded case
    with an entry function does, 1-2 ms of each child's CPU otherwise;
    pickle's C part, with which a direct session's process loads its
    calls, ~1.1 ms of its first call otherwise, for 64 KiB),
    specialize the request path (specialize_request_path) and freeze it
    all, so that the children forked from here on share it. The imports
    cost ~10 ms where the environment's start-up (``site``, its ``.pth``
    files) imported none of it, the rehearsals ~2.5 ms, so they wait
    until the first run has ended and is reported, or until the worker has
    had no request for PREPARE_IDLE_MS since it started (a spare in its
    pool: see Worker.serve): the first children import what their runs
    need themselves, and specialize their own code."""
    global _JSON
    present = set(sys.modules)
    import_bootstrap_traceback()
    import fnmatch  # noqa: F401
    import json
    try:
        import _pickle  # noqa: F401
    except ImportError:
        pass
    _JSON = json

    # A run's own json.py, token.py or traceback.py is still its own, as in
    # a fresh interpreter (see shadowed_by_files); the bootstrap keeps the
    # standard library's.
    note_zygote_modules(set(sys.modules) - present)
    specialize_request_path()
    if hasattr(gc, "freeze"):
        gc.freeze()


def child_main(worker_pid, rundir, req_r, out_w, err_w, ctl_w, parent_fds, scope=None,
               warm=WARM_AFTER_MS):
    """Body of a forked child; never returns. Unless ``warm`` is None, it
    rehearses the request path while it waits, once it has waited ``warm``
    ms for its request (see below)."""
    status = 70
    try:
        # PWD, TMPDIR, sys.path and the plot directory came set from the
        # worker (every run has the same directory).
        restore_fork_handlers()
        enter_run(worker_pid, rundir, out_w, err_w, parent_fds, _signal.default_int_handler)
        if scope is not None:
            scope_signals(scope)
            os.close(scope)
        # Everything that does not depend on the request is done now, while
        # no client waits: stdin on /dev/null (fd 0 already is), a fresh
        # __main__, and one pass over the request path so that its
        # copy-on-write page faults (refcounts written in pages shared with
        # the worker) happen here, unless the request comes within ``warm``
        # ms (see Worker.execute).
        if warm is not None:
            rehearse(req_r, warm)
        main = fresh_main()
        req = open(req_r, "rb", buffering=0)
        try:
            frame = read_frame(req)
        except (ChannelClosed, EOFError):
            os._exit(0)
        req.close()
        begun = own_usage().get("cpu_ms", 0.0)
        collections = run_collections()
        msg = marshal.loads(frame)
        del frame
        # The request's own files are written before its limits apply: a
        # file over its file_size_bytes is the run's to read, not a fault
        # before the run (so are files past a small open_files).
        write_files(rundir, msg["files"])
        apply_limits(msg["limits"])
        digits = msg.get("int_max_str_digits")
        if digits is not None and hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(digits)
        _figures["max_pixels"] = msg.get("max_image_pixels")
        if _JSON is None and msg.get("call") is not None:
            import_harness_json()
        # The run's directory was kept out of imports until now (the
        # worker's entry for it in sys.path_importer_cache, inherited): a
        # listing of it taken before its files were written, with the same
        # mtime, could hide them from the run's own imports.
        sys.path_importer_cache.pop(rundir, None)
        shadowed_by_files(msg["files"])
        restart_logging_clock()
        set_stdin(msg["stdin"])
        code = msg["code"]
        argv = msg["argv"]
        result_cap = msg["max_result_chars"]
        compiled = look_up_held(msg.get("compiled"))
        call = msg.get("call")
        returned_cap = msg["max_artifact_bytes"]
        modules = tuple(msg.get("compile") or ())
        if msg.get("compiled_files"):
            main.__dict__["__compiled__"] = look_up_held_files(msg["compiled_files"])
        del msg
        outcome = run_user_code(code, argv, main, result_cap=result_cap, compiled=compiled,
                                call=call, modules=modules)
        del main  # what only it holds is freed as the run ends
        end_run(collections)
        status = outcome.status
        report = {"status": status, "result": outcome.result, "error": outcome.error,
                  **own_usage(begun)}
        if outcome.returned is not None:
            # The report is not made bigger than the run's memory, nor the
            # worker's, needs.
            report.update(returned_fields(outcome.returned, returned_cap))
        imported = imported_since_fork()
        if imported:
            report["imported"] = imported
        report = clean_report_frame(report)
        try:
            write_all(ctl_w, report)
        except OSError:
            pass
    except BaseException as exc:  # a fault before the user's code ran, or after it
        if status == 0:  # its report was lost (a MemoryError making it): not a clean exit
            status = 1
        try:
            user_traceback(exc)
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(status)


# ---------------------------------------------------------------------------
# Plots: matplotlib figures become PNG files in the run directory
# ---------------------------------------------------------------------------

_figures = {"dir": None, "count": 0, "max_pixels": None}


def save_figures():
    """Save every open pyplot figure as figure-N.png and close it."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or _figures["dir"] is None:
        return
    try:
        for num in plt.get_fignums():
            while True:
                _figures["count"] += 1
                path = os.path.join(_figures["dir"], "figure-%d.png" % _figures["count"])
                if not os.path.exists(path):
                    break
            figure = plt.figure(num)
            dpi = figure.dpi
            cap = _figures["max_pixels"]
            if cap:
                # At most `cap` pixels: the same figure, at a lower resolution.
                width, height = figure.get_size_inches()
                if width * height * dpi * dpi > cap:
                    dpi = (cap / (width * height)) ** 0.5
            figure.savefig(path, format="png", dpi=dpi)
        plt.close("all")
    except Exception as exc:
        try:
            sys.stderr.write("code-executor: could not save figures: %s\n" % exc)
        except Exception:
            pass


def patch_pyplot(module):
    def show(*args, **kwargs):
        save_figures()

    module.show = show


class _PatchingLoader:
    """Runs the real loader, then ``patch`` on the module it loaded."""

    def __init__(self, loader, patch):
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


# Module name -> what to call with that module once it is imported: see
# on_import.
_on_import = {}


class _ImportHook:
    """Meta-path finder that calls ``_on_import[name](module)`` on the module
    ``name`` once it is loaded."""

    def find_spec(self, name, path=None, target=None):
        patch = _on_import.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def on_import(name, patch):
    """Call ``patch(module)`` on the module ``name``: now if it is imported,
    else when it is."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    _on_import[name] = patch
    if not any(isinstance(f, _ImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportHook())


def install_plot_capture(rundir):
    _figures["dir"] = rundir
    on_import("matplotlib.pyplot", patch_pyplot)


# ---------------------------------------------------------------------------
# Artifacts: files a run created or changed in its directory
# ---------------------------------------------------------------------------

def read_file(path, size):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        chunks = []
        left = size
        while left > 0:
            data = os.read(fd, min(left, 1 << 20))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def readable(path, size):
    """``read_file``, or None where the run took away the read permission."""
    try:
        return read_file(path, size)
    except PermissionError:
        return None


def removed_if_empty(path):
    """Whether ``path`` was an empty directory, now removed."""
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False


def collect_artifacts(rundir, inputs, select, max_each, max_total):
    """Regular files under ``rundir`` that are new or differ from the input
    file of the same path; symlinks are never followed. And whether the
    listing was cut (see pick_artifacts and Walk)."""
    walk = Walk()
    files = ((rel, path, st.st_size) for rel, path, st in walk.files(rundir))
    found, cut = pick_artifacts(files, inputs, select, max_each, max_total)
    return found, cut or walk.cut


class Walk:
    """One walk of a directory tree: at most WALK_ENTRIES entries are read;
    ``cut`` says whether there were more."""

    __slots__ = ("left", "cut")

    def __init__(self):
        self.left = WALK_ENTRIES
        self.cut = False

    def files(self, root, tree=None):
        """(relative path, path, stat) of the regular files under ``root``:
        a directory's files in name order, then its subdirectories' in turn,
        depth first; symlinks are never followed. ``tree``: a
        TreeWatch, told of each directory before it is read. Past the entry
        budget the walk ends, the directory it was reading listed only in
        part."""
        pending = [""]
        while pending and not self.cut:
            rel_dir = pending.pop()
            path = os.path.join(root, rel_dir)
            if tree is not None:
                tree.add(path)
            try:
                entries = self.entries(path)
            except OSError:
                continue
            yield from self.regular(rel_dir, entries, pending)

    def entries(self, path):
        """The entries of directory ``path`` by name, while the budget lasts."""
        left = self.left
        entries = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if not left:
                        self.cut = True
                        break
                    left -= 1
                    entries.append(entry)
        finally:
            self.left = left
        entries.sort(key=lambda e: e.name)
        return entries

    @staticmethod
    def regular(rel_dir, entries, pending):
        """The regular files among ``entries`` (see files); directories go
        on ``pending``, the first to be read first."""
        dirs = []
        for entry in entries:
            rel = rel_dir + "/" + entry.name if rel_dir else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    yield rel, entry.path, entry.stat(follow_symlinks=False)
            except OSError:
                continue
        pending.extend(reversed(dirs))


# fnmatch and mimetypes as the artifact walk uses them (see artifact_modules).
_ARTIFACT_MODULES = None


def artifact_modules():
    """fnmatch and mimetypes, imported once and then kept here: once a
    session's process has them, a module of those names that a call sends
    or leaves in the session directory (first on sys.path), or takes out of
    sys.modules, is never the walk's (a call's own ``mimetypes.py`` would
    otherwise run in the walk, and could end the session)."""
    global _ARTIFACT_MODULES
    if _ARTIFACT_MODULES is None:
        import fnmatch, mimetypes  # noqa: E401

        _ARTIFACT_MODULES = (fnmatch, mimetypes)
    return _ARTIFACT_MODULES


def pick_artifacts(files, inputs, select, max_each, max_total):
    """The artifacts among ``files`` ((relative path, path, size) each):
    those ``select`` matches, except input files left as they were sent; the
    content of each while the caps allow, else ``omitted`` (also where the
    run took away the read permission: the file is still its own). And
    whether there were more than MAX_ARTIFACTS of them (the rest are not
    listed)."""
    found = []
    total = 0
    mimetypes = None
    for rel, path, size in files:
        if mimetypes is None:
            # At the first file: most runs leave none, and these two import
            # re and urllib.parse.
            fnmatch, mimetypes = artifact_modules()
        if select is not None and not any(fnmatch.fnmatchcase(rel, p) for p in select):
            continue
        try:
            original = inputs.get(rel)
            if original is not None and len(original) == size and readable(path, size) == original:
                continue
            if len(found) >= MAX_ARTIFACTS:
                return found, True
            item = {
                "path": rel,
                "size": size,
                "mime": mimetypes.guess_type(rel)[0] or "application/octet-stream",
            }
            data = None
            if size <= max_each and total + size <= max_total:
                data = readable(path, size)
            if data is None:
                item["omitted"] = True
            else:
                item["data"] = data
                total += size
        except OSError:
            continue
        found.append(item)
    return found, False


# ---------------------------------------------------------------------------
# The worker: the parent of every run
# ---------------------------------------------------------------------------

def signal_name(signum):
    import signal  # its enum costs ~7 ms to import, so not before a run is killed

    try:
        return signal.Signals(signum).name
    except ValueError:
        return "SIG%d" % signum


def exit_status(status):
    """(exit code, signal number or None) of a raw wait status, as results
    give them."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return -sig, sig
    return os.WEXITSTATUS(status), None


def report_cap(msg):
    """The most bytes a report on ``msg`` can need: its value's repr (up to
    4 bytes a character, and the note that says it was cut), a returned
    value, a session call's artifacts, and REPORT_ROOM."""
    return min(4 * (msg["max_result_chars"] + 64) + msg["max_artifact_bytes"]
               + msg["max_artifacts_bytes"] + REPORT_ROOM, NO_REPORT_LENGTH - 1)


# The length over every cap (report_cap stays below it) that a report
# buffer holds once no report can come on the pipe.
NO_REPORT_LENGTH = 0xFFFFFFFF
NO_REPORT = NO_REPORT_LENGTH.to_bytes(4, "big")


def read_report(fd, buf, cap):
    """Read the child's final report (a length-prefixed msgpack map) into
    ``buf``; return (report or None, whether the pipe closed). User code
    can write to the pipe too: a report announced longer than ``cap`` bytes
    is none, and what comes after its length is read and dropped, so that
    a run cannot make its worker hold what it writes there; nor, keeping
    the pipe full, keep the worker reading (PIPE_READS)."""
    for _ in range(PIPE_READS):
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            break
        except OSError:
            data = b""
        if not data:
            return complete_report(buf, cap), True
        if len(buf) < 4 or struct.unpack_from("!I", buf)[0] <= cap:
            buf += data
        report = complete_report(buf, cap)
        if report is not None:
            return report, False
    return None, False


def complete_report(buf, cap):
    if len(buf) < 4:
        return None
    (n,) = struct.unpack_from("!I", buf)
    if n > cap:
        del buf[4:]  # its length stays: the mark that the rest is dropped
        return None
    if len(buf) < 4 + n:
        return None
    if n == _CLEAN_REPORT.size - 4:
        _, a, status, b, cpu, c, peak = _CLEAN_REPORT.unpack_from(buf)
        if (a, b, c) == _CLEAN_PARTS and status < 0x80:
            return {"status": status, "result": None, "error": None, "cpu_ms": cpu,
                    "peak_rss_kb": peak}
    try:
        return report_unpackb(bytes(buf[4:4 + n]))
    except Exception:
        # No report can follow one that is not: what comes next is
        # dropped, as after a length over the cap, not decoded again.
        buf[:] = NO_REPORT
        return None


# A clean run's common report (it returned nothing, raised nothing and
# imported nothing the zygote could learn) as one struct: its length, then
# a msgpack map of status (0-127), result and error (nil), cpu_ms (a double)
# and peak_rss_kb (32 bits), the constant parts between the values. The
# worker reads it back with the same struct (complete_report).
_CLEAN_PARTS = (b"\x85\xa6status", b"\xa6result\xc0\xa5error\xc0\xa6cpu_ms\xcb",
                b"\xabpeak_rss_kb\xce")
_CLEAN_REPORT = struct.Struct("!I%dsB%dsd%dsI" % tuple(map(len, _CLEAN_PARTS)))


def clean_report_frame(report):
    """A clean run's ``report``, framed for its worker: the common one in
    one ``struct.pack`` (``packb`` walking its map cost the run ~3 us warm,
    more in place); any other through ``packb``."""
    if len(report) == 5 and report["result"] is None and report["error"] is None:
        status, cpu, peak = report["status"], report.get("cpu_ms"), report.get("peak_rss_kb")
        if (type(status) is int and 0 <= status < 0x80 and type(cpu) is float
                and type(peak) is int and 0 <= peak < 1 << 32):
            a, b, c = _CLEAN_PARTS
            return _CLEAN_REPORT.pack(_CLEAN_REPORT.size - 4, a, status, b, cpu, c, peak)
    return framed(packb(report))


def run_usage(child):
    """CPU time and peak RSS of the run's process, from the OS: the child is
    reaped here (its group is already killed) with ``os.wait4``.  Subprocesses
    count only as far as the run itself waited for them."""
    child.reap(True)
    usage = child.rusage
    if usage is None:
        return {}
    return {"cpu_ms": usage[0] * 1000.0, "peak_rss_kb": int(usage[1])}


def own_usage(begun=0.0):
    """The report's ``cpu_ms`` and ``peak_rss_kb``, as the run's own process
    measures them just before it reports (subprocesses it waited for
    included): CPU time since ``begun`` (its ``cpu_ms`` at the request's
    start), and the process's peak RSS in KiB."""
    if resource is None:
        return {}
    me, kids = own_rusage()
    cpu_ms = (me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime) * 1000.0
    return {"cpu_ms": max(0.0, cpu_ms - begun),
            "peak_rss_kb": max(me.ru_maxrss, kids.ru_maxrss)}


def own_rusage():
    """This process's rusage and that of the children it waited for."""
    return resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)


def sane_report(report):
    """The child's report, trusting nothing: user code can write to the ctl
    pipe, so anything that is not a well-formed report reads as an empty one."""
    if not isinstance(report, dict):
        report = {}
    status = report.get("status")
    error = report.get("error")
    if isinstance(error, dict):
        error = {k: error.get(k) for k in ("type", "message", "traceback", "line", "errno")}
        for k in ("type", "message", "traceback"):
            if not isinstance(error[k], str):
                error[k] = ""
        # In the ranges the server decodes (u32, i32): a forged value must
        # not make the frame unreadable.
        for k, top in (("line", 0xFFFFFFFF), ("errno", 0x7FFFFFFF)):
            value = error[k]
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
                error[k] = None
    else:
        error = None
    result = report.get("result")
    sane = {
        "status": status if isinstance(status, int) and not isinstance(status, bool)
        and -255 <= status <= 255 else 0,
        "result": result if isinstance(result, str) else None,
        "error": error,
    }
    cpu, rss = report.get("cpu_ms"), report.get("peak_rss_kb")
    if isinstance(cpu, float) and 0 <= cpu < 1e15:
        sane["cpu_ms"] = cpu
    if isinstance(rss, int) and not isinstance(rss, bool) and 0 <= rss < 1 << 63:
        sane["peak_rss_kb"] = rss
    returned = report.get("returned")
    if isinstance(returned, str) and returned.isascii():  # as json.dumps writes it
        sane["returned"] = returned
    refused = report.get("refused")
    if (isinstance(refused, dict) and refused.get("code") in ("conflict", "too_large")
            and isinstance(refused.get("message"), str)):
        sane["refused"] = {"code": refused["code"], "message": refused["message"]}
    size = report.get("returned_size")
    if isinstance(size, int) and not isinstance(size, bool) and 0 <= size < 1 << 63:
        sane["returned_size"] = size
    if report.get("timed_out") is True:
        sane["timed_out"] = True
    imported = report.get("imported")
    if isinstance(imported, list):
        sane["imported"] = list(dict.fromkeys(
            name for name in imported[:LEARN_REPORTED] if learnable(name)))
    return sane


def empty_pipe(fd):
    """Read a non-blocking wake-up pipe empty."""
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def normalize(rel):
    return "/".join(p for p in rel.split("/") if p not in ("", "."))


class Child:
    """A forked child waiting for its request, with the pipes around it."""

    __slots__ = ("pid", "rundir", "req_w", "out_r", "err_r", "ctl_r", "ctl_r_open", "status",
                 "rusage", "zygote", "left", "held")

    def __init__(self, pid, rundir, req_w, out_r, err_r, ctl_r, zygote=None):
        self.pid = pid  # None: the zygote's answer to its fork is not read yet (``forked``)
        self.zygote = zygote  # the Zygote that forked it; None: the worker did
        self.left = True  # whether processes may be left from its run once it ended
        self.rundir = rundir
        self.req_w = req_w
        self.out_r = out_r
        self.err_r = err_r
        self.ctl_r = ctl_r
        self.ctl_r_open = True
        self.status = None  # raw wait status once reaped
        self.rusage = None  # (CPU seconds, peak RSS in KiB), once reaped
        # program_key -> id of the programs its zygote held when it forked
        # it (see HELD)
        self.held = zygote.held if zygote is not None else {}

    def forked(self):
        """Make sure it exists and its pid is known: the zygote's answer to
        its fork is read now if it was not yet (by then it is long there:
        see Zygote.fork). One whose fork failed has its pipes closed, and
        raises the OSError."""
        if self.pid is None:
            try:
                self.pid = self.zygote.forked()
            except OSError:
                self.close()
                raise

    def reap(self, block):
        if self.status is None:
            if self.zygote is not None:
                ended = self.zygote.exit_of(self.pid, block)
                if ended is not None:
                    self.status, self.rusage, self.left = ended
                return self.status is not None
            try:
                pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, status, usage = self.pid, 0, None
            if pid:
                self.status = status
                self.rusage = usage and (usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
        return self.status is not None

    def kill_group(self):
        try:
            os.killpg(self.pid, _signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self):
        """Its process group and the child itself, which may have moved
        into another group: what comes before waiting for it to end (its pid
        is not reused before it is reaped)."""
        self.kill_group()
        if not self.reap(False):
            try:
                os.kill(self.pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self):
        for fd in (self.req_w, self.out_r, self.err_r, self.ctl_r):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_w = self.out_r = self.err_r = self.ctl_r = None


class DiskWatch:
    """A run's ``limits.disk_bytes``: the bytes in use on the worker's scratch
    filesystem (its own tmpfs, which holds nothing but the current run's
    directories) may grow by at most that much, checked every INTERVAL
    seconds while the run lasts; past it the run is killed."""

    INTERVAL = 0.02
    __slots__ = ("path", "limit", "base")

    def __init__(self, path, limit):
        self.path = path
        self.limit = limit
        self.base = self.used()

    def used(self):
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def exceeded(self):
        return self.used() - self.base > self.limit


class Capture:
    """One captured stream, keeping at most ``cap`` bytes."""

    __slots__ = ("chunks", "size", "cap", "truncated", "open", "name")

    def __init__(self, cap, name):
        self.chunks = []
        self.size = 0
        self.cap = cap
        self.truncated = False
        self.open = True
        self.name = name

    def feed(self, data):
        """Keep what fits under the cap; return the part kept."""
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        if data:
            self.chunks.append(data)
            self.size += len(data)
        return data

    def value(self):
        return b"".join(self.chunks)


class Supervision:
    """What ``supervise`` saw of one run or session call."""

    __slots__ = ("out", "err", "report", "ended", "timed_out", "duration_ms", "exit_code",
                 "signal")

    def __init__(self, cap, ended):
        self.out = Capture(cap, "stdout")
        self.err = Capture(cap, "stderr")
        self.report = None  # the child's report (checked), if it sent one
        # How the run ended: "report" (the child reported), "exit" (it exited,
        # or a session child closed its report pipe), "timeout", "disk" or
        # "cancel" (killed for that), "unsent" (the request never reached it).
        self.ended = ended
        self.timed_out = False
        self.duration_ms = 0.0
        self.exit_code = 0
        self.signal = None  # number of the signal that ended the child, if one did


def supervise(worker, child, msg, start, disk=None, session=None, ended=None):
    """Watch ``child`` serve the request ``msg``, handed to it at ``start``,
    until it ends: drain its stdout and stderr (at most ``max_output`` bytes
    of each kept, sent on as ``output`` frames when ``stream`` asks), read its
    report, and enforce the deadline and the ``disk`` watch.  The child's
    pipes are drained before this returns: what is written in them meanwhile
    is read up to a full pipe (see PIPE_READS); more is cut off, and its
    stream marked ``truncated``.

    A clean run (``session`` None) ends when its child reports, or exits and
    closes its report pipe; at its deadline, over its disk quota or when the
    server cancels it, it is killed (SIGKILL).  Its process group is killed in
    any case: stray subprocesses do not outlive their run.

    A session call (``session``: the Session) ends when the session child
    reports; at the deadline the child gets SIGINT (KeyboardInterrupt) and
    ``session.grace`` more seconds before it is killed.  A call is never
    cancelled (the server kills a session's worker instead), so the channel
    is watched only for the server going away.  A session child that exits or
    closes its report pipe during the call is lost (and killed).

    ``ended`` is "unsent" when the request could not be handed over: there is
    nothing to wait for.  Raises ChannelClosed when the server went away."""
    run = Supervision(msg["max_output"], ended)
    stream_id = msg["id"] if msg["stream"] else None
    timeout = msg["timeout"]
    streams = {child.out_r: run.out, child.err_r: run.err}
    persistent = session is not None
    poller = select.poll()
    # Where the end of the child is heard of: the zygote's reports, or
    # SIGCHLD through the wake-up pipe.
    exits = child.zygote.fd if child.zygote is not None else worker.wake_r
    for fd in (child.ctl_r, exits):
        poller.register(fd, select.POLLIN)
    # The output pipes are watched from the start only when streamed (see
    # QUIET); they are drained once the run is over in any case.
    quiet = None
    if stream_id is None:
        quiet = start + QUIET
    else:
        for fd in streams:
            poller.register(fd, select.POLLIN)
    # POLLIN: a clean run may be cancelled; 0: only POLLHUP and POLLERR.
    poller.register(worker.rfd, 0 if persistent else select.POLLIN)
    report = None
    ctl = bytearray()
    cap = report_cap(msg)
    deadline = start + timeout
    while run.ended is None:
        now = time.monotonic()
        remaining = deadline - now
        if quiet is not None:
            if now < quiet:
                remaining = min(remaining, quiet - now)
            else:
                quiet = None
                for fd, capture in streams.items():
                    if capture.open:
                        poller.register(fd, select.POLLIN)
        if remaining <= 0:
            if persistent and not run.timed_out:
                run.timed_out = True
                try:
                    os.kill(child.pid, _signal.SIGINT)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + session.grace
                continue
            run.timed_out = True  # a session call's interrupt was not heeded
            run.ended = "timeout"
            break
        if disk is not None:
            if disk.exceeded():
                run.ended = "disk"
                break
            remaining = min(remaining, DiskWatch.INTERVAL)
        # Every event of a batch is handled before the loop looks at ``ended``.
        for fd, _ in poller.poll(max(1, int(remaining * 1000) + 1)):
            if fd in streams:
                worker.drain(fd, streams[fd], poller, stream_id)
            elif fd == child.ctl_r:
                report, closed = read_report(fd, ctl, cap)
                if report is not None:
                    run.ended = "report"
                elif closed:
                    poller.unregister(fd)
                    child.ctl_r_open = False
                    if persistent or child.reap(False):
                        run.ended = "exit"
            elif fd == exits:
                if fd == worker.wake_r:
                    empty_pipe(fd)
                if child.reap(False) and (persistent or not child.ctl_r_open):
                    run.ended = "exit"
            elif fd == worker.rfd:
                if persistent:
                    raise ChannelClosed()
                # ChannelClosed when the server went away; nothing but
                # ``cancel`` comes during a run.
                if server_frame(read_frame(worker.rfile))["t"] != "cancel":
                    raise ChannelClosed()
                run.ended = "cancel"
    run.duration_ms = (time.monotonic() - start) * 1000.0
    # A clean run's process group ends here whatever the outcome: stray
    # subprocesses do not outlive their run.  A session child lives on
    # unless the call cost its life.
    killed = run.ended in ("timeout", "disk", "cancel")
    if killed or run.ended == "unsent" or (persistent and run.ended != "report"):
        child.kill()
        child.reap(True)
    elif not persistent:
        child.kill_group()
    for fd, capture in streams.items():
        if capture.open:
            worker.drain(fd, capture, None, stream_id)
    if report is not None:
        run.report = sane_report(report)
    if killed:
        run.exit_code, run.signal = -_SIGKILL, _SIGKILL
    elif run.report is not None:
        run.exit_code = run.report["status"]
    else:
        child.reap(True)
        run.exit_code, run.signal = exit_status(child.status or 0)
    return run


def result_frame(msg, run, artifacts, artifacts_cut=False):
    """The ``result`` frame of a run or session call that ``supervise``
    watched; ``artifacts_cut``: its listing of artifacts was cut (see
    pick_artifacts and Walk)."""
    report = run.report or {}
    frame = {
        "t": "result",
        "id": msg["id"],
        "stdout": run.out.value(),
        "stderr": run.err.value(),
        "exit_code": run.exit_code,
        "signal": run.signal,
        "timed_out": run.timed_out or report.get("timed_out") is True,
        "stdout_truncated": run.out.truncated,
        "stderr_truncated": run.err.truncated,
        "duration_ms": run.duration_ms,
        "result": report.get("result"),
        "error": report.get("error"),
        "artifacts": artifacts,
        **{k: report[k] for k in ("cpu_ms", "peak_rss_kb") if k in report},
    }
    if artifacts_cut:
        frame["artifacts_cut"] = True
    if "refused" in report:
        frame["refused"] = report["refused"]
    returned = report.get("returned")
    if returned is not None:  # the run's process capped it, unless forged
        frame.update(returned_fields(returned, msg["max_artifact_bytes"]))
    elif "returned_size" in report:
        frame["returned_size"] = report["returned_size"]
    return frame


def input_files(files):
    """A request's input ``files`` by normalized path, to tell them from
    artifacts."""
    return {normalize(p): d for p, d in files}


def artifact_globs(select):
    """The ``artifacts`` field of an ``exec``: None (every file) or its globs."""
    return None if select is True else list(select)


class Worker:
    def __init__(self, scratch, rfd, wfd):
        self.scratch = scratch
        self.rfd = rfd
        self.wfd = wfd
        self.rfile = open(rfd, "rb", buffering=0)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        # Every run has this directory, emptied and made anew between runs,
        # so what a run sees of it is set once here and inherited.
        self.rundir = os.path.join(scratch, "run")
        self.base_tmp = {name: os.environ.get(name) for name in TMP_VARS}
        set_run_dir(self.rundir, {name: private_tmp(self.rundir) for name in TMP_VARS})
        # Not a place the worker (or its zygote) imports from: a run's files
        # are there.  Each run's child drops this entry once its files are
        # written (see child_main).
        sys.path_importer_cache[self.rundir] = None
        self.next = None
        self.session = None  # a Session once a `session` frame switched this worker
        self.zygote = None  # started by main once the worker is set up
        self.prepared = False  # whether prepare_later_runs ran here
        self.scope = None  # a Landlock ruleset fd that scopes signals, if any
        # Whether runs can signal the zygote (no Landlock signal scope): a run
        # then ends, leftovers and all, before it is answered.
        self.exposed = False
        self.dirty = None  # why the scratch root could not be cleared, if it could not
        self.learning = Learning()
        # The programs of the run in flight, as take_child found them:
        # (program_key, compiled); and the keys of those run once (see
        # hold_repeats).
        self.programs = []
        self.seen = {}
        # (device, size) of the scratch root while empty, where it is on a
        # tmpfs (see clear_scratch); None elsewhere.
        self.empty_root = empty_tmpfs_root(scratch)
        self.empty_shm = empty_tmpfs_root("/dev/shm") if private_shm() else None
        # What the filesystems of the scratch root and a private /dev/shm
        # held once clear (see heavy_cleanup).
        self.clear_marks()
        # Whether a frame from the server is waiting (``queued``).
        self.incoming = select.poll()
        self.incoming.register(rfd, select.POLLIN)

    def queued(self):
        """Whether the server's next frame is already here."""
        return bool(self.incoming.poll(0))

    def passes_fds(self):
        """Whether the channel from the server is a socket, over which the
        worker can hand it descriptors (a pipe cannot carry them)."""
        return stat.S_ISSOCK(os.fstat(self.rfd).st_mode)

    def spawn(self, warm=WARM_AFTER_MS):
        """Fork the next child; it waits for its request, rehearsing the
        request path once it has waited ``warm`` ms (None: never)."""
        try:
            os.mkdir(self.rundir, 0o700)
        except FileExistsError:  # left by a run that was not retired
            self.cleaned(clear_dir(self.scratch))
            os.mkdir(self.rundir, 0o700)
        os.mkdir(private_tmp(self.rundir), 0o700)
        if self.zygote is None:
            self.next = self.fork_child(
                self.rundir, lambda *fds: child_main(*fds, warm=warm))
            return
        self.next = self.zygote_child(self.rundir, self.zygote.fork, warm)

    def zygote_child(self, rundir, ask, *args):
        """A Child the zygote forks: ``ask(fds, *args)`` hands it the child's
        ends (req_r, out_w, err_w, ctl_w) of four new pipes, closed here
        once sent; on failure the worker's ends are closed too."""
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        child = self.child_of(None, rundir, req_w, out_r, err_r, ctl_r, self.zygote)
        try:
            ask((req_r, out_w, err_w, ctl_w), *args)
        except BaseException:
            child.close()
            raise
        finally:
            for fd in (req_r, out_w, err_w, ctl_w):
                os.close(fd)
        return child

    def fork_session(self, rundir, limits, direct, prefork=None):
        """A session child forked by the zygote (see open_session), which
        first kills and reaps ``prefork`` (a Child it forked, or None)."""
        child = self.zygote_child(rundir, self.zygote.fork_session, limits, direct, rundir,
                                  prefork.pid if prefork is not None else 0)
        try:
            child.forked()
        except ZygoteLost:
            child.close()
            raise
        return child

    @staticmethod
    def child_of(pid, rundir, req_w, out_r, err_r, ctl_r, zygote=None):
        for fd in (out_r, err_r, ctl_r):
            os.set_blocking(fd, False)
        return Child(pid, rundir, req_w, out_r, err_r, ctl_r, zygote)

    def fork_child(self, rundir, body):
        """Fork a child of the worker itself (without a zygote: tests of
        CODE_EXECUTOR_NO_ZYGOTE alone) in its own process
        group with fresh request, output and control pipes; it runs
        ``body(worker_pid, rundir, req_r, out_w, err_w, ctl_w, parent_fds)``,
        which never returns."""
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        parent_fds = (self.rfd, self.wfd, self.wake_r, self.wake_w, req_w, out_r, err_r, ctl_r)
        if self.zygote is not None:
            parent_fds += (self.zygote.fd,)
        worker_pid = os.getpid()
        # Earlier requests' programs stay out of the child's memory.
        _precompiled.clear()
        pid = os.fork()
        if pid == 0:
            body(worker_pid, rundir, req_r, out_w, err_w, ctl_w, parent_fds)
        for fd in (req_r, out_w, err_w, ctl_w):
            os.close(fd)
        try:
            # The child makes its own group first thing (enter_run); this
            # only closes the race, and fails harmlessly once it has exited.
            os.setpgid(pid, pid)
        except OSError:
            pass
        return self.child_of(pid, rundir, req_w, out_r, err_r, ctl_r)

    def retire(self, child, rundir_removed=False):
        """Kill ``child`` and what its run left, and clear the scratch root.
        A ZygoteLost is raised once that is done all the same: the zygote is
        then stopped, and what it left (the child among it) was handed to
        the worker, a subreaper, which kills it."""
        lost = None
        try:
            try:
                child.forked()
            except OSError:
                return  # never forked: nothing ran
            child.kill()
            child.reap(True)
            # What the run left running was handed to its parent (a
            # subreaper) when the run's process died.
            if child.zygote is not None and child.left:
                child.zygote.kill_leftovers()
        except ZygoteLost as exc:
            lost = exc
            child.zygote.stop()
        if child.zygote is None or lost is not None:
            kill_descendants()
        self.cleaned(clear_private_shm(self.empty_shm))
        child.close()
        # Everything in the scratch root goes, not only the run's own
        # directories: what a run wrote beside them (``~`` is the scratch
        # root) must neither reach the next run nor hold its disk quota.
        self.cleaned(self.clear_scratch(rundir_removed))
        if lost is not None:
            raise lost

    def dismiss(self, child):
        """Reap a pre-forked run child that never had a request, which its
        zygote killed as it forked a session (see end_child; killed here if
        the session's request never reached the zygote), and remove its
        directories: unlike ``retire``, nothing else of the scratch root,
        where the session lives, and none of the zygote's other children."""
        try:
            if not child.reap(False):
                # Not reported: the zygote, which reports it before the
                # session's pid, has not reaped it, so its pid is its own.
                child.kill()
                child.reap(True)
        except ZygoteLost as exc:
            self.dirty = self.dirty or "the zygote is gone: %s" % exc
        child.close()
        for path in (private_tmp(child.rundir), child.rundir):
            self.cleaned(clear_dir(path))
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.cleaned("cannot remove %s: %s" % (path, exc))

    def clear_scratch(self, rundir_removed=False):
        """``clear_dir`` of the scratch root. On a tmpfs, where a directory's
        size counts its entries, a root that held no more than the run's two
        directories, empty, is cleared by removing them (the run directory
        only if not ``rundir_removed`` already): its size then says it is
        empty, and there is nothing to list."""
        if self.empty_root is not None:
            dirs = (private_tmp(self.rundir),)
            if not rundir_removed:
                dirs += (self.rundir,)
            for path in dirs:
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError:  # not empty, not a directory
                    return clear_dir(self.scratch)
            if still_empty(self.scratch, self.empty_root):
                return None
        return clear_dir(self.scratch)

    def clear_marks(self):
        """Note the inodes in use on the filesystems of the scratch root and
        a private /dev/shm (None: not counted there) and, where the root's
        are not counted, its size, with both clear, for heavy_cleanup to
        compare with."""
        self.scratch_inodes = inodes_used(self.scratch)
        self.shm_inodes = inodes_used("/dev/shm") if self.empty_shm is not None else None
        self.root_bytes = 0
        if self.scratch_inodes is None:
            try:
                self.root_bytes = os.lstat(self.scratch).st_size
            except OSError:
                pass

    def heavy_cleanup(self, child, removed):
        """Whether the run left more than HEAVY_CLEANUP entries to clear, as
        one look tells before the clean-up begins: by the inodes in use on
        the scratch root's filesystem, else (one that does not count them)
        by the sizes of the run's directories and of the root, which miss
        a subdirectory's entries. On a filesystem the scratch root shares
        with others (no scratch tmpfs), theirs count too, made since the
        last clean-up set the mark: a false alarm costs the server one
        more frame."""
        if self.scratch_inodes is not None:
            if self.past_mark(self.scratch, self.scratch_inodes):
                return True
        else:
            dirs = [(self.scratch, self.root_bytes), (private_tmp(child.rundir), 0)]
            if not removed:
                dirs.append((child.rundir, 0))
            for path, clear in dirs:
                try:
                    if os.lstat(path).st_size - clear > HEAVY_DIR_BYTES:
                        return True
                except OSError:
                    pass
        return self.shm_inodes is not None and self.past_mark("/dev/shm", self.shm_inodes)

    def past_mark(self, path, clear):
        """Whether the inodes in use on the filesystem of ``path`` are over
        HEAVY_CLEANUP more than ``clear``, noted when it was clear."""
        used = inodes_used(path)
        return used is not None and used - clear > HEAVY_CLEANUP

    def say_cleaned(self):
        """Tell the server, which was told the run's clean-up is heavy
        (``cleaning``), that it is over: a bare ``cleaned`` frame, or with
        ``retire`` and why when something stayed (the worker refuses
        requests from now on)."""
        frame = {"t": "cleaned"}
        if self.dirty is not None:
            frame["retire"] = True
            frame["message"] = "worker retired: " + self.dirty
        write_frame(self.wfd, frame)

    def cleaned(self, problem):
        """Note a clean-up that left something: the worker is then dirty and
        answers its next request with a ``retire`` error (the server runs it
        elsewhere and replaces this worker), never on a dirty root."""
        if problem is not None and self.dirty is None:
            self.dirty = problem
            sys.stderr.write("code-executor: scratch not clean, retiring: %s\n" % problem)

    def take_child(self, msg):
        """Hand the request to the waiting child, re-forking once if it died.
        Its programs, compiled, go in the request, or their ids where the
        child's zygote held them when it forked the child (see HELD); they
        are left in ``self.programs`` for hold_repeats."""
        digits = msg.get("int_max_str_digits")
        compiled = precompile(msg["code"], digits)
        files = precompile_files(msg["files"], msg["compile"], digits) if msg.get("compile") else {}
        key = None
        if HOLD_PROGRAMS and self.zygote is not None:
            key = program_key(msg["code"], digits, None)
            files = {path: (program_key(*source), module)
                     for path, (source, module) in files.items()}
            self.programs = [(key, compiled), *files.values()]
        for attempt in (0, 1):
            child = self.next
            self.next = None
            if child is not None:
                try:
                    child.forked()
                except OSError:  # the zygote could not fork it (at the pids cap)
                    child = None
            if child is None or child.reap(False):
                if child is not None:
                    self.retire(child)
                self.spawn(None)  # a client waits: no rehearsal
                child = self.next
                self.next = None
                child.forked()
            ids = child.held
            msg["compiled"] = ids.get(key, compiled) if ids else compiled
            if files:
                msg["compiled_files"] = {path: ids.get(name, module)
                                         for path, (name, module) in files.items()}
            frame = hand_off(msg)
            try:
                # One write: the child wakes once, with the whole frame there.
                write_all(child.req_w, frame)
                os.close(child.req_w)
                child.req_w = None
                return child
            except BrokenPipeError:
                self.retire(child)
                if attempt:
                    raise
        raise RuntimeError("unreachable")

    def execute(self, msg):
        disk_bytes = msg["limits"].get("disk_bytes")
        disk = DiskWatch(self.scratch, disk_bytes) if disk_bytes else None
        start = time.monotonic()
        try:
            child = self.take_child(msg)
        except ZygoteLost as exc:
            exc.when = "before"
            raise
        gone = False  # the server went away: no next child
        answered = False
        heavy = False  # the answer says ``cleaning``: ``cleaned`` follows it
        imported = None
        removed = False  # whether the run's directory was removed, empty
        try:
            run = supervise(self, child, msg, start, disk=disk)
            if self.exposed:
                self.end_processes(child)
            if run.report is not None:
                imported = run.report.get("imported")
            artifacts = []
            cut = False
            # Most runs leave their directory empty: it goes now, with one
            # call, and there is nothing to list (nor for the clean-up to).
            if msg["artifacts"] is not False:
                removed = removed_if_empty(child.rundir)
            if msg["artifacts"] is not False and not removed:
                artifacts, cut = collect_artifacts(
                    child.rundir,
                    input_files(msg["files"]),
                    artifact_globs(msg["artifacts"]),
                    msg["max_artifact_bytes"],
                    msg["max_artifacts_bytes"],
                )
            reply = result_frame(msg, run, artifacts, cut)
            if msg.get("rusage"):
                reply.update(run_usage(child))
            # A run that ends between two looks may have ended over it.
            if run.ended == "disk" or (disk is not None and disk.exceeded()):
                reply["disk_exceeded"] = True
            heavy = cut or self.heavy_cleanup(child, removed)
            if heavy:
                reply["cleaning"] = True
            write_frame(self.wfd, reply)
            answered = True
        except ChannelClosed:
            gone = True
            raise
        finally:
            # Off the request path: reap (done already where runs can signal
            # the zygote: see end_processes), clean up, fork the next child.
            # The rehearsal only moves work ahead of a request, so the next
            # child skips it where runs are bound by CPU, not by one run's
            # latency: after a run whose client waits for its exit (graded
            # runs, which report the kernel's rusage: they come in bursts),
            # and when the next request came while this one was cleaned up
            # (the server has runs queued for this environment). Where the
            # server saw this run come after a pause, with nothing else in
            # flight (``paused``), its client's next pause is the CPU's free
            # time: the child warms up at once. Otherwise it does only if
            # its request has not come within WARM_AFTER_MS.
            try:
                try:
                    self.retire(child, removed)
                except Exception as exc:
                    # Whatever the clean-up did not finish, no run goes there.
                    gist = "the zygote is gone" if isinstance(exc, ZygoteLost) else "clean-up failed"
                    self.dirty = self.dirty or "%s: %s" % (gist, exc)
                    raise
                finally:
                    # On a filesystem shared with others, their files come
                    # and go: the mark is set anew after every clean-up.
                    if heavy or self.empty_root is None:
                        self.clear_marks()
                    if heavy and answered:
                        self.say_cleaned()
                if not gone:
                    self.learn(imported)
                    self.hold_repeats()
                    if msg.get("rusage") or self.queued():
                        warm = None
                    else:
                        warm = 0 if msg.get("paused") else WARM_AFTER_MS
                    self.spawn(warm)
            except ZygoteLost as exc:
                if answered:
                    exc.when = "after"
                raise

    @staticmethod
    def end_processes(child):
        """Kill and reap the run's process and whatever it left running. Where
        runs can signal the zygote (``exposed``), this comes before the
        answer: no process of a run that was answered can stop or kill the
        zygote, whose next child serves the next request."""
        child.kill()
        child.reap(True)
        if child.left:
            child.zygote.kill_leftovers()
            child.left = False

    def hold_repeats(self):
        """Have the zygote hold the programs of the run just ended that an
        earlier run used too (see HELD): the children it forks next find
        them loaded. Those it holds already become its most recently used."""
        programs, self.programs = self.programs, []
        zygote = self.zygote
        if zygote is None:
            return
        for key, compiled in programs:
            if compiled is None:
                continue
            if key in zygote.held or key in self.seen:
                zygote.hold(key, compiled)
            else:
                self.seen[key] = None
                if len(self.seen) > SEEN_PROGRAMS:
                    del self.seen[next(iter(self.seen))]

    def learn(self, imported):
        """Tally a run's imports; have the zygote import the next few now
        due (see "Learned imports"): when no request waits, or when they
        have waited LEARN_DEFERRED runs (a burst of runs would otherwise
        never leave a gap, and it is the burst that pays most for them)."""
        if self.zygote is None:
            return
        learning = self.learning
        learning.note(imported)
        if not learning.pending or not learning.open:
            return
        if self.queued() and learning.deferred < LEARN_DEFERRED:
            learning.deferred += 1
            return
        learning.deferred = 0
        consumed, learning.open = self.zygote.learn(learning.pending[:LEARN_SENT])
        del learning.pending[:consumed]

    def drain(self, fd, capture, poller, stream_id=None):
        """Read what ``fd`` holds into ``capture``, PIPE_READS reads at most;
        with no ``poller`` (the run is over) what is left past them is cut
        off: something still writes, or the pipe was made larger."""
        for _ in range(PIPE_READS):
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                capture.open = False
                if poller is not None:
                    poller.unregister(fd)
                return
            kept = capture.feed(data)
            if stream_id is not None and kept:
                write_frame(self.wfd, {"t": "output", "id": stream_id, "stream": capture.name, "data": kept})
        if poller is None:
            capture.truncated = True

    def serve(self):
        if self.next is None:
            self.spawn()
        # Until its first run or session, a worker that waits PREPARE_IDLE_MS
        # for a request has its zygote prepare (``R``): its first run's
        # end, where the zygote prepares otherwise, may be far off, and a
        # session forked meanwhile would do without. Never while a run is
        # on: the preparation would take the CPU from it.
        idle = None
        if self.zygote is not None:
            idle = select.poll()
            idle.register(self.rfd, select.POLLIN)
        while True:
            if idle is not None and not idle.poll(PREPARE_IDLE_MS):
                idle = None
                try:
                    self.zygote.send([b"R"], [])
                except ZygoteLost:
                    pass  # the next request finds out
            try:
                frame = read_frame(self.rfile)
            except ChannelClosed:
                return
            msg = server_frame(frame)
            del frame  # a large request is held once, decoded
            kind = msg["t"]
            if kind in ("exec", "session"):
                idle = None
            if kind in ("session", "exec") and self.dirty is not None:
                # Nothing runs on a root an earlier run could plant state in.
                write_frame(self.wfd, {"t": "error", "id": msg["id"], "retire": True,
                                       "message": "worker retired: " + self.dirty})
                return
            if kind == "release":
                release_session(self, msg)
                continue
            if kind in ("session", "exec", "end") and (kind == "session" or self.session is not None):
                try:
                    serve_session(self, msg)
                except ChannelClosed:
                    return
                continue
            if kind == "interrupt":
                if self.session is not None:
                    self.session.interrupt()
                # Answered once the signal is sent: the server sends no
                # next call before, so it cannot land in one.
                write_frame(self.wfd, {"t": "result", "id": msg.get("id"), "exit_code": 0})
                continue
            if kind == "exec":
                try:
                    self.execute(msg)
                    if not self.prepared:
                        # The first run has answered: the worker's later
                        # requests find these imported and its heap frozen
                        # (see prepare_later_runs), and so do the children
                        # it forks itself (without a zygote).
                        prepare_later_runs()
                        self.prepared = True
                except ChannelClosed:
                    return
                except ZygoteLost as exc:
                    # The server replaces this worker. A request it has run
                    # nothing of runs on another worker (``retire``), as the
                    # next one does when this one was answered already (the
                    # worker is dirty); one whose run died with the zygote is
                    # told so.
                    sys.stderr.write("code-executor: %s\n" % exc)
                    if exc.when == "after":
                        self.dirty = self.dirty or "the zygote is gone: %s" % exc
                        continue
                    if exc.when == "before":
                        write_frame(self.wfd, {"t": "error", "id": msg.get("id"), "retire": True,
                                               "message": "worker retired: %s" % exc})
                    else:
                        write_frame(self.wfd, {"t": "error", "id": msg.get("id"),
                                               "message": "the run's process was lost: %s" % exc})
                    return
                except Exception as exc:
                    # ``get``: a frame that lacks a required field (KeyError)
                    # is answered too, by an error naming the field.
                    write_error(self.wfd, msg.get("id"), "", exc)
                    if self.next is None:
                        self.spawn()
            elif kind == "cancel":
                pass  # for a run that had already answered
            elif kind == "echo":
                value = msg["value"]
                write_frame(self.wfd, {"t": "echo", "value": value, "repr": repr(value)[:4096]})
            else:
                write_error(self.wfd, msg.get("id"), "unknown frame type %r" % (kind,))

    def close(self):
        if self.session is not None:
            self.session.close()
        try:
            if self.next is not None:
                self.retire(self.next)
        except ZygoteLost:
            pass
        if self.zygote is not None:
            # The zygote kills what is left of its children as it exits.
            self.zygote.stop()
        kill_descendants()  # and the worker what was left to it


# ---------------------------------------------------------------------------
# The zygote: the process clean runs are forked from
# ---------------------------------------------------------------------------
#
# A fork leaves every page the parent shares with the child copy-on-write,
# so a worker that forked its runs itself would copy, during each request,
# every page its own request path writes, and hand each run what earlier
# requests left in its memory (freed memory keeps its bytes).  Instead the
# worker forks, once, before any request, a zygote that does nothing but
# fork runs and sessions: the worker's pages stay its own and its request
# path runs warm.  Worker and zygote share a SOCK_SEQPACKET pair:
#
#   worker -> zygote  F + the child's 4 pipe ends (SCM_RIGHTS): fork a run
#                       child that rehearses once it has waited
#                       WARM_AFTER_MS; answered by  P + pid.  W: the same,
#                       for a child that rehearses at once; f: for one that
#                       does not rehearse (see Worker.execute)
#                     S + marshalled (limits, direct, directory, pid) + the
#                       4 pipe ends: kill and reap the run child ``pid``
#                       (the pre-forked one; 0: none) and report its exit
#                       (X), then fork a session child (see "Sessions"),
#                       answered by  P + pid as F is
#                     R: prepare for later runs (prepare_later_runs) now,
#                       if not done yet; not answered
#                     K: kill and reap every child left (between runs these
#                       are only what a run left running: the zygote is a
#                       subreaper); answered by  k
#                     I + module names, one per line: import the next few
#                       (see "Learned imports"); answered by  i + 1 (it
#                       takes more) or 0, and how many names it dealt with
#                     C + marshalled (id, ids to drop, size), then a message
#                       of that size: a program to hold under that id (see
#                       HELD), marshalled; not answered
#   zygote -> worker  X + pid, wait status, CPU seconds, peak RSS, whether
#                       other children are left: a child ended (sent when it
#                       is reaped, unasked); with none left, K is not needed
#
# The zygote dies with its worker (parent-death signal), and its children
# with it; it exits when the worker closes its end.

_EXIT = struct.Struct("!iidq?")
# A fork request's kind: how long its child waits before it warms up.
_FORK_WARM = {b"F": WARM_AFTER_MS, b"W": 0, b"f": None}
_FORK_KIND = {wait: kind for kind, wait in _FORK_WARM.items()}
# One descriptor of an SCM_RIGHTS message (a C int).
_FD = struct.Struct("i")


# The after-fork handlers the zygote holds back from its children (see
# hold_fork_handlers), by name: each function, its own code, which each
# child puts back before anything else runs, and what the child does in its
# stead (or None).
_held_fork_handlers = {}


def _no_fork_handler():
    pass


def hold_fork_handlers():
    """Spare the zygote's children the after-fork handlers of ``threading``
    and ``logging``, where the zygote imported them (``site``, as most
    installs' ``.pth`` files do, a preload, or a learned import such as
    ``asyncio`` or ``concurrent.futures``). After a bare fork
    ``threading``'s costs a child ~0.25 ms of CPU and ~100 copy-on-write
    page faults (``benches/support/worker_cost.py``); ``logging``'s, which
    walks a weak set of handlers, ~0.25 ms and ~80 (the same fork-and-exit
    loop in a process that imported ``asyncio``, ``threading``'s held); in
    a run, whose own code touches many of the same pages, ~45 faults and
    ~20-35.

    The handlers make the modules' state true in a process forked from one
    that had other threads. The zygote never has any (it is a fork of the
    worker's main thread and runs no code but its own), so its children's
    state is already true: the same main thread, with the same ident, and no
    lock held, but for ``logging``'s module lock, which its handler before
    the fork takes and which each child resets itself; ``logging``'s is held
    only while each handler the zygote has resets nothing else
    (handlers_reset_only_locks). Each child puts the handlers back before
    anything else runs (restore_fork_handlers), so that a fork in a run
    resets as it always does. Nothing is held while the zygote has a thread
    of its own (a thread of its worker, a preload's, is not in it)."""
    threading = sys.modules.get("threading")
    if _thread_count() > 0 or (threading is not None and (
            threading.active_count() != 1
            or threading.current_thread() is not threading.main_thread())):
        release_fork_handlers()
        return
    hold_fork_handler("threading", "_after_fork", None)
    logging = sys.modules.get("logging")
    lock = getattr(logging, "_lock", None)
    if hasattr(lock, "_at_fork_reinit") and handlers_reset_only_locks(logging):
        hold_fork_handler("logging", "_after_at_fork_child_reinit_locks", lock._at_fork_reinit)
    else:
        release_fork_handlers("logging._after_at_fork_child_reinit_locks")


def handlers_reset_only_locks(logging):
    """Whether each logging handler the zygote has resets nothing after a
    fork but its own lock (``logging``'s own ``_at_fork_reinit``, as every
    handler of the standard library), which no handler of the zygote holds
    as it forks. A handler of another library may reset more (a pid, a
    queue, a thread): its children then run logging's handler."""
    handlers = getattr(logging, "_at_fork_reinit_lock_weakset", None)
    if handlers is None:
        return False
    own = {vars(cls)["_at_fork_reinit"] for cls in (logging.Handler, logging.NullHandler)
           if "_at_fork_reinit" in vars(cls)}
    for handler in list(handlers):
        # As logging's handler finds it: the instance's own, if it has one.
        reset = getattr(handler, "_at_fork_reinit", None)
        if getattr(reset, "__func__", None) not in own:
            return False
    return True


def hold_fork_handler(module, name, instead):
    """Hold back ``module.name``, if it is a plain function (see
    hold_fork_handlers)."""
    key = module + "." + name
    if key in _held_fork_handlers:
        return
    handler = getattr(sys.modules.get(module), name, None)
    if type(handler) is not types.FunctionType or handler.__code__.co_freevars:
        return
    _held_fork_handlers[key] = (handler, handler.__code__, instead)
    handler.__code__ = _no_fork_handler.__code__


def restore_fork_handlers():
    """Put the held after-fork handlers back (in a child of the zygote), and
    do what they would have done that this child needs."""
    for handler, code, instead in _held_fork_handlers.values():
        handler.__code__ = code
        if instead is not None:
            instead()


def release_fork_handlers(*keys):
    """Stop holding the after-fork handlers of ``keys`` back (logging's,
    once a handler resets more than its lock), or all of them (once the
    zygote has a thread of its own)."""
    for key in keys or list(_held_fork_handlers):
        held = _held_fork_handlers.pop(key, None)
        if held is not None:
            held[0].__code__ = held[1]


class ZygoteLost(Exception):
    """The zygote is gone: this worker cannot fork runs any more. ``when``
    the request being served learned it: "before" its run was handed to a
    child (it ran nothing), "during" it (its process died with the zygote),
    or "after" it was answered."""

    when = "during"


class Zygote:
    """The worker's end of its zygote."""

    def __init__(self, worker, scope):
        import _socket as socket  # the C module: no enum classes to build

        self.socket = socket
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        worker_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(ours.detach())
            zygote_main(theirs, worker, worker_pid, scope)
        theirs.close()
        self.pid = pid
        self.sock = ours
        self.fd = ours.fileno()
        # pid -> (wait status, (CPU seconds, peak RSS KiB), others left)
        self.exits = {}
        # The zygote's answers to fork requests not yet taken by ``forked``:
        # a pid, or -errno.
        self.pids = []
        # program_key -> id of the programs it holds, least recently used
        # first (see HELD). Replaced, never changed: each Child keeps the
        # one its fork saw.
        self.held = {}
        self.last_held = 0
        self.too_big = set()  # keys of programs over held_max
        # What one message may carry here, with room to spare.
        self.held_max = min(HELD_MAX_BYTES,
                            ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2)

    def hold(self, key, compiled):
        """Have the zygote hold the program ``compiled`` (see HELD), or make
        it the most recently used if it does; the least recently used goes
        when it holds HELD_PROGRAMS."""
        held = self.held
        ident = held.get(key)
        if ident is not None:
            if next(reversed(held)) != key:
                held = dict(held)
                del held[key]
                held[key] = ident
                self.held = held
            return
        if key in self.too_big:
            return
        data = marshal.dumps(compiled)
        if len(data) > self.held_max:
            if len(self.too_big) >= SEEN_PROGRAMS:
                self.too_big.clear()
            self.too_big.add(key)
            return
        held = dict(held)
        dropped = []
        while len(held) >= HELD_PROGRAMS:
            dropped.append(held.pop(next(iter(held))))
        self.last_held += 1
        self.send([b"C" + marshal.dumps((self.last_held, dropped, len(data)))], [])
        self.send([data], [])
        held[key] = self.last_held
        self.held = held

    def fork(self, fds, warm=WARM_AFTER_MS):
        """Ask for a new run child holding ``fds`` (req_r, out_w, err_w,
        ctl_w), rehearsing the request path once it has waited ``warm`` ms
        (WARM_AFTER_MS or 0; None: never). Its pid is read later
        (``forked``): the worker does not wait while the zygote forks, nor
        wake again when it has."""
        rights = struct.pack("%di" % len(fds), *fds)
        self.send([_FORK_KIND[warm]], [(self.socket.SOL_SOCKET, self.socket.SCM_RIGHTS, rights)])

    def fork_session(self, fds, limits, direct, rundir, prefork):
        """Ask for a session child holding ``fds`` (req_r, out_w, err_w,
        ctl_w) that serves calls in ``rundir`` under ``limits`` (see
        session_main), once the run child ``prefork`` (a pid, or 0) is
        killed and reported; its pid is read as a run child's
        (``forked``)."""
        rights = struct.pack("%di" % len(fds), *fds)
        self.send([b"S" + marshal.dumps((limits, direct, rundir, prefork))],
                  [(self.socket.SOL_SOCKET, self.socket.SCM_RIGHTS, rights)])

    def forked(self):
        """The pid of the child the oldest unanswered ``fork`` asked for."""
        while not self.pids:
            msg = self.receive(True)
            if msg[:1] not in (b"X", b"P"):
                raise ZygoteLost("unexpected message %r from the zygote" % msg[:1])
        pid = self.pids.pop(0)
        if pid < 0:
            raise OSError(-pid, "the zygote could not fork: %s" % os.strerror(-pid))
        return pid

    def kill_leftovers(self):
        self.send([b"K"], [])
        self.reply(b"k")

    def learn(self, names):
        """Have the zygote import the next of the stdlib modules ``names``
        (see learn_imports); how many of them it dealt with, and whether it
        takes more."""
        self.send([b"I" + "\n".join(names).encode("ascii")], [])
        answer = self.reply(b"i")
        return int(answer[1:] or b"0"), answer[:1] == b"1"

    def send(self, parts, ancillary):
        try:
            self.sock.sendmsg(parts, ancillary)
        except OSError as exc:
            raise ZygoteLost("the zygote is gone: %s" % exc)

    def reply(self, kind):
        while True:
            msg = self.receive(True)
            if msg[:1] == kind:
                return msg[1:]
            if msg[:1] not in (b"X", b"P"):
                raise ZygoteLost("unexpected message %r from the zygote" % msg[:1])

    def receive(self, block):
        """One message (exit reports and fork answers are noted on the
        way), or None."""
        try:
            msg = self.sock.recv(64, 0 if block else self.socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise ZygoteLost("the zygote is gone: %s" % exc)
        if not msg:
            raise ZygoteLost("the zygote exited")
        if msg[:1] == b"X":
            pid, status, cpu, rss, others = _EXIT.unpack(msg[1:])
            self.exits[pid] = (status, (cpu, rss), others)
        elif msg[:1] == b"P":
            self.pids.append(struct.unpack("!i", msg[1:])[0])
        return msg

    def exit_of(self, pid, block):
        """(wait status, usage, whether the zygote had other children) of
        child ``pid`` once it ended; with ``block``, waits for that."""
        while pid not in self.exits:
            msg = self.receive(block)
            if msg is None:
                return None
            if msg[:1] not in (b"X", b"P"):
                raise ZygoteLost("unexpected message %r from the zygote" % msg[:1])
        return self.exits.pop(pid)

    def stop(self):
        """Close the zygote's socket: it kills what children it has and
        exits; one that does not within a second is killed. Its number is
        no longer the zygote's (a child forked after must not close it)."""
        self.sock.close()
        self.fd = -1
        deadline = time.monotonic() + 1.0
        try:
            while not os.waitpid(self.pid, os.WNOHANG)[0]:
                if time.monotonic() > deadline:
                    os.kill(self.pid, _signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    break
                time.sleep(0.005)
        except (ChildProcessError, ProcessLookupError):
            pass


def zygote_main(sock, worker, worker_pid, scope):
    """Body of the zygote; never returns."""
    global _THREADS_INHERITED
    import _socket as socket

    code = 0
    try:
        die_with_parent()
        if os.getppid() != worker_pid:
            raise ChannelClosed()
        become_subreaper()
        for fd in (worker.rfd, worker.wfd, worker.wake_r, worker.wake_w):
            os.close(fd)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        _signal.set_wakeup_fd(wake_w)
        me = os.getpid()
        own_fds = (sock.fileno(), wake_r, wake_w)
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        rights_size = socket.CMSG_SPACE(4 * _FD.size)
        _THREADS_INHERITED = _thread_count()
        hold_fork_handlers()
        # Memory and address space the learned imports added (see learn_imports).
        learned_kib = learned_vm_kib = 0
        forked = set()  # run children not reported yet
        prepared = False  # whether prepare_later_runs ran
        handed_down = own_handed_down()
        while True:
            for fd, _ in poller.poll():
                if fd == wake_r:
                    empty_pipe(wake_r)
                    running = len(forked)
                    report_exits(sock, forked)
                    if len(forked) < running:
                        check_handed_down(handed_down)
                    if not prepared and len(forked) < running:
                        # A run has ended, its report is sent: the next child
                        # may wait for these, the first result does not.
                        prepared = prepare_zygote()
                    continue
                # The pipe ends come close-on-exec: a process a run starts
                # inherits its stdin, stdout and stderr, not its request or
                # report pipe (dup2 clears the flag on fds 1 and 2).
                msg, ancillary, _, _ = sock.recvmsg(LEARN_MESSAGE_BYTES, rights_size,
                                                    socket.MSG_CMSG_CLOEXEC)
                if not msg:
                    raise ChannelClosed()
                if msg in (b"F", b"W", b"f") or msg[:1] == b"S":
                    note_zygote_modules()
                    fds = []
                    for level, kind, data in ancillary:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            fds.extend(v for (v,) in _FD.iter_unpack(data[:len(data) - len(data) % _FD.size]))
                    if len(fds) != 4:
                        raise RuntimeError("a fork request without its 4 pipe ends")
                    session = marshal.loads(msg[1:]) if msg[:1] == b"S" else None
                    if session is not None:
                        # No use for its worker's pre-forked run child,
                        # which goes first (it holds one of the processes
                        # the session may have). Not a run's end: the
                        # zygote prepares when the session's process ends,
                        # if it had not yet, for the worker's next session.
                        end_child(sock, forked, session[3])
                    try:
                        pid = os.fork()
                    except OSError as exc:  # EAGAIN at the pids cap, ENOMEM
                        pid = -exc.errno
                    if pid == 0:
                        sock.detach()
                        if session is not None:
                            limits, direct, rundir, _ = session
                            session_main(me, rundir, fds[0], fds[1], fds[2], fds[3], own_fds,
                                         limits, worker.base_tmp, worker.rundir, scope, direct)
                        child_main(me, worker.rundir, fds[0], fds[1], fds[2], fds[3], own_fds,
                                   scope, _FORK_WARM[msg])
                    for fd in fds:
                        os.close(fd)
                    if pid > 0:
                        forked.add(pid)
                        try:
                            os.setpgid(pid, pid)  # as in Worker.fork_child
                        except OSError:
                            pass
                    sock.send(b"P" + struct.pack("!i", pid))
                elif msg[:1] == b"C":
                    # A program to hold (see HELD); the next message is it.
                    ident, dropped, size = marshal.loads(msg[1:])
                    data = sock.recv(size)
                    for old in dropped:
                        HELD.pop(old, None)
                    try:
                        if len(data) == size:
                            HELD[ident] = marshal.loads(data)
                    except Exception:
                        pass  # its runs compile it themselves
                    del data
                    if hasattr(gc, "freeze"):  # as the zygote's other objects
                        gc.freeze()
                elif msg == b"R":
                    # Its worker has had no request since it started (see
                    # Worker.serve): a spare in its pool prepares now, and
                    # the session or the runs it forks later find it done.
                    if not prepared:
                        prepared = prepare_zygote()
                elif msg == b"K":
                    report_exits(sock, forked)
                    kill_descendants()
                    check_handed_down(handed_down)
                    sock.send(b"k")
                elif msg[:1] == b"I":
                    consumed = 0
                    if learned_kib < LEARN_MAX_KIB and learned_vm_kib < LEARN_MAX_VM_KIB:
                        names = msg[1:].decode("ascii", "replace").split("\n")
                        kept, consumed, kib, vm_kib, threaded = learn_imports(names, own_fds)
                        note_zygote_modules(kept)
                        learned_kib += kib
                        learned_vm_kib += vm_kib
                        if threaded:  # an import started a thread: stop there
                            sys.stderr.write("code-executor: a learned import started a thread\n")
                            learned_kib = LEARN_MAX_KIB
                    more = learned_kib < LEARN_MAX_KIB and learned_vm_kib < LEARN_MAX_VM_KIB
                    sock.send(b"i" + (b"1" if more else b"0") + str(consumed).encode("ascii"))
    except ChannelClosed:
        pass
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        kill_descendants()
    finally:
        os._exit(code)


# Every rlimit a process has (see own_handed_down), once it is asked for.
_ALL_RLIMITS = None


def own_handed_down():
    """What of the zygote every child it forks inherits and any process of
    the same user can change from outside (``prlimit``, ``setpriority``,
    ``sched_setaffinity``, ``sched_setscheduler``): its rlimits, nice
    value, CPU affinity and scheduling policy (~10 us)."""
    global _ALL_RLIMITS
    if _ALL_RLIMITS is None:
        _ALL_RLIMITS = tuple(sorted({getattr(resource, name) for name in dir(resource)
                                     if name.startswith("RLIMIT_")})) if resource else ()
    limits = tuple((r, resource.getrlimit(r)) for r in _ALL_RLIMITS)
    return (limits, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getaffinity(0),
            os.sched_getscheduler(0))


def handed_down_changed(before):
    """Whether own_handed_down() would differ from ``before``, found while
    making as few objects as it can: each is freed before the next is made,
    in the same memory, so the check writes few of the zygote's pages (each
    page it writes costs it a fault after every fork)."""
    limits, nice, cpus, policy = before
    getrlimit = resource.getrlimit
    for r, was in limits:
        if getrlimit(r) != was:
            return True
    return (os.getpriority(os.PRIO_PROCESS, 0) != nice or os.sched_getscheduler(0) != policy
            or os.sched_getaffinity(0) != cpus)


def check_handed_down(before):
    """Exit the zygote if what it hands down to its children is no longer
    ``before`` (see own_handed_down): a run or session changed it from
    outside, as a process of the same user may, and no later child may
    inherit that. The worker finds its zygote gone and is replaced. Called
    once a child has ended, and once what a run left is killed: by then the
    next child is not forked yet, so what the check allocates is no page a
    child shares (a check before each fork cost every run ~15 copy-on-write
    faults)."""
    if handed_down_changed(before):
        sys.stderr.write("code-executor: the zygote's limits, priority or CPU affinity were "
                         "changed; it exits\n")
        raise ChannelClosed()


def prepare_zygote():
    """prepare_later_runs in the zygote, then its heap in huge pages where
    they are asked for (after the preparation's writes); True."""
    prepare_later_runs()
    if HUGE_PAGES:
        collapse_heap()
    return True


def end_child(sock, forked, pid):
    """Kill child ``pid`` (one of ``forked``, which never had a request),
    wait for it to end and report it, as ``report_exits`` does."""
    if pid not in forked:
        return  # ended and reported already
    status, cpu, rss = 0, 0.0, 0
    try:
        os.kill(pid, _SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        cpu, rss = usage.ru_utime + usage.ru_stime, usage.ru_maxrss
    except (ProcessLookupError, ChildProcessError):
        pass  # gone already: reported all the same, which the worker waits for
    forked.discard(pid)
    sock.send(b"X" + _EXIT.pack(pid, status, cpu, rss, True))


def report_exits(sock, forked):
    """Reap every child that ended and tell the worker of those it had
    forked (``forked``), and whether any child is left; what a run left
    behind is reaped unreported."""
    ended = []
    others = False
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            others = True
            break
        ended.append((pid, status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
    for pid, status, cpu, rss in ended:
        if pid in forked:
            forked.discard(pid)
            sock.send(b"X" + _EXIT.pack(pid, status, cpu, rss, others))


# ---------------------------------------------------------------------------
# Learned imports: stdlib modules that runs keep importing, imported once by
# the zygote
# ---------------------------------------------------------------------------
#
# A module a run imports costs that run its import, in a process whose pages
# are the zygote's: `typing` ~3 ms of CPU, `statistics` ~5, for every run of
# a code benchmark or a tool loop that imports them. Each child reports the
# standard-library modules it imported (found in the interpreter's own
# library, not in the run's files or site-packages); a module that
# LEARN_AFTER runs within one block of LEARN_WINDOW runs imported is
# imported by the zygote, LEARN_PER_GAP at a time, between two runs (not
# while a request waits, unless it has waited LEARN_DEFERRED runs), and the
# children forked from then on have it.
# Every later run, whether it imports the module or not, pays for the
# zygote's larger memory in its fork (~20 us per MiB here): LEARN_AFTER runs
# in LEARN_WINDOW is about where the two costs meet, and the learned imports
# stop once they have added LEARN_MAX_KIB of private memory or
# LEARN_MAX_VM_KIB of address space (which counts against the runs'
# memory_bytes) to the zygote.
#
# What a report (which user code can forge) names is only a hint: the zygote
# imports a name only if the interpreter's own library holds it
# (STDLIB_DIRS, built-in or frozen), it is no test or __main__ module, none
# with side effects at import or state taken when imported (NEVER_LEARN),
# and it keeps it only if it imported cleanly from there, without a warning
# (a deprecated module's warning belongs on each run's stderr). A run then
# finds such a module already imported, as it finds those the
# environment's start-up imports; a run whose own files hold a module of
# that name gets its own (shadowed_by_files). CODE_EXECUTOR_LEARN_IMPORTS=0
# turns it off; it needs Python 3.10+ (``sys.stdlib_module_names``) and a
# zygote.

LEARN_AFTER = 2
LEARN_WINDOW = 100
LEARN_PER_GAP = 4
LEARN_DEFERRED = 8
LEARN_MAX_MODULES = 128
LEARN_MAX_KIB = 16 << 10
LEARN_MAX_VM_KIB = 64 << 10
# At most this many names per report, and per message to the zygote (whose
# buffer, LEARN_MESSAGE_BYTES, holds them at 100 characters each).
LEARN_REPORTED = 64
LEARN_SENT = 32
LEARN_MESSAGE_BYTES = 1 << 12
NEVER_LEARN = frozenset({
    # do something as they are imported
    "antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter", "turtle",
    "turtledemo", "__main__", "ensurepip", "venv", "pydoc", "webbrowser", "readline",
    "rlcompleter", "distutils",
    # keep state from the moment they are imported (the start time of
    # logging's records, multiprocessing's authentication key and directory)
    "logging", "multiprocessing",
})
_STDLIB = getattr(sys, "stdlib_module_names", frozenset())
LEARNING = os.environ.get("CODE_EXECUTOR_LEARN_IMPORTS") != "0" and bool(_STDLIB)
# Where the interpreter's own library lives: the directory of a pure-Python
# stdlib module, and its extension modules beside it.
_STDLIB_DIR = os.path.dirname(os.__file__)
STDLIB_DIRS = (_STDLIB_DIR + os.sep, os.path.join(_STDLIB_DIR, "lib-dynload") + os.sep)
# The modules of the zygote when it forked this process (see
# imported_since_fork), and those of them it learned or imported itself
# after its start (see shadowed_by_files).
_zygote_modules = frozenset()
_zygote_added = frozenset()


# What a file's name ends with to be a module (see module_named).
_ext = sys.modules.get("_frozen_importlib_external")
MODULE_SUFFIXES = tuple(getattr(_ext, "SOURCE_SUFFIXES", [".py"])
                        + getattr(_ext, "BYTECODE_SUFFIXES", [".pyc"])
                        + getattr(_ext, "EXTENSION_SUFFIXES", [".so"]))
del _ext
# What a learned module may not import either: logging may come with one
# (asyncio imports it), since its one piece of state from that moment, the
# clock of its records, restarts with each run (restart_logging_clock).
NEVER_PULLED = NEVER_LEARN - {"logging"}
# Modules that imported one of those: neither they nor their submodules are
# learned.
_PULLS_NEVER_LEARNED = set()


def pulls_never_learned(name):
    return any(name == m or name.startswith(m + ".") for m in _PULLS_NEVER_LEARNED)


# How long the children that try the modules of one learning message may
# take in all (the worker waits for the answer; see Zygote.learn).
PROBE_SECONDS = 2.0


def probe_import(name, deadline, zygote_fds):
    """The names of the modules importing ``name`` adds, imported in a
    child forked for that alone (without the zygote's ``zygote_fds``), by
    the monotonic ``deadline``; None if it failed, warned, started a
    thread, came from elsewhere than the interpreter's library (see
    learn_imports), or took too long. Never learned then."""
    zygote = os.getpid()
    try:
        r, w = os.pipe()
    except OSError:  # EMFILE
        return None
    try:
        pid = os.fork()
    except OSError:  # EAGAIN at the pids cap
        os.close(r)
        os.close(w)
        return None
    if pid == 0:
        code = 1
        me = os.getpid()
        try:
            try:
                die_with_parent()
            except OSError:
                pass
            if os.getppid() == zygote:
                restore_fork_handlers()
                _signal.set_wakeup_fd(-1)  # the zygote's, not this child's
                for fd in (r,) + tuple(zygote_fds):
                    os.close(fd)
                import warnings

                present = set(sys.modules)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    __import__(name)
                # A deprecated module warns as it is imported, on the
                # run's stderr: each run that imports it keeps doing so
                # itself. One loaded from elsewhere than the interpreter's
                # library (an import hook's redirection) is not learned.
                if (not caught and from_stdlib(sys.modules.get(name))
                        and _thread_count() == 0 and os.getpid() == me):
                    added = "\n".join(set(sys.modules) - present)
                    write_all(w, added.encode("utf-8", "replace"))
                    code = 0
        except BaseException:  # noqa: B902 - a module that will not import is not learned
            pass
        os._exit(code)
    os.close(w)
    chunks = []
    finished = False
    try:
        poller = select.poll()
        poller.register(r, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                break
            data = os.read(r, 1 << 16)
            if not data:
                finished = True
                break
            chunks.append(data)
    finally:
        os.close(r)
        if not finished:
            try:
                os.kill(pid, _signal.SIGKILL)
            except OSError:
                pass
        _, status = os.waitpid(pid, 0)
    if not finished or status != 0:
        return None
    return b"".join(chunks).decode("utf-8").split("\n")


def learnable(name):
    """Whether ``name`` may name a module for the zygote to import: a
    stdlib module or one of its submodules, no test or ``__main__``."""
    if type(name) is not str or not 0 < len(name) <= 100:
        return False
    parts = name.split(".")
    return (parts[0] in _STDLIB and parts[0] not in NEVER_LEARN
            and all(part.isidentifier() and part.isascii()
                    and part not in ("__main__", "test", "tests", "idle_test") for part in parts))


def from_stdlib(module):
    """Whether ``module`` was loaded from the interpreter's own library."""
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if origin in ("built-in", "frozen"):
        return True
    return type(origin) is str and origin.startswith(STDLIB_DIRS)


def note_zygote_modules(added=()):
    """Keep the zygote's module names for the children it forks next
    (``added``: names it imported after its start, which a run's own files
    shadow, learning or not: see shadowed_by_files)."""
    global _zygote_modules, _zygote_added
    if added:
        _zygote_added = _zygote_added.union(added)
    if not LEARNING:
        return
    if len(_zygote_modules) != len(sys.modules):
        _zygote_modules = frozenset(sys.modules)


def imported_since_fork():
    """The stdlib modules this process imported since its zygote forked it,
    for its report (None: none, or no zygote to learn them)."""
    try:
        # A clean run's __main__ has left sys.modules by now (see free_main).
        if not _zygote_modules or len(sys.modules) + ("__main__" not in sys.modules) <= len(
                _zygote_modules):
            return None
        new = [name for name, module in list(sys.modules.items())
               if type(name) is str and name not in _zygote_modules and learnable(name)
               and from_stdlib(module)]
        # A module takes its place in sys.modules once it has run, after
        # those it imported: last first, the zygote imports a module before
        # its own imports, which then come with it.
        new.reverse()
        return new[:LEARN_REPORTED] or None
    except BaseException:  # noqa: B902 - user code may have broken sys.modules
        return None


def module_named(filename):
    """The module a file of this name is to an import (``json.py``,
    ``json.pyc``, ``_json.cpython-311-x86_64-linux-gnu.so``), else None."""
    for suffix in MODULE_SUFFIXES:
        if filename.endswith(suffix):
            stem = filename[:-len(suffix)]
            if stem and "." not in stem:
                return stem
    return None


def shadowed_by_files(files, forget=False):
    """Drop the modules the zygote imported after its start (json, pickle's
    C part and _compat_pickle, traceback, linecache and fnmatch and what
    they import, learned ones) that the run's own files shadow (``name.py``,
    ``name.pyc``, an extension ``name.*.so``, or a package's
    ``name/__init__.*``), so that the run imports its own, as a fresh
    interpreter would. With ``forget`` (a session), those names are no
    longer the zygote's: what the session imports under them from then on
    stays."""
    global _zygote_added
    if not _zygote_added or not files:
        return
    tops = set()
    for rel, _ in files:
        parts = normalize(rel.replace("\\", "/")).split("/")  # "./json.py" too
        if len(parts) == 1:
            tops.add(module_named(parts[0]))
        elif len(parts) == 2 and module_named(parts[1]) == "__init__":
            # A directory without one (data, a namespace package) never
            # hides a module, as in a fresh interpreter.
            tops.add(parts[0])
    for top in tops & _zygote_added:
        for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
            del sys.modules[name]
    if forget:
        _zygote_added = _zygote_added - tops


def learn_imports(names, zygote_fds):
    """Import (in the zygote) those of ``names`` the interpreter's own
    library holds, not imported yet, at most LEARN_PER_GAP of them (a
    module's own imports come after it in a report, see
    imported_since_fork, and are then imported already), each once a child
    forked for it (without the zygote's ``zygote_fds``) imported it cleanly
    (see probe_import). Returns the names kept,
    how many of ``names`` were dealt with, the KiB of private memory and
    address space the imports added, and whether one of them started a
    thread here (learning then stops)."""
    import _imp
    from importlib.machinery import PathFinder

    before = own_memory_kib()
    kept = []
    removed = threaded = False
    consumed = imports = 0
    deadline = time.monotonic() + PROBE_SECONDS
    for name in names:
        if name in sys.modules or not learnable(name) or pulls_never_learned(name):
            consumed += 1
            continue
        if imports == LEARN_PER_GAP or time.monotonic() >= deadline:
            break
        consumed += 1
        imports += 1
        top = name.split(".")[0]
        if not (top in sys.builtin_module_names or _imp.is_frozen(top)
                or PathFinder.find_spec(top, list(STDLIB_DIRS)) is not None):
            continue
        # What importing it adds, seen in a child forked for that (which
        # also refuses what is not to be learned): the zygote imports
        # nothing it would not keep (a module pulled in and then dropped
        # would leave its at-fork and exit hooks behind).
        pulled = probe_import(name, deadline, zygote_fds)
        if pulled is None:
            continue
        if any(n.partition(".")[0] in NEVER_PULLED for n in pulled):
            # concurrent.futures.process imports multiprocessing
            _PULLS_NEVER_LEARNED.add(name)  # and so do its submodules
            continue
        present = set(sys.modules)
        try:
            __import__(name)
        except BaseException:  # noqa: B902 - it imported in the child; not here, not learned
            for n in set(sys.modules) - present:
                del sys.modules[n]
            removed = True
        else:
            kept.extend(set(sys.modules) - present)
        if _thread_count() > 0:
            # It started a thread here: no fork from here on with a handler
            # held, and no more learning (see the caller).
            threaded = True
            release_fork_handlers()
            break
    if removed:
        gc.collect()
    # As for the start's imports: out of the collector's way, and the
    # after-fork handlers of threading and logging held back if one of them
    # imported them.
    if hasattr(gc, "freeze"):
        gc.freeze()
    if not threaded:
        hold_fork_handlers()
    after = own_memory_kib()
    return (kept, consumed, max(0, after[0] - before[0]), max(0, after[1] - before[1]),
            threaded)


# Threads the zygote's count starts with: those of its worker (a preload's),
# which a fork leaves counted but not running.
_THREADS_INHERITED = 0


def _thread_count():
    """Threads this process started, the main one aside."""
    import _thread

    return _thread._count() - _THREADS_INHERITED


def own_memory_kib():
    """(private resident memory, address space) of this process, KiB."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
        # resident - shared (file-backed): mostly anonymous
        return (int(fields[1]) - int(fields[2])) * page_kib, int(fields[0]) * page_kib
    except (OSError, ValueError, IndexError):
        return 0, 0


class Learning:
    """The worker's tally of the modules its runs imported."""

    __slots__ = ("counts", "runs", "learned", "pending", "deferred", "open")

    def __init__(self):
        self.counts = {}
        self.runs = 0
        self.learned = set()  # asked of the zygote, or due
        self.pending = []  # due, not asked yet
        self.deferred = 0  # runs they have waited for a gap
        self.open = LEARNING

    def note(self, imported):
        """Count a run's imports (``imported``: its report's, checked)."""
        if not self.open:
            return
        self.runs += 1
        if self.runs > LEARN_WINDOW:
            self.runs = 1
            self.counts.clear()
        for name in imported or ():
            if name in self.learned:
                continue
            count = self.counts.get(name, 0) + 1
            self.counts[name] = count
            if count >= LEARN_AFTER and len(self.learned) < LEARN_MAX_MODULES:
                self.pending.append(name)
                self.learned.add(name)



# ---------------------------------------------------------------------------
# Sessions: one long-lived child keeps its __main__ between calls
# ---------------------------------------------------------------------------
#
# A `session` frame switches a worker into session mode until a `release`
# frame ends it (see release_session; the server then keeps the worker for
# its next session, else ends it): its zygote ends the worker's pre-forked
# child and forks one session
# child (own process group, limits, parent-death signal, a working directory
# that persists) which runs every later `exec` in one `__main__`.  Not the
# worker itself: its memory keeps what the requests it relayed left there.
# The session child dies with its zygote, and the session is then lost.
# The child's stdout/stderr stay pipes to the worker; after each call the child flushes
# and reports over its ctl pipe, and the worker then drains both pipes, so
# output is attributed to the call that wrote it.  At the deadline the
# worker sends SIGINT (KeyboardInterrupt); a child that does not report
# within the grace period is killed and the session is lost
# (`session_lost` in the result says why).
#
# A direct session (``direct`` in the `session` frame) takes the worker off
# the calls' path: the worker hands the server its ends of the child's
# pipes, and the server writes the calls to the child and reads its output
# and reports itself. The child then computes each call's artifacts and puts
# them, and the call's id, in its report. The worker still interrupts a call
# at its timeout (`interrupt`), and kills the child and says how the session
# was lost when a call cannot end by a report (`end`).

def session_main(worker_pid, rundir, req_r, out_w, err_w, ctl_w, parent_fds, limits, base_tmp,
                 run_dir, scope, direct=False):
    """Body of a session child: serve calls until the request pipe closes.
    ``direct``: the server writes the calls (``exec`` frames, pickled) and
    reads the pipes itself, so the report carries the call's artifacts too
    (see "Sessions")."""
    status = 70
    try:
        restore_fork_handlers()  # held back in the zygote (see hold_fork_handlers)
        # SIGINT interrupts only while user code runs (see interrupt_call).
        enter_run(worker_pid, rundir, out_w, err_w, parent_fds, interrupt_call)
        if scope is not None:  # the zygote, idle now, stays out of reach
            scope_signals(scope)
            os.close(scope)
        set_run_dir(rundir, base_tmp, previous=run_dir)
        fixed = dict(limits)
        fixed.pop("cpu_seconds", None)  # a budget per call, see session_call
        apply_limits(fixed)
        main = fresh_main()
        devnull = os.open(os.devnull, os.O_RDONLY)
        req = FrameReader(req_r)
        files = None  # the directory as the last call left it (see Session)
        tree = TreeWatch() if direct else None
        clock = SessionClock()
        if direct:
            with imports_apart_from(rundir):
                before = set(sys.modules)
                # What collecting artifacts imports, imported and kept
                # before user code runs: a call's own ``mimetypes.py`` (the
                # session directory is on sys.path) is then never the one
                # the walk gets.
                artifact_modules()  # SESSION_IMPORTS
                # pickle's C unpickler, without pickle.py (the zygote has it)
                from _pickle import loads as load_call
                if _TRACEBACK is None:  # forked before its zygote prepared
                    import_bootstrap_traceback()
                # A call's own module of one of these names is its code's.
                note_zygote_modules(set(sys.modules) - before)
        restart_logging_clock()
        while True:
            try:
                frame = req.read()
            except (ChannelClosed, EOFError):
                status = 0
                break
            if direct:
                # A tuple, not the exec frame's map: unpickling a map's keys
                # cost each call ~6 us (see SessionCall in src/worker/direct.rs).
                (call, code, stdin, sent, argv, cpu_seconds, select_, max_each, max_total,
                 cap, interrupt_at) = load_call(frame)
            else:
                msg = marshal.loads(frame)
                call, code, stdin, sent, argv = (
                    msg["id"], msg["code"], msg["stdin"], msg["files"], msg["argv"])
                cpu_seconds = msg["limits"].get("cpu_seconds")
                cap = msg["max_result_chars"]
                interrupt_at = msg.get("interrupt_at")
                select_ = False
                del msg
            del frame
            if select_ is not False:
                before = files if files is not None else snapshot(rundir, tree)
                inputs = input_files(sent)
                caps = (max_each, max_total)
            files = None
            report = session_call(code, stdin, sent, argv, cpu_seconds, cap, main, rundir,
                                  devnull, clock, interrupt_at)
            del code, stdin, sent, argv
            if direct:
                report["id"] = call  # the server skips reports of other calls
            if select_ is not False:
                # The walk is the session machinery's, not the call's: it
                # gets CPU of its own, and a failure loses the artifacts of
                # this call, never the session.
                clock.at_least(CLEAN_SECONDS + 1)
                try:
                    # Quiet: the walk would read what the last one read (a
                    # cut walk watched every directory it read, and those it
                    # did not reach come after it).
                    if tree is not None and tree.quiet():
                        report["artifacts"], files, cut = [], before, before.cut
                    else:
                        report["artifacts"], cut, files = changed_artifacts(
                            rundir, before, inputs, artifact_globs(select_), *caps, tree=tree)
                    if cut:
                        report["artifacts_cut"] = True
                except Exception:
                    report["artifacts"], files = [], None
            write_all(ctl_w, report_frame(report))
    except BaseException as exc:  # a fault of the session machinery itself
        try:
            user_traceback(exc)
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(status)


# The report of a direct call that returned nothing, raised nothing and
# made no artifacts, the common one, as one struct: its length, then a
# msgpack map of status (0-127), result and error (nil), cpu_ms (a double),
# peak_rss_kb (32 bits), id (64 bits) and artifacts (empty). The constant
# parts come between the values.
_PLAIN_PARTS = (b"\x87\xa6status", b"\xa6result\xc0\xa5error\xc0\xa6cpu_ms\xcb",
                b"\xabpeak_rss_kb\xce", b"\xa2id\xcf", b"\xa9artifacts\x90")
_PLAIN_REPORT = struct.Struct("!I%dsB%dsd%dsI%dsQ%ds" % tuple(map(len, _PLAIN_PARTS)))


def report_frame(report):
    """A session call's ``report``, framed for the server (4-byte length,
    msgpack map). The common one is packed in one call: walking its map
    in ``packb`` cost a call ~8 us of the session process's time in place,
    where its code is no longer in the CPU's caches."""
    # Seven keys with an empty ``artifacts`` are the plain report's (a
    # refused call's has ``refused`` in place of ``artifacts``).
    if (len(report) == 7 and report.get("artifacts") == [] and report["result"] is None
            and report["error"] is None):
        status, peak, call = report["status"], report["peak_rss_kb"], report["id"]
        if (type(status) is int and 0 <= status < 0x80 and type(peak) is int
                and 0 <= peak < 1 << 32 and type(call) is int and 0 <= call < 1 << 64):
            a, b, c, d, e = _PLAIN_PARTS
            return _PLAIN_REPORT.pack(_PLAIN_REPORT.size - 4, a, status, b,
                                      float(report["cpu_ms"]), c, peak, d, call, e)
    return framed(packb(report))


# Whether a session child's call is running its code, and whether an
# interrupt came while none was: what its SIGINT handler writes and reads
# (see interrupt_call).
_in_call = [False]
_interrupted = [False]
# The clock session_call reads, bound here: user code may replace (freeze,
# mock) time.monotonic in the session's process.
_monotonic = time.monotonic


def interrupt_call(signum, frame):
    """A session child's SIGINT handler, for its whole life: the interrupt
    sent at a call's timeout is a KeyboardInterrupt while the call's code
    runs. One that comes while no code runs is noted: it came late, for the
    last call, or early, for the call being read or set up (a timeout
    shorter than its setup), which the call tells apart as its code would
    start, by its time (see session_call). One handler, not one installed
    per call: that took two ``sigaction`` calls, ~10 us."""
    if _in_call[0]:
        raise KeyboardInterrupt
    _interrupted[0] = True


# The sys.stdin a session's last call with stdin got (see session_call).
_call_stdin = [None]


def session_call(code, stdin, files, argv, cpu_seconds, cap, main, rundir, devnull, clock,
                 interrupt_at=None):
    """Run one call's ``code`` in the session's ``main`` (with its
    ``stdin``, input ``files``, ``argv``, ``cpu_seconds`` and result
    ``cap``); its report, with the call's CPU time and peak RSS as ``clock``
    measures them. ``interrupt_at``: when the call's interrupt is sent if it
    has not ended (``time.monotonic()``, the system's monotonic clock, as
    the server reads it)."""
    begun = clock.start(cpu_seconds)
    outcome = RunOutcome()
    due = False  # the call's own interrupt came as it was set up
    try:
        os.dup2(devnull, 0)
        if files:
            check_session_files(rundir, files)
            # The first call that sends a module the zygote imported gets
            # its own; later calls import as the session did (forget).
            shadowed_by_files(files, forget=True)
            write_session_files(rundir, files)
        if stdin:
            set_stdin(stdin)
            sys.stdin = _call_stdin[0] = open(0, "r", closefd=False)
        elif _call_stdin[0] is not None:
            # The reader an earlier call got may hold what that call left
            # unread: a call without stdin reads none of it, only EOF.
            if sys.stdin is _call_stdin[0]:
                sys.stdin = open(0, "r", closefd=False)
            _call_stdin[0] = None
        # The last programs are kept compiled, as the worker keeps them for
        # clean runs (see precompile): a call sent again (a harness, a
        # check) skips the ~50 us of parsing and compiling even a one-liner.
        digits = getattr(sys, "get_int_max_str_digits", None)
        compiled = precompile(code, digits() if digits else None, here=True)
        if _signal.getsignal(_SIGINT) is not interrupt_call:  # not put back after the last call
            _signal.signal(_SIGINT, interrupt_call)
        try:
            # From here an interrupt raises. One noted before is this call's
            # when its time has come (the server sends a call's interrupt at
            # that time, never before; a late one for the last call came
            # before it): raised now, in place of the code.
            _in_call[0] = True
            if _interrupted[0]:
                _interrupted[0] = False
                if interrupt_at is not None and _monotonic() >= interrupt_at:
                    due = True
                    raise KeyboardInterrupt
            outcome = run_user_code(code, argv, main, result_cap=cap,
                                    compiled=compiled)
        finally:
            _in_call[0] = False
            # The code may have set a SIGINT handler of its own (or ignored
            # SIGINT): this one is back before the next call is read, so that
            # an interrupt that comes as it is read or set up is noted.
            if _signal.getsignal(_SIGINT) is not interrupt_call:
                _signal.signal(_SIGINT, interrupt_call)
        save_figures()
    except FilesRefused as refused:
        report = {"status": 0, "result": None, "error": None,
                  "refused": {"code": refused.code, "message": refused.message}}
        clock.stop(begun, report)
        return report
    except BaseException as exc:  # an interrupt that landed outside the code
        outcome.status = 1
        outcome.error = user_traceback(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    report = {"status": outcome.status, "result": outcome.result, "error": outcome.error}
    if due:  # the server may not have sent it yet: it timed out all the same
        report["timed_out"] = True
    clock.stop(begun, report)
    return report


def whole_seconds(used):
    """CPU seconds ``used``, rounded up: RLIMIT_CPU counts whole seconds,
    and a budget set above ``used`` rounded down would lose up to a second
    of what the call may use."""
    whole = int(used)
    return whole + 1 if used > whole else whole


class SessionClock:
    """A session process's CPU, call by call: each call's ``cpu_ms`` and
    ``peak_rss_kb``, and its CPU budget (RLIMIT_CPU counts the life of the
    process, so each call's limit is set above what the process has used).

    A call's start reads only the process's own CPU clock; its rusage, and
    that of the children it waited for, are read once, as it ends. So the
    CPU of children reaped between two calls (by a thread the code left
    running) counts in the next call."""

    def __init__(self):
        self.used = None  # the process's own CPU seconds as the last call ended
        self.kids = 0.0  # those of the children it had waited for
        self.soft = None  # RLIMIT_CPU's soft limit as this object last saw it
        if resource is not None:
            waited = resource.getrusage(resource.RUSAGE_CHILDREN)
            self.kids = waited.ru_utime + waited.ru_stime

    def start(self, seconds):
        """A call begins that may use ``seconds`` of CPU: the process's CPU
        seconds now, for ``stop``."""
        begun = time.process_time()
        self.budget(seconds, begun)
        return begun

    def stop(self, begun, report):
        """The call that began at ``begun`` has ended: its CPU time (its
        children's included) and peak RSS go into ``report``."""
        if resource is None:
            return
        me, children = own_rusage()
        self.used = me.ru_utime + me.ru_stime
        waited = children.ru_utime + children.ru_stime
        report["cpu_ms"] = max(0.0, self.used - begun + waited - self.kids) * 1000.0
        report["peak_rss_kb"] = max(me.ru_maxrss, children.ru_maxrss)
        self.kids = waited

    def budget(self, seconds, used, keep_higher=False):
        """Let the process use ``seconds`` of CPU beyond the ``used`` seconds
        it has used so far. ``keep_higher``: a soft limit that allows as
        much already stays."""
        if not seconds or resource is None:
            return
        try:
            soft = whole_seconds(used) + int(seconds)
            current, hard = resource.getrlimit(resource.RLIMIT_CPU)
            if keep_higher and (current == resource.RLIM_INFINITY or current >= soft):
                soft = current
            elif hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            if soft != current:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
            self.soft = soft
        except (ValueError, OSError):
            self.soft = None

    def at_least(self, seconds):
        """Let the harness use ``seconds`` of CPU after a call, whatever the
        call left of its budget: the soft limit rises if it allows less.
        The limit the call began with is trusted here without asking the
        OS again: code that lowered it since harms only its own session."""
        if self.used is None:
            return
        soft = self.soft
        if soft is not None and (soft == resource.RLIM_INFINITY
                                 or soft >= whole_seconds(self.used) + int(seconds)):
            return
        self.budget(seconds, self.used, keep_higher=True)


class Snapshot(dict):
    """(size, mtime_ns, inode) of every regular file under a directory, by
    relative path; ``cut``: the walk stopped at its budget (see Walk), so
    files past it are not in it; ``taken_ns``: when the walk began (ns
    since the epoch)."""

    __slots__ = ("cut", "taken_ns")


def snapshot(root, tree=None):
    """The Snapshot of ``root`` now (see Walk.files for ``tree``)."""
    walk = Walk()
    taken_ns = time.time_ns()
    files = Snapshot((rel, (st.st_size, st.st_mtime_ns, st.st_ino))
                     for rel, _, st in walk.files(root, tree))
    files.cut = walk.cut
    files.taken_ns = taken_ns
    return files


def written_since(root, since, inputs, select, max_each, max_total):
    """Files under ``root`` modified at or after ``since`` (seconds since the
    epoch), except the input files named in ``inputs``: the artifacts of a
    direct call that ended without its report (its snapshot died with it).
    And whether the listing was cut.

    The kernel stamps files' times by a clock up to a timer tick behind
    ``since``'s: a file the call made at its start and never wrote may
    carry a time before it, and is missed; comparing with that coarse clock
    instead would take in what the call before wrote in the same tick."""
    since_ns = int(since * 1e9)
    walk = Walk()
    found = ((rel, path, st.st_size) for rel, path, st in sorted(walk.files(root))
             if st.st_mtime_ns >= since_ns and rel not in inputs)
    found, cut = pick_artifacts(found, {}, select, max_each, max_total)
    return found, cut or walk.cut


def changed_artifacts(root, before, inputs, select, max_each, max_total, tree=None):
    """Files under ``root`` created or changed since the Snapshot ``before``
    (a call's, and what an earlier call's threads wrote since), except input
    files left as they were sent; whether that listing was cut; and the
    Snapshot taken now (see Walk.files for ``tree``). Where ``before`` was
    cut, a file not in it counts only if modified after that walk began.
    Files' times never run ahead of the clock, but may lag it by a timer
    tick or more (the kernel's coarse clock, or a finer time it handed out
    earlier): a file written just before the walk is never taken in, one
    written in the tick after it began may be missed."""
    after = snapshot(root, tree)
    cut, taken = before.cut, before.taken_ns
    changed = sorted(rel for rel, st in after.items() if before.get(rel) != st
                     and (not cut or st[1] > taken or rel in before))
    if not changed:
        return [], after.cut, after
    found = ((rel, os.path.join(root, rel), after[rel][0]) for rel in changed)
    found, cut = pick_artifacts(found, inputs, select, max_each, max_total)
    return found, cut or after.cut, after


# inotify(7): the events that may change a session directory's snapshot,
# and the flags of a watch and of the instance (linux/inotify.h).
IN_CHANGES = (0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800)
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000


class TreeWatch:
    """Whether anything under a direct session's directory may have changed
    since it was last walked, as inotify(7) tells: a call that touched no
    file there is not walked at all. The walk reads every directory and
    stats every file (~10 us for an empty directory, ~5 us more a file), on
    every call however little it did; this costs one ``poll``.

    Every directory is watched before it is read (see Walk.files), so what
    changes after its read raises an event, and what changed before is in
    the snapshot. Any event means "walk": the snapshot's comparison, not
    the events, still says which files changed. inotify does not see writes
    through a shared mmap; the walk does (they change the file's mtime), so
    once ``mmap`` is imported every call is walked. So is every call
    without inotify, or once a watch fails (the user's watch limit)."""

    __slots__ = ("fd", "failed", "pending")

    def __init__(self):
        self.fd = None
        self.failed = _libc is None
        self.pending = None  # a poll object on fd: whether events wait

    def quiet(self):
        """True when nothing under the tree changed since the last walk
        (then the last snapshot stands); False when something may have,
        with the events read."""
        if self.fd is None:
            return False
        if "mmap" in sys.modules:
            self.stop()
            return False
        if not self.pending.poll(0):  # no events (a read would raise, ~2 us)
            return True
        changed = False
        for _ in range(PIPE_READS):
            try:
                if not os.read(self.fd, READ_CHUNK):
                    break
            except BlockingIOError:
                return not changed
            except OSError:
                break
            changed = True
        else:
            return False  # events keep coming: read the rest next time
        self.stop()  # user code closed or replaced the descriptor
        return False

    def add(self, path):
        """Watch the directory ``path``, about to be read (a watch it has
        already is kept)."""
        if self.failed:
            return
        try:
            if self.fd is None:
                fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
                if fd < 0:
                    raise _failed("inotify_init1")
                self.fd = fd
                self.pending = select.poll()
                self.pending.register(fd, select.POLLIN)
            if _libc.inotify_add_watch(self.fd, os.fsencode(path),
                                       IN_CHANGES | IN_ONLYDIR | IN_DONT_FOLLOW) < 0:
                error = _failed("inotify_add_watch")
                if error.errno not in (errno.ENOENT, errno.ENOTDIR):  # not gone since read
                    raise error
        except Exception:  # no inotify here, the user's limits
            self.stop()

    def stop(self):
        """Walk every call from now on."""
        self.failed = True
        self.pending = None
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


class Session:
    """The worker's side of its session child."""

    __slots__ = ("child", "grace", "lost", "files", "direct", "before")

    def __init__(self, child, grace, direct=False, before=None):
        self.child = child
        self.grace = grace
        self.lost = None  # why the child is gone, once it is
        # The directory as the last call left it (see snapshot): the next
        # call's "before", saving a walk; None when unknown.
        self.files = None
        # Whether the server holds the child's pipes and speaks to it
        # itself: the worker then only interrupts and ends calls.
        self.direct = direct
        # What of the worker and its zygote the session's code could change
        # from outside (see inherited_state), as it was before the session.
        self.before = before

    def execute(self, worker, msg):
        child = self.child
        if child is None:
            raise RuntimeError("the session is gone: %s" % self.lost)
        if self.direct:
            raise RuntimeError("the server speaks to this session's process directly")
        select_ = msg["artifacts"]
        before = None
        if select_ is not False:
            before = self.files if self.files is not None else snapshot(child.rundir)
        self.files = None
        start = time.monotonic()
        msg["interrupt_at"] = start + msg["timeout"]  # see session_call
        unsent = None
        try:
            write_all(child.req_w, hand_off(msg))
        except OSError:
            unsent = "unsent"
        try:
            run = supervise(worker, child, msg, start, session=self, ended=unsent)
        except ChannelClosed:
            self.close()
            raise
        lost = self.why_lost(run.ended, msg["timeout"])
        artifacts = []
        cut = False
        if select_ is not False:
            artifacts, cut, self.files = changed_artifacts(
                child.rundir,
                before,
                input_files(msg["files"]),
                artifact_globs(select_),
                msg["max_artifact_bytes"],
                msg["max_artifacts_bytes"],
            )
        if lost is not None:
            self.close()
            self.lost = lost
        reply = result_frame(msg, run, artifacts, cut)
        reply["session_lost"] = lost
        write_frame(worker.wfd, reply)

    def why_lost(self, ended, timeout):
        """Why the call that ended so (``supervise``'s ``ended``) cost the
        session its process, or None if it did not."""
        if ended == "timeout":
            return ("the session was killed: its code did not stop within %gs of the "
                    "interrupt sent at the %gs timeout; its state is gone" % (self.grace, timeout))
        if ended == "unsent":
            return "the session process had already exited"
        if ended == "report":  # it reported: the session goes on
            return None
        if ended == "flood":  # a direct call: the server read more than any call's report
            return ("the session process was killed: it sent a report larger than any call's; "
                    "its state is gone")
        status = self.child.status
        if status is not None:  # it ended, or was killed for closing its pipe
            code, signum = exit_status(status)
            how = (("was killed by %s" % signal_name(signum)) if signum
                   else ("exited with status %d" % code))
            return "the session process %s during this call; its state is gone" % how
        return None

    def interrupt(self):
        """A direct call's timeout: KeyboardInterrupt in the session child."""
        try:
            if self.child is None or self.child.reap(False):
                return
        except ZygoteLost:
            return  # the child went with it; the call's end says so
        try:
            os.kill(self.child.pid, _SIGINT)
        except ProcessLookupError:
            pass

    @staticmethod
    def stop(child):
        """Kill and reap the session's process; False when its zygote is gone.
        The zygote took the process along (its parent-death signal): the
        zygote is stopped, and what is left of them killed by the worker (a
        subreaper, or pid 1)."""
        try:
            child.kill()
            child.reap(True)
        except ZygoteLost:
            child.zygote.stop()
            kill_descendants()
            return False
        return True

    def end(self, worker, msg):
        """A direct call the server gave up on: its process is killed (at the
        deadline after the interrupt) or gone (it closed its pipes or could
        not be written to); the answer says how and why the session is lost."""
        child = self.child
        if child is None:
            raise RuntimeError("the session is gone: %s" % self.lost)
        ended = msg["ended"]
        stopped = self.stop(child)
        artifacts = []
        cut = False
        if msg.get("artifacts", False) is not False:
            artifacts, cut = written_since(child.rundir, msg["since"], set(msg["inputs"]),
                                           artifact_globs(msg["artifacts"]),
                                           msg["max_artifact_bytes"], msg["max_artifacts_bytes"])
        lost = self.why_lost(ended, msg["timeout"]) if stopped else ZYGOTE_TOOK_SESSION
        code, signum = exit_status(child.status or 0)
        if ended == "timeout" or not stopped:
            code, signum = -_SIGKILL, _SIGKILL
        self.close()
        self.lost = lost
        write_frame(worker.wfd, {"t": "result", "id": msg["id"], "exit_code": code,
                                 "signal": signum, "timed_out": ended == "timeout",
                                 "session_lost": lost, "artifacts": artifacts,
                                 "artifacts_cut": cut})

    def close(self):
        child = self.child
        if child is not None:
            self.child = None
            self.stop(child)
            child.close()
            remove_tree(child.rundir)  # the worker leaves with its session


ZYGOTE_TOOK_SESSION = ("the session process was killed with its worker's zygote; its state is "
                       "gone")


def open_session(worker, msg):
    """Fork the session child (the pre-forked run child goes as it does)
    and answer. With ``direct``, its ends of the child's pipes go to the
    server (see "Sessions") before the answer."""
    direct = bool(msg.get("direct"))
    if direct and not worker.passes_fds():
        raise RuntimeError("a direct session needs a socket as the worker's channel")
    prefork, worker.next = worker.next, None
    try:
        if prefork is not None and worker.zygote is not None:
            # The zygote kills it as it forks the session (see end_child);
            # its pid is read first, as the zygote answers forks in order.
            try:
                prefork.forked()
            except BaseException as exc:
                prefork.close()
                prefork = None
                if not isinstance(exc, OSError):  # OSError: it was never forked
                    raise
        elif prefork is not None:
            worker.retire(prefork)
            prefork = None
        before = inherited_state(worker)
        rundir = os.path.join(worker.scratch, "session")
        os.mkdir(rundir, 0o700)
        limits = msg["limits"]
        if worker.zygote is not None:
            # Forked by the zygote, as runs are: the worker's own memory holds
            # what the requests it served left in it (their code, input and
            # output), and a fork of it would too.
            child = worker.fork_session(rundir, limits, direct, prefork)
        else:
            child = worker.fork_child(rundir, lambda *fds: session_main(
                *fds, limits, worker.base_tmp, worker.rundir, worker.scope, direct))
    finally:
        if prefork is not None:
            worker.dismiss(prefork)
    worker.session = Session(child, msg["grace"], direct, before)
    if direct:
        import _socket as socket

        fds = [child.req_w, child.out_r, child.err_r, child.ctl_r]
        # A pidfd, where there is one: the server sees the child end even
        # when a process it forked keeps its pipes open.
        pidfd = None
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(child.pid)
                fds.append(pidfd)
            except OSError:
                pass
        channel = socket.socket(fileno=worker.rfd)
        try:
            channel.settimeout(None)  # blocking, whatever a preload set as default
            channel.sendmsg([b"S"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      struct.pack("%di" % len(fds), *fds))])
        finally:
            channel.detach()  # the worker's channel stays open
            if pidfd is not None:
                os.close(pidfd)
        child.close()  # the server holds them now
    write_frame(worker.wfd, {"t": "result", "id": msg["id"], "exit_code": 0, "pid": child.pid})


# What a direct session child imports before any call (see session_main).
SESSION_IMPORTS = ("fnmatch", "mimetypes")


def inherited_state(worker):
    """What the worker and its zygote hold that every session child forked
    later inherits and that a session's code, a process of the same user,
    can change from outside (``prlimit``, ``setpriority``,
    ``sched_setaffinity``, ``sched_setscheduler``): their rlimits, nice
    values, CPU affinities and scheduling policies. None when unreadable."""
    pids = [os.getpid()]
    if worker.zygote is not None:
        pids.append(worker.zygote.pid)
    try:
        state = []
        for pid in pids:
            with open("/proc/%d/limits" % pid) as f:
                state.append((f.read(), os.getpriority(os.PRIO_PROCESS, pid),
                              sorted(os.sched_getaffinity(pid)), os.sched_getscheduler(pid)))
        return state
    except OSError:
        return None


def release_session(worker, msg):
    """End the session of a ``release`` frame (the server closed it) and
    leave the worker ready for another: the session's process and what it
    left running are killed, the scratch root and a private /dev/shm
    cleared, as after a run. Answered once that is done; a worker where
    something stayed answers ``retire`` (the server then ends it). No run
    child is forked ahead: the server keeps the worker for its next session,
    which would end it."""
    session, worker.session = worker.session, None
    if session is None:
        write_error(worker.wfd, msg.get("id"), "", RuntimeError("this worker serves no session"))
        return
    child, session.child = session.child, None
    try:
        if child is not None:
            worker.retire(child)
        else:  # lost: its process is gone, its directory removed
            worker.cleaned(clear_private_shm(worker.empty_shm))
            worker.cleaned(worker.clear_scratch())
        if session.before is None or inherited_state(worker) != session.before:
            worker.dirty = worker.dirty or (
                "the session changed the limits, priority or CPU affinity of its worker or "
                "zygote, which a next session would inherit")
        if worker.zygote is not None and worker.dirty is None and LEARNING:
            # The worker serves sessions next: what a session child imports
            # as it starts (see session_main) is imported in its zygote now,
            # and the next session's first call waits ~4 ms less.
            worker.zygote.learn(SESSION_IMPORTS)
    except ZygoteLost as exc:
        worker.dirty = worker.dirty or "the zygote is gone: %s" % exc
    except Exception as exc:
        worker.dirty = worker.dirty or "the session's clean-up failed: %s" % exc
    if worker.dirty is not None:
        write_frame(worker.wfd, {"t": "error", "id": msg.get("id"), "retire": True,
                                 "message": "worker retired: " + worker.dirty})
        return
    write_frame(worker.wfd, {"t": "result", "id": msg.get("id"), "exit_code": 0})


def serve_session(worker, msg):
    """Handle a ``session`` frame, or an ``exec`` frame in session mode."""
    try:
        if msg["t"] == "session":
            if worker.session is not None:
                raise RuntimeError("this worker already serves a session")
            open_session(worker, msg)
        elif msg["t"] == "end":
            worker.session.end(worker, msg)
        else:
            worker.session.execute(worker, msg)
    except ChannelClosed:
        raise
    except ZygoteLost as exc:
        if msg["t"] != "session":
            # A call of a session that is not direct: the process went with
            # the zygote.
            worker.session.close()
            worker.session.lost = ZYGOTE_TOOK_SESSION
            write_error(worker.wfd, msg.get("id"), "", exc)
            return
        # The server starts the session on another worker and replaces this
        # one, which has no zygote to fork it from.
        sys.stderr.write("code-executor: %s\n" % exc)
        worker.dirty = worker.dirty or "the zygote is gone: %s" % exc
        write_frame(worker.wfd, {"t": "error", "id": msg.get("id"), "retire": True,
                                 "message": "worker retired: %s" % exc})
    except Exception as exc:
        write_error(worker.wfd, msg.get("id"), "", exc)


# ---------------------------------------------------------------------------
# Between runs: what a run left behind
# ---------------------------------------------------------------------------

def child_pids():
    pids = set()
    me = os.getpid()
    try:
        tasks = os.listdir("/proc/%d/task" % me)
    except OSError:
        return pids
    for task in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (me, task)) as f:
                pids.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return pids


def kill_descendants():
    """SIGKILL and reap every child of the worker. Called between runs, when
    the worker has no child of its own: whatever is left belongs to the run
    that just ended (the worker is a subreaper, so orphans come back to it)."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        # No child at all, so no descendant: the run's process is reaped, and
        # whatever it left running was handed to this worker when it died.
        return
    for _ in range(10000):
        pids = child_pids()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, _signal.SIGKILL)
            except OSError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
    while True:  # zombies not listed any more but still unreaped
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            break


def private_shm():
    """Whether the launcher made /dev/shm this worker's alone."""
    return os.environ.get("CODE_EXECUTOR_PRIVATE_SHM") == "1"


def clear_private_shm(empty=None):
    """Empty /dev/shm between runs when the launcher made it ours alone;
    return None, or why something stayed. ``empty``: what
    ``empty_tmpfs_root`` found of it, to tell it is still empty without
    listing it."""
    if not private_shm() or still_empty("/dev/shm", empty):
        return None
    return clear_dir("/dev/shm")


# How long clearing what one run left may take. Past it (or when anything
# stays behind) the worker is dirty: it serves no further request.
CLEAN_SECONDS = 2.0
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def remove_tree(path):
    """Remove ``path`` and everything in it (see ``clear_dir``); return None,
    or why something stayed."""
    # Most run directories are empty by now: one rmdir instead of a walk.
    try:
        os.rmdir(path)
        return None
    except FileNotFoundError:
        return None
    except OSError:
        pass
    why = clear_dir(path)
    try:
        os.rmdir(path)
    except OSError as exc:
        return why or "cannot remove %s: %s" % (path, exc)
    return why


def empty_tmpfs_root(path):
    """(device, size) of the directory ``path`` if it is empty and on a
    tmpfs, where a directory's size grows with each entry and shrinks with
    its removal (by a fixed 20 bytes): a later size equal to this one says
    it is empty again. None otherwise, or when /proc says nothing."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or os.listdir(path):
            return None
        dev = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                fields = line.split(" - ", 1)
                if len(fields) == 2 and fields[0].split()[2:3] == [dev]:
                    if fields[1].split()[:1] == ["tmpfs"]:
                        return st.st_dev, st.st_size
                    return None
    except (OSError, IndexError, ValueError):
        pass
    return None


def inodes_used(path):
    """Inodes in use on the filesystem of ``path``; None where it does not
    count them."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_files - st.f_ffree if st.f_files else None


def still_empty(path, empty):
    """Whether the directory ``path`` is as ``empty_tmpfs_root`` found it
    (``empty``, None: not known) when it was empty: on the same tmpfs, of
    the same size."""
    if empty is None:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_size) == empty and stat.S_ISDIR(st.st_mode)


def clear_dir(path, budget=CLEAN_SECONDS):
    """Remove everything inside ``path`` (symlinks themselves, not what they
    point to); return None once it is empty, else why it is not.

    No recursion and no path longer than one name, so that no depth of tree
    can fail it: a directory found empty goes with one rmdir; any other is
    renamed up into ``path`` itself (one found in ``path`` stays there) and
    emptied in turn, with its own subdirectories moved up likewise. A mode a
    run took away (a directory made 0555 or 0000) is given back first: the
    run's files are this user's. Bounded by ``budget`` seconds."""
    deadline = time.monotonic() + budget
    try:
        root = os.open(path, _O_DIR)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "cannot open %s: %s" % (path, exc)
    problem = None
    serial = 0
    todo = [None]  # None: the root itself; else a directory's name in it
    try:
        while todo:
            if time.monotonic() > deadline:
                return "clearing %s took over %g s" % (path, budget)
            name = todo.pop()
            if name is None:
                fd = root
            else:
                try:
                    os.chmod(name, 0o700, dir_fd=root)
                    fd = os.open(name, _O_DIR, dir_fd=root)
                except OSError as exc:
                    problem = "cannot open %s/%s: %s" % (path, name, exc)
                    continue
            try:
                with os.scandir(fd) as it:
                    entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                for entry, is_dir in entries:
                    try:
                        if not is_dir:
                            os.unlink(entry, dir_fd=fd)
                            continue
                        try:
                            # Most are empty by now: one rmdir, no walk.
                            os.rmdir(entry, dir_fd=fd)
                            continue
                        except OSError:
                            pass
                        if fd == root:
                            todo.append(entry)
                        else:
                            # Moving a directory rewrites its "..": it must
                            # be writable (a run may have made it 0555).
                            os.chmod(entry, 0o700, dir_fd=fd)
                            while True:
                                serial += 1
                                moved = ".gone-%d" % serial
                                try:
                                    os.rename(entry, moved, src_dir_fd=fd, dst_dir_fd=root)
                                    break
                                except (FileExistsError, IsADirectoryError):
                                    continue
                                except OSError as exc:
                                    if exc.errno != errno.ENOTEMPTY:
                                        raise
                            todo.append(moved)
                    except OSError as exc:
                        problem = "cannot remove %s: %s" % (entry, exc)
            except OSError as exc:
                problem = "cannot list %s: %s" % (path, exc)
            finally:
                if fd != root:
                    os.close(fd)
            if name is not None:
                try:
                    os.rmdir(name, dir_fd=root)
                except OSError as exc:
                    problem = "cannot remove %s/%s: %s" % (path, name, exc)
        # Every entry listed was removed, or ``problem`` says which was not;
        # no process of the run is left to add one meanwhile.
        return problem
    finally:
        os.close(root)


# ---------------------------------------------------------------------------
# Start
# ---------------------------------------------------------------------------

def join_cgroups(barrier):
    """Wait until the launcher has moved this process into its cgroups: its
    ``--join-async`` pipe ``barrier`` (a descriptor number, None without one)
    then reads b"1"; empty, the join failed, and the worker exits."""
    if barrier is None:
        return
    fd = int(barrier)
    joined = os.read(fd, 1) == b"1"
    os.close(fd)
    if not joined:
        sys.stderr.write("code-executor: the worker could not join its cgroups\n")
        sys.stderr.flush()
        os._exit(1)


def main():
    # Left by the launcher (see LAUNCH in src/worker/mod.rs): the code it
    # compiled this script to, sent in `ready` for the server to keep; and
    # the pipe that tells when this process is in its cgroups. The join
    # waits out an RCU grace period, longer than a small interpreter's start:
    # what comes before a preload or a fork does not wait for it.
    compiled = globals().pop("__bootstrap_code__", None)
    barrier = globals().pop("__cgroup_barrier__", None)
    scratch = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
    preload = [m for m in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if m]
    rfd = os.dup(0)
    wfd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    if preload:
        # A preload may fork, and its memory belongs in the worker's cgroup.
        join_cgroups(barrier)
        barrier = None
    try:
        for name in preload:
            __import__(name)
        # Modules every run needs, imported once here instead of in each child.
        # (traceback and linecache come once the first run has ended: see
        # prepare_later_runs. shutil and mimetypes, which only the worker
        # needs and rarely, are imported by it when it first does.)
        import builtins, atexit  # noqa: F401,E401
        global resource
        import resource
    except BaseException as exc:
        write_error(wfd, None, "preload failed: ", exc)
        os._exit(1)
    try:
        missing = load_libc()
        if missing is not None:  # see "Linux calls" for what this costs
            sys.stderr.write("code-executor: no prctl or Landlock calls: %s\n" % missing)
        become_subreaper()
        # Not dumpable: a run of the same user cannot read the worker's memory
        # (/proc/<pid>/mem, which may hold earlier requests) or attach to it.
        set_dumpable(False)
    except OSError as exc:
        write_error(wfd, None, "worker setup failed: ", exc)
        os._exit(1)
    worker = Worker(scratch, rfd, wfd)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    _signal.set_wakeup_fd(worker.wake_w)
    # Objects alive now never need collecting: freeze them so that a child's
    # collections do not touch (and copy) every page it shares with us. No
    # collection first: the start leaves no garbage to speak of (a full one
    # here found none, with numpy or pandas preloaded too) and would cost
    # 2 ms, 5 with numpy, 9 with pandas, before every worker is ready.
    if hasattr(gc, "freeze"):
        gc.freeze()
    # Heap memory freed since start (the compiler's, the preloads' imports)
    # goes back to the OS: each fork would otherwise copy the page tables that
    # map it, and each exit tear them down again.
    trim_heap()
    join_cgroups(barrier)  # before the first fork (signal_scope's)
    code = 0
    try:
        # Runs and sessions are forked by a zygote, forked before any request:
        # the worker's own memory keeps what the requests it served left in
        # it (their code, input, files and output), and every fork of it
        # would too. Where Landlock scopes signals, every run is scoped (in
        # the container tier too, where the worker is no pid 1): no run
        # signals its worker or zygote. Where it cannot, a run can stop or
        # kill its zygote (not the worker, pid 1 of its namespace); that
        # costs the run itself and its worker, which is replaced, and
        # nothing of a run is left once it is answered (``exposed``), so no
        # other request. (CODE_EXECUTOR_NO_ZYGOTE, for tests of the forks'
        # other path, has the worker fork its runs itself.)
        scope = signal_scope()
        if not os.environ.get("CODE_EXECUTOR_NO_ZYGOTE"):
            worker.zygote = Zygote(worker, scope)
            worker.exposed = scope is None
        if worker.zygote is None:
            worker.scope = scope  # for the session children it forks itself
        elif scope is not None:
            os.close(scope)  # the zygote has its own
        # The first child exists before `ready`: the server then counts the
        # worker's own tasks (a preload may start threads) as all but one.
        worker.spawn()
        worker.next.forked()
        ready = {
            "t": "ready",
            "protocol": PROTOCOL_VERSION,
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": sys.executable,
            "pid": os.getpid(),
        }
        if compiled is not None:
            ready["code"] = compiled
        write_frame(wfd, ready)
        del ready, compiled
        worker.serve()
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        worker.close()
        os._exit(code)


if __name__ == "__main__":
    main()

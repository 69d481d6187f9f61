"""Where a clean run's CPU goes: python/worker.py driven directly, no server.

    python3 benches/support/worker_cost.py [--python PATH] [--runs N] [--worker FILE]
                                           [--compare FILE [--rounds R]] [--preload MODULES]

Prints, for the interpreter given (default: this one):

* the floor: a bare ``fork`` + ``_exit`` + ``waitpid`` cycle of a process holding
  the worker's imports, what one copy-on-write page fault costs here, and
  the least a graded case costs with a fork per case (a child that only
  reads stdin, runs precompiled code and writes to a pipe);
* the same cycle of the bare interpreter (``python -I -S``, nothing imported);
* clean runs of ``print(2+2)`` sent back to back: CPU and minor page faults
  per run of the worker and of its forked children (from /proc/<pid>/stat),
  and the round trip seen by this driver, back to back and 50 ms apart;
* session calls of the same code: the same figures without a fork, and the
  floor of a session call: the code run by the very process that answers
  over the pipes (no relay, no fork, no output pipes); both also with calls
  50 ms apart, every process idle in between.

``--preload`` imports those modules (comma-separated, as the server's
``--preload``) in the worker and in the worker-sized floor's process: what a
clean run costs where an environment preloads numpy or matplotlib, whose
memory every fork copies the page tables of and every exit tears down.
``CODE_EXECUTOR_HUGE_PAGES=1`` in the environment measures the server's
``huge_pages = true`` (the worker reads it as it does from the server).

``--worker`` drives another copy of the bootstrap (an edited one, to compare
with). ``--compare FILE`` drives the two bootstraps (``--worker``'s and FILE)
in turns instead, ``--rounds`` times each (in the order A B, then B A), with a
scratch root on a tmpfs as the server gives each worker, and prints for each
the medians over its rounds of the worker's, the zygote's and the children's
CPU per clean run, the round trip, and how often the worker went to sleep
per run (its voluntary context switches: each is a wake-up the run waits
for). Linux only; the worker's pure-Python codec frames the requests.
"""

import argparse
import marshal
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "python", "worker.py")
sys.path.insert(0, os.path.dirname(WORKER))
import worker as codec  # noqa: E402  (the bootstrap doubles as the codec)

TICK = os.sysconf("SC_CLK_TCK")

FLOOR = r"""
import gc, os, resource, sys, time, mmap
import ast, linecache, traceback, atexit, shutil, fnmatch, mimetypes, ctypes, select, struct, types
mimetypes.init()
for name in filter(None, sys.argv[2].split(",")):
    __import__(name)
gc.collect(); gc.freeze()
n = int(sys.argv[1])
anon = [l.split()[1] for l in open("/proc/self/status") if l.startswith("RssAnon")][0]
fork_s = 0.0
t = time.perf_counter()
for _ in range(n):
    a = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    fork_s += time.perf_counter() - a
    os.waitpid(pid, 0)
wall = time.perf_counter() - t
me, kids = resource.getrusage(0), resource.getrusage(resource.RUSAGE_CHILDREN)
# One copy-on-write fault: a child writes once to each of 2000 shared pages.
pages = 2000
buf = mmap.mmap(-1, pages * 4096)
for i in range(pages):
    buf[i * 4096] = 1
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    f0 = resource.getrusage(0).ru_minflt
    a = time.perf_counter()
    for i in range(pages):
        buf[i * 4096] = 2
    faulting = time.perf_counter() - a
    faults = resource.getrusage(0).ru_minflt - f0
    a = time.perf_counter()
    for i in range(pages):
        buf[i * 4096] = 3
    plain = time.perf_counter() - a
    os.write(w, b"%f" % ((faulting - plain) / max(faults, 1) * 1e6))
    os._exit(0)
os.waitpid(pid, 0)
per_fault = float(os.read(r, 64))
# The least a graded case can cost with a fork per case: a child that reads
# its stdin (a memfd), runs code compiled once in the parent and writes to a
# pipe the parent reads to the end, then is reaped with its rusage. Nothing
# else: no sandbox, no limits, no run directory, no report.
code = compile("print(int(input()) * 2)", "<code>", "exec")
me0 = resource.getrusage(0)
case_cpu = case_faults = 0.0
for _ in range(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            fd = os.memfd_create("stdin")
            os.write(fd, b"21\n")
            os.lseek(fd, 0, 0)
            os.dup2(fd, 0)
            os.dup2(w, 1)
            exec(code, {"__name__": "__main__"})
            sys.stdout.flush()
        finally:
            os._exit(0)
    os.close(w)
    while os.read(r, 4096):
        pass
    os.close(r)
    _, _, usage = os.wait4(pid, 0)
    case_cpu += usage.ru_utime + usage.ru_stime
    case_faults += usage.ru_minflt
me1 = resource.getrusage(0)
parent = (me1.ru_utime + me1.ru_stime - me0.ru_utime - me0.ru_stime) / n * 1e6
print(anon, fork_s / n * 1e6, wall / n * 1e6, (me.ru_utime + me.ru_stime) / n * 1e6,
      (kids.ru_utime + kids.ru_stime) / n * 1e6, per_fault, parent, case_cpu / n * 1e6,
      case_faults / n)
"""


# The same cycle in the bare interpreter: nothing imported, no site.
BARE_FLOOR = r"""
import os, sys, resource
n = int(sys.argv[1])
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
me, kids = resource.getrusage(0), resource.getrusage(resource.RUSAGE_CHILDREN)
print((me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime) / n * 1e6)
"""


# The least a session call can cost: one process that runs each call's code
# itself (the bootstrap's own run_user_code, in one __main__) and answers
# over the same pipes and codec. Nothing else: no relay through a worker, no
# fork, no output pipes (stdout goes to a memfd read back after the call), no
# interrupt, limits or artifacts. Not something to ship: user code would
# share a process with the channel.
SESSION_FLOOR = r"""
import os, sys
sys.path.insert(0, %r)
import worker as w
rfd, wfd = os.dup(0), os.dup(1)
out = os.memfd_create("stdout")
os.dup2(out, 1)
w.write_frame(wfd, {"t": "ready"})
main = w.fresh_main()
requests = open(rfd, "rb", buffering=0)
while True:
    try:
        msg = w.unpackb(w.read_frame(requests))
    except w.ChannelClosed:
        break
    outcome = w.run_user_code(msg["code"], None, main)
    sys.stdout.flush()
    size = os.lseek(out, 0, os.SEEK_CUR)
    data = os.pread(out, size, 0)
    os.ftruncate(out, 0)
    os.lseek(out, 0, os.SEEK_SET)
    w.write_frame(wfd, {"t": "result", "id": msg["id"], "stdout": data, "stderr": b"",
                        "exit_code": outcome.status, "result": outcome.result})
"""


# How the server starts a worker (LAUNCH in src/worker/mod.rs): the bootstrap
# compiled by a one-line `-c` program, so that its syntax tree is freed.
LAUNCH = ("import io, sys; p = sys.argv.pop(1); sys.argv[0] = __file__ = p; "
          "f = io.open_code(p); c = compile(f.read(), p, 'exec'); f.close(); del f; exec(c)")


class Worker:
    def __init__(self, python, scratch, script=WORKER, stdin=subprocess.PIPE, preload=""):
        self.proc = subprocess.Popen(
            [python, "-I", "-u", "-c", LAUNCH, script, scratch, preload],
            stdin=stdin, stdout=subprocess.PIPE)
        self.ready = ready = self.read()
        if ready.get("t") != "ready":
            raise SystemExit("worker did not start: %r" % (ready,))
        # Clean runs' exec frames go in marshal, as the server sends them, to
        # a bootstrap of protocol 6 or later (an older one reads msgpack
        # only); until a session starts.
        self.marshal_exec = ready.get("protocol", 0) >= 6

    def send(self, msg):
        # As the server sends them: a clean run's exec frame in marshal,
        # anything else (a session's calls among them) in msgpack.
        if msg["t"] == "session":
            self.marshal_exec = False
        if msg["t"] == "exec" and self.marshal_exec:
            data = marshal.dumps(msg)
        else:
            data = codec.pure_packb(msg)
        self.proc.stdin.write(struct.pack("!I", len(data)) + data)
        self.proc.stdin.flush()

    def run(self, msg):
        self.send(msg)
        reply = self.read()
        if reply.get("cleaning"):
            self.read()  # its ``cleaned`` frame: the worker reads nothing before
        return reply

    def read(self):
        (n,) = struct.unpack("!I", self.proc.stdout.read(4))
        return codec.pure_unpackb(self.proc.stdout.read(n))

    def stat(self, pid=None):
        """(minflt, cminflt, cpu s, children's cpu s) of ``pid``."""
        fields = open("/proc/%d/stat" % (pid or self.proc.pid)).read().rsplit(")", 1)[1].split()
        minflt, cminflt = int(fields[7]), int(fields[8])
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        ccpu = (int(fields[13]) + int(fields[14])) / TICK
        return minflt, cminflt, cpu, ccpu

    def helpers(self):
        """The worker's children: its zygote and the child waiting for a run."""
        pids = []
        root = "/proc/%d/task" % self.proc.pid
        for task in os.listdir(root):
            with open("%s/%s/children" % (root, task)) as f:
                pids += [int(p) for p in f.read().split()]
        return pids

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# Session calls sent this far apart, and at most this many: what the
# relay's extra process costs a client that pauses between calls.
PACE = 0.05
PACED_CALLS = 100


def exec_frame(i):
    frame = dict(codec.WARM_REQUEST)
    frame.update({"id": i, "code": "print(2+2)", "timeout": 5.0, "max_output": 1 << 20})
    return frame


def timed(worker, runs, gap=0.0):
    rts = []
    for i in range(runs):
        if gap:
            time.sleep(gap)
        t = time.perf_counter()
        reply = worker.run(exec_frame(i))
        rts.append((time.perf_counter() - t) * 1e3)
        if reply.get("stdout") != b"4\n":
            raise SystemExit("unexpected reply: %r" % (reply,))
    return rts


def sleeps(pid):
    """The voluntary context switches of process ``pid`` so far."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def costs(worker, n):
    """Clean runs of print(2+2) back to back on ``worker`` after 100 to warm
    up: (worker, zygote, children) CPU in ms per run, the round trip's p50 in
    ms, and the worker's sleeps per run."""
    timed(worker, 100)
    h0 = {pid: worker.stat(pid) for pid in worker.helpers()}
    s0, v0 = worker.stat(), sleeps(worker.proc.pid)
    rts = timed(worker, n)
    s1, v1 = worker.stat(), sleeps(worker.proc.pid)
    h1 = {pid: worker.stat(pid) for pid in worker.helpers()}
    zygote = [(h0[pid], h1[pid]) for pid in h0 if pid in h1]
    z_cpu = sum(b[2] - a[2] for a, b in zygote)
    c_cpu = s1[3] - s0[3] + sum(b[3] - a[3] for a, b in zygote)
    return ((s1[2] - s0[2]) / n * 1e3, z_cpu / n * 1e3, c_cpu / n * 1e3,
            statistics.median(rts), (v1 - v0) / n)


def compare(python, scripts, runs, rounds, preload=""):
    """``costs`` of each bootstrap in ``scripts``, in turns, ``rounds`` times."""
    tmpfs = "/dev/shm" if os.path.isdir("/dev/shm") else None
    rows = {script: [] for script in scripts}
    for r in range(rounds):
        for script in (scripts if r % 2 == 0 else scripts[::-1]):
            with tempfile.TemporaryDirectory(dir=tmpfs) as scratch:
                worker = Worker(python, scratch, script, preload=preload)
                rows[script].append(costs(worker, runs))
                worker.close()
    print("clean runs of print(2+2), %d back to back per round, %d rounds in turns "
          "(medians; ms of CPU per run):" % (runs, rounds))
    for script in scripts:
        med = [statistics.median(row[i] for row in rows[script]) for i in range(5)]
        print("  %s: worker %.3f, zygote %.3f, children %.3f, total %.3f; round trip p50 "
              "%.3f ms; the worker slept %.2f times a run (worker per round: %s)"
              % (script, med[0], med[1], med[2], sum(med[:3]), med[3], med[4],
                 " ".join("%.3f" % row[0] for row in rows[script])))


def clean_runs(worker, path, n, floor_us, bare_us, fault_us):
    """Clean runs of print(2+2) back to back on ``worker``: CPU and page
    faults per run of each process, and the round trip."""
    timed(worker, 100)
    h0 = {pid: worker.stat(pid) for pid in worker.helpers()}
    s0 = worker.stat()
    rts = timed(worker, n)
    s1 = worker.stat()
    h1 = {pid: worker.stat(pid) for pid in worker.helpers()}
    # A helper alive all along is the worker's zygote (when it has one):
    # the run children are its children, not the worker's.
    zygote = [(h0[pid], h1[pid]) for pid in h0 if pid in h1]
    w_cpu, c_cpu = (s1[2] - s0[2]) / n * 1e3, (s1[3] - s0[3]) / n * 1e3
    w_flt, c_flt = (s1[0] - s0[0]) / n, (s1[1] - s0[1]) / n
    z_cpu = sum(b[2] - a[2] for a, b in zygote) / n * 1e3
    z_flt = sum(b[0] - a[0] for a, b in zygote) / n
    c_cpu += sum(b[3] - a[3] for a, b in zygote) / n * 1e3
    c_flt += sum(b[1] - a[1] for a, b in zygote) / n
    # Each run PACE after the last answer: the next child has warmed up by then.
    gapped = timed(worker, min(n, PACED_CALLS), gap=PACE)
    worker.close()
    print()
    print("clean run print(2+2), %s, %d back to back:" % (path, n))
    print("  worker   %.2f ms CPU, %4.0f page faults per run" % (w_cpu, w_flt))
    if zygote:
        print("  zygote   %.2f ms CPU, %4.0f page faults per run" % (z_cpu, z_flt))
    print("  children %.2f ms CPU, %4.0f page faults per run" % (c_cpu, c_flt))
    total = w_cpu + z_cpu + c_cpu
    print("  total    %.2f ms CPU per run = %.1fx the fork floor, %.1fx the bare interpreter's; "
          "faults alone ~%.2f ms" % (total, total / (floor_us / 1e3), total / (bare_us / 1e3),
                                     (w_flt + z_flt + c_flt) * fault_us / 1e3))
    print("  round trip p50 %.3f ms back to back, %.3f ms %d ms apart"
          % (statistics.median(rts), statistics.median(gapped), PACE * 1e3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--worker", default=WORKER, help="the bootstrap to drive")
    ap.add_argument("--compare", metavar="FILE",
                    help="drive this bootstrap and --worker's in turns (see above) and exit")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each with --compare")
    ap.add_argument("--preload", default="", metavar="MODULES",
                    help="modules the worker (and the worker-sized floor) import first, "
                         "comma-separated")
    ap.add_argument("--floors", action="store_true",
                    help="print only the two fork floors (us of CPU: a worker-sized process's, "
                         "the bare interpreter's) and exit")
    args = ap.parse_args()
    python = os.path.abspath(args.python)  # a venv's link, not resolved: its packages
    if args.compare:
        compare(python, [args.worker, args.compare], args.runs, args.rounds, args.preload)
        return
    floor = subprocess.run([python, "-I", "-c", FLOOR, str(args.runs), args.preload],
                           capture_output=True, text=True)
    if floor.returncode:
        raise SystemExit("the floor measurement failed:\n" + floor.stderr)
    out = floor.stdout.split()
    anon_kb, fork_us, cycle_us, parent_us, child_us, fault_us, case_parent, case_child, \
        case_faults = map(float, out)
    bare = subprocess.run([python, "-I", "-S", "-c", BARE_FLOOR, str(args.runs)],
                          capture_output=True, text=True)
    if bare.returncode:
        raise SystemExit("the bare floor measurement failed:\n" + bare.stderr)
    bare_us = float(bare.stdout)
    if args.floors:
        print("%.1f %.1f" % (parent_us + child_us, bare_us))
        return
    print("interpreter: %s%s (worker's imports: %d KiB anonymous memory)"
          % (python, args.preload and ", preloading " + args.preload, anon_kb))
    print("floor: fork() %.0f us; fork+exit+wait cycle %.0f us wall, %.0f us CPU "
          "(parent %.0f + child %.0f)" % (fork_us, cycle_us, parent_us + child_us,
                                           parent_us, child_us))
    print("bare interpreter (python -I -S) fork+exit+wait cycle: %.0f us CPU" % bare_us)
    print("one copy-on-write page fault: %.2f us" % fault_us)
    print("least a fork per graded case costs (print(int(input()) * 2), compiled once; stdin, "
          "stdout pipe, wait4): %.0f us CPU (parent %.0f + child %.0f), %.0f page faults in the "
          "child" % (case_parent + case_child, case_parent, case_child, case_faults))

    n = args.runs
    with tempfile.TemporaryDirectory() as scratch:
        clean_runs(Worker(python, scratch, args.worker, preload=args.preload),
                   "relayed by the worker", args.runs, parent_us + child_us, bare_us, fault_us)

        worker = Worker(python, scratch, args.worker, preload=args.preload)
        worker.send({"t": "session", "id": 0, "limits": {}, "grace": 1.0})
        child = worker.read()["pid"]
        timed(worker, 100)
        s0, k0 = worker.stat(), worker.stat(child)
        rts = timed(worker, n)
        s1, k1 = worker.stat(), worker.stat(child)
        paced = timed(worker, min(n, PACED_CALLS), gap=PACE)
        worker.close()
        print()
        print("session call print(2+2), %d back to back:" % n)
        print("  worker %.0f us CPU, session child %.0f us CPU per call; round trip p50 %.0f us"
              % ((s1[2] - s0[2]) / n * 1e6, (k1[2] - k0[2]) / n * 1e6,
                 statistics.median(rts) * 1e3))

        floor_script = os.path.join(scratch, "session_floor.py")
        with open(floor_script, "w") as f:
            f.write(SESSION_FLOOR % os.path.dirname(os.path.abspath(WORKER)))
        floor = Worker(python, scratch, floor_script)
        floor.marshal_exec = False  # it reads the msgpack of session calls
        timed(floor, 100)
        s0 = floor.stat()
        rts = timed(floor, n)
        s1 = floor.stat()
        paced_floor = timed(floor, min(n, PACED_CALLS), gap=PACE)
        floor.close()
        print("  floor (the code run by the process that answers, no relay, no fork): "
              "%.0f us CPU per call; round trip p50 %.0f us"
              % ((s1[2] - s0[2]) / n * 1e6, statistics.median(rts) * 1e3))
        print("  %.0f ms apart (every process idle in between): round trip p50 %.0f us, "
              "%.0f us for the floor" % (PACE * 1e3, statistics.median(paced) * 1e3,
                                        statistics.median(paced_floor) * 1e3))


if __name__ == "__main__":
    main()

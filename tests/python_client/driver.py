"""Drive code-executor with the Python client of clients/python (installed into
a venv by setup.sh) and report what it saw as one JSON object on the last line
of stdout. The Rust tests (tests/integration/python_client.rs, balancer.rs)
make the assertions.

usage:
  driver.py sessions <url> <sessions> <calls>   # sessions in parallel, state kept per call
  driver.py retry <url>                          # 503 busy with Retry-After, retried and bounded
  driver.py features <url> [<url> ...]           # execute, stream, grade, session, spreading
"""

import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from code_executor_client import Busy, Client, CodeExecutorError, RetryPolicy, SessionLost


class Waits(logging.Handler):
    """Collects the client's retry log lines."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append({"message": record.getMessage(), "wait": record.args[0], "at": time.monotonic()})


def sessions(url, count, calls):
    client = Client(url)

    def one(n):
        report = {"calls_ok": 0, "errors": []}
        with client.session() as s:
            report.update(id=s.id, replica=s.replica, cookies=s.cookies)
            s.execute("x = 0")
            for i in range(1, calls + 1):
                r = s.execute("x += 1\nprint(x)")
                if r.stdout == "%d\n" % i and r.exit_code == 0:
                    report["calls_ok"] += 1
                else:
                    report["errors"].append(dict(r))
        try:
            s.execute("print(x)")
            report["after_close"] = "answered"
        except SessionLost as e:
            report["after_close"] = "session_lost: " + e.message
        return report

    with ThreadPoolExecutor(count) as pool:
        return {"sessions": list(pool.map(one, range(count)))}


def retry(url):
    waits = Waits()
    log = logging.getLogger("code_executor_client")
    log.addHandler(waits)
    log.setLevel(logging.INFO)
    holder = Client(url, retry=RetryPolicy(attempts=1))
    report = {}

    def hold(seconds):
        # Holds the only worker for `seconds`.
        return holder.execute("import time\ntime.sleep(%s)\nprint('held')" % seconds)

    def is_busy():
        try:
            Client(url, retry=RetryPolicy(attempts=1)).execute("print(1)")
            return False
        except Busy:
            return True

    # 1. Retried until the worker is free: every wait at least Retry-After.
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold, 2.5)
        while not is_busy():
            time.sleep(0.05)
        started = time.monotonic()
        result = Client(url, retry=RetryPolicy(attempts=10, deadline=30)).execute("print('after')")
        report["retried"] = {
            "stdout": result.stdout,
            "elapsed_s": time.monotonic() - started,
            "waits": [w["wait"] for w in waits.lines],
            "held": held.result().stdout,
        }
    # 2. Bounded: two tries while the worker stays held, then Busy.
    waits.lines.clear()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold, 4)
        while not is_busy():
            time.sleep(0.05)
        started = time.monotonic()
        try:
            Client(url, retry=RetryPolicy(attempts=2, deadline=30)).execute("print('never')")
            report["bounded"] = {"raised": None}
        except Busy as e:
            report["bounded"] = {
                "raised": type(e).__name__,
                "status": e.status,
                "code": e.code,
                "message": e.message,
                "elapsed_s": time.monotonic() - started,
                "waits": [w["wait"] for w in waits.lines],
            }
        # 3. A deadline shorter than Retry-After: no wait at all, Busy at once.
        waits.lines.clear()
        started = time.monotonic()
        try:
            Client(url, retry=RetryPolicy(attempts=5, deadline=0.5)).execute("print('never')")
            report["deadline"] = {"raised": None}
        except Busy as e:
            report["deadline"] = {
                "raised": type(e).__name__,
                "elapsed_s": time.monotonic() - started,
                "waits": [w["wait"] for w in waits.lines],
            }
        held.result()
    return report


def features(urls):
    client = Client(urls if len(urls) > 1 else urls[0])
    report = {}
    r = client.execute("print(2 + 2)\n6 * 7")
    report["execute"] = {"stdout": r.stdout, "result": r.result, "exit_code": r.exit_code}
    r = client.execute("import sys\nprint(sys.stdin.read().upper())", stdin="hi", timeout=5)
    report["stdin"] = r.stdout
    events = []
    started = time.monotonic()
    for e in client.stream("import time\nprint('a', flush=True)\ntime.sleep(0.5)\nprint('b')"):
        events.append({"kind": e.kind, "after_s": time.monotonic() - started,
                       "data": e.data if e.kind != "result" else {"stdout": e.data.stdout}})
    report["stream"] = events
    try:
        client.execute("print(1)", env="no-such-env")
        report["unknown_env"] = None
    except CodeExecutorError as e:
        report["unknown_env"] = {"status": e.status, "code": e.code, "message": e.message}
    g = client.grade(
        "print(sum(map(int, input().split())))",
        tests=[{"stdin": "1 2", "expected_stdout": "3"}, {"stdin": "2 2", "expected_stdout": "5"}],
        compare="trim",
    )
    report["grade"] = [c.get("verdict") for c in g["cases"]]
    with client.session() as s:
        s.execute("import math\nr = 3")
        report["session"] = {"result": s.execute("round(math.pi * r * r, 2)").result, "id": s.id,
                             "replica": s.replica}
        streamed = [e.kind for e in s.stream("print(r)")]
        report["session"]["stream"] = streamed
    try:
        s.execute("r")
        report["session"]["after_close"] = "answered"
    except SessionLost as e:
        report["session"]["after_close"] = e.message
    # Which replicas answered stateless calls in a row.
    answered = []
    for _ in range(12):
        answered.append(client.health().replica)
    report["replicas"] = answered
    return report


def main():
    mode = sys.argv[1]
    if mode == "sessions":
        report = sessions(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "retry":
        report = retry(sys.argv[2])
    elif mode == "features":
        report = features(sys.argv[2:])
    else:
        sys.exit("unknown mode %r" % mode)
    print(json.dumps(report))


main()

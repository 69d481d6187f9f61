"""What a run that leaves many directories behind costs the next request.

    python3 benches/support/left_behind.py [--binary PATH] [--python PATH]
                                           [--dirs N] [--rounds R] [--pool-size N]
                                           [--worker FILE [--compare FILE]]
                                           [--compare-binary PATH]

Starts the server (default: target/release/code-executor) with one worker
(``--pool-size``), then, ``--rounds`` times: a run that makes ``--dirs``
empty directories in its ``$TMPDIR`` (and a few nested ones), followed at
once by clean runs, one per worker. The worker clears its scratch root after
answering the first: with one worker the clean run waits for that, and its
round trip, against a clean run's after a clean run, is what the clearing
costs; with more, the slowest of the clean runs says whether one waited.
``--worker`` and ``--compare`` run two bootstraps (``--worker-script``) in
turns, A B then B A; ``--compare-binary`` two servers likewise, each with
its own bootstrap.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEAVE = """import os
top = os.environ["TMPDIR"]
for i in range({dirs}):
    os.mkdir(os.path.join(top, "d%d" % i))
os.makedirs(os.path.join(top, "n", "e", "s", "t"))
print("left")
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, code):
    req = urllib.request.Request(url + "/execute", data=json.dumps({"code": code, "timeout": 60}).encode(),
                                 headers={"content-type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        body = json.loads(resp.read())
    return (time.perf_counter() - started) * 1e3, body


def measure(args, script):
    port = free_port()
    binary, script = script
    cmd = [binary, "serve", "--port", str(port), "--pool-size", str(args.pool_size), "--discover", "false"]
    if args.python:
        cmd += ["--python", args.python]
    if script:
        cmd += ["--worker-script", os.path.abspath(script)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit("the server exited: %s" % " ".join(cmd))
                time.sleep(0.1)
        for _ in range(5):
            post(url, "print(1)")
        after_clean, after_left = [], []
        for _ in range(args.rounds):
            after_clean.append(post(url, "print(1)")[0])
            _, body = post(url, LEAVE.format(dirs=args.dirs))
            if body.get("stdout") != "left\n":
                sys.exit("the run that leaves directories failed: %s" % json.dumps(body)[:500])
            slowest = 0.0
            for _ in range(args.pool_size):
                ms, body = post(url, "print(1)")
                if body.get("stdout") != "1\n":
                    sys.exit("the run after it failed: %s" % json.dumps(body)[:500])
                slowest = max(slowest, ms)
            after_left.append(slowest)
            time.sleep(args.rest)
        return statistics.median(after_clean), statistics.median(after_left)
    finally:
        server.kill()
        server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "code-executor"))
    parser.add_argument("--python", help="the environment's interpreter (default: the server's)")
    parser.add_argument("--dirs", type=int, default=60000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=1)
    parser.add_argument("--rest", type=float, default=0.0,
                        help="seconds between rounds (for the clearing to end; with --pool-size over 1)")
    parser.add_argument("--compare-binary", help="a second server binary, run in turns with --binary")
    parser.add_argument("--worker", help="a bootstrap to run instead of the embedded one")
    parser.add_argument("--compare", help="a second bootstrap, run in turns with --worker's")
    args = parser.parse_args()
    a = (args.binary, args.worker)
    if args.compare_binary is not None:
        b = (args.compare_binary, args.worker)
    elif args.compare is not None:
        b = (args.binary, args.compare)
    else:
        b = None
    for config in [a] if b is None else [a, b, b, a]:
        clean, left = measure(args, config)
        print("%-40s clean run after a clean run p50 %8.2f ms, after %d directories left %8.2f ms"
              % (config[1] or config[0], clean, args.dirs, left))


if __name__ == "__main__":
    main()

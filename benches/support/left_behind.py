"""What a run that leaves many directories behind costs the next request.

    python3 benches/support/left_behind.py [--binary PATH] [--python PATH]
                                           [--dirs N] [--rounds R]
                                           [--worker FILE [--compare FILE]]

Starts the server (default: target/release/code-executor) with one worker,
then, ``--rounds`` times: a run that makes ``--dirs`` empty directories in
its ``$TMPDIR`` (and a few nested ones), followed at once by a clean run.
The worker clears its scratch root after answering the first, so the clean
run waits for that: its round trip, against a clean run's after a clean
run, is what the clearing costs. ``--worker`` and ``--compare`` run two
bootstraps (``--worker-script``) in turns, A B then B A.
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
    cmd = [args.binary, "serve", "--port", str(port), "--pool-size", "1", "--discover", "false"]
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
            ms, body = post(url, "print(1)")
            if body.get("stdout") != "1\n":
                sys.exit("the run after it failed: %s" % json.dumps(body)[:500])
            after_left.append(ms)
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
    parser.add_argument("--worker", help="a bootstrap to run instead of the embedded one")
    parser.add_argument("--compare", help="a second bootstrap, run in turns with --worker's")
    args = parser.parse_args()
    scripts = [args.worker] if args.compare is None else [args.worker, args.compare, args.compare, args.worker]
    for script in scripts:
        clean, left = measure(args, script)
        print("%-40s clean run after a clean run p50 %8.2f ms, after %d directories left %8.2f ms"
              % (script or "(embedded bootstrap)", clean, args.dirs, left))


if __name__ == "__main__":
    main()

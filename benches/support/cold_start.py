"""MCP stdio cold start, as a client meets it, for one or more server binaries
in turns, beside a `python -c` spawn of the same interpreter.

    python3 benches/support/cold_start.py PYTHON ROUNDS BINARY [BINARY ...]

Each round spawns every BINARY as `BINARY mcp --python PYTHON --pool-size 4`,
sends `initialize`, then one `execute_code` of `print(2+2)`, and times spawn to
answer; then it spawns `PYTHON -c 'print(2+2)'`. A BINARY may carry its own
flags after a space (`"target/release/code-executor --cache-dir none"`).
Prints the median of each, and of `initialize` alone.

PYTHON may be `conda:INTERPRETER`: the rounds then run in a throwaway
environment laid out as `conda create` makes one, with INTERPRETER copied in,
the standard library linked and an empty site-packages. Its `site` runs no
`.pth` file, as in a fresh Conda environment; an interpreter's own
site-packages may hold some that import a lot (one here imports certifi, 31 ms
of every start), which a `python -c` spawn of it pays too.

A BINARY with `--shared` relays to a shared server (`mcp --shared`): the
first round starts it, later rounds find it warm, so its median is a warm
launch's. The script gives them a runtime directory of its own
(`XDG_RUNTIME_DIR`) and stops the shared servers there when it ends.

The binaries take turns in a new order each round, and every killed server
is given SETTLE seconds (`COLD_START_SETTLE`, default 1.5) to be torn down
before the next spawn: the kernel tears a killed worker's namespaces down
after it exits, and a start in the middle of that waits for it (a server
started right after another was 40 ms slower here), which would charge one
binary's teardown to whichever comes next.
"""

import json
import statistics
import os
import shutil
import subprocess
import sys
import tempfile
import time

SETTLE = float(os.environ.get("COLD_START_SETTLE", "1.5"))


def cold_start(command, python):
    started = time.perf_counter()
    server = subprocess.Popen(
        command[:1] + ["mcp", "--python", python, "--pool-size", "4"] + command[1:],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )

    def send(message):
        server.stdin.write((json.dumps(message) + "\n").encode())
        server.stdin.flush()

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "cold-start", "version": "1"}}})
    server.stdout.readline()
    initialized = time.perf_counter() - started
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": "print(2+2)"}}})
    while True:
        answer = json.loads(server.stdout.readline())
        if answer.get("id") == 2:
            break
    elapsed = time.perf_counter() - started
    text = answer["result"]["content"][0]["text"]
    assert text.startswith("4\n"), answer
    server.kill()
    server.wait()
    time.sleep(SETTLE)
    return elapsed, initialized


def spawn(python):
    started = time.perf_counter()
    out = subprocess.run([python, "-c", "print(2+2)"], capture_output=True, check=True)
    assert out.stdout == b"4\n", out
    return time.perf_counter() - started


def conda_layout(interpreter, root):
    """A Conda-layout environment under ``root`` running ``interpreter``;
    its ``bin/python``."""
    out = subprocess.run(
        [interpreter, "-c", "import sys, sysconfig; print(sys.executable); "
         "print(sysconfig.get_paths()['stdlib']); print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True)
    binary, stdlib, version = out.stdout.split()
    lib = os.path.join(root, "lib", "python" + version)
    os.makedirs(os.path.join(lib, "site-packages"))
    for name in os.listdir(stdlib):
        if name != "site-packages":
            os.symlink(os.path.join(stdlib, name), os.path.join(lib, name))
    os.makedirs(os.path.join(root, "bin"))
    python = os.path.join(root, "bin", "python")
    shutil.copy2(binary, python)
    os.makedirs(os.path.join(root, "conda-meta"))
    open(os.path.join(root, "conda-meta", "history"), "w").close()
    return python


def main():
    python, rounds, binaries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    runtime = tempfile.mkdtemp(prefix="cold-start-run-")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        if python.startswith("conda:"):
            root = tempfile.mkdtemp(prefix="cold-start-env-")
            try:
                measure(conda_layout(python[len("conda:"):], root), rounds, binaries)
            finally:
                shutil.rmtree(root, ignore_errors=True)
        else:
            measure(python, rounds, binaries)
    finally:
        stop_shared_servers(runtime)
        shutil.rmtree(runtime, ignore_errors=True)


def stop_shared_servers(runtime):
    """SIGTERM every process whose command line names ``runtime``: the
    shared servers listening on sockets there; wait until they are gone."""
    def mentioning():
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if runtime.encode() in f.read():
                        pids.append(int(pid))
            except OSError:
                pass
        return pids
    for pid in mentioning():
        try:
            os.kill(pid, 15)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while mentioning() and time.monotonic() < deadline:
        time.sleep(0.05)


def measure(python, rounds, binaries):
    commands = [b.split() for b in binaries]
    cold = {b: [] for b in binaries}
    init = {b: [] for b in binaries}
    spawns = []
    for round in range(rounds):
        turn = round % len(binaries)
        order = list(zip(binaries, commands))
        for binary, command in order[turn:] + order[:turn]:
            elapsed, initialized = cold_start(command, python)
            cold[binary].append(elapsed)
            init[binary].append(initialized)
        spawns.append(spawn(python))
    ms = lambda values: statistics.median(values) * 1e3
    base = ms(spawns)
    for binary in binaries:
        print(f"{binary}: first result {ms(cold[binary]):.1f} ms ({ms(cold[binary]) / base:.2f}x "
              f"python -c), initialize {ms(init[binary]):.1f} ms")
    print(f"python -c spawn: {base:.1f} ms (median of {rounds})")


if __name__ == "__main__":
    main()

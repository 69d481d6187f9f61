"""Baseline for benches/e2e.rs: a warm Jupyter kernel executing the same code.

usage: python jupyter_baseline.py SECONDS CODE
Prints one JSON line: {"latencies_ms": [...], "elapsed_s": ...}.
"""
import json
import sys
import time

from jupyter_client.manager import start_new_kernel

seconds = float(sys.argv[1])
code = sys.argv[2]
km, kc = start_new_kernel(kernel_name="python3")
try:
    for _ in range(20):  # warm-up
        kc.execute_interactive(code, timeout=30, output_hook=lambda msg: None)
    latencies = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        t = time.perf_counter()
        reply = kc.execute_interactive(code, timeout=30, output_hook=lambda msg: None)
        latencies.append((time.perf_counter() - t) * 1000.0)
        assert reply["content"]["status"] == "ok", reply
    print(json.dumps({"latencies_ms": latencies, "elapsed_s": time.perf_counter() - started}))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)

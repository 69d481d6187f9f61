//! Pool checkout/return under contention, over a `{concurrency, pool_size}`
//! matrix, with real (idle) Python workers.

use std::time::{Duration, Instant};

use code_executor::executor::WORKER_SCRIPT;
use code_executor::testing::WorkerSpec;
use code_executor::testing::{EnvPool, PoolConfig};
use criterion::{Criterion, criterion_group, criterion_main};

fn real_python() -> std::path::PathBuf {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    String::from_utf8(out.stdout).unwrap().trim().into()
}

fn checkout(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.py");
    std::fs::write(&script, WORKER_SCRIPT).unwrap();
    let python = real_python();
    let mut group = c.benchmark_group("pool_checkout");
    for pool_size in [1usize, 4] {
        let pool = rt.block_on(async {
            let pool = EnvPool::new(
                WorkerSpec {
                    python: python.clone(),
                    script: script.clone(),
                    scratch_parent: dir.path().to_path_buf(),
                    env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                    preload: vec![],
                    egress: None,
                    start_timeout: Duration::from_secs(30),
                    grace_period: Duration::from_millis(200),
                    sandbox: None,
                    owner: None,
                    run_processes: 256,
                    memory_max: None,
                    code_cache: None,
                },
                PoolConfig {
                    size: pool_size,
                    queue_timeout: Duration::from_secs(30),
                    max_runs: 0,
                },
            );
            pool.prewarm().await.unwrap();
            pool
        });
        for concurrency in [1usize, 8, 32] {
            let name = format!("pool{pool_size}_c{concurrency}");
            group.bench_function(&name, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let pool = pool.clone();
                    async move {
                        let per_task = (iters as usize).div_ceil(concurrency);
                        let started = Instant::now();
                        let tasks = (0..concurrency).map(|_| {
                            let pool = pool.clone();
                            tokio::spawn(async move {
                                for _ in 0..per_task {
                                    let worker = pool.get().await.unwrap();
                                    pool.put(worker);
                                }
                            })
                        });
                        futures_util::future::join_all(tasks).await;
                        // Time per checkout/return pair.
                        started.elapsed() / (per_task * concurrency) as u32 * iters as u32
                    }
                })
            });
        }
        rt.block_on(pool.close());
    }
    group.finish();
}

criterion_group!(benches, checkout);
criterion_main!(benches);

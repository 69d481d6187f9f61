//! Environment benchmark on the real server binary: clone an environment
//! without Conda (`POST /envs` with `clone`), then install the same set of
//! five local wheels into the clone with pip and, into another clone, with
//! uv (`POST /install` with the wheels' paths and `no_index`). Prints the
//! median of each over the rounds.
//!
//! `cargo bench --bench envs` (env: `BENCH_ROUNDS`, default 5;
//! `BENCH_PYTHON`, default the real `python3`; `BENCH_UV`, default `uv` on
//! PATH, else one installed from PyPI into a venv beside the build). The
//! wheels (six, idna, certifi, packaging, attrs; pure Python, no
//! dependencies) are fetched once with `pip download`. The source
//! environment is a Conda-layout copy of the interpreter with pip linked in.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "support/server.rs"]
#[allow(dead_code)] // RSS and the Conda-layout switch are the other benchmarks'
mod server;

use server::{Server, conda_layout, env_or};

const WHEELS: &[&str] = &["six", "idna", "certifi", "packaging", "attrs"];
const ADMIN: &str = "bench-admin";

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn python() -> PathBuf {
    match std::env::var("BENCH_PYTHON") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let out = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 on PATH");
            String::from_utf8(out.stdout).unwrap().trim().into()
        }
    }
}

fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The five wheels, downloaded once.
fn wheels(python: &Path) -> Vec<PathBuf> {
    let dir = tmp().join("bench-wheels");
    let found = || -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|e| e.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        found.retain(|p| p.extension().is_some_and(|x| x == "whl"));
        found.sort();
        found
    };
    if found().len() < WHEELS.len() {
        run(std::process::Command::new(python)
            .args([
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "--quiet",
            ])
            .args(["--no-deps", "--only-binary=:all:", "--dest"])
            .arg(&dir)
            .args(WHEELS));
    }
    let wheels = found();
    assert_eq!(wheels.len(), WHEELS.len(), "{wheels:?}");
    wheels
}

/// `BENCH_UV`, else `uv` on PATH, else one installed from PyPI.
fn uv(python: &Path) -> PathBuf {
    if let Ok(uv) = std::env::var("BENCH_UV") {
        return uv.into();
    }
    if let Some(found) = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("uv"))
        .find(|p| p.is_file())
    {
        return found;
    }
    let venv = tmp().join("bench-uv");
    let uv = venv.join("bin/uv");
    if !uv.is_file() {
        run(std::process::Command::new(python)
            .args(["-m", "venv"])
            .arg(&venv));
        run(std::process::Command::new(venv.join("bin/python")).args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--quiet",
            "uv",
        ]));
    }
    uv
}

/// The source environment: a Conda-layout copy of the interpreter, with
/// the interpreter's own pip linked into its `site-packages`.
fn source_env(python: &Path) -> PathBuf {
    let prefix = conda_layout(python);
    let site = run(std::process::Command::new(python).args([
        "-I",
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ]));
    let site = PathBuf::from(site.trim());
    let target = std::fs::read_dir(prefix.join("lib"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .unwrap();
    for entry in std::fs::read_dir(&site).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "pip" || (name.starts_with("pip-") && name.ends_with(".dist-info")) {
            std::os::unix::fs::symlink(entry.path(), target.join(&name)).unwrap();
        }
    }
    prefix
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> (Duration, Value) {
    let start = Instant::now();
    let resp = client
        .post(url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .expect("request answered");
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{body}: {answer}");
    (start.elapsed(), answer)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let rounds: usize = env_or("BENCH_ROUNDS", 5);
    let python = python();
    let wheels = wheels(&python);
    let uv = uv(&python);
    let source = source_env(&python);
    let envs_dir = tmp().join("bench-envs");
    let _ = std::fs::remove_dir_all(&envs_dir);
    std::fs::create_dir_all(&envs_dir).unwrap();
    let server = Server::start(&[
        "--conda-prefix",
        source.to_str().unwrap(),
        "--discover",
        "false",
        "--admin-token",
        ADMIN,
        "--envs-dir",
        envs_dir.to_str().unwrap(),
        "--uv",
        uv.to_str().unwrap(),
    ])
    .await;
    let client = reqwest::Client::new();
    let packages: Vec<String> = wheels.iter().map(|w| w.display().to_string()).collect();
    let (mut clone, mut pip, mut uv_times) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        for (manager, times) in [("pip", &mut pip), ("uv", &mut uv_times)] {
            let name = format!("r{round}-{manager}");
            let (took, _) = post(
                &client,
                &format!("{}/envs", server.url),
                json!({"name": name, "clone": "bench-conda-env"}),
            )
            .await;
            clone.push(took);
            let (took, answer) = post(
                &client,
                &format!("{}/install", server.url),
                json!({"env": name, "manager": manager, "packages": packages, "no_index": true}),
            )
            .await;
            assert_eq!(answer["exit_code"], 0, "{answer}");
            assert_eq!(
                answer["installed"].as_array().unwrap().len(),
                WHEELS.len(),
                "{answer}"
            );
            times.push(took);
            let resp = client
                .delete(format!("{}/envs/{name}", server.url))
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
    }
    println!(
        "environments: {} rounds, source {} ({} wheels: {})",
        rounds,
        source.display(),
        WHEELS.len(),
        WHEELS.join(", ")
    );
    println!("| operation | median |");
    println!("|---|---|");
    println!("| clone (POST /envs, no Conda) | {} |", ms(median(clone)));
    println!("| install 5 wheels with pip | {} |", ms(median(pip)));
    println!("| install 5 wheels with uv | {} |", ms(median(uv_times)));
}

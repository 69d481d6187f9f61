//! The server's image under Docker, as users run it: the seed's `docker run`
//! line, the flags of a restricted Kubernetes pod, another `--user`, and
//! `docker stop`. Docker, the base image and the image are set up by
//! `common::docker` (installed and built when missing). Traffic goes to
//! loopback only: every container runs with `--network host` and its server
//! on a free port.
//!
//! Also the Dockerfiles themselves: one runtime stage in both, and a
//! `.dockerignore` that keeps what they copy.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::docker::{self, Container, Docker, FixtureEnv, IMAGE};

/// Docker with the image built (blocking setup, off the runtime).
async fn setup() -> &'static Docker {
    tokio::task::spawn_blocking(docker::docker).await.unwrap()
}

/// A client for a server in a container on `127.0.0.1:port`.
struct Api {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Api {
    fn new(port: u16, token: &str) -> Api {
        Api {
            base: format!("http://127.0.0.1:{port}"),
            token: token.to_string(),
            client: reqwest::Client::new(),
        }
    }

    async fn execute(&self, body: Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}/execute", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("the server in the container answers");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("a JSON answer"))
    }

    /// Run `code` in the default env; insist on a 200.
    async fn run(&self, code: &str) -> Value {
        let (status, body) = self.execute(json!({ "code": code })).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("the server in the container answers");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("a JSON answer"))
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn mount(env: &FixtureEnv) -> String {
    format!("{}:/opt/conda/envs/target_env:ro", env.prefix.display())
}

/// The token inside the logged curl line, and the line from `curl` on.
fn logged_curl(line: &str) -> Option<(String, String)> {
    let start = line.find("curl -H \"Authorization: Bearer ")?;
    let curl = line[start..].to_string();
    let token = curl
        .strip_prefix("curl -H \"Authorization: Bearer ")?
        .split('"')
        .next()?
        .to_string();
    Some((token, curl))
}

/// `sh -c COMMAND`: its stdout as JSON.
fn shell_json(command: &str) -> Value {
    let out = std::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "{command}: {out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{command} printed no JSON ({e}): {out:?}"))
}

#[tokio::test]
async fn the_seeds_docker_run_line_serves_the_mounted_env_with_a_logged_token() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let port = docker::free_port();
    // docker run --rm -p 8080:8080 -v /path/to/conda/env:/opt/conda/envs/target_env:ro \
    //   -e CONDA_ENV_NAME=target_env mcp-code-executor
    // but for the network: loopback of the host, the server on a free port.
    let mut container = Container::run(
        docker,
        &args(&[
            "--network",
            "host",
            "-v",
            &mount(&env),
            "-e",
            "CONDA_ENV_NAME=target_env",
            "-e",
            &format!("CODE_EXECUTOR_PORT={port}"),
            IMAGE,
        ]),
    );
    container.wait_ready().await;
    let (token, curl) = container
        .wait_for_line(Duration::from_secs(10), logged_curl)
        .await;
    assert_eq!(token.len(), 64, "{curl}");
    assert!(
        curl.ends_with(&format!("http://127.0.0.1:{port}/execute")),
        "{curl}"
    );
    // The logged line, pasted into a shell as it is.
    let answer = shell_json(&curl);
    assert_eq!(answer["stdout"], "4\n", "{answer}");
    // The seed's curl example, with the logged token.
    let answer = shell_json(&format!(
        "curl -s -X POST http://localhost:{port}/execute -H \"Content-Type: application/json\" \
         -H \"Authorization: Bearer {token}\" -d '{{\"code\": \"print(2+2)\", \"env\": \"target_env\"}}'"
    ));
    assert_eq!(answer["stdout"], "4\n", "{answer}");
    assert_eq!(answer["exit_code"], 0, "{answer}");

    let api = Api::new(port, &token);
    let code = "import os, sys\nprint(sys.prefix)\nprint(os.environ.get('FIXTURE_ACTIVATED'))\nprint(os.getuid())";
    let (status, body) = api
        .execute(json!({"code": code, "env": "target_env"}))
        .await;
    assert_eq!(status, 200, "{body}");
    // The read-only env's activation script ran; the image's user is 10001.
    assert_eq!(body["stdout"], "/opt/conda/envs/target_env\nyes\n10001\n");
    // CONDA_ENV_NAME made it the default.
    let body = api.run(code).await;
    assert_eq!(body["stdout"], "/opt/conda/envs/target_env\nyes\n10001\n");
    let (status, envs) = api.get("/list-envs").await;
    assert_eq!(status, 200, "{envs}");
    let listed = envs.to_string();
    assert!(listed.contains("target_env"), "{envs}");
    // Without the token: refused.
    let anonymous = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/execute"))
        .body(r#"{"code": "print(1)"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    // The token is in the log once.
    let mentions = container
        .log()
        .iter()
        .filter(|l| l.contains(&token))
        .count();
    assert_eq!(mentions, 1, "{:#?}", container.log());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(container.cli.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = container.wait_exit(Duration::from_secs(40)).await;
    assert!(status.success(), "{status}: {:#?}", container.log());
}

/// A container with the flags a restricted pod gets, a known token and a
/// canary secret in the server's environment; ready.
async fn restricted(docker: &Docker, env: &FixtureEnv, canary: &str) -> (Container, Api) {
    let port = docker::free_port();
    let token = "restricted-pod-token";
    let mut container = Container::run(
        docker,
        &args(&[
            "--network",
            "host",
            "--user",
            "10001:10001",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "-v",
            &mount(env),
            "-e",
            "CONDA_ENV_NAME=target_env",
            "-e",
            &format!("CODE_EXECUTOR_PORT={port}"),
            "-e",
            &format!("CODE_EXECUTOR_TOKEN={token}"),
            "-e",
            &format!("CANARY_SECRET={canary}"),
            IMAGE,
        ]),
    );
    container.wait_ready().await;
    (container, Api::new(port, token))
}

fn canary() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 12];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn restricted_pod_flags_start_the_server_in_the_container_tier() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let (_container, api) = restricted(docker, &env, &canary()).await;
    let (status, health) = api.get("/health").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["sandbox"]["tier"], "container", "{health}");
    let mechanisms = health["sandbox"]["mechanisms"]
        .as_array()
        .unwrap_or_else(|| panic!("/health names no mechanisms: {health}"));
    assert!(!mechanisms.is_empty(), "{health}");
    let body = api.run("print(2 + 2)").await;
    assert_eq!(body["stdout"], "4\n", "{body}");
}

#[tokio::test]
async fn a_run_under_restricted_pod_flags_reaches_no_network() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let (_container, api) = restricted(docker, &env, &canary()).await;
    let port = api.base.rsplit(':').next().unwrap().to_string();
    let code = format!(
        "import socket\n\
         def attempt(f):\n\
         \x20   try:\n\
         \x20       f()\n\
         \x20       return 'allowed'\n\
         \x20   except OSError as e:\n\
         \x20       return 'refused'\n\
         print('tcp', attempt(lambda: socket.create_connection(('127.0.0.1', {port}), timeout=3).close()))\n\
         print('udp', attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()))\n\
         print('tcp6', attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()))\n"
    );
    let body = api.run(&code).await;
    assert_eq!(
        body["stdout"], "tcp refused\nudp refused\ntcp6 refused\n",
        "{body}"
    );
}

#[tokio::test]
async fn a_run_under_restricted_pod_flags_cannot_read_the_servers_secrets() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let secret = canary();
    let (_container, api) = restricted(docker, &env, &secret).await;
    // The canary travels hex-encoded, so that the code itself holds no copy.
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    let code = format!(
        "import glob\n\
         needle = bytes.fromhex('{hex}')\n\
         try:\n\
         \x20   open('/proc/1/environ', 'rb').read()\n\
         \x20   print('pid 1: read')\n\
         except OSError as e:\n\
         \x20   print('pid 1:', type(e).__name__)\n\
         leaks = []\n\
         for path in glob.glob('/proc/*/environ'):\n\
         \x20   try:\n\
         \x20       if needle in open(path, 'rb').read():\n\
         \x20           leaks.append(path)\n\
         \x20   except OSError:\n\
         \x20       pass\n\
         print('leaks:', leaks)\n"
    );
    let body = api.run(&code).await;
    assert_eq!(
        body["stdout"], "pid 1: PermissionError\nleaks: []\n",
        "{body}"
    );
}

#[tokio::test]
async fn a_run_under_restricted_pod_flags_writes_only_its_directory_and_cannot_signal_the_server() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let (_container, api) = restricted(docker, &env, &canary()).await;
    let code = "import os, signal\n\
                def attempt(f):\n\
                \x20   try:\n\
                \x20       f()\n\
                \x20       return 'allowed'\n\
                \x20   except OSError as e:\n\
                \x20       return type(e).__name__\n\
                print('here', attempt(lambda: open('inside.txt', 'w').write('x')))\n\
                print('tmp', attempt(lambda: open('/tmp/x-outside-the-run', 'w').write('x')))\n\
                print('etc', attempt(lambda: open('/etc/x', 'w').write('x')))\n\
                print('env', attempt(lambda: open('/opt/conda/envs/target_env/x', 'w').write('x')))\n\
                print('kill', attempt(lambda: os.kill(1, signal.SIGTERM)))\n";
    let body = api.run(code).await;
    let lines: Vec<&str> = body["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines[0], "here allowed", "{body}");
    for (line, place) in lines[1..4].iter().zip(["tmp", "etc", "env"]) {
        assert!(
            line.starts_with(place) && !line.ends_with("allowed"),
            "{place}: {body}"
        );
    }
    assert_eq!(lines[4], "kill PermissionError", "{body}");
    // The server (pid 1) lives on.
    let (status, health) = api.get("/health").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(api.run("print('alive')").await["stdout"], "alive\n");
}

#[tokio::test]
async fn a_run_under_restricted_pod_flags_leaves_no_process_behind() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let (container, api) = restricted(docker, &env, &canary()).await;
    // A daemon: fork, setsid, fork again, exec sleep 301.
    let code = "import os\n\
                if os.fork() == 0:\n\
                \x20   os.setsid()\n\
                \x20   if os.fork() == 0:\n\
                \x20       os.execv('/bin/sleep', ['sleep', '301'])\n\
                \x20   os._exit(0)\n\
                os.wait()\n\
                print('started')\n";
    let body = api.run(code).await;
    assert_eq!(body["stdout"], "started\n", "{body}");
    let scan = "import glob\n\
                found = []\n\
                for path in glob.glob('/proc/[0-9]*/cmdline'):\n\
                \x20   try:\n\
                \x20       if open(path, 'rb').read() == b'sleep\\x00301\\x00':\n\
                \x20           found.append(path)\n\
                \x20   except OSError:\n\
                \x20       pass\n\
                print(found)\n";
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = container.exec(docker, &["python3", "-c", scan]);
        assert!(out.status.success(), "{out:?}");
        let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if found == "[]" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run's sleep outlived it: {found}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_run_under_restricted_pod_flags_hits_memory_processes_and_timeout_limits() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let (_container, api) = restricted(docker, &env, &canary()).await;
    let (status, body) = api
        .execute(json!({
            "code": "x = bytearray(4 << 30)\nprint('allocated')",
            "limits": {"memory_bytes": 256u64 << 20},
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limit"], "memory", "{body}");
    let (status, body) = api
        .execute(json!({
            "code": "import os\nwhile True:\n    os.fork()",
            "limits": {"processes": 8},
            "timeout": 20,
        }))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limit"], "processes", "{body}");
    let started = Instant::now();
    let (status, body) = api
        .execute(json!({"code": "while True:\n    pass", "timeout": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limit"], "timeout", "{body}");
    assert_eq!(body["timed_out"], true, "{body}");
    assert!(started.elapsed() < Duration::from_secs(10), "{body}");
    // And the next run is served as usual.
    assert_eq!(api.run("print('next')").await["stdout"], "next\n");
}

#[tokio::test]
async fn the_image_serves_under_any_user() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let port = docker::free_port();
    let mut container = Container::run(
        docker,
        &args(&[
            "--network",
            "host",
            "--user",
            "4242:4343",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "-v",
            &mount(&env),
            "-e",
            "CODE_EXECUTOR_TOKEN=any-user-token",
            "-e",
            &format!("CODE_EXECUTOR_PORT={port}"),
            IMAGE,
        ]),
    );
    container.wait_ready().await;
    let api = Api::new(port, "any-user-token");
    // No CONDA_ENV_NAME: the image's python3 is the default, the mounted env
    // is discovered and served by name.
    let body = api
        .run("import os, sys\nprint(os.getuid(), os.getgid(), sys.prefix)")
        .await;
    assert_eq!(body["stdout"], "4242 4343 /usr\n", "{body}");
    let (status, body) = api
        .execute(json!({"code": "import sys; print(sys.prefix)", "env": "target_env"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "/opt/conda/envs/target_env\n", "{body}");
}

#[tokio::test]
async fn docker_stop_lets_a_running_run_finish_and_the_container_exits_0() {
    let docker = setup().await;
    let env = FixtureEnv::create();
    let port = docker::free_port();
    let mut container = Container::run(
        docker,
        &args(&[
            "--network",
            "host",
            "-v",
            &mount(&env),
            "-e",
            "CONDA_ENV_NAME=target_env",
            "-e",
            "CODE_EXECUTOR_TOKEN=stop-token",
            "-e",
            &format!("CODE_EXECUTOR_PORT={port}"),
            IMAGE,
        ]),
    );
    container.wait_ready().await;
    let api = Api::new(port, "stop-token");
    let run = tokio::spawn(async move {
        api.execute(json!({"code": "import time\ntime.sleep(2)\nprint('finished')"}))
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!run.is_finished(), "the run ended before docker stop");
    let stop = {
        let mut cmd = tokio::process::Command::from(docker.command());
        cmd.args(["stop", "--time", "30", &container.name]);
        cmd.output()
    };
    let (stopped, answered) = tokio::join!(stop, run);
    let stopped = stopped.unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    let (status, body) = answered.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "finished\n", "{body}");
    let exit = container.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(exit.code(), Some(0), "{:#?}", container.log());
    assert!(
        container
            .log()
            .iter()
            .any(|l| l.contains("code-executor stopped")),
        "{:#?}",
        container.log()
    );
}

// ---- the Dockerfiles (no Docker needed) ----

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The instructions of a Dockerfile's `runtime` stage from its `FROM` on,
/// continuation lines joined, comments and the binary's `COPY` left out.
fn runtime_stage(text: &str) -> Vec<String> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.trim_start().starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        current.push_str(line.trim_end_matches('\\'));
        if !line.ends_with('\\') {
            instructions.push(std::mem::take(&mut current));
        }
    }
    let from = instructions
        .iter()
        .position(|i| i.starts_with("FROM ") && i.ends_with(" AS runtime"))
        .expect("a stage named runtime");
    instructions[from..]
        .iter()
        .filter(|i| !i.contains("/usr/local/bin/code-executor") || i.starts_with("ENTRYPOINT"))
        .filter(|i| !i.starts_with("ARG BINARY"))
        .cloned()
        .collect()
}

#[test]
fn both_dockerfiles_share_one_runtime_stage() {
    let root = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let prebuilt = std::fs::read_to_string(repo("deploy/Dockerfile.prebuilt")).unwrap();
    assert!(
        !repo("deploy/Dockerfile").exists(),
        "deploy/Dockerfile is replaced by ./Dockerfile"
    );
    let (a, b) = (runtime_stage(&root), runtime_stage(&prebuilt));
    assert_eq!(
        a, b,
        "the runtime stages of Dockerfile and deploy/Dockerfile.prebuilt differ"
    );
    // What the stage holds.
    for wanted in [
        "FROM ${BASE} AS runtime",
        "COPY deploy/container/defaults.toml /usr/local/share/code-executor/defaults.toml",
        "ENV CODE_EXECUTOR_DEFAULTS=/usr/local/share/code-executor/defaults.toml",
        "USER 10001:10001",
        "STOPSIGNAL SIGTERM",
        r#"ENTRYPOINT ["/usr/local/bin/code-executor"]"#,
        r#"CMD ["serve"]"#,
    ] {
        assert!(a.iter().any(|i| i == wanted), "{wanted} missing: {a:#?}");
    }
    assert!(
        a.iter()
            .any(|i| i.starts_with("HEALTHCHECK ") && i.contains("/health"))
    );
    // Nothing chooses the env: a user's -e CONDA_ENV_NAME, CODE_EXECUTOR_* or
    // flag decides.
    for text in [&root, &prebuilt] {
        for var in [
            "CODE_EXECUTOR_PYTHON",
            "CODE_EXECUTOR_CONDA",
            "CONDA_ENV_NAME=",
        ] {
            assert!(
                !text
                    .lines()
                    .any(|l| l.starts_with("ENV") && l.contains(var)),
                "the image sets {var}"
            );
        }
    }
    // The prebuilt one builds nothing and fetches nothing; the binary is a build-arg.
    assert!(
        !prebuilt.lines().any(|l| l.starts_with("RUN ")),
        "{prebuilt}"
    );
    assert!(prebuilt.contains("ARG BINARY=target/release/code-executor"));
    assert!(prebuilt.contains("COPY ${BINARY} /usr/local/bin/code-executor"));
    // The root one compiles in a stage of its own.
    let froms: Vec<&str> = root.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(froms[0].ends_with(" AS build"), "{froms:?}");
    assert!(root.contains(
        "COPY --from=build /src/target/release/code-executor /usr/local/bin/code-executor"
    ));
    assert!(root.contains("cargo build --release --locked --bin code-executor"));
    // The defaults the image points at parse with the real loader.
    let defaults = std::fs::read_to_string(repo("deploy/container/defaults.toml")).unwrap();
    let file = code_executor::config::parse_file(&defaults).unwrap();
    assert_eq!(file.host, Some("0.0.0.0".parse().unwrap()));
    assert_eq!(file.port, Some(8080));
}

/// Whether `.dockerignore`'s `rules` leave `path` in the build context, as
/// Docker reads them: the last rule that matches the path or one of its
/// parents decides; `!` re-includes; `*` is one path segment's worth, `**`
/// any number of segments.
fn in_context(rules: &[&str], path: &str) -> bool {
    fn matches(pattern: &[&str], path: &[&str]) -> bool {
        match (pattern.first(), path.first()) {
            (None, _) => true, // a parent matched: everything below it too
            (Some(&"**"), _) => (0..=path.len()).any(|skip| matches(&pattern[1..], &path[skip..])),
            (Some(_), None) => false,
            (Some(p), Some(s)) => segment(p, s) && matches(&pattern[1..], &path[1..]),
        }
    }
    fn segment(pattern: &str, name: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == name,
            Some((head, tail)) => {
                name.starts_with(head)
                    && (0..=name.len() - head.len()).any(|i| segment(tail, &name[head.len() + i..]))
            }
        }
    }
    let path: Vec<&str> = path.split('/').collect();
    let mut included = true;
    for rule in rules {
        let (negated, pattern) = match rule.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, *rule),
        };
        let pattern: Vec<&str> = pattern.trim_matches('/').split('/').collect();
        if matches(&pattern, &path) {
            included = negated;
        }
    }
    included
}

#[test]
fn the_dockerignore_keeps_what_the_dockerfiles_copy_and_little_else() {
    let text = std::fs::read_to_string(repo(".dockerignore")).unwrap();
    let rules: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // What the Dockerfiles copy is in the context (and exists).
    for text in [
        std::fs::read_to_string(repo("Dockerfile")).unwrap(),
        std::fs::read_to_string(repo("deploy/Dockerfile.prebuilt")).unwrap(),
    ] {
        for line in text
            .lines()
            .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
        {
            let words: Vec<&str> = line.split_whitespace().skip(1).collect();
            for source in &words[..words.len() - 1] {
                let source = source.replace("${BINARY}", "target/release/code-executor");
                if source != "target/release/code-executor" {
                    assert!(repo(&source).exists(), "COPY {source}: no such file");
                }
                assert!(in_context(&rules, &source), "{source} is ignored");
            }
        }
    }
    assert!(in_context(&rules, "src/main.rs"));
    assert!(in_context(&rules, "python/worker.py"));
    // The rest of target/ and .git stay out.
    for ignored in [
        ".git/HEAD",
        "target/debug/code-executor",
        "target/release/deps/code_executor-0123",
        "target/release/build",
        "python/__pycache__/worker.cpython-311.pyc",
    ] {
        assert!(
            !in_context(&rules, ignored),
            "{ignored} is sent to the daemon"
        );
    }
    // The matcher itself.
    assert!(in_context(&["a/*", "!a/b"], "a/b/c"));
    assert!(!in_context(&["a/*", "!a/b"], "a/c"));
    assert!(!in_context(&["**/x"], "p/q/x/y"));
}

#[test]
fn this_machines_apt_sources_give_mmdebstrap_its_bookworm_mirrors() {
    let sources = docker::bookworm_sources();
    assert!(!sources.is_empty(), "no bookworm source on this machine");
    let lines: Vec<String> = sources.iter().map(|s| s.line()).collect();
    assert!(
        lines.iter().any(|l| l.contains(" bookworm main")),
        "{lines:#?}"
    );
    for line in &lines {
        assert!(line.starts_with("deb "), "{line}");
    }
}

#[test]
fn apt_sources_in_both_formats_are_read_as_apt_reads_them() {
    let files = vec![
        (
            "/etc/apt/sources.list".into(),
            "# comment\ndeb http://a.example/debian bookworm main contrib\n\
             deb-src http://a.example/debian bookworm main\n\
             deb [arch=amd64 signed-by=/k.gpg] http://b.example/debian bookworm-updates main # tail\n"
                .to_string(),
        ),
        (
            "/etc/apt/sources.list.d/debian.sources".into(),
            "Types: deb deb-src\n\
             # http://snapshot.example/archive\n\
             URIs: http://c.example/debian\n\
             Suites: bookworm bookworm-updates\n\
             Components: main\n\
             Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\
             \n\
             Types: deb\n\
             URIs: http://d.example/debian\n\
             Suites: bookworm-security\n\
             Components: main\n\
             Enabled: no\n\
             \n\
             Types: deb\n\
             URIs: http://e.example/debian\n\
             Suites: trixie\n\
             Components: main\n\
             Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n -----END PGP PUBLIC KEY BLOCK-----\n"
                .to_string(),
        ),
        (
            "/etc/apt/sources.list.d/old.list.disabled".into(),
            "deb http://f.example/debian bookworm main\n".to_string(),
        ),
    ];
    let lines: Vec<String> = docker::parse_apt_sources(&files)
        .iter()
        .map(|s| s.line())
        .collect();
    assert_eq!(
        lines,
        [
            "deb http://a.example/debian bookworm main contrib",
            "deb [signed-by=/k.gpg] http://b.example/debian bookworm-updates main",
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://c.example/debian bookworm main",
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://c.example/debian bookworm-updates main",
            "deb http://e.example/debian trixie main",
        ]
    );
}

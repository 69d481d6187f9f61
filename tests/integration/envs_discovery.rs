//! Discovery that follows the disk: environments created or removed after
//! the server started are served or dropped without a restart (the
//! watcher, and one rescan for an unknown name), served ones whose
//! `conda-meta` changed are read again (configured ones too), sessions show
//! the name a rescan gives their environment, and `/list-envs` tells every
//! env's Python version and platform without starting a worker.

use std::time::{Duration, Instant};

use code_executor::config::{Config, EnvChoice};
use serde_json::{Value, json};

use crate::common::conda::{CondaFixture, Interpreter};
use crate::common::{self, TestServer, processes_mentioning};

const PREFIX: &str = "import sys; print(sys.prefix)";

/// Discovery sees only the fixture, whose root `environments.txt` lists
/// (as `conda init` leaves it).
fn config_for(fixture: &CondaFixture, rescan: Duration) -> Config {
    let listed = fixture.home.join(".conda/environments.txt");
    if !listed.exists() {
        std::fs::write(&listed, format!("{}\n", fixture.root.display())).unwrap();
    }
    Config {
        host_env: fixture.host_env(),
        env: EnvChoice::Default,
        pool_size: 1,
        rescan_interval: rescan,
        ..common::config()
    }
}

async fn env_names(server: &TestServer) -> Vec<String> {
    let (status, body) = server.get("/list-envs").await;
    assert_eq!(status, 200, "{body}");
    body["envs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect()
}

/// Wait until `/list-envs` does (or does not) name `env`.
async fn wait_for_listing(server: &TestServer, env: &str, listed: bool, within: Duration) {
    let start = Instant::now();
    loop {
        let names = env_names(server).await;
        if names.iter().any(|n| n == env) == listed {
            return;
        }
        assert!(
            start.elapsed() < within,
            "{env} still {} after {within:?}: {names:?}",
            if listed { "missing" } else { "listed" }
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn prefix_of_run(server: &TestServer, env: &str) -> (u16, Value) {
    server.execute(json!({"code": PREFIX, "env": env})).await
}

#[tokio::test]
async fn envs_created_and_removed_after_start_come_and_go_without_a_restart() {
    // No fake conda: discovery reads environments.txt and the root's envs/.
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let server = TestServer::with_config(config_for(&fixture, Duration::from_millis(200))).await;
    assert_eq!(env_names(&server).await, vec!["base"]);

    // `conda create -n fresh`: a new folder under the root's envs/.
    let fresh = fixture.create_env("fresh", Interpreter::primary());
    // `conda create -p ELSEWHERE`: a line in environments.txt.
    let elsewhere = fixture.create_env_at(
        &fixture.dir.path().join("projects/tool"),
        Interpreter::primary(),
    );
    wait_for_listing(&server, "fresh", true, Duration::from_secs(5)).await;
    wait_for_listing(&server, "tool", true, Duration::from_secs(5)).await;
    for (env, prefix) in [("fresh", &fresh), ("tool", &elsewhere)] {
        let (status, body) = prefix_of_run(&server, env).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["stdout"].as_str().unwrap().trim(),
            prefix.canonicalize().unwrap().display().to_string()
        );
    }

    // `conda env remove -n fresh`: the folder goes; its pool drains and the
    // name is refused.
    let fresh_python = fresh.join("bin/python");
    std::fs::remove_dir_all(&fresh).unwrap();
    wait_for_listing(&server, "fresh", false, Duration::from_secs(5)).await;
    let (status, body) = prefix_of_run(&server, "fresh").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_env");
    let start = Instant::now();
    while !processes_mentioning(&fresh_python).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the removed env's workers are still alive"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(env_names(&server).await.contains(&"tool".to_string()));
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_name_rescans_once_before_it_is_refused() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    // No watcher: only the request for the name finds it.
    let server = TestServer::with_config(config_for(&fixture, Duration::ZERO)).await;
    let prefix = fixture.create_env("late", Interpreter::primary());
    let (status, body) = prefix_of_run(&server, "late").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["stdout"].as_str().unwrap().trim(),
        prefix.canonicalize().unwrap().display().to_string()
    );
    let (status, body) = prefix_of_run(&server, "never-made").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        common::error_message(&body).contains("late"),
        "the known names are listed: {body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn python_version_and_platform_of_three_envs_are_listed_with_no_worker_started() {
    let primary = Interpreter::primary();
    let secondary = Interpreter::secondary();
    let mut fixture = CondaFixture::new(primary);
    // Told by conda-meta/python-*.json (its subdir is the platform).
    let a = fixture.create_env("a", primary);
    let record = std::fs::read_dir(a.join("conda-meta"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("python-")
        })
        .unwrap();
    std::fs::write(
        &record,
        format!(
            r#"{{"name": "python", "version": "{}", "build": "h0_0", "subdir": "linux-aarch64"}}"#,
            primary.version
        ),
    )
    .unwrap();
    // Told by conda-meta too, another interpreter.
    let b = fixture.create_env("b", secondary);
    // No Python record: only the layout's lib/pythonX.Y tells.
    let c = fixture.create_env("c", primary);
    for entry in std::fs::read_dir(c.join("conda-meta")).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("python-") {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    let server = TestServer::with_config(config_for(&fixture, Duration::from_secs(3))).await;
    let (status, body) = server.get("/list-envs").await;
    assert_eq!(status, 200, "{body}");
    let envs = body["envs"].as_array().unwrap();
    let env = |name: &str| envs.iter().find(|e| e["name"] == name).unwrap().clone();
    let host = if cfg!(target_arch = "aarch64") {
        "linux-aarch64"
    } else {
        "linux-64"
    };
    assert_eq!(env("a")["python_version"], primary.version.as_str());
    assert_eq!(env("a")["platform"], "linux-aarch64", "the record's subdir");
    assert_eq!(env("b")["python_version"], secondary.version.as_str());
    assert_eq!(env("b")["platform"], host);
    assert_eq!(env("c")["python_version"], primary.short_version.as_str());
    assert_eq!(env("c")["platform"], host);
    for (name, prefix) in [("a", &a), ("b", &b), ("c", &c)] {
        assert_eq!(env(name)["pool"]["size"], 0, "{name}: {:?}", env(name));
        assert!(
            env(name)["env_hash"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"),
            "{:?}",
            env(name)
        );
        assert_eq!(
            processes_mentioning(&prefix.join("bin/python")),
            Vec::<u32>::new(),
            "a process of {name} runs: the listing started one"
        );
    }
    server.stop().await;
}

async fn run_stdout(server: &TestServer, env: &str, code: &str) -> String {
    let (status, body) = server.execute(json!({"code": code, "env": env})).await;
    assert_eq!(status, 200, "{body}");
    body["stdout"].as_str().unwrap().to_string()
}

/// `conda install`'s last step: the package's record in `conda-meta/`.
fn write_package_record(prefix: &std::path::Path) {
    std::fs::write(
        prefix.join("conda-meta/activator-1.0-0.json"),
        r#"{"name": "activator", "version": "1.0", "build": "0"}"#,
    )
    .unwrap();
}

/// Wait (5 s at most) until `/list-envs` shows `env` with a hash other
/// than `first_hash`.
async fn wait_for_new_hash(server: &TestServer, env: &str, first_hash: &str) {
    let start = Instant::now();
    while env_hash_of(server, env).await == first_hash {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "env_hash still {first_hash}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn env_hash_of(server: &TestServer, env: &str) -> String {
    let (status, body) = server.get("/list-envs").await;
    assert_eq!(status, 200, "{body}");
    body["envs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == env)
        .unwrap_or_else(|| panic!("{env} is not listed: {body}"))["env_hash"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn an_env_found_while_conda_fills_it_is_activated_again_when_conda_meta_changes() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let server = TestServer::with_config(config_for(&fixture, Duration::from_millis(200))).await;
    // Found before `conda create` has linked the package that brings the
    // activation script.
    let prefix = fixture.create_env("filling", Interpreter::primary());
    wait_for_listing(&server, "filling", true, Duration::from_secs(5)).await;
    let probe = "import os; print(os.environ.get('FILLED_BY', 'unset'))";
    assert_eq!(run_stdout(&server, "filling", probe).await, "unset\n");
    let first_hash = env_hash_of(&server, "filling").await;

    // The rest of the transaction: the script, then the history's new lines.
    crate::common::conda::add_activate_script(&prefix, "filled.sh", "export FILLED_BY=conda\n");
    let history = prefix.join("conda-meta/history");
    let mut text = std::fs::read_to_string(&history).unwrap();
    text.push_str("+conda-forge/linux-64::activator-1.0-0\n");
    std::fs::write(&history, text).unwrap();
    let start = Instant::now();
    loop {
        let seen = run_stdout(&server, "filling", probe).await;
        if seen == "conda\n" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the activation script is still not applied: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A package record written later changes the hash shown.
    write_package_record(&prefix);
    wait_for_new_hash(&server, "filling", &first_hash).await;
    assert_eq!(run_stdout(&server, "filling", probe).await, "conda\n");
    server.stop().await;
}

/// `GET /envs/{name}`'s prefix.
async fn details_prefix(server: &TestServer, env: &str) -> String {
    let (status, body) = server.get(&format!("/envs/{env}")).await;
    assert_eq!(status, 200, "{body}");
    body["prefix"].as_str().unwrap().to_string()
}

/// What the server logs at `warn` and above, on this test's thread (a
/// `#[tokio::test]` runs the server's tasks there).
#[derive(Clone, Default)]
struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Warnings {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(self.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn lines_with(&self, text: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_string)
            .collect()
    }
}

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Warnings {
    type Writer = Warnings;

    fn make_writer(&'a self) -> Warnings {
        self.clone()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_name_found_twice_at_runtime_goes_where_discovery_at_start_would_put_it() {
    let warnings = Warnings::default();
    let _capture = warnings.capture();
    let mut fixture = CondaFixture::new(Interpreter::primary());
    // `conda create -p .../projects/ml`: listed in environments.txt.
    let listed = fixture.create_env_at(
        &fixture.dir.path().join("projects/ml"),
        Interpreter::primary(),
    );
    let server = TestServer::with_config(config_for(&fixture, Duration::from_millis(200))).await;
    assert_eq!(
        run_stdout(&server, "ml", PREFIX).await.trim(),
        listed.display().to_string()
    );

    // `conda create -n ml`: in the root's envs/, which ranks first.
    let named = fixture.create_env("ml", Interpreter::primary());
    wait_for_listing(&server, "ml-2", true, Duration::from_secs(5)).await;
    // Another rescan: the clash is not logged again.
    fixture.create_env("other", Interpreter::primary());
    wait_for_listing(&server, "other", true, Duration::from_secs(5)).await;
    let clashes = warnings.lines_with("is taken");
    assert_eq!(clashes.len(), 1, "{clashes:#?}");
    assert!(
        clashes[0].contains(&format!("prefix={}", listed.display()))
            && clashes[0].contains(&format!("is taken by {}", named.display()))
            && clashes[0].contains("\"ml-2\""),
        "{}",
        clashes[0]
    );

    let fresh = TestServer::with_config(config_for(&fixture, Duration::ZERO)).await;
    for server in [&server, &fresh] {
        for (env, prefix) in [("ml", &named), ("ml-2", &listed)] {
            assert_eq!(
                run_stdout(server, env, PREFIX).await.trim(),
                prefix.display().to_string(),
                "{env}"
            );
            assert_eq!(
                details_prefix(server, env).await,
                prefix.display().to_string()
            );
        }
        let run = run_stdout(
            server,
            "ml-2",
            "import os; print(os.environ['CONDA_DEFAULT_ENV'])",
        );
        assert_eq!(run.await, "ml-2\n");
    }
    fresh.stop().await;
    server.stop().await;
}

/// `/health`'s `sandbox.disk_bytes`: each served environment's scratch size.
async fn scratch_quotas(server: &TestServer) -> Value {
    let (status, health) = server.get("/health").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["sandbox"]["disk_quota"], true, "{health}");
    health["sandbox"]["disk_bytes"].clone()
}

#[tokio::test]
async fn health_names_the_scratch_quota_of_the_envs_served_now() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let config = config_for(&fixture, Duration::from_millis(200));
    let size = config.sandbox.disk_bytes;
    let server = TestServer::with_config(config).await;
    assert_eq!(scratch_quotas(&server).await, json!({"base": size}));

    let late = fixture.create_env("late", Interpreter::primary());
    wait_for_listing(&server, "late", true, Duration::from_secs(5)).await;
    assert_eq!(
        scratch_quotas(&server).await,
        json!({"base": size, "late": size})
    );

    std::fs::remove_dir_all(&late).unwrap();
    wait_for_listing(&server, "late", false, Duration::from_secs(5)).await;
    assert_eq!(scratch_quotas(&server).await, json!({"base": size}));
    server.stop().await;
}

#[tokio::test]
async fn a_session_stays_with_its_environment_when_a_rescan_renames_it() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let listed = fixture.create_env_at(
        &fixture.dir.path().join("projects/ml"),
        Interpreter::primary(),
    );
    let server = TestServer::with_config(Config {
        admin_token: Some("admin-secret".into()),
        ..config_for(&fixture, Duration::from_millis(200))
    })
    .await;
    let (status, info) = server.post("/sessions", json!({"env": "ml"})).await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    // `conda create -n ml` ranks first: the session's environment is
    // served as ml-2 now, and its session is still its own.
    fixture.create_env("ml", Interpreter::primary());
    wait_for_listing(&server, "ml-2", true, Duration::from_secs(5)).await;
    let delete = |name: &str| {
        server
            .client
            .delete(format!("{}/envs/{name}", server.url))
            .bearer_auth("admin-secret")
            .send()
    };
    let answer = delete("ml-2").await.unwrap();
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is used by 1 session(s)"),
        "{body}"
    );
    assert!(listed.exists());
    // The environment that took the name has no session.
    let answer = delete("ml").await.unwrap();
    assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text().await);
    let (status, body) = server
        .execute(json!({"session": id, "code": "import sys; print(sys.prefix)"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["stdout"].as_str().unwrap().trim(),
        listed.display().to_string()
    );
    server.stop().await;
}

/// `GET /sessions`' one session.
async fn listed_session(server: &TestServer) -> Value {
    let (status, body) = server.get("/sessions").await;
    assert_eq!(status, 200, "{body}");
    let sessions = body["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{body}");
    sessions[0].clone()
}

#[tokio::test]
async fn a_session_shows_the_name_a_rescan_gives_its_environment() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let listed = fixture.create_env_at(
        &fixture.dir.path().join("projects/ml"),
        Interpreter::primary(),
    );
    let log = fixture.dir.path().join("audit.jsonl");
    let server = TestServer::with_config(Config {
        audit: crate::audit::audit_to(&log, code_executor::audit::AuditFail::Open),
        ..config_for(&fixture, Duration::from_millis(200))
    })
    .await;
    let (status, info) = server.post("/sessions", json!({"env": "ml"})).await;
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["env"], "ml");
    let id = info["id"].as_str().unwrap().to_string();
    assert_eq!(listed_session(&server).await["env"], "ml");

    // `conda create -n ml` ranks first: the session's environment is served
    // as ml-2 now, and the session says so wherever it names it.
    fixture.create_env("ml", Interpreter::primary());
    wait_for_listing(&server, "ml-2", true, Duration::from_secs(5)).await;
    let shown = listed_session(&server).await;
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["env"], "ml-2", "{shown}");
    assert!(env_names(&server).await.contains(&"ml-2".to_string()));
    let (status, body) = server
        .execute(json!({"session": id, "env": "ml-2", "code": "import sys; print(sys.prefix)"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["stdout"].as_str().unwrap().trim(),
        listed.display().to_string()
    );
    let (status, closed) = server.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["env"], "ml-2", "{closed}");

    // The records of its later calls and of its close name it the same way.
    for kind in ["session_call", "session_close"] {
        let record = crate::audit::wait_for_record(&log, kind, |r| {
            r["kind"] == kind && r["session"] == id.as_str()
        })
        .await;
        assert_eq!(record["env"], "ml-2", "{record}");
    }
    let created = crate::audit::wait_for_record(&log, "session_create", |r| {
        r["kind"] == "session_create" && r["session"] == id.as_str()
    })
    .await;
    assert_eq!(created["env"], "ml", "{created}");
    server.stop().await;
}

/// `/health`'s pool of environment `env`.
async fn pool_of(server: &TestServer, env: &str) -> Value {
    let (status, health) = server.get("/health").await;
    assert_eq!(status, 200, "{health}");
    health["envs"][env].clone()
}

#[tokio::test]
async fn a_configured_env_is_activated_again_when_conda_meta_changes() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let prefix = fixture.create_env("pinned", Interpreter::primary());
    // `--conda-prefix`: the default environment, kept warm.
    let server = TestServer::with_config(Config {
        env: EnvChoice::CondaPrefix(prefix.clone()),
        ..config_for(&fixture, Duration::from_millis(200))
    })
    .await;
    let probe = "import os; print(os.environ.get('FILLED_BY', 'unset'))";
    assert_eq!(run_stdout(&server, "pinned", probe).await, "unset\n");
    let first_hash = env_hash_of(&server, "pinned").await;
    let python = prefix.join("bin/python");
    let first_workers = processes_mentioning(&python);
    assert!(!first_workers.is_empty(), "no warm worker");

    // `conda install -p PREFIX activator`: a script, then the records.
    crate::common::conda::add_activate_script(&prefix, "filled.sh", "export FILLED_BY=conda\n");
    let history = prefix.join("conda-meta/history");
    let mut text = std::fs::read_to_string(&history).unwrap();
    text.push_str("+conda-forge/linux-64::activator-1.0-0\n");
    std::fs::write(&history, text).unwrap();
    write_package_record(&prefix);
    wait_for_new_hash(&server, "pinned", &first_hash).await;

    // Its pool is warm again, on new workers, before any request asks.
    let start = Instant::now();
    loop {
        let pool = pool_of(&server, "pinned").await;
        let workers = processes_mentioning(&python);
        if pool["idle"] == 1
            && pool["starting"] == 0
            && !workers.is_empty()
            && workers.iter().all(|pid| !first_workers.contains(pid))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no new warm worker: {pool}, pids {workers:?} (were {first_workers:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its name and place as the default stay; runs that name no env get the
    // new activation.
    let (status, body) = server.get("/list-envs").await;
    assert_eq!(status, 200, "{body}");
    let listed = body["envs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "pinned")
        .unwrap_or_else(|| panic!("pinned is not listed: {body}"));
    assert_eq!(listed["default"], true, "{listed}");
    let (status, body) = server.execute(json!({"code": probe})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "conda\n");
    assert_ne!(body["env_hash"], first_hash.as_str());
    assert_eq!(run_stdout(&server, "pinned", probe).await, "conda\n");
    server.stop().await;
}

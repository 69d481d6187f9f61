//! Creating, cloning, describing and deleting environments over HTTP
//! (`POST /envs`, `GET /envs/{name}`, `DELETE /envs/{name}`): a Conda-free
//! clone, a fake `conda` that records its argv and lays out the prefix,
//! conflicts, the token rules, progress as server-sent events.

use code_executor::config::{Config, EnvChoice};
use serde_json::{Value, json};

use crate::common::conda::{CondaFixture, Interpreter, build_wheel, create_prefix, link_pip};
use crate::common::{self, TestServer};

const ADMIN: &str = "admin-secret";
const USER: &str = "user-secret";

fn config_for(fixture: &CondaFixture) -> Config {
    let listed = fixture.home.join(".conda/environments.txt");
    if !listed.exists() {
        std::fs::write(&listed, format!("{}\n", fixture.root.display())).unwrap();
    }
    Config {
        host_env: fixture.host_env(),
        env: EnvChoice::Default,
        pool_size: 1,
        token: Some(USER.into()),
        admin_token: Some(ADMIN.into()),
        ..common::config()
    }
}

async fn call(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = server
        .client
        .request(method, format!("{}{path}", server.url))
        .bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

async fn create(server: &TestServer, body: Value) -> (u16, Value) {
    call(server, reqwest::Method::POST, "/envs", ADMIN, Some(body)).await
}

async fn run_in(server: &TestServer, env: &str, code: &str) -> Value {
    let resp = server
        .client
        .post(format!("{}/execute", server.url))
        .bearer_auth(USER)
        .json(&json!({"code": code, "env": env}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn a_clone_without_conda_takes_a_local_wheel_that_the_source_does_not_see() {
    let fixture = CondaFixture::new(Interpreter::primary());
    link_pip(&fixture.root, Interpreter::primary());
    let wheel = build_wheel(fixture.dir.path(), "clonepkg", "1.0", "5");
    let server = TestServer::with_config(config_for(&fixture)).await;
    let (status, body) = create(&server, json!({"name": "copy", "clone": "base"})).await;
    assert_eq!(status, 200, "{body}");
    let prefix = fixture.root.join("envs/copy");
    assert_eq!(body["prefix"], prefix.display().to_string());
    assert_eq!(body["steps"][0]["step"], "copy", "{body}");
    assert!(
        body["steps"][0]["stdout"]
            .as_str()
            .unwrap()
            .contains("hard-linked"),
        "{body}"
    );
    assert_eq!(
        body["python_version"],
        Interpreter::primary().version.as_str()
    );
    let history = std::fs::read_to_string(prefix.join("conda-meta/history")).unwrap();
    assert!(
        history.contains(&format!(
            "# cmd: code-executor create --clone {} -p {}",
            fixture.root.display(),
            prefix.display()
        )),
        "{history}"
    );
    // The interpreter is a hard link of the source's, not a copy.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(prefix.join("bin/python")).unwrap().ino(),
        std::fs::metadata(fixture.root.join("bin/python"))
            .unwrap()
            .ino()
    );
    // Served at once, in its own prefix.
    let ran = run_in(&server, "copy", "import sys; print(sys.prefix)").await;
    assert_eq!(ran["stdout"], format!("{}\n", prefix.display()), "{ran}");

    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/install",
        ADMIN,
        Some(json!({"env": "copy", "packages": [wheel.display().to_string()], "no_index": true})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["installed"], json!(["clonepkg==1.0"]), "{body}");
    let ran = run_in(&server, "copy", "import clonepkg; print(clonepkg.VALUE)").await;
    assert_eq!(ran["stdout"], "5\n", "{ran}");
    let ran = run_in(&server, "base", "import clonepkg").await;
    assert_eq!(ran["error"]["type"], "ModuleNotFoundError", "{ran}");

    // Its lock lists the new distribution in pip freeze form.
    let (status, details) = call(&server, reqwest::Method::GET, "/envs/copy", USER, None).await;
    assert_eq!(status, 200, "{details}");
    assert!(
        details["lock"]["requirements_txt"]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l == "clonepkg==1.0"),
        "{details}"
    );
    assert_eq!(details["name"], "copy");
    server.stop().await;
}

#[tokio::test]
async fn a_clone_installs_its_pip_entries_and_a_failed_one_leaves_nothing() {
    let fixture = CondaFixture::new(Interpreter::primary());
    link_pip(&fixture.root, Interpreter::primary());
    let wheel = build_wheel(fixture.dir.path(), "withpkg", "2.0", "9");
    let server = TestServer::with_config(config_for(&fixture)).await;
    let (status, body) = create(
        &server,
        json!({"name": "with", "clone": "base", "pip": [wheel.display().to_string()], "requirements": ""}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["installed"], json!(["withpkg==2.0"]), "{body}");
    assert_eq!(body["steps"][1]["step"], "pip install", "{body}");
    let ran = run_in(&server, "with", "import withpkg; print(withpkg.VALUE)").await;
    assert_eq!(ran["stdout"], "9\n", "{ran}");

    // pip fails (no such distribution offline): nothing of the env is left.
    let (status, body) = create(
        &server,
        json!({"name": "broken", "clone": "base", "requirements": "no-such-dist==1.0\n"}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "create_failed");
    assert!(
        common::error_message(&body).contains("pip install failed"),
        "{body}"
    );
    assert!(
        !fixture.root.join("envs/broken").exists(),
        "a half-made prefix is left"
    );
    let (_, list) = call(&server, reqwest::Method::GET, "/list-envs", USER, None).await;
    assert!(!list.to_string().contains("\"broken\""), "{list}");
    server.stop().await;
}

#[tokio::test]
async fn with_a_fake_conda_yml_and_specs_pass_the_right_argv_and_a_failure_leaves_no_prefix() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    fixture.install_fake_conda();
    let server = TestServer::with_config(config_for(&fixture)).await;
    let yml = "name: ignored\nchannels: [conda-forge]\ndependencies:\n  - python=3.11\n  - numpy\n";
    let (status, body) = create(&server, json!({"name": "fromyml", "environment_yml": yml})).await;
    assert_eq!(status, 200, "{body}");
    let prefix = fixture.root.join("envs/fromyml");
    let calls = fixture.conda_calls();
    let call = calls
        .iter()
        .find(|c| c.starts_with("env create"))
        .unwrap_or_else(|| panic!("no env create in {calls:?}"));
    let (head, file) = call.split_once(" -f ").unwrap();
    assert_eq!(head, format!("env create -p {}", prefix.display()));
    assert!(file.ends_with(".yml"), "{call}");
    assert!(
        !std::path::Path::new(file).exists(),
        "the yml file is removed after"
    );
    assert_eq!(
        std::fs::read_to_string(prefix.join("conda-meta/environment.yml")).unwrap(),
        yml,
        "conda read the text as given"
    );
    let ran = run_in(&server, "fromyml", "import sys; print(sys.prefix)").await;
    assert_eq!(ran["exit_code"], 0, "{ran}");

    let (status, body) = create(
        &server,
        json!({"name": "fromspecs", "specs": ["python=3.11", "zlib>=1.2,<2"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let prefix = fixture.root.join("envs/fromspecs");
    assert!(
        fixture.conda_calls().contains(&format!(
            "create -y -p {} python=3.11 zlib>=1.2,<2",
            prefix.display()
        )),
        "{:?}",
        fixture.conda_calls()
    );
    assert!(prefix.join("conda-meta/zlib-1.0-0.json").is_file());

    let (status, body) = create(&server, json!({"name": "cloned", "clone": "fromspecs"})).await;
    assert_eq!(status, 200, "{body}");
    assert!(fixture.conda_calls().contains(&format!(
        "create -y -p {} --clone {}",
        fixture.root.join("envs/cloned").display(),
        prefix.display()
    )));

    // Conda fails after laying out part of the prefix: it is removed.
    for body in [
        json!({"name": "badspec", "specs": ["python=3.11", "failing-pkg"]}),
        json!({"name": "badyml", "environment_yml": "dependencies:\n  - fail\n"}),
    ] {
        let (status, answer) = create(&server, body.clone()).await;
        assert_eq!(status, 422, "{answer}");
        assert_eq!(answer["error"]["code"], "create_failed", "{answer}");
        let name = body["name"].as_str().unwrap();
        assert!(
            !fixture.root.join("envs").join(name).exists(),
            "{name} left behind"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn conflicts_refusals_and_the_token_rules() {
    let fixture = CondaFixture::new(Interpreter::primary());
    let server = TestServer::with_config(config_for(&fixture)).await;
    // Only the admin token creates and deletes.
    for token in [USER, "wrong"] {
        let (status, body) = call(
            &server,
            reqwest::Method::POST,
            "/envs",
            token,
            Some(json!({"name": "x", "clone": "base"})),
        )
        .await;
        assert_eq!(status, 403, "{body}");
        let (status, _) = call(&server, reqwest::Method::DELETE, "/envs/base", token, None).await;
        assert_eq!(status, 403);
    }
    // Describing takes the user token.
    let (status, _) = call(&server, reqwest::Method::GET, "/envs/base", "wrong", None).await;
    assert_eq!(status, 401);

    let (status, body) = create(&server, json!({"name": "base", "clone": "base"})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    let (status, body) = create(&server, json!({"name": "two", "clone": "base"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = create(&server, json!({"name": "two", "clone": "base"})).await;
    assert_eq!(status, 409, "{body}");
    // A folder of that name on disk is a conflict too.
    std::fs::create_dir_all(fixture.root.join("envs/stray")).unwrap();
    let (status, body) = create(&server, json!({"name": "stray", "clone": "base"})).await;
    assert_eq!(status, 409, "{body}");

    for (body, says) in [
        (json!({"name": "../up", "clone": "base"}), "name"),
        (json!({"name": "-rf", "clone": "base"}), "name"),
        (json!({"name": "s", "specs": ["numpy"]}), "needs Conda"),
        (
            json!({"name": "y", "environment_yml": "dependencies: [numpy]"}),
            "needs Conda",
        ),
        (
            json!({"name": "both", "clone": "base", "specs": ["numpy"]}),
            "exactly one",
        ),
        (json!({"name": "none"}), "exactly one"),
        (
            json!({"name": "p", "clone": "base", "pip": ["--index-url=https://evil"]}),
            "options",
        ),
        (
            json!({"name": "q", "clone": "base", "specs": []  , "requirements": "-e ."}),
            "options",
        ),
        (
            json!({"name": "c", "clone": "base", "manager": "conda", "pip": ["x"]}),
            "pip, uv or auto",
        ),
    ] {
        let (status, answer) = create(&server, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            common::error_message(&answer).contains(says),
            "{body}: {answer}"
        );
    }
    let (status, _) = create(&server, json!({"name": "z", "clone": "nope"})).await;
    assert_eq!(status, 404);

    // The default environment and one with a session are kept unless forced.
    let (status, body) = call(&server, reqwest::Method::DELETE, "/envs/base", ADMIN, None).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        common::error_message(&body).contains("Conda's root"),
        "{body}"
    );
    let resp = server
        .client
        .post(format!("{}/sessions", server.url))
        .bearer_auth(USER)
        .json(&json!({"env": "two"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let (status, body) = call(&server, reqwest::Method::DELETE, "/envs/two", ADMIN, None).await;
    assert_eq!(status, 409, "{body}");
    assert!(common::error_message(&body).contains("session"), "{body}");
    let (status, body) = call(
        &server,
        reqwest::Method::DELETE,
        "/envs/two?force=true",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["sessions_closed"], 1);
    assert!(!fixture.root.join("envs/two").exists());
    let (status, _) = call(&server, reqwest::Method::GET, "/envs/two", USER, None).await;
    assert_eq!(status, 404);
    server.stop().await;
}

/// Delete `name` without and with `force`: both are a 409 whose message
/// says `says`.
async fn assert_never_deleted(server: &TestServer, name: &str, says: &str) {
    for path in [format!("/envs/{name}"), format!("/envs/{name}?force=true")] {
        let (status, body) = call(server, reqwest::Method::DELETE, &path, ADMIN, None).await;
        assert_eq!(status, 409, "{path}: {body}");
        assert_eq!(body["error"]["code"], "conflict", "{path}: {body}");
        assert!(
            common::error_message(&body).contains(says),
            "{path}: {body}"
        );
    }
}

#[tokio::test]
async fn a_root_without_condabin_is_never_deleted_forced_or_not() {
    // Laid out as micromamba does: a root prefix with envs/ but no condabin/.
    let mut fixture = CondaFixture::new(Interpreter::primary());
    std::fs::remove_dir(fixture.root.join("condabin")).unwrap();
    let alpha = fixture.create_env("alpha", Interpreter::primary());
    let beta = fixture.create_env("beta", Interpreter::primary());
    for (env, base_is_default) in [
        (EnvChoice::CondaEnv("alpha".into()), false),
        (EnvChoice::Default, true),
    ] {
        let server = TestServer::with_config(Config {
            env,
            ..config_for(&fixture)
        })
        .await;
        let (status, details) = call(&server, reqwest::Method::GET, "/envs/base", USER, None).await;
        assert_eq!(status, 200, "{details}");
        assert_eq!(details["prefix"], fixture.root.display().to_string());
        assert_eq!(details["default"], base_is_default, "{details}");
        assert_never_deleted(&server, "base", "Conda's root").await;
        for prefix in [&fixture.root, &alpha, &beta] {
            assert!(
                prefix.join("bin/python").is_file(),
                "{} was touched",
                prefix.display()
            );
        }
        let ran = run_in(&server, "base", "print('served')").await;
        assert_eq!(ran["stdout"], "served\n", "{ran}");
        let ran = run_in(&server, "beta", "print('served')").await;
        assert_eq!(ran["stdout"], "served\n", "{ran}");
        server.stop().await;
    }
}

#[tokio::test]
async fn a_root_only_conda_names_is_never_deleted() {
    // Neither condabin/ nor envs/: only `conda info`'s root_prefix tells.
    let mut fixture = CondaFixture::new(Interpreter::primary());
    std::fs::remove_dir(fixture.root.join("condabin")).unwrap();
    std::fs::remove_dir(fixture.root.join("envs")).unwrap();
    fixture.install_fake_conda();
    let beside = fixture.dir.path().join("alpha");
    let alpha = fixture.create_env_at(&beside, Interpreter::primary());
    let server = TestServer::with_config(Config {
        env: EnvChoice::CondaEnv("alpha".into()),
        ..config_for(&fixture)
    })
    .await;
    assert_never_deleted(&server, "base", "Conda's root").await;
    assert!(fixture.root.join("bin/python").is_file());
    // An environment beside it is deleted as before.
    let (status, body) = call(
        &server,
        reqwest::Method::DELETE,
        "/envs/alpha?force=true",
        ADMIN,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(!alpha.exists());
    assert!(fixture.root.join("bin/python").is_file());
    // It was the default: a request that names no environment is told so,
    // and one that names another still runs.
    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/execute",
        USER,
        Some(json!({"code": "print(1)"})),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_env", "{body}");
    assert_eq!(
        body["error"]["message"],
        "the default environment \"alpha\" was deleted: name an environment in `env` \
         (known environments: base)"
    );
    let ran = run_in(&server, "base", "print('served')").await;
    assert_eq!(ran["stdout"], "served\n", "{ran}");
    server.stop().await;
}

#[tokio::test]
async fn a_prefix_holding_another_environment_is_never_deleted() {
    let mut fixture = CondaFixture::new(Interpreter::primary());
    let outer = fixture.dir.path().join("outer");
    let outer = fixture.create_env_at(&outer, Interpreter::primary());
    // Listed in environments.txt, so served as `inner`.
    let inner = fixture.create_env_at(&outer.join("sub/inner"), Interpreter::primary());
    // Listed nowhere: found on disk only.
    let unlisted = outer.join("tools/hidden");
    create_prefix(&unlisted, Interpreter::primary());
    let server = TestServer::with_config(config_for(&fixture)).await;
    let (status, body) = call(&server, reqwest::Method::GET, "/envs/inner", USER, None).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&server, reqwest::Method::GET, "/envs/outer", USER, None).await;
    assert_eq!(status, 200, "{body}");
    assert_never_deleted(&server, "outer", "holds environment \"inner\"").await;
    assert!(inner.join("bin/python").is_file());

    // Once `inner` is gone, the unlisted one still keeps `outer`.
    let (status, body) = call(&server, reqwest::Method::DELETE, "/envs/inner", ADMIN, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(!inner.exists());
    assert_never_deleted(
        &server,
        "outer",
        &format!("holds the environment at {}", unlisted.display()),
    )
    .await;
    assert!(unlisted.join("bin/python").is_file());

    // With nothing inside, it is deleted.
    std::fs::remove_dir_all(&unlisted).unwrap();
    let (status, body) = call(&server, reqwest::Method::DELETE, "/envs/outer", ADMIN, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(!outer.exists());
    server.stop().await;
}

#[tokio::test]
async fn without_an_admin_token_creates_are_disabled() {
    let fixture = CondaFixture::new(Interpreter::primary());
    let server = TestServer::with_config(Config {
        admin_token: None,
        ..config_for(&fixture)
    })
    .await;
    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/envs",
        USER,
        Some(json!({"name": "x", "clone": "base"})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(!fixture.root.join("envs/x").exists());
    server.stop().await;
}

#[tokio::test]
async fn a_create_streams_its_progress_as_server_sent_events() {
    let fixture = CondaFixture::new(Interpreter::primary());
    let server = TestServer::with_config(config_for(&fixture)).await;
    let resp = server
        .client
        .post(format!("{}/envs", server.url))
        .bearer_auth(ADMIN)
        .header("accept", "text/event-stream")
        .json(&json!({"name": "streamed", "clone": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    let events: Vec<(&str, &str)> = text
        .split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name, data))
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
    assert!(names.len() >= 3, "{text}");
    assert!(
        names[..names.len() - 1].iter().all(|n| *n == "progress"),
        "{names:?}"
    );
    assert_eq!(names.last(), Some(&"result"), "{text}");
    assert!(events[0].1.contains("creating environment"), "{text}");
    let result: Value = serde_json::from_str(events.last().unwrap().1).unwrap();
    assert_eq!(result["name"], "streamed");
    server.stop().await;
}

#[tokio::test]
async fn an_env_reached_through_a_link_is_deleted_with_its_link_and_nothing_beside_it() {
    let fixture = CondaFixture::new(Interpreter::primary());
    let data = fixture.root.parent().unwrap().join("data");
    // In the root's envs/, as a link to another disk.
    let linked = data.join("linked");
    create_prefix(&linked, Interpreter::primary());
    let linked_link = fixture.root.join("envs/linked");
    std::os::unix::fs::symlink(&linked, &linked_link).unwrap();
    // Listed in environments.txt by the path of a link.
    let tool = data.join("tool");
    create_prefix(&tool, Interpreter::primary());
    let tool_link = fixture.home.join("tool");
    std::os::unix::fs::symlink(&tool, &tool_link).unwrap();
    let listed = fixture.home.join(".conda/environments.txt");
    std::fs::write(
        &listed,
        format!("{}\n{}\n", fixture.root.display(), tool_link.display()),
    )
    .unwrap();
    std::fs::write(data.join("notes.txt"), "not an environment").unwrap();
    let server = TestServer::with_config(config_for(&fixture)).await;
    for (name, link, prefix) in [
        ("linked", &linked_link, &linked),
        ("tool", &tool_link, &tool),
    ] {
        let (status, body) = call(
            &server,
            reqwest::Method::GET,
            &format!("/envs/{name}"),
            USER,
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["prefix"], prefix.display().to_string(), "{body}");
        let (status, body) = call(
            &server,
            reqwest::Method::DELETE,
            &format!("/envs/{name}"),
            ADMIN,
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["prefix"], prefix.display().to_string(), "{body}");
        assert!(!prefix.exists(), "{name}: the environment's files are left");
        assert!(
            std::fs::symlink_metadata(link).is_err(),
            "{name}: the link to it is left"
        );
        let (status, body) = call(
            &server,
            reqwest::Method::GET,
            &format!("/envs/{name}"),
            USER,
            None,
        )
        .await;
        assert_eq!(status, 404, "{body}");
    }
    assert_eq!(
        std::fs::read_to_string(data.join("notes.txt")).unwrap(),
        "not an environment"
    );
    assert_eq!(
        std::fs::read_to_string(&listed).unwrap(),
        format!("{}\n", fixture.root.display())
    );
    assert!(fixture.root.join("bin/python").is_file());
    // The name is free again.
    let (status, body) = create(&server, json!({"name": "linked", "clone": "base"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["prefix"], linked_link.display().to_string());
    server.stop().await;
}

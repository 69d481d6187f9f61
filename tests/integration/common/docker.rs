//! Docker for the container tests, set up by the tests themselves so that
//! README's test command passes on a fresh machine (root, Debian):
//!
//! * Debian's `docker.io`, `mmdebstrap` and `curl` are installed with apt-get
//!   when missing;
//! * a private `dockerd` is started when none answers on [`HOST`]: its own
//!   socket, data root and exec root, `--iptables=false --bridge=none` (tests
//!   only use `--network host` or `--network none`, never a bridge);
//! * the base image [`BASE_IMAGE`] is built once from Debian packages with
//!   `mmdebstrap --variant=minbase --include=python3,ca-certificates`, from
//!   this machine's own apt sources, and loaded with `docker import`; it is
//!   kept between runs;
//! * the server's image [`IMAGE`] is built with `deploy/Dockerfile.prebuilt`
//!   from this build's (debug) binary, again only when an input changed.
//!
//! nextest runs every test in a process of its own: a file lock
//! ([`LOCK`]) makes one process at a time do the setup, and every step first
//! checks whether an earlier process already did it.

use std::collections::hash_map::DefaultHasher;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

/// The private daemon's socket, as `DOCKER_HOST` names it.
pub const HOST: &str = "unix:///run/code-executor-docker.sock";
const DATA_ROOT: &str = "/var/lib/code-executor-docker";
const EXEC_ROOT: &str = "/run/code-executor-docker";
const PIDFILE: &str = "/run/code-executor-docker.pid";
const DAEMON_LOG: &str = "/var/log/code-executor-dockerd.log";
/// Held while one test process sets Docker up.
pub const LOCK: &str = "/tmp/code-executor-docker.lock";
/// Debian bookworm with python3, from mmdebstrap.
pub const BASE_IMAGE: &str = "code-executor-test-base:bookworm";
/// The server's image, as the seed's README names it.
pub const IMAGE: &str = "mcp-code-executor";
/// The image label holding a digest of everything the image was built from.
const BUILD_LABEL: &str = "code-executor.test-build";
/// The docker CLI of the docker.io package.
const CLI: &str = "/usr/bin/docker";
const DOCKERD: &str = "/usr/sbin/dockerd";

/// The Docker this test process talks to, with [`IMAGE`] built.
pub struct Docker;

impl Docker {
    /// `docker ARGS` against the private daemon.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(CLI);
        cmd.env("DOCKER_HOST", HOST).env("DOCKER_BUILDKIT", "0");
        cmd
    }

    /// `docker ARGS`, which must succeed; its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().expect("docker runs");
        check(&out, &format!("docker {}", args.join(" ")));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn image_label(&self, image: &str) -> Option<String> {
        let out = self
            .command()
            .args(["image", "inspect", "--format"])
            .arg(format!("{{{{index .Config.Labels \"{BUILD_LABEL}\"}}}}"))
            .arg(image)
            .output()
            .expect("docker runs");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn image_exists(&self, image: &str) -> bool {
        self.command()
            .args(["image", "inspect", image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("docker runs")
            .success()
    }
}

/// Docker, set up once per test process (and once per machine for what
/// lasts): packages, daemon, base image, the server's image.
pub fn docker() -> &'static Docker {
    static DOCKER: OnceLock<Docker> = OnceLock::new();
    DOCKER.get_or_init(|| {
        let lock = File::create(LOCK).unwrap_or_else(|e| panic!("cannot create {LOCK}: {e}"));
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("cannot lock {LOCK}: {e}"));
        install_packages();
        let docker = Docker;
        start_daemon(&docker);
        base_image(&docker);
        build_image(&docker);
        docker
    })
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn on_path(name: &str) -> bool {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join(name).is_file())
}

/// apt-get install what is missing: docker.io (dockerd and its CLI),
/// mmdebstrap, curl (the README's example is run as written).
fn install_packages() {
    let mut missing = Vec::new();
    if !Path::new(DOCKERD).exists() || !Path::new(CLI).exists() {
        missing.push("docker.io");
    }
    if !on_path("mmdebstrap") {
        missing.push("mmdebstrap");
    }
    if !on_path("curl") {
        missing.push("curl");
    }
    if missing.is_empty() {
        return;
    }
    eprintln!("installing {missing:?} for the container tests");
    let out = Command::new("apt-get")
        .args(["update", "-q"])
        .output()
        .expect("apt-get runs (the container tests install docker.io and mmdebstrap)");
    check(&out, "apt-get update");
    let out = Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .expect("apt-get runs");
    check(&out, &format!("apt-get install {}", missing.join(" ")));
}

fn daemon_answers(docker: &Docker) -> bool {
    docker
        .command()
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Start the private dockerd unless it answers already. It outlives this
/// process (its own session, stdio in [`DAEMON_LOG`]), so that later tests
/// and runs reuse it.
fn start_daemon(docker: &Docker) {
    if daemon_answers(docker) {
        return;
    }
    std::fs::create_dir_all(DATA_ROOT).unwrap();
    let log = File::create(DAEMON_LOG).unwrap_or_else(|e| panic!("{DAEMON_LOG}: {e}"));
    // `setsid --fork`: the daemon gets a session of its own and init as its
    // parent, so it neither dies with this test nor lingers as its zombie.
    let status = Command::new("setsid")
        .arg("--fork")
        .arg(DOCKERD)
        .args([
            "--host",
            HOST,
            "--data-root",
            DATA_ROOT,
            "--exec-root",
            EXEC_ROOT,
            "--pidfile",
            PIDFILE,
            "--iptables=false",
            "--bridge=none",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap_or_else(|e| panic!("cannot start {DOCKERD} through setsid: {e}"));
    assert!(status.success(), "setsid --fork {DOCKERD}: {status}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !daemon_answers(docker) {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(DAEMON_LOG).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "dockerd did not answer on {HOST} within 60 s; {DAEMON_LOG} ends with:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One source of apt packages for mmdebstrap, as a one-line `deb` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    pub uri: String,
    pub suite: String,
    pub components: Vec<String>,
    /// `Signed-By`, when it names a keyring file.
    pub signed_by: Option<String>,
}

impl AptSource {
    /// `deb [signed-by=...] URI SUITE COMPONENTS...`
    pub fn line(&self) -> String {
        let options = self
            .signed_by
            .as_ref()
            .map(|k| format!("[signed-by={k}] "))
            .unwrap_or_default();
        format!(
            "deb {options}{} {} {}",
            self.uri,
            self.suite,
            self.components.join(" ")
        )
    }
}

/// The binary-package sources of `*.list` (one-line) and `*.sources`
/// (deb822) texts, as apt reads them: comments, `deb-src` entries,
/// `Enabled: no` stanzas and files of other names skipped.
pub fn parse_apt_sources(files: &[(PathBuf, String)]) -> Vec<AptSource> {
    let mut sources = Vec::new();
    for (path, text) in files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.ends_with(".list") {
            for line in text.lines() {
                let line = line.split('#').next().unwrap().trim();
                let Some(rest) = line.strip_prefix("deb ") else {
                    continue;
                };
                let mut rest = rest.trim_start();
                let mut signed_by = None;
                if let Some(options) = rest.strip_prefix('[') {
                    let (options, after) = options.split_once(']').unwrap_or((options, ""));
                    signed_by = options
                        .split_whitespace()
                        .find_map(|o| o.strip_prefix("signed-by="))
                        .map(str::to_string);
                    rest = after.trim_start();
                }
                let mut words = rest.split_whitespace();
                let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
                    continue;
                };
                sources.push(AptSource {
                    uri: uri.to_string(),
                    suite: suite.to_string(),
                    components: words.map(str::to_string).collect(),
                    signed_by,
                });
            }
        } else if name.ends_with(".sources") {
            let uncommented: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect();
            for stanza in uncommented.split(|l| l.trim().is_empty()) {
                let mut fields: Vec<(String, String)> = Vec::new();
                for line in stanza {
                    if line.starts_with([' ', '\t']) {
                        // A continuation line (an inline key): not a path.
                        if let Some(last) = fields.last_mut() {
                            last.1.push('\n');
                            last.1.push_str(line.trim());
                        }
                    } else if let Some((key, value)) = line.split_once(':') {
                        fields.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
                    }
                }
                let get = |key: &str| {
                    fields
                        .iter()
                        .find(|(k, _)| k == key)
                        .map(|(_, v)| v.as_str())
                };
                let words = |key: &str| -> Vec<String> {
                    get(key)
                        .unwrap_or("")
                        .split_whitespace()
                        .map(str::to_string)
                        .collect()
                };
                if !words("types").iter().any(|t| t == "deb")
                    || get("enabled").is_some_and(|v| v.eq_ignore_ascii_case("no"))
                {
                    continue;
                }
                let signed_by = get("signed-by")
                    .filter(|v| v.starts_with('/') && !v.contains('\n'))
                    .map(str::to_string);
                for uri in words("uris") {
                    for suite in words("suites") {
                        sources.push(AptSource {
                            uri: uri.clone(),
                            suite,
                            components: words("components"),
                            signed_by: signed_by.clone(),
                        });
                    }
                }
            }
        }
    }
    sources
}

/// This machine's apt sources for Debian bookworm (`bookworm`,
/// `bookworm-updates`, `bookworm-security`, ...).
pub fn bookworm_sources() -> Vec<AptSource> {
    let mut files = Vec::new();
    if let Ok(text) = std::fs::read_to_string("/etc/apt/sources.list") {
        files.push((PathBuf::from("/etc/apt/sources.list"), text));
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if let Ok(text) = std::fs::read_to_string(&path) {
                files.push((path, text));
            }
        }
    }
    parse_apt_sources(&files)
        .into_iter()
        .filter(|s| s.suite == "bookworm" || s.suite.starts_with("bookworm-"))
        .collect()
}

/// Build [`BASE_IMAGE`] with mmdebstrap unless it exists.
fn base_image(docker: &Docker) {
    if docker.image_exists(BASE_IMAGE) {
        return;
    }
    let sources = bookworm_sources();
    assert!(
        !sources.is_empty(),
        "no bookworm source in /etc/apt/sources.list or /etc/apt/sources.list.d: \
         the container tests build their base image from it"
    );
    eprintln!(
        "building {BASE_IMAGE} with mmdebstrap from {:?}",
        sources.iter().map(AptSource::line).collect::<Vec<_>>()
    );
    let started = Instant::now();
    let mut mmdebstrap = Command::new("mmdebstrap")
        .args([
            "--variant=minbase",
            "--include=python3,ca-certificates",
            "--quiet",
            "bookworm",
            "-",
        ])
        .args(sources.iter().map(AptSource::line))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mmdebstrap runs");
    let tar = mmdebstrap.stdout.take().unwrap();
    let import = docker
        .command()
        .args(["import", "-", BASE_IMAGE])
        .stdin(tar)
        .output()
        .expect("docker import runs");
    let built = mmdebstrap.wait_with_output().unwrap();
    check(&built, "mmdebstrap");
    check(&import, "docker import");
    eprintln!("{BASE_IMAGE} built in {:?}", started.elapsed());
}

/// Build [`IMAGE`] from `deploy/Dockerfile.prebuilt` and this build's binary,
/// unless the image was built from the same inputs.
fn build_image(docker: &Docker) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = Path::new(env!("CARGO_BIN_EXE_code-executor"));
    let dockerfile = std::fs::read_to_string(repo.join("deploy/Dockerfile.prebuilt")).unwrap();
    let defaults = std::fs::read_to_string(repo.join("deploy/container/defaults.toml")).unwrap();
    let base_id = docker.run(&["image", "inspect", "--format", "{{.Id}}", BASE_IMAGE]);
    let meta = binary.metadata().unwrap();
    let mut hasher = DefaultHasher::new();
    (
        &dockerfile,
        &defaults,
        base_id.trim(),
        meta.len(),
        meta.modified().unwrap(),
    )
        .hash(&mut hasher);
    let key = format!("{:016x}", hasher.finish());
    if docker.image_label(IMAGE).as_deref() == Some(key.as_str()) {
        return;
    }
    // A build context with only what the Dockerfile copies.
    let context = tempfile::tempdir().unwrap();
    let ctx = context.path();
    std::fs::create_dir_all(ctx.join("deploy/container")).unwrap();
    std::fs::write(ctx.join("deploy/Dockerfile.prebuilt"), &dockerfile).unwrap();
    std::fs::write(ctx.join("deploy/container/defaults.toml"), &defaults).unwrap();
    if std::fs::hard_link(binary, ctx.join("code-executor")).is_err() {
        std::fs::copy(binary, ctx.join("code-executor")).unwrap();
    }
    let started = Instant::now();
    let out = docker
        .command()
        .arg("build")
        .arg("--quiet")
        .arg("-f")
        .arg(ctx.join("deploy/Dockerfile.prebuilt"))
        .args(["--build-arg", &format!("BASE={BASE_IMAGE}")])
        .args(["--build-arg", "BINARY=code-executor"])
        .args(["--label", &format!("{BUILD_LABEL}={key}")])
        .args(["-t", IMAGE])
        .arg(ctx)
        .output()
        .expect("docker build runs");
    check(&out, "docker build -f deploy/Dockerfile.prebuilt");
    eprintln!("{IMAGE} built in {:?}", started.elapsed());
}

/// A free TCP port on loopback (for a server in `--network host`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Conda-layout environment that holds all it needs, as `conda create`
/// lays one out: a copy of Debian's `/usr/bin/python3.11` and of its
/// standard library (`/usr/lib/python3.11`) inside the prefix, its own empty
/// `site-packages`, `conda-meta/history` and an activation script that sets
/// `FIXTURE_ACTIVATED=yes`. World-readable, so any container uid can use it.
pub struct FixtureEnv {
    _dir: tempfile::TempDir,
    /// The prefix (its folder is named `target_env`).
    pub prefix: PathBuf,
}

impl FixtureEnv {
    pub fn create() -> FixtureEnv {
        let binary = Path::new("/usr/bin/python3.11");
        let stdlib = Path::new("/usr/lib/python3.11");
        assert!(
            binary.is_file() && stdlib.is_dir(),
            "the container fixture copies Debian's python3.11 (apt-get install python3)"
        );
        let dir = tempfile::Builder::new()
            .prefix("container-env-")
            .tempdir()
            .unwrap();
        let prefix = dir.path().join("target_env");
        let bin = prefix.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy(binary, bin.join("python3.11")).unwrap();
        std::os::unix::fs::symlink("python3.11", bin.join("python3")).unwrap();
        std::os::unix::fs::symlink("python3.11", bin.join("python")).unwrap();
        let lib = prefix.join("lib/python3.11");
        copy_tree(
            stdlib,
            &lib,
            &["dist-packages", "site-packages", "EXTERNALLY-MANAGED"],
        );
        std::fs::create_dir_all(lib.join("site-packages")).unwrap();
        std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
        std::fs::write(
            prefix.join("conda-meta/history"),
            "==> 2024-01-01 00:00:00 <==\n# cmd: conda create -n target_env python=3.11\n",
        )
        .unwrap();
        let activate = prefix.join("etc/conda/activate.d");
        std::fs::create_dir_all(&activate).unwrap();
        std::fs::write(activate.join("x.sh"), "export FIXTURE_ACTIVATED=yes\n").unwrap();
        make_world_readable(dir.path());
        FixtureEnv { _dir: dir, prefix }
    }
}

/// Copy a tree, following symlinks (Debian links a few stdlib files to
/// /etc; a broken link is left out), skipping the top-level `skip` names.
fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let source = entry.path();
        let Ok(meta) = std::fs::metadata(&source) else {
            continue;
        };
        if meta.is_dir() {
            copy_tree(&source, &to.join(&name), &[]);
        } else {
            std::fs::copy(&source, to.join(&name)).unwrap();
        }
    }
}

fn make_world_readable(path: &Path) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    if meta.file_type().is_symlink() {
        return;
    }
    let mode = meta.permissions().mode();
    let wanted = if meta.is_dir() {
        mode | 0o755
    } else {
        mode | 0o444
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted)).unwrap();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap().flatten() {
            make_world_readable(&entry.path());
        }
    }
}

/// A container run in the foreground by `docker run --rm --name NAME ...`
/// (as a user would type it): its log is the CLI's output, read line by
/// line; dropping it removes the container.
pub struct Container {
    pub name: String,
    /// The `docker run` CLI: its exit status is the container's.
    pub cli: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    grew: Arc<tokio::sync::Notify>,
}

impl Container {
    /// `docker run --rm --name NAME ARGS...`, where ARGS end with the image
    /// (and its command, if any).
    pub fn run(docker: &Docker, args: &[String]) -> Container {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!(
            "code-executor-test-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut cli = tokio::process::Command::from(docker.command())
            .args(["run", "--rm", "--name", &name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("docker run starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let grew = Arc::new(tokio::sync::Notify::new());
        let stdout = cli.stdout.take().unwrap();
        let stderr = cli.stderr.take().unwrap();
        for reader in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(stderr),
        ] {
            let (lines, grew) = (lines.clone(), grew.clone());
            tokio::spawn(async move {
                let mut reader = BufReader::new(reader).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().unwrap().push(line);
                    grew.notify_waiters();
                }
            });
        }
        Container {
            name,
            cli,
            lines,
            grew,
        }
    }

    /// The log so far.
    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The first log line `pick` accepts (its value), waiting up to `within`.
    pub async fn wait_for_line<T>(
        &mut self,
        within: Duration,
        pick: impl Fn(&str) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.grew.notified();
            if let Some(found) = self.log().iter().find_map(|l| pick(l)) {
                return found;
            }
            if let Ok(Some(status)) = self.cli.try_wait() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "container {} exited ({status}) before the line looked for:\n{}",
                    self.name,
                    self.log().join("\n")
                );
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "container {}: no such line within {within:?}:\n{}",
                    self.name,
                    self.log().join("\n")
                );
            }
            // A new line, or a look at whether the container exited.
            let _ = tokio::time::timeout(Duration::from_millis(250), notified).await;
        }
    }

    /// Wait until the server in the container logged that it is ready.
    pub async fn wait_ready(&mut self) {
        self.wait_for_line(Duration::from_secs(90), |l| {
            l.contains("code-executor ready").then_some(())
        })
        .await;
    }

    /// `docker exec NAME ARGS...`
    pub fn exec(&self, docker: &Docker, args: &[&str]) -> Output {
        docker
            .command()
            .args(["exec", &self.name])
            .args(args)
            .output()
            .expect("docker exec runs")
    }

    /// Wait for the `docker run` CLI to exit: the container's exit status.
    pub async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        match tokio::time::timeout(within, self.cli.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!(
                "container {} still running after {within:?}:\n{}",
                self.name,
                self.log().join("\n")
            ),
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("log of container {}:\n{}", self.name, self.log().join("\n"));
        }
        let _ = Command::new(CLI)
            .env("DOCKER_HOST", HOST)
            .args(["rm", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

//! Request and result types shared by every front end (HTTP, MCP): what a
//! client sends and sees, in one place.

pub mod grade;
pub(crate) mod object;
pub mod session;

pub use grade::{
    CaseResult, Checker, GradeBatchRequest, GradeBatchResult, GradeRequest, GradeResult, JsonText,
    TestCase, Verdict,
};
pub use session::{CreateSessionRequest, SessionInfo};

use std::collections::BTreeMap;

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use self::object::RequestObject;
use crate::limits::RequestLimits;
use crate::outcome::Limit;
use crate::pool::PoolStatus;
use crate::sandbox::SandboxStatus;

/// A request's own resource limits (`limits` of `/execute`, `/sessions`,
/// `/grade`). Each may only lower the server's configured limit; a value
/// over it is capped, `0` is refused. An unknown field is refused.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    /// CPU seconds (`RLIMIT_CPU`; `SIGXCPU` past it, `limit: "cpu"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// Address space in bytes (`RLIMIT_AS`, and the worker's memory cgroup
    /// where there is one; `limit: "memory"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Largest file the run may write, bytes (`EFBIG`, `limit: "file_size"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<u64>,
    /// Open file descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// Processes and threads (the worker's pids cgroup; `limit: "processes"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// Bytes the run may have in its directories at once, below the env's
    /// `disk_bytes` (the size of the worker's scratch tmpfs; `limit: "disk"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
}

/// One execution request (`POST /execute`, MCP `execute_code`: the same
/// type, so both accept the same fields). An unknown field is refused, so a
/// misspelt one is reported rather than ignored.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Python source to run, as `python script.py` would run it.
    pub code: String,
    /// Environment name or prefix path; the default environment if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Wall-clock limit in seconds; the server's default if absent, capped
    /// by the server's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// Input files written into the run's working directory: relative path
    /// -> UTF-8 text, or `{"base64": "..."}` for binary content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, FileContent>>,
    /// Text fed to the program's standard input (empty if absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Run in a persistent session (`POST /sessions`): its variables,
    /// imports and working directory carry over between calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Which files the run wrote come back as artifacts: `true` (the
    /// default) for all, `false` for none, or a list of globs (`["*.png"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts: Option<ArtifactSelection>,
    /// Stream output as server-sent events (same as `Accept: text/event-stream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Resource limits for this run (`cpu_seconds`, `memory_bytes`,
    /// `file_size_bytes`, `open_files`, `processes`); each may only lower the
    /// server's configured limit.
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub limits: Option<RunLimits>,
    /// CPython's limit on the digits of an int converted to or from a
    /// string (3.11+): `0` lifts it; absent keeps the interpreter's default
    /// (4300). Below 640 only `0` is allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int_max_str_digits: Option<u32>,
    /// The run's network: `allowed_hosts` narrows the environment's
    /// allow-list (never widens it; an empty list allows nothing).
    #[serde(
        default,
        deserialize_with = "object::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<NetworkRequest>,
}

impl RequestObject for RunLimits {
    const FIELD: &'static str = "limits";
}

impl RequestObject for NetworkRequest {
    const FIELD: &'static str = "network";
}

/// A request's network policy.
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Hosts the run may reach: each entry within the environment's
    /// `allowed_hosts` (`host`, `host:port`, `*.domain`, an address or CIDR
    /// block with an optional `:port`).
    pub allowed_hosts: Vec<String>,
}

/// What a run did through the egress proxy (environments with
/// `allowed_hosts` only).
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
pub struct NetworkUsage {
    /// Connections the run asked the proxy for, refused ones included.
    pub connections: u64,
    /// Bytes the run sent through the proxy.
    pub bytes_sent: u64,
    /// Bytes the run received through the proxy.
    pub bytes_received: u64,
    /// The refused connections (at most 32 listed), each with its rule.
    pub denied: Vec<DeniedConnection>,
    /// A cap (connections or bytes per run) refused or cut a connection.
    #[serde(skip)]
    #[schemars(skip)]
    #[schema(ignore)]
    pub capped: bool,
}

/// A connection the egress proxy refused.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
pub struct DeniedConnection {
    /// The host the run asked for.
    pub host: String,
    /// The port it asked for.
    pub port: u16,
    /// Why it was refused (the rule, or the cap).
    pub reason: String,
}

/// Which artifacts a request wants.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ArtifactSelection {
    /// All (`true`) or none (`false`).
    All(bool),
    /// Only files whose path relative to the run directory matches a glob.
    Globs(Vec<String>),
}

/// A file the run created or changed in its working directory.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
pub struct Artifact {
    /// Path relative to the run's working directory.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// MIME type guessed from the file name.
    pub mime: String,
    /// The content, base64-encoded; absent when `omitted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// The file was over the per-artifact or total cap, or unreadable (the
    /// run took its read permission away); only listed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omitted: bool,
    /// Over MCP: where the file can be read again (`resources/read`, and
    /// `GET /artifacts/{run}/{path}` over HTTP) until it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

/// An uncaught exception of the run, with the user's own line numbers.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
pub struct RunError {
    /// Exception class (`ZeroDivisionError`, `mymodule.MyError`).
    #[serde(rename = "type")]
    pub kind: String,
    /// `str()` of the exception.
    pub message: String,
    /// The traceback as Python prints it, without the server's own frames.
    pub traceback: String,
    /// Line of the user's code where it was raised (innermost), if known.
    pub line: Option<u32>,
}

/// Content of one input file.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
#[serde(
    untagged,
    expecting = "every value of files must be a string or {\"base64\": \"...\"}"
)]
pub enum FileContent {
    /// UTF-8 text.
    Text(String),
    /// Binary content, base64-encoded.
    #[serde(deserialize_with = "object::base64")]
    Base64 {
        /// The bytes in standard base64.
        base64: String,
    },
}

impl FileContent {
    /// The file's bytes, or a message saying why they cannot be decoded.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            FileContent::Text(text) => Ok(text.as_bytes().to_vec()),
            FileContent::Base64 { base64 } => base64::engine::general_purpose::STANDARD
                .decode(base64)
                .map_err(|e| format!("invalid base64: {e}")),
        }
    }
}

/// The result of a run that happened, whatever its exit code.
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
pub struct ExecResult {
    /// Captured standard output (invalid UTF-8 replaced).
    pub stdout: String,
    /// Captured standard error (invalid UTF-8 replaced).
    pub stderr: String,
    /// Exit status; `-N` when the run was killed by signal N.
    pub exit_code: i32,
    /// Files the run created or changed, plots included.
    pub artifacts: Vec<Artifact>,
    /// The run left more files than `artifacts` lists: more than 1000
    /// matched, or its directory held more entries than one listing reads
    /// (65,536). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub artifacts_truncated: bool,
    /// The run hit its wall-clock timeout and was killed.
    pub timed_out: bool,
    /// Output went over the per-stream cap and was cut.
    pub truncated: bool,
    /// Wall time of the run inside the worker, in milliseconds.
    pub duration_ms: f64,
    /// Name of the signal that killed the run (`"SIGKILL"`), if any.
    pub signal: Option<String>,
    /// Repr of the last expression statement, as a notebook shows it; null
    /// when there is none or it is `None`.
    pub result: Option<String>,
    /// The uncaught exception, if the run raised one.
    pub error: Option<RunError>,
    /// Which limit stopped the run: `"timeout"`, `"cpu"`, `"memory"`,
    /// `"processes"`, `"file_size"`, `"disk"`, `"output"`.
    pub limit: Option<Limit>,
    /// Session calls only: the session process died or was killed during
    /// this call, and why. The session is gone; later calls get 404.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_lost: Option<String>,
    /// Environments with `allowed_hosts`: the run's connections through
    /// the egress proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkUsage>,
    /// The content hash of the environment the run ran in (`sha256:...`,
    /// as `/list-envs` shows it): its interpreter, Conda package records
    /// and installed distributions. Changes after an install, not otherwise.
    #[serde(default)]
    pub env_hash: String,
}

/// Which installer `POST /install` runs.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PackageManager {
    /// `<prefix>/bin/python -m pip install ...`
    #[default]
    Pip,
    /// `uv pip install --python <prefix>/bin/python ...` (the configured
    /// `uv`, else `uv` on the server's `PATH`)
    Uv,
    /// uv where the server has one, else pip
    Auto,
    /// The discovered `conda`/`mamba` with `install -y -p PREFIX ...`
    Conda,
}

impl PackageManager {
    /// The name clients use.
    pub fn as_str(self) -> &'static str {
        match self {
            PackageManager::Pip => "pip",
            PackageManager::Uv => "uv",
            PackageManager::Auto => "auto",
            PackageManager::Conda => "conda",
        }
    }
}

/// `POST /install`, MCP `install_packages`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstallRequest {
    /// Environment name or prefix path; the default environment if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// What to install, each one argv item: requirements (`pkg`,
    /// `pkg==1.0`, `pkg[extra]>=2; python_version>='3.9'`), direct
    /// references (`pkg @ https://.../pkg-1.0.tar.gz`), URLs of archives,
    /// or absolute paths of wheels and sdists
    /// (`/tmp/wheels/pkg-1.0-py3-none-any.whl`); match specs such as
    /// `pkg=1.0` for conda. Options are refused.
    #[serde(default)]
    pub packages: Vec<String>,
    /// The text of a requirements file: one item as in `packages` per
    /// line, `#` comments; written to a private file and passed with `-r`.
    /// Option lines (`-r`, `--index-url`, ...) are refused: use the fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<String>,
    /// `pip` (default), `uv`, `auto` (uv where the server has one) or `conda`.
    #[serde(default)]
    pub manager: PackageManager,
    /// `--index-url`: the package index (an `http(s)://` URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_url: Option<String>,
    /// `--extra-index-url`, each an `http(s)://` URL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_index_urls: Vec<String>,
    /// `--find-links`: `http(s)://` or `file://` URLs, or absolute folders
    /// holding archives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub find_links: Vec<String>,
    /// `--no-index`: use `find_links` and local paths only.
    #[serde(default)]
    pub no_index: bool,
    /// `--upgrade`: upgrade what is already installed.
    #[serde(default)]
    pub upgrade: bool,
    /// `--pre` (uv: `--prerelease allow`): allow pre-releases.
    #[serde(default)]
    pub pre: bool,
}

/// The outcome of an install that ran, whatever its exit code.
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
pub struct InstallResult {
    /// The environment's name.
    pub env: String,
    /// The installer that ran: `pip`, `uv` or `conda` (`auto` resolved).
    pub manager: String,
    /// Exit status of the installer; `-N` when killed by signal N.
    pub exit_code: i32,
    /// The installer's standard output (its last MiB).
    pub stdout: String,
    /// The installer's standard error (its last MiB).
    pub stderr: String,
    /// `name==version` of every distribution added or changed by the run.
    pub installed: Vec<String>,
    /// The install hit its timeout and was killed.
    pub timed_out: bool,
    /// The environment's content hash after the install (unchanged when
    /// nothing was installed).
    pub env_hash: String,
}

/// One installed distribution (`GET /list-packages`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
pub struct PackageInfo {
    /// Distribution name as installed.
    pub name: String,
    /// Installed version.
    pub version: String,
}

/// An environment as `/list-envs` and MCP `list_environments` show it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct EnvInfo {
    /// Name in requests (`env`).
    pub name: String,
    /// The environment's prefix directory.
    pub prefix: String,
    /// `conda` (a Conda prefix), `venv` or `python` (any other interpreter).
    pub kind: String,
    /// Python version (`3.11.7`; `3.11` when only the layout tells), read
    /// from disk without starting a worker; null when nothing tells.
    pub python_version: Option<String>,
    /// Conda's platform name (`linux-64`, `linux-aarch64`, `osx-arm64`): the
    /// Python package record's `subdir`, else the host's.
    pub platform: String,
    /// The environment's content hash (`sha256:...`): its interpreter's
    /// version, Conda package records and installed distributions.
    pub env_hash: String,
    /// Whether requests that name no environment run here.
    pub default: bool,
    /// Its pool's worker counts.
    pub pool: PoolSummary,
    /// What its runs may reach over the network.
    pub network: EnvNetwork,
    /// Why the environment cannot run code (absent when it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An environment's network policy.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct EnvNetwork {
    /// `isolated` (loopback only), `host` (the host's network) or
    /// `allow_list` (only `allowed_hosts`, through the egress proxy).
    pub mode: &'static str,
    /// The hosts runs may reach (`allow_list` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
}

/// Pool counts of one environment.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct PoolSummary {
    /// Workers alive.
    pub size: usize,
    /// Workers free for a request.
    pub idle: usize,
    /// Workers running a request.
    pub busy: usize,
}

/// Overall health: `ok` while at least one environment can serve.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, `unavailable` (no environment can serve) or `draining` (the
    /// replica is stopping: it serves what still reaches it, and asks
    /// balancers to send nothing more).
    pub status: &'static str,
    /// This replica's id (`--replica-id`, default the host name): the
    /// replica that answered, and the one its sessions live on.
    pub replica: String,
    /// Live sessions on this replica.
    pub sessions: usize,
    /// Each environment's pool, by name.
    pub envs: BTreeMap<String, PoolStatus>,
    /// Which confinement mechanisms are enforced (never any secret).
    pub sandbox: SandboxStatus,
    /// Caps on a request's code and files (413 above them).
    pub request_limits: RequestLimits,
}

/// Validate a relative path from `files`: no absolute paths, no `..`, no
/// empty or NUL-containing names, within the caps on its length, names and
/// depth.
pub fn check_file_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.contains('\0') {
        return Err(format!("file path {path:?} is empty or contains NUL"));
    }
    if path.starts_with('/') {
        return Err(format!("file path {path:?} must be relative"));
    }
    if path.len() > MAX_FILE_PATH_BYTES {
        return Err(format!(
            "file path {:?}... is {} bytes, over the limit of {MAX_FILE_PATH_BYTES}",
            path.chars().take(40).collect::<String>(),
            path.len()
        ));
    }
    let mut depth = 0usize;
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(format!("file path {path:?} leaves the working directory")),
            _ if part.len() > MAX_FILE_NAME_BYTES => {
                return Err(format!(
                    "file path {path:?} has a name of {} bytes, over the limit of {MAX_FILE_NAME_BYTES}",
                    part.len()
                ));
            }
            _ => depth += 1,
        }
    }
    if depth == 0 {
        return Err(format!("file path {path:?} names no file"));
    }
    // The names before the file's own are its directories.
    let directories = depth - 1;
    if directories > MAX_FILE_DEPTH {
        return Err(format!(
            "file path {:?}... is {directories} directories deep, over the limit of {MAX_FILE_DEPTH}",
            path.chars().take(40).collect::<String>()
        ));
    }
    Ok(())
}

/// Longest name of one file or directory (Linux's `NAME_MAX`).
pub const MAX_FILE_NAME_BYTES: usize = 255;
/// Longest path of an input file.
pub const MAX_FILE_PATH_BYTES: usize = 1024;
/// Deepest an input file may lie below the working directory.
pub const MAX_FILE_DEPTH: usize = 32;

/// The one spelling of an input file's path: no empty or `.` parts
/// (`./a//b` is `a/b`). Two paths name the same file when these are equal.
pub fn normal_file_path(path: &str) -> String {
    path.split('/')
        .filter(|p| !matches!(*p, "" | "."))
        .collect::<Vec<_>>()
        .join("/")
}

/// Check that input files (each already passed by [`check_file_path`]) can
/// all be written: no path twice (`a` and `./a`), and no file where another
/// needs a directory (`a` beside `a/b`).
pub fn check_file_set<'a>(paths: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let mut files = std::collections::HashMap::new();
    let mut dirs = std::collections::HashMap::new();
    for path in paths {
        let normal = normal_file_path(path);
        let parts: Vec<&str> = normal.split('/').collect();
        if let Some(other) = files.insert(normal.clone(), path) {
            return Err(format!(
                "file paths {other:?} and {path:?} name the same file"
            ));
        }
        for end in 1..parts.len() {
            dirs.entry(parts[..end].join("/")).or_insert(path);
        }
    }
    for (normal, path) in &files {
        if let Some(inside) = dirs.get(normal) {
            return Err(format!(
                "file path {path:?} is a file, but {inside:?} needs it to be a directory"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_sets_must_be_writable_together() {
        assert!(check_file_set(["a/b", "a/c", "d"].into_iter()).is_ok());
        let err = check_file_set(["a", "a/b"].into_iter()).unwrap_err();
        assert!(err.contains("\"a\" is a file"), "{err}");
        let err = check_file_set(["x/y", "./x//y"].into_iter()).unwrap_err();
        assert!(err.contains("name the same file"), "{err}");
        let long = "n".repeat(300);
        assert!(check_file_path(&long).unwrap_err().contains("255"));
        let deep = "d/".repeat(1500) + "f";
        assert!(
            check_file_path(&deep)
                .unwrap_err()
                .contains("over the limit")
        );
        let deep = "d/".repeat(40) + "f";
        assert!(
            check_file_path(&deep)
                .unwrap_err()
                .contains("directories deep")
        );
        // 32 directories and the file is the deepest path taken.
        assert!(check_file_path(&("d/".repeat(32) + "f")).is_ok());
        assert!(
            check_file_path(&("d/".repeat(33) + "f"))
                .unwrap_err()
                .contains("is 33 directories deep, over the limit of 32")
        );
    }

    #[test]
    fn file_paths_stay_inside_the_run_dir() {
        assert!(check_file_path("data/in.txt").is_ok());
        assert!(check_file_path("./a").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", ".", "a\0b"] {
            assert!(check_file_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn file_content_accepts_text_and_base64() {
        let files: BTreeMap<String, FileContent> =
            serde_json::from_str(r#"{"a": "hi", "b": {"base64": "AAE="}}"#).unwrap();
        assert_eq!(files["a"].to_bytes().unwrap(), b"hi");
        assert_eq!(files["b"].to_bytes().unwrap(), vec![0, 1]);
        let bad = FileContent::Base64 {
            base64: "!!".into(),
        };
        assert!(bad.to_bytes().unwrap_err().contains("invalid base64"));
    }
}

/// `POST /envs` (admin): create an environment from an `environment.yml`,
/// from Conda specs, or as a clone of an existing environment; then install
/// `pip` and `requirements` entries into it. Exactly one of
/// `environment_yml`, `specs` and `clone` is given.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvRequest {
    /// The new environment's name (and its folder's): letters, digits,
    /// `.`, `_`, `-`; at most 64 characters.
    pub name: String,
    /// The text of an `environment.yml` (`conda env create -p PREFIX -f
    /// FILE`); needs Conda.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_yml: Option<String>,
    /// Conda match specs (`python=3.12`, `numpy>=1.26`) for `conda create -p
    /// PREFIX SPECS`; needs Conda.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub specs: Vec<String>,
    /// The environment to clone (name or prefix): `conda create --clone`,
    /// or without Conda a copy of its prefix (hard links where possible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<String>,
    /// Items installed into the new environment afterwards, as `/install`'s
    /// `packages` (requirements, wheel and sdist paths).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip: Vec<String>,
    /// A requirements text installed afterwards, as `/install`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<String>,
    /// The installer of `pip` and `requirements`: `pip` (default), `uv` or `auto`.
    #[serde(default)]
    pub manager: PackageManager,
}

/// One command a create ran, and how it ended.
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
pub struct CreateStep {
    /// What the step did: `conda env create`, `conda create`, `conda create
    /// --clone`, `copy`, `pip install`, `uv pip install`.
    pub step: String,
    /// Exit status of its command (0 for `copy`).
    pub exit_code: i32,
    /// The command's standard output (its last MiB), or what the copy did.
    pub stdout: String,
    /// The command's standard error (its last MiB).
    pub stderr: String,
}

/// A created environment: it is served at once (its pool starts on first use).
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
pub struct CreateEnvResult {
    /// The new environment's name.
    pub name: String,
    /// Its prefix.
    pub prefix: String,
    /// Its Python version, as `/list-envs` shows it.
    pub python_version: Option<String>,
    /// Its content hash, as `/list-envs` and results show it.
    pub env_hash: String,
    /// The commands the create ran, in order.
    pub steps: Vec<CreateStep>,
    /// `name==version` of every distribution the `pip`/`requirements`
    /// entries added.
    pub installed: Vec<String>,
    /// Seconds the create took.
    pub duration_secs: f64,
}

/// `DELETE /envs/{name}`'s answer: the environment is no longer served and
/// its prefix is gone.
#[derive(
    Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema, utoipa::ToSchema,
)]
pub struct DeleteEnvResult {
    /// The deleted environment's name.
    pub name: String,
    /// Its former prefix.
    pub prefix: String,
    /// Sessions that were closed because `force` was given.
    pub sessions_closed: usize,
}

/// `GET /envs/{name}`: an environment, its packages and its lock.
#[derive(Debug, Clone, Serialize, JsonSchema, utoipa::ToSchema)]
pub struct EnvDetails {
    /// As `/list-envs` shows it.
    #[serde(flatten)]
    pub env: EnvInfo,
    /// Installed distributions and Conda packages, sorted by name.
    pub packages: Vec<PackageInfo>,
    /// The environment's lock, to recreate it elsewhere.
    pub lock: EnvLock,
}

/// An environment's content as files to recreate it from.
#[derive(Debug, Clone, Serialize, JsonSchema, utoipa::ToSchema)]
pub struct EnvLock {
    /// `requirements.txt` in `pip freeze` form: `name==version` per line.
    pub requirements_txt: String,
    /// An explicit Conda spec (`@EXPLICIT` and one package URL per line)
    /// when every `conda-meta` record names its URL; null otherwise.
    pub conda_explicit: Option<String>,
}

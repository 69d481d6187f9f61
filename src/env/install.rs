//! Package listing and installs: commands run in an environment as its
//! workers are (activated variables only, a private `HOME`, no stdin, no
//! shell), each in its own process group and bounded in time.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use super::EnvSpec;
use super::packages::{LIST_SCRIPT, check_conda_spec, check_pip_spec, conda_packages};
use crate::api::{InstallRequest, PackageInfo, PackageManager};
use crate::error::ExecError;
use crate::worker::{kill_process_tree, worker_env};

/// Bound on listing an environment's packages.
const LIST_PACKAGES_TIMEOUT: Duration = Duration::from_secs(60);

/// Output kept per stream of an install run.
const INSTALL_OUTPUT_LIMIT: usize = 1 << 20;

/// Variables of the server's environment an install may see besides the
/// env's activation: proxies and index settings an operator sets for
/// installs. Tokens never are.
const INSTALL_VARS: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "CONDA_PKGS_DIRS",
    "CONDARC",
];

/// What a bounded helper process printed and how it ended.
pub(crate) struct ProcessOutput {
    pub(crate) exit_code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) timed_out: bool,
}

/// Run `cmd` in its own process group with captured output; past `timeout`
/// the whole group is killed and `timed_out` set.
pub(crate) async fn run_bounded(
    mut cmd: tokio::process::Command,
    timeout: Duration,
) -> std::io::Result<ProcessOutput> {
    use std::os::unix::process::ExitStatusExt;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(out) => {
            let out = out?;
            let code = out
                .status
                .code()
                .unwrap_or_else(|| -out.status.signal().unwrap_or(0));
            Ok(ProcessOutput {
                exit_code: code,
                stdout: capped(out.stdout),
                stderr: capped(out.stderr),
                timed_out: false,
            })
        }
        Err(_) => {
            kill_process_tree(pid);
            Ok(ProcessOutput {
                exit_code: -9,
                stdout: String::new(),
                stderr: format!("killed after the install timeout of {timeout:?}"),
                timed_out: true,
            })
        }
    }
}

/// Output as text, its tail kept when it is over the limit.
fn capped(mut bytes: Vec<u8>) -> String {
    if bytes.len() > INSTALL_OUTPUT_LIMIT {
        bytes.drain(..bytes.len() - INSTALL_OUTPUT_LIMIT);
    }
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Where commands of one environment run.
pub(crate) struct EnvCommands<'a> {
    pub(crate) spec: &'a EnvSpec,
    /// The activated environment (scripts included), built from scratch.
    pub(crate) vars: &'a HashMap<String, String>,
    /// The server's own directory: `home/` in it is the commands' `HOME`,
    /// and it is their `TMPDIR`.
    pub(crate) base_dir: &'a Path,
}

impl EnvCommands<'_> {
    /// A command run in the environment as its workers are: activated
    /// variables only (plus [`INSTALL_VARS`]), a private `HOME`, no stdin.
    fn command(&self, program: &Path) -> tokio::process::Command {
        let home = self.base_dir.join("home");
        let _ = std::fs::create_dir_all(&home);
        let mut cmd = tokio::process::Command::new(program);
        cmd.env_clear()
            .envs(worker_env(self.vars))
            .envs(
                INSTALL_VARS
                    .iter()
                    .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v))),
            )
            .env("HOME", &home)
            .env("TMPDIR", self.base_dir)
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .env("PIP_NO_INPUT", "1")
            .current_dir(&home);
        cmd
    }

    /// Installed distributions (name, version), sorted by name: what
    /// `importlib.metadata` sees, plus the Conda packages of `conda-meta/`
    /// that are not Python distributions. Runs the env's interpreter with a
    /// fixed script. An error is why they cannot be listed.
    pub(crate) async fn packages(&self) -> Result<Vec<PackageInfo>, String> {
        let mut cmd = self.command(&self.spec.python);
        cmd.args(["-I", "-c", LIST_SCRIPT]);
        let out = run_bounded(cmd, LIST_PACKAGES_TIMEOUT)
            .await
            .map_err(|e| format!("cannot list packages: {e}"))?;
        if out.exit_code != 0 {
            return Err(format!("listing packages failed: {}", out.stderr.trim()));
        }
        let pairs: Vec<(String, String)> = serde_json::from_str(&out.stdout)
            .map_err(|e| format!("unreadable package list: {e}"))?;
        let normal = |n: &str| n.to_ascii_lowercase().replace('_', "-");
        let mut packages: BTreeMap<String, PackageInfo> = pairs
            .into_iter()
            .map(|(name, version)| (normal(&name), PackageInfo { name, version }))
            .collect();
        for (name, version) in conda_packages(&self.spec.prefix) {
            packages
                .entry(normal(&name))
                .or_insert(PackageInfo { name, version });
        }
        Ok(packages.into_values().collect())
    }

    /// The installer command of `req`: pip of the env's interpreter, or
    /// `conda` (any of conda, mamba, micromamba) on the env's prefix. The
    /// specs are argv items after the options.
    pub(crate) fn installer(
        &self,
        req: &InstallRequest,
        conda: Option<&Path>,
    ) -> Result<tokio::process::Command, ExecError> {
        let mut cmd = match req.manager {
            PackageManager::Pip => {
                let mut cmd = self.command(&self.spec.python);
                cmd.args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    "--",
                ]);
                cmd
            }
            PackageManager::Conda => {
                let conda = conda.ok_or_else(|| {
                    ExecError::BadRequest(
                        "manager \"conda\" needs a conda, mamba or micromamba executable and none was found (set CONDA_EXE or put one on PATH)".into(),
                    )
                })?;
                let mut cmd = self.command(conda);
                cmd.arg("install")
                    .arg("-y")
                    .arg("-p")
                    .arg(&self.spec.prefix);
                cmd
            }
        };
        cmd.args(&req.packages);
        Ok(cmd)
    }
}

/// Check an install request's specs before anything runs: an option or an
/// invalid requirement refuses the whole request.
pub(crate) fn check_install(req: &InstallRequest) -> Result<(), ExecError> {
    if req.packages.is_empty() {
        return Err(ExecError::BadRequest(
            "packages must name at least one package".into(),
        ));
    }
    for spec in &req.packages {
        let checked = if spec.trim_start().starts_with('-') {
            Err("options are not accepted, only package requirements".to_string())
        } else {
            match req.manager {
                PackageManager::Pip => check_pip_spec(spec),
                PackageManager::Conda => check_conda_spec(spec),
            }
        };
        if let Err(reason) = checked {
            return Err(ExecError::BadRequest(format!(
                "package spec {spec:?} is refused: {reason}"
            )));
        }
    }
    Ok(())
}

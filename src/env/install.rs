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
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_CACHE_DIR",
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
        tool_command(program, worker_env(self.vars), self.base_dir)
    }

    /// Installed distributions as `importlib.metadata` sees them (name,
    /// version), sorted by name; what `pip freeze` would list.
    pub(crate) async fn distributions(&self) -> Result<Vec<PackageInfo>, String> {
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
        Ok(pairs
            .into_iter()
            .map(|(name, version)| PackageInfo { name, version })
            .collect())
    }
}

/// A helper command (installer, Conda) with the given variables only, plus
/// [`INSTALL_VARS`], a private `HOME` under `base_dir`, no stdin.
pub(crate) fn tool_command(
    program: &Path,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    base_dir: &Path,
) -> tokio::process::Command {
    let home = base_dir.join("home");
    let _ = std::fs::create_dir_all(&home);
    let mut cmd = tokio::process::Command::new(program);
    cmd.env_clear()
        .envs(vars)
        .envs(
            INSTALL_VARS
                .iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v))),
        )
        .env("HOME", &home)
        .env("TMPDIR", base_dir)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_INPUT", "1")
        .current_dir(&home);
    cmd
}

impl EnvCommands<'_> {
    /// Installed distributions (name, version), sorted by name: what
    /// `importlib.metadata` sees, plus the Conda packages of `conda-meta/`
    /// that are not Python distributions. Runs the env's interpreter with a
    /// fixed script. An error is why they cannot be listed.
    pub(crate) async fn packages(&self) -> Result<Vec<PackageInfo>, String> {
        let pairs = self.distributions().await?;
        let normal = |n: &str| n.to_ascii_lowercase().replace('_', "-");
        let mut packages: BTreeMap<String, PackageInfo> =
            pairs.into_iter().map(|p| (normal(&p.name), p)).collect();
        for (name, version) in conda_packages(&self.spec.prefix) {
            packages
                .entry(normal(&name))
                .or_insert(PackageInfo { name, version });
        }
        Ok(packages.into_values().collect())
    }

    /// The installer command of an already checked request: pip of the
    /// env's interpreter, `uv pip install --python`, or `conda` (any of
    /// conda, mamba, micromamba) on the env's prefix. Options come from the
    /// request's structured fields only; the items are argv items after
    /// `--`. `requirements` is the file holding the request's requirements
    /// text, if it has one.
    pub(crate) fn installer(
        &self,
        req: &InstallRequest,
        tool: &Installer,
        requirements: Option<&Path>,
    ) -> tokio::process::Command {
        let index_options = |cmd: &mut tokio::process::Command, pre: &[&str]| {
            if let Some(url) = &req.index_url {
                cmd.arg("--index-url").arg(url);
            }
            for url in &req.extra_index_urls {
                cmd.arg("--extra-index-url").arg(url);
            }
            for link in &req.find_links {
                cmd.arg("--find-links").arg(link);
            }
            if req.no_index {
                cmd.arg("--no-index");
            }
            if req.upgrade {
                cmd.arg("--upgrade");
            }
            if req.pre {
                cmd.args(pre);
            }
            if let Some(file) = requirements {
                cmd.arg("-r").arg(file);
            }
        };
        let mut cmd = match tool {
            Installer::Pip => {
                let mut cmd = self.command(&self.spec.python);
                cmd.args([
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                ]);
                index_options(&mut cmd, &["--pre"]);
                cmd.arg("--");
                cmd
            }
            Installer::Uv(uv) => {
                let mut cmd = self.command(uv);
                cmd.env("UV_PYTHON_DOWNLOADS", "never")
                    .env("UV_NO_PROGRESS", "1")
                    .args(["pip", "install", "--python"])
                    .arg(&self.spec.python);
                index_options(&mut cmd, &["--prerelease", "allow"]);
                cmd.arg("--");
                cmd
            }
            Installer::Conda(conda) => {
                let mut cmd = self.command(conda);
                cmd.arg("install")
                    .arg("-y")
                    .arg("-p")
                    .arg(&self.spec.prefix);
                cmd
            }
        };
        cmd.args(&req.packages);
        cmd
    }
}

/// The installer a request runs, resolved.
#[derive(Debug, Clone)]
pub(crate) enum Installer {
    /// `python -m pip` of the environment.
    Pip,
    /// This `uv`.
    Uv(std::path::PathBuf),
    /// This `conda`, `mamba` or `micromamba`.
    Conda(std::path::PathBuf),
}

impl Installer {
    /// The name results show.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Installer::Pip => "pip",
            Installer::Uv(_) => "uv",
            Installer::Conda(_) => "conda",
        }
    }

    /// The installer `manager` names, given the server's `uv` and `conda`.
    pub(crate) fn choose(
        manager: PackageManager,
        uv: Option<&Path>,
        conda: Option<&Path>,
    ) -> Result<Installer, ExecError> {
        match manager {
            PackageManager::Pip => Ok(Installer::Pip),
            PackageManager::Auto => Ok(uv.map_or(Installer::Pip, |uv| Installer::Uv(uv.into()))),
            PackageManager::Uv => uv.map(|uv| Installer::Uv(uv.into())).ok_or_else(|| {
                ExecError::BadRequest(
                    "manager \"uv\" needs a uv executable and none was found (put uv on the server's PATH or set the uv option)".into(),
                )
            }),
            PackageManager::Conda => conda.map(|c| Installer::Conda(c.into())).ok_or_else(|| {
                ExecError::BadRequest(
                    "manager \"conda\" needs a conda, mamba or micromamba executable and none was found (set CONDA_EXE or put one on PATH)".into(),
                )
            }),
        }
    }
}

/// Largest `requirements` text accepted.
const MAX_REQUIREMENTS_BYTES: usize = 1 << 20;

/// Longest URL accepted in an index option.
const MAX_URL_LEN: usize = 4096;

/// Check an install request before anything runs: an option, an invalid
/// requirement, a relative or missing path, a malformed URL refuses the
/// whole request with the reason.
pub(crate) fn check_install(req: &InstallRequest) -> Result<(), ExecError> {
    let bad = |what: String| Err(ExecError::BadRequest(what));
    let has_requirements = req
        .requirements
        .as_deref()
        .is_some_and(|r| !r.trim().is_empty());
    if req.packages.is_empty() && !has_requirements {
        return bad("packages or requirements must name at least one package".into());
    }
    if req.manager == PackageManager::Conda {
        let pip_only = [
            (req.requirements.is_some(), "requirements"),
            (req.index_url.is_some(), "index_url"),
            (!req.extra_index_urls.is_empty(), "extra_index_urls"),
            (!req.find_links.is_empty(), "find_links"),
            (req.no_index, "no_index"),
            (req.upgrade, "upgrade"),
            (req.pre, "pre"),
        ];
        if let Some((_, field)) = pip_only.iter().find(|(set, _)| *set) {
            return bad(format!(
                "{field} applies to pip and uv installs, not to manager \"conda\""
            ));
        }
    }
    for spec in &req.packages {
        let checked = if req.manager == PackageManager::Conda {
            if spec.trim_start().starts_with('-') {
                Err("options are not accepted, only package specs".to_string())
            } else {
                check_conda_spec(spec)
            }
        } else {
            check_pip_item(spec)
        };
        if let Err(reason) = checked {
            return bad(format!("package spec {spec:?} is refused: {reason}"));
        }
    }
    if let Some(text) = &req.requirements {
        if text.len() > MAX_REQUIREMENTS_BYTES {
            return bad(format!(
                "requirements is {} bytes, over the limit of {MAX_REQUIREMENTS_BYTES}",
                text.len()
            ));
        }
        for (number, line) in requirement_lines(text) {
            if let Err(reason) = check_pip_item(&line) {
                return bad(format!(
                    "requirements line {number} ({line:?}) is refused: {reason}"
                ));
            }
        }
    }
    if let Some(url) = &req.index_url {
        check_url("index_url", url, false)?;
    }
    for url in &req.extra_index_urls {
        check_url("extra_index_urls", url, false)?;
    }
    for link in &req.find_links {
        check_url("find_links", link, true)?;
    }
    Ok(())
}

/// The requirement lines of a requirements text, numbered from 1: `\`
/// continuations joined, comments (`#` at the start or after a blank) and
/// blank lines dropped.
pub(crate) fn requirement_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        if pending.is_empty() {
            start = i + 1;
        }
        let line = match raw.find('#') {
            Some(0) => "",
            Some(at) if raw[..at].ends_with(char::is_whitespace) => &raw[..at],
            _ => raw,
        };
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let item = pending.trim().to_string();
        pending.clear();
        if !item.is_empty() {
            out.push((start, item));
        }
    }
    let item = pending.trim().to_string();
    if !item.is_empty() {
        out.push((start, item));
    }
    out
}

/// Archive suffixes pip installs from a path or URL: wheels and sdists.
const ARCHIVES: &[&str] = &[".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip"];

/// One pip/uv item: a requirement (PEP 508, direct references included),
/// the URL of an archive, or the absolute path of an existing wheel or
/// sdist. Anything that looks like an option is refused.
pub(crate) fn check_pip_item(item: &str) -> Result<(), String> {
    let item = item.trim();
    if item.starts_with('-') {
        return Err("options are not accepted, only package requirements (use the request's index_url, extra_index_urls, find_links, no_index, upgrade and pre fields)".into());
    }
    if item.chars().any(char::is_control) {
        return Err("has a control character".into());
    }
    let archive = ARCHIVES
        .iter()
        .any(|x| item.to_ascii_lowercase().ends_with(x));
    if item.starts_with('/') {
        if !archive {
            return Err(format!(
                "is a path but not of a wheel or sdist (one of {})",
                ARCHIVES.join(", ")
            ));
        }
        if item.chars().any(char::is_whitespace) || item.split('/').any(|c| c == "..") {
            return Err("is a path with blanks or `..` in it".into());
        }
        let path = Path::new(item);
        return match path.metadata() {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err("is not a file".into()),
            Err(e) => Err(format!("cannot be read by the server: {e}")),
        };
    }
    if ["https://", "http://", "file://"]
        .iter()
        .any(|s| item.starts_with(s))
    {
        if !archive || item.chars().any(char::is_whitespace) {
            return Err("is a URL but not of a wheel or sdist".into());
        }
        return Ok(());
    }
    if item.starts_with('.') || item.contains('/') && !item.contains('@') {
        return Err("is a relative path: give the absolute path of a wheel or sdist".into());
    }
    check_pip_spec(item)
}

/// An index option's value: an `http(s)://` URL (`file://` or an absolute
/// folder too where `local` is allowed), no blanks, never an option.
fn check_url(field: &str, value: &str, local: bool) -> Result<(), ExecError> {
    let schemes: &[&str] = if local {
        &["https://", "http://", "file://"]
    } else {
        &["https://", "http://"]
    };
    let ok_scheme = schemes.iter().any(|s| value.starts_with(s))
        || (local && value.starts_with('/') && !value.split('/').any(|c| c == ".."));
    let ok = ok_scheme
        && value.len() <= MAX_URL_LEN
        && !value.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(ExecError::BadRequest(format!(
            "{field} value {value:?} is refused: give {}",
            if local {
                "an http(s):// or file:// URL or an absolute folder"
            } else {
                "an http(s):// URL"
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_text_is_split_into_items() {
        let text = "# pinned\nfoo==1.0  # why\n\nbar \\\n  >=2\nurl @ https://x/y.whl#sha256=abc\n";
        assert_eq!(
            requirement_lines(text),
            vec![
                (2, "foo==1.0".to_string()),
                (4, "bar   >=2".to_string()),
                (6, "url @ https://x/y.whl#sha256=abc".to_string()),
            ]
        );
    }

    #[test]
    fn pip_items_are_specs_urls_or_existing_archive_paths() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("pkg-1.0-py3-none-any.whl");
        std::fs::write(&wheel, "").unwrap();
        for good in [
            wheel.to_str().unwrap(),
            "https://example.org/pkg-1.0.tar.gz",
            "pkg @ https://example.org/pkg-1.0.tar.gz",
            "pkg==1.0",
        ] {
            assert!(
                check_pip_item(good).is_ok(),
                "{good}: {:?}",
                check_pip_item(good)
            );
        }
        let missing = dir.path().join("nope-1.0-py3-none-any.whl");
        for bad in [
            missing.to_str().unwrap(),
            "/etc/passwd",
            "./pkg-1.0.whl",
            "wheels/pkg-1.0.whl",
            "-rfile",
            "--index-url=https://evil",
            "https://example.org/",
            "pkg; $(id)",
            "pkg\n--pre",
        ] {
            assert!(check_pip_item(bad).is_err(), "{bad:?} accepted");
        }
    }
}

//! Creating, cloning, describing and deleting environments (`POST /envs`,
//! `GET /envs/{name}`, `DELETE /envs/{name}`). With Conda, `conda env
//! create -p PREFIX -f FILE`, `conda create -y -p PREFIX SPECS` or `conda
//! create -y -p PREFIX --clone SOURCE`; without it, a clone copies the
//! prefix (see [`clone_prefix`]). Then `pip` and `requirements` entries are
//! installed with the chosen installer. Every command is argv only, the
//! whole create is bounded by `create_timeout`, and a create that fails
//! removes what it made.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Executor;
use crate::api::{
    CreateEnvRequest, CreateEnvResult, CreateStep, DeleteEnvResult, EnvDetails, EnvLock,
    InstallRequest, PackageManager,
};
use crate::env::install::{
    EnvCommands, Installer, ProcessOutput, check_install, run_bounded, tool_command,
};
use crate::env::lifecycle::{
    Undeletable, check_env_name, clone_prefix, conda_explicit, links_to, undeletable,
};
use crate::env::packages::check_conda_spec;
use crate::env::{EnvKind, EnvSpec, activate::activate};
use crate::error::ExecError;

/// Where a long operation's progress goes (one line of text per event).
pub type Progress = tokio::sync::mpsc::UnboundedSender<String>;

/// Largest `environment_yml` accepted.
const MAX_YML_BYTES: usize = 1 << 20;

/// What a create builds from.
enum Source {
    Yml(String),
    Specs(Vec<String>),
    Clone(PathBuf),
}

fn say(progress: Option<&Progress>, line: String) {
    tracing::info!("{line}");
    if let Some(p) = progress {
        let _ = p.send(line);
    }
}

/// The tail of a command's output, for an error message.
fn tail(text: &str) -> String {
    let text = text.trim();
    let start = text
        .char_indices()
        .rev()
        .nth(1999)
        .map(|(i, _)| i)
        .unwrap_or(0);
    text[start..].to_string()
}

fn step(name: &str, out: ProcessOutput) -> Result<CreateStep, ExecError> {
    if out.timed_out {
        return Err(ExecError::CreateFailed(format!(
            "{name} did not finish within the create timeout"
        )));
    }
    if out.exit_code != 0 {
        return Err(ExecError::CreateFailed(format!(
            "{name} failed with exit status {}: {}",
            out.exit_code,
            tail(if out.stderr.trim().is_empty() {
                &out.stdout
            } else {
                &out.stderr
            })
        )));
    }
    Ok(CreateStep {
        step: name.into(),
        exit_code: out.exit_code,
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

/// An env create's or delete's outcome in its record: `ok`, or `error`
/// with the error's code and status.
fn audit_outcome<T>(r: &mut crate::audit::Record, done: &Result<T, ExecError>) {
    match done {
        Ok(_) => r.outcome = Some("ok"),
        Err(err) => {
            r.outcome = Some("error");
            r.error = Some(err.code());
            r.status = Some(err.status());
        }
    }
}

impl Executor {
    /// Create an environment (see the module); it is served at once. The
    /// attempt, made or failed, leaves an `env_create` audit record.
    pub async fn create_env(
        &self,
        req: CreateEnvRequest,
        progress: Option<&Progress>,
    ) -> Result<CreateEnvResult, ExecError> {
        let started = Instant::now();
        let name = req.name.clone();
        let packages: Vec<String> = req.specs.iter().chain(&req.pip).cloned().collect();
        let created = self.create_new_env(req, progress).await;
        self.audit_record(crate::audit::RecordKind::EnvCreate, |r| {
            r.env = Some(name);
            r.packages = (!packages.is_empty()).then_some(packages);
            r.wall_ms = Some((started.elapsed().as_secs_f64() * 1e6).round() / 1e3);
            r.env_hash = created.as_ref().ok().map(|done| done.env_hash.clone());
            audit_outcome(r, &created);
        });
        created
    }

    /// Delete an environment (see [`Executor::delete_unaudited`]), leaving
    /// an `env_delete` audit record, done or refused.
    pub async fn delete_env(&self, name: &str, force: bool) -> Result<DeleteEnvResult, ExecError> {
        self.reserve_records(1)?;
        let hash = self
            .audit()
            .enabled()
            .then(|| self.audit_env_hash(Some(name)))
            .flatten();
        let deleted = self.delete_unaudited(name, force).await;
        self.audit_record(crate::audit::RecordKind::EnvDelete, |r| {
            let env = deleted.as_ref().map_or(name, |d| d.name.as_str());
            r.env = Some(env.to_string());
            r.env_hash = hash;
            audit_outcome(r, &deleted);
        });
        deleted
    }

    /// [`Executor::create_env`] before its record.
    async fn create_new_env(
        &self,
        req: CreateEnvRequest,
        progress: Option<&Progress>,
    ) -> Result<CreateEnvResult, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        let started = Instant::now();
        check_env_name(&req.name).map_err(ExecError::BadRequest)?;
        let sources = [
            req.environment_yml.is_some(),
            !req.specs.is_empty(),
            req.clone.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() != 1 {
            return Err(ExecError::BadRequest(
                "give exactly one of environment_yml, specs and clone".into(),
            ));
        }
        for spec in &req.specs {
            if spec.trim_start().starts_with('-') {
                return Err(ExecError::BadRequest(format!(
                    "spec {spec:?} is refused: options are not accepted, only Conda match specs"
                )));
            }
            check_conda_spec(spec)
                .map_err(|why| ExecError::BadRequest(format!("spec {spec:?} is refused: {why}")))?;
        }
        if let Some(yml) = &req.environment_yml
            && yml.len() > MAX_YML_BYTES
        {
            return Err(ExecError::TooLarge(format!(
                "environment_yml is {} bytes, over the limit of {MAX_YML_BYTES}",
                yml.len()
            )));
        }
        let pip = InstallRequest {
            packages: req.pip.clone(),
            requirements: req.requirements.clone(),
            manager: req.manager,
            ..InstallRequest::default()
        };
        let has_pip = !pip.packages.is_empty() || pip.requirements.is_some();
        if req.manager == PackageManager::Conda {
            return Err(ExecError::BadRequest(
                "manager installs the pip and requirements entries: pip, uv or auto (Conda packages go in specs or environment_yml)".into(),
            ));
        }
        if has_pip {
            check_install(&pip)?;
        }
        let installer = Installer::choose(req.manager, self.uv.as_deref(), None)?;
        let conda = self.envs.conda();
        let source = match (&req.environment_yml, &req.clone) {
            (Some(yml), _) => Source::Yml(yml.clone()),
            (None, Some(name)) => {
                self.find_env(Some(name)).await;
                let from = self.env_entry(Some(name))?;
                if from.spec.kind == EnvKind::Python {
                    return Err(ExecError::BadRequest(format!(
                        "environment {:?} is a plain interpreter, not a prefix: only Conda environments and venvs can be cloned",
                        from.spec.name
                    )));
                }
                Source::Clone(from.spec.prefix.clone())
            }
            (None, None) => Source::Specs(req.specs.clone()),
        };
        if conda.is_none() && !matches!(source, Source::Clone(_)) {
            return Err(ExecError::BadRequest(
                "creating an environment from an environment.yml or Conda specs needs Conda (conda, mamba or micromamba) and this server has none: set CONDA_EXE or put one on PATH, or clone an existing environment".into(),
            ));
        }
        let _one_at_a_time = self.create_lock.lock().await;
        self.envs.rescan_for_miss().await;
        if self.env_entry(Some(&req.name)).is_ok() {
            return Err(ExecError::Conflict(format!(
                "an environment named {:?} exists; delete it first or choose another name",
                req.name
            )));
        }
        let dir = self.envs.placement().ok_or_else(|| {
            ExecError::BadRequest(
                "this server has no writable folder for new environments: start it with --envs-dir DIR".into(),
            )
        })?;
        let prefix = dir.join(&req.name);
        if std::fs::symlink_metadata(&prefix).is_ok() {
            return Err(ExecError::Conflict(format!(
                "{} exists on disk; remove it or choose another name",
                prefix.display()
            )));
        }
        let _creating = self.envs.creating(&prefix);
        say(
            progress,
            format!(
                "creating environment {:?} at {}",
                req.name,
                prefix.display()
            ),
        );
        let deadline = started + self.create_timeout;
        let work = self.create_steps(
            &req,
            &prefix,
            source,
            conda.as_deref(),
            &installer,
            &pip,
            has_pip,
            deadline,
            progress,
        );
        let outcome = match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(outcome) => outcome,
            Err(_) => Err(ExecError::CreateFailed(format!(
                "the create did not finish within create_timeout ({:?})",
                self.create_timeout
            ))),
        };
        let (steps, installed, spec) = match outcome {
            Ok(done) => done,
            Err(e) => {
                say(
                    progress,
                    format!("create failed; removing {}", prefix.display()),
                );
                let doomed = prefix.clone();
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(doomed)).await;
                return Err(e);
            }
        };
        let entry = self.envs.add_created(spec).await;
        say(
            progress,
            format!("environment {:?} is served", entry.spec.name),
        );
        Ok(CreateEnvResult {
            name: entry.spec.name.clone(),
            prefix: entry.spec.prefix.display().to_string(),
            python_version: entry.facts.python_version.clone(),
            env_hash: entry.hash().to_string(),
            steps,
            installed,
            duration_secs: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        })
    }

    /// The commands of one create, in order.
    #[allow(clippy::too_many_arguments)]
    async fn create_steps(
        &self,
        req: &CreateEnvRequest,
        prefix: &Path,
        source: Source,
        conda: Option<&Path>,
        installer: &Installer,
        pip: &InstallRequest,
        has_pip: bool,
        deadline: Instant,
        progress: Option<&Progress>,
    ) -> Result<(Vec<CreateStep>, Vec<String>, EnvSpec), ExecError> {
        let base = self.base_dir.path();
        let left = || deadline.saturating_duration_since(Instant::now());
        let server_path = [("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())];
        let mut steps = Vec::new();
        // Kept until the create ends: the environment.yml conda reads.
        let mut _yml_file = None;
        let (name, cmd) = match (source, conda) {
            (Source::Clone(from), None) => {
                say(
                    progress,
                    format!("copying {} (hard links where possible)", from.display()),
                );
                let (src, dst) = (from.clone(), prefix.to_path_buf());
                let stats = tokio::task::spawn_blocking(move || clone_prefix(&src, &dst))
                    .await
                    .map_err(|e| ExecError::EnvFiles(std::io::Error::other(e)))?
                    .map_err(ExecError::EnvFiles)?;
                steps.push(CreateStep {
                    step: "copy".into(),
                    exit_code: 0,
                    stdout: format!(
                        "copied {} to {}: {} files hard-linked, {} copied, {} symbolic links\n",
                        from.display(),
                        prefix.display(),
                        stats.linked,
                        stats.copied,
                        stats.symlinks
                    ),
                    stderr: String::new(),
                });
                (None, None)
            }
            (source, Some(conda)) => {
                let mut cmd = tool_command(conda, server_path.clone(), base);
                let name = match source {
                    Source::Yml(text) => {
                        let file = tempfile::Builder::new()
                            .prefix("environment-")
                            .suffix(".yml")
                            .tempfile_in(base)
                            .map_err(ExecError::EnvFiles)?;
                        std::fs::write(file.path(), text).map_err(ExecError::EnvFiles)?;
                        cmd.args(["env", "create", "-p"])
                            .arg(prefix)
                            .arg("-f")
                            .arg(file.path());
                        _yml_file = Some(file.into_temp_path());
                        "conda env create"
                    }
                    Source::Specs(specs) => {
                        cmd.args(["create", "-y", "-p"]).arg(prefix).args(specs);
                        "conda create"
                    }
                    Source::Clone(from) => {
                        cmd.args(["create", "-y", "-p"])
                            .arg(prefix)
                            .arg("--clone")
                            .arg(from);
                        "conda create --clone"
                    }
                };
                (Some(name), Some(cmd))
            }
            (_, None) => unreachable!("checked: without Conda only clones are made"),
        };
        if let (Some(name), Some(cmd)) = (name, cmd) {
            say(progress, format!("running {name}"));
            let out = run_bounded(cmd, left())
                .await
                .map_err(ExecError::EnvFiles)?;
            steps.push(step(name, out)?);
        }
        let spec = EnvSpec::from_prefix(prefix, Some(&req.name)).map_err(|e| {
            ExecError::CreateFailed(format!(
                "the new environment has no interpreter ({e}); does it install python?"
            ))
        })?;
        let mut installed = Vec::new();
        if has_pip {
            let vars = activate(&spec.prefix, &spec.activation, self.activation_timeout)
                .await
                .map_err(|why| {
                    ExecError::CreateFailed(format!("activating the new environment failed: {why}"))
                })?;
            let commands = EnvCommands {
                spec: &spec,
                vars: &vars,
                base_dir: base,
            };
            let requirements = match &pip.requirements {
                Some(text) => {
                    let file = tempfile::Builder::new()
                        .prefix("requirements-")
                        .suffix(".txt")
                        .tempfile_in(base)
                        .map_err(ExecError::EnvFiles)?;
                    std::fs::write(file.path(), text).map_err(ExecError::EnvFiles)?;
                    Some(file.into_temp_path())
                }
                None => None,
            };
            let before = commands.packages().await.unwrap_or_default();
            let name = match installer {
                Installer::Uv(_) => "uv pip install",
                _ => "pip install",
            };
            say(progress, format!("running {name}"));
            let cmd = commands.installer(pip, installer, requirements.as_deref());
            let out = run_bounded(cmd, left())
                .await
                .map_err(ExecError::Installer)?;
            steps.push(step(name, out)?);
            let after = commands.packages().await.unwrap_or_default();
            installed = after
                .into_iter()
                .filter(|p| !before.contains(p))
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
        }
        Ok((steps, installed, spec))
    }

    /// Delete an environment: it is no longer served (its pool drains) and
    /// its prefix is removed, with its line in `environments.txt` and the
    /// symbolic links it was found through (see [`links_to`]). Only
    /// Conda prefixes can be deleted, never Conda's root nor a prefix that
    /// holds another environment (see [`undeletable`]); the default
    /// environment, or one with live sessions, only with `force` (which
    /// closes the sessions).
    async fn delete_unaudited(
        &self,
        name: &str,
        force: bool,
    ) -> Result<DeleteEnvResult, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        let _one_at_a_time = self.create_lock.lock().await;
        self.find_env(Some(name)).await;
        let entry = self.env_entry(Some(name))?;
        if entry.spec.kind != EnvKind::Conda {
            return Err(ExecError::BadRequest(format!(
                "environment {:?} is a {}, not a Conda environment: only Conda environments can be deleted",
                entry.spec.name,
                entry.spec.kind.as_str()
            )));
        }
        let table = self.envs.table();
        let listed = self.envs.environments_txt();
        let mut others: Vec<PathBuf> = table
            .entries
            .iter()
            .chain([&table.default])
            .filter(|e| e.id != entry.id)
            .map(|e| e.spec.prefix.clone())
            .collect();
        let (prefix, roots) = (entry.spec.prefix.clone(), self.envs.roots());
        let refusal = tokio::task::spawn_blocking(move || {
            others.extend(listed.iter().flat_map(|txt| {
                std::fs::read_to_string(txt)
                    .unwrap_or_default()
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(PathBuf::from)
                    .collect::<Vec<_>>()
            }));
            undeletable(&prefix, &roots, &others)
        })
        .await
        .map_err(|e| ExecError::EnvFiles(std::io::Error::other(e)))?;
        match refusal {
            None => {}
            Some(Undeletable::Root) => {
                return Err(ExecError::Conflict(format!(
                    "environment {:?} is Conda's root installation and cannot be deleted",
                    entry.spec.name
                )));
            }
            Some(Undeletable::Holds(inner)) => {
                let served = table.entries.iter().find(|e| e.spec.prefix == inner);
                let what = match served {
                    Some(e) => format!("environment {:?} ({})", e.spec.name, inner.display()),
                    None => format!("the environment at {}", inner.display()),
                };
                return Err(ExecError::Conflict(format!(
                    "environment {:?} holds {what} and cannot be deleted",
                    entry.spec.name
                )));
            }
        }
        let is_default = entry.id == table.default.id;
        if is_default && !force {
            return Err(ExecError::Conflict(format!(
                "environment {:?} is the default environment; pass force=true to delete it anyway",
                entry.spec.name
            )));
        }
        let sessions = self.sessions.in_env(entry.id);
        if !sessions.is_empty() && !force {
            return Err(ExecError::Conflict(format!(
                "environment {:?} is used by {} session(s); close them or pass force=true",
                entry.spec.name,
                sessions.len()
            )));
        }
        for id in &sessions {
            let _ = self.sessions.close(id, None);
        }
        self.envs.remove(entry.id);
        let prefix = entry.spec.prefix.clone();
        let listed = self.envs.environments_txt();
        let envs_dirs = self.envs.envs_dirs();
        tokio::task::spawn_blocking(move || {
            // Found before the prefix goes: a link to it then resolves.
            let lines: Vec<PathBuf> = listed
                .iter()
                .flat_map(|txt| {
                    std::fs::read_to_string(txt)
                        .unwrap_or_default()
                        .lines()
                        .map(|l| PathBuf::from(l.trim()))
                        .collect::<Vec<_>>()
                })
                .collect();
            let links = links_to(&prefix, &envs_dirs, &lines);
            // The prefix is canonical: the environment's own folder, never a
            // link to it.
            std::fs::remove_dir_all(&prefix)?;
            // The environment is gone with its prefix: a link that stays
            // is told of, and environments.txt is still brought up to date.
            for link in &links {
                match std::fs::remove_file(link) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(link = %link.display(), "a link to a deleted environment could not be removed: {e}");
                    }
                    _ => {}
                }
            }
            if let Some(txt) = listed
                && let Ok(text) = std::fs::read_to_string(&txt)
            {
                let kept: Vec<&str> = text
                    .lines()
                    .map(|l| (l, Path::new(l.trim())))
                    .filter(|(_, p)| *p != prefix && !links.iter().any(|link| link == p))
                    .map(|(l, _)| l)
                    .collect();
                let mut out = kept.join("\n");
                if !out.is_empty() {
                    out.push('\n');
                }
                if out != text {
                    std::fs::write(&txt, out)?;
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| ExecError::EnvFiles(std::io::Error::other(e)))?
        .map_err(ExecError::EnvFiles)?;
        tracing::info!(env = %entry.spec.name, prefix = %entry.spec.prefix.display(), "environment deleted");
        Ok(DeleteEnvResult {
            name: entry.spec.name.clone(),
            prefix: entry.spec.prefix.display().to_string(),
            sessions_closed: sessions.len(),
        })
    }

    /// An environment as `/list-envs` shows it, with its packages and lock.
    pub async fn env_details(&self, name: &str) -> Result<EnvDetails, ExecError> {
        self.find_env(Some(name)).await;
        let entry = self.available_entry(Some(name))?;
        let info = self
            .list_envs()
            .into_iter()
            .find(|e| e.name == entry.spec.name)
            .ok_or_else(|| ExecError::UnknownEnv {
                name: name.into(),
                known: String::new(),
            })?;
        let commands = self.commands(&entry);
        let unavailable = |reason| ExecError::EnvUnavailable {
            env: entry.spec.name.clone(),
            reason,
        };
        let packages = commands.packages().await.map_err(unavailable)?;
        let distributions = commands.distributions().await.map_err(unavailable)?;
        let requirements_txt: String = distributions
            .iter()
            .map(|p| format!("{}=={}\n", p.name, p.version))
            .collect();
        Ok(EnvDetails {
            env: info,
            packages,
            lock: EnvLock {
                requirements_txt,
                conda_explicit: conda_explicit(&entry.spec.prefix),
            },
        })
    }
}

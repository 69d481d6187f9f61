//! Every environment the server serves: the configured ones (command line,
//! `[[envs]]` tables, or the automatic default) and the discovered Conda
//! environments, each under a unique name.
//!
//! Naming follows Conda: `base` for the root prefix, else the prefix's folder
//! name. Configured names win; a discovered env whose name is taken gets
//! `NAME-2`, `NAME-3`, ... in discovery order (root first, then the members
//! of the `envs/` folders, then other prefixes, by path within each), which
//! is deterministic: a rescan names what it finds as a start would. Each
//! clash is in [`Registry::clashes`] for the caller to log.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use std::time::Duration;

use super::discover::{Discovered, discover, find_conda};
use super::{EnvChoice, EnvSpec, HostEnv, name_of};
use crate::error::ConfigError;
use crate::protocol::WireLimits;

/// Execution settings of one environment.
#[derive(Debug, Clone)]
pub struct EnvSettings {
    /// Workers kept warm (configured envs) or at most started (lazy envs).
    pub pool_size: usize,
    /// Modules every worker imports before it serves.
    pub preload: Vec<String>,
    /// Whether each worker's zygote maps its memory with huge pages.
    pub huge_pages: bool,
    /// Default wall-clock timeout of a run, seconds.
    pub timeout: f64,
    /// Largest timeout a request may ask for, seconds.
    pub max_timeout: f64,
    /// Limits every run of the environment gets.
    pub run_limits: WireLimits,
    /// The workers' network.
    pub network: crate::sandbox::Network,
    /// Hosts runs may reach through the egress proxy (checked when the
    /// configuration is read); empty: none, and no proxy.
    pub allowed_hosts: Vec<String>,
    /// Size of each worker's scratch tmpfs.
    pub disk_bytes: u64,
}

/// An environment configured by an `[[envs]]` table, resolved.
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// Name in requests; derived from the prefix when absent.
    pub name: Option<String>,
    /// Where the environment is.
    pub location: EnvChoice,
    /// The environment used when a request names none.
    pub default: bool,
    /// Its pool size, timeouts, limits, network and scratch quota.
    pub settings: EnvSettings,
}

/// What building the registry reads from the configuration.
#[derive(Debug, Clone)]
pub struct RegistryConfig<'a> {
    /// What discovery reads from the server's environment.
    pub host: &'a HostEnv,
    /// Whether Conda environments are discovered.
    pub discover: bool,
    /// Bound on each Conda query during discovery.
    pub query_timeout: Duration,
    /// The default environment the flags, variables or file chose.
    pub env: &'a EnvChoice,
    /// Settings of the default environment (and of discovered ones).
    pub defaults: EnvSettings,
    /// The `[[envs]]` tables.
    pub envs: &'a [EnvConfig],
    /// Cap on live workers across all pools.
    pub max_workers: usize,
}

/// One environment the server will serve.
#[derive(Debug, Clone)]
pub(crate) struct EnvPlan {
    pub spec: EnvSpec,
    pub settings: EnvSettings,
    /// Configured envs are pre-warmed and kept warm; discovered ones start
    /// on first use and shrink back when idle.
    pub configured: bool,
}

/// The environments and which one serves requests that name none.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    pub envs: Vec<EnvPlan>,
    /// Index into `envs`.
    pub default: usize,
    /// The Conda front end found (for `conda install`).
    pub conda: Option<PathBuf>,
    /// Conda's root prefix (`base`), when discovery found one: never deleted.
    pub root: Option<PathBuf>,
    /// Where environments appear: the `envs_dirs` (first the root's) and
    /// `~/.conda/environments.txt`; watched for rescans, and the first
    /// writable `envs_dirs` entry is where new environments go.
    pub envs_dirs: Vec<PathBuf>,
    /// `~/.conda/environments.txt`, when there is a home.
    pub environments_txt: Option<PathBuf>,
    /// Discovered environments served under another name than Conda's,
    /// because an environment before them holds it.
    pub clashes: Vec<Clash>,
}

/// A discovered environment whose Conda name was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Clash {
    /// Conda's name of it (the folder's, or `base`).
    pub name: String,
    /// The name it is served under instead.
    pub served_as: String,
    /// The prefix that lost the name.
    pub prefix: PathBuf,
    /// The prefix that holds the name (none when it is held by an
    /// environment no scan finds).
    pub winner: Option<PathBuf>,
}

impl Clash {
    /// Tell the operator, once per clash.
    pub(crate) fn warn(&self) {
        let winner = self
            .winner
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "another environment".into());
        tracing::warn!(
            prefix = %self.prefix.display(),
            "environment name {:?} is taken by {winner}; serving this one as {:?}",
            self.name,
            self.served_as
        );
    }
}

impl Registry {
    /// Discover (unless disabled), resolve the configured environments and
    /// name everything. Fails when a configured environment cannot be found.
    pub(crate) async fn build(config: &RegistryConfig<'_>) -> Result<Registry, ConfigError> {
        let host = config.host;
        let found = if config.discover {
            discover(host, config.query_timeout).await
        } else {
            Discovered {
                conda: find_conda(host),
                ..Discovered::default()
            }
        };
        let root = found.root.clone();
        let candidates: Vec<(String, PathBuf)> = found
            .prefixes
            .iter()
            .filter(|p| super::python_in(p).is_some())
            .map(|p| (conda_name(p, root.as_deref()), p.clone()))
            .collect();
        let resolve = |choice: &EnvChoice, name: Option<&str>| -> Result<EnvSpec, ConfigError> {
            match choice {
                EnvChoice::Python(python) => EnvSpec::from_interpreter(python, name),
                EnvChoice::CondaPrefix(prefix) => {
                    let canonical = prefix.canonicalize().unwrap_or_else(|_| prefix.clone());
                    let derived = conda_name(&canonical, root.as_deref());
                    EnvSpec::from_prefix(prefix, Some(name.unwrap_or(&derived)))
                }
                EnvChoice::CondaEnv(wanted) => {
                    let (_, prefix) =
                        candidates
                            .iter()
                            .find(|(n, _)| n == wanted)
                            .ok_or_else(|| ConfigError::UnknownCondaEnv {
                                name: wanted.clone(),
                                found: names(candidates.iter().map(|(n, _)| n.as_str())),
                            })?;
                    EnvSpec::from_prefix(prefix, Some(name.unwrap_or(wanted)))
                }
                EnvChoice::Default => auto_default(host, &candidates),
            }
        };

        let global = config.defaults.clone();
        let mut envs = Vec::new();
        if *config.env != EnvChoice::Default || config.envs.is_empty() {
            envs.push(EnvPlan {
                spec: resolve(config.env, None)?,
                settings: global.clone(),
                configured: true,
            });
        }
        let flagged = envs.len();
        for table in config.envs {
            envs.push(EnvPlan {
                spec: resolve(&table.location, table.name.as_deref())?,
                settings: table.settings.clone(),
                configured: true,
            });
        }
        let default = if flagged == 1 {
            0
        } else {
            config.envs.iter().position(|t| t.default).unwrap_or(0)
        };

        let mut taken = HashSet::new();
        let mut prefixes = HashSet::new();
        for env in &envs {
            if !taken.insert(env.spec.name.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "two configured environments are named {:?}; give one a `name`",
                    env.spec.name
                )));
            }
            prefixes.insert(env.spec.prefix.clone());
        }
        let workers: usize = envs.iter().map(|e| e.settings.pool_size).sum();
        if workers > config.max_workers {
            return Err(ConfigError::Invalid(format!(
                "the configured environments keep {workers} workers warm, over max_workers = {}",
                config.max_workers
            )));
        }

        for (name, prefix) in candidates {
            if prefixes.contains(&prefix) {
                continue;
            }
            let spec = match EnvSpec::from_prefix(&prefix, Some(&name)) {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::debug!("skipping discovered environment: {e}");
                    continue;
                }
            };
            prefixes.insert(prefix);
            envs.push(EnvPlan {
                spec,
                settings: global.clone(),
                configured: false,
            });
        }
        let mut envs_dirs = found.envs_dirs.clone();
        if let Some(root) = &found.root
            && !envs_dirs.contains(&root.join("envs"))
        {
            envs_dirs.insert(0, root.join("envs"));
        }
        let mut registry = Registry {
            envs,
            default,
            conda: found.conda,
            root: found.root,
            envs_dirs,
            environments_txt: host
                .home
                .as_ref()
                .map(|h| h.join(".conda/environments.txt")),
            clashes: Vec::new(),
        };
        registry.name_discovered(&HashSet::new());
        Ok(registry)
    }

    /// Name the discovered environments: Conda's name where it is free,
    /// else `NAME-2`, `NAME-3`, ... in discovery order, after the
    /// configured names and `reserved` (names served elsewhere that no scan
    /// finds). The same scan always gives the same names, whenever it runs.
    pub(crate) fn name_discovered(&mut self, reserved: &HashSet<String>) {
        let mut taken: HashMap<String, Option<PathBuf>> = reserved
            .iter()
            .map(|n| (n.clone(), None))
            .chain(
                self.envs
                    .iter()
                    .filter(|e| e.configured)
                    .map(|e| (e.spec.name.clone(), Some(e.spec.prefix.clone()))),
            )
            .collect();
        self.clashes.clear();
        for env in self.envs.iter_mut().filter(|e| !e.configured) {
            let name = conda_name(&env.spec.prefix, self.root.as_deref());
            let unique = match taken.get(&name) {
                None => name.clone(),
                Some(winner) => {
                    let unique = (2..)
                        .map(|i| format!("{name}-{i}"))
                        .find(|n| !taken.contains_key(n))
                        .expect("an unused suffix exists");
                    self.clashes.push(Clash {
                        name: name.clone(),
                        served_as: unique.clone(),
                        prefix: env.spec.prefix.clone(),
                        winner: winner.clone(),
                    });
                    unique
                }
            };
            if env.spec.name != unique {
                env.spec.rename(unique.clone());
            }
            taken.insert(unique, Some(env.spec.prefix.clone()));
        }
    }

    /// A table of the environments, as `code-executor envs` prints it:
    /// name, kind, Python version, default, prefix.
    pub(crate) async fn describe(&self) -> String {
        let versions = futures_util::future::join_all(self.envs.iter().map(|e| async {
            match e.spec.python_version_hint() {
                Some(v) => v,
                None => probe_version(&e.spec.python)
                    .await
                    .unwrap_or_else(|| "?".into()),
            }
        }))
        .await;
        let width = self
            .envs
            .iter()
            .map(|e| e.spec.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let mut out = format!(
            "{:<width$}  {:<6}  {:<8}  {:<7}  PREFIX\n",
            "NAME", "KIND", "PYTHON", "DEFAULT"
        );
        for (i, (env, version)) in self.envs.iter().zip(versions).enumerate() {
            out.push_str(&format!(
                "{:<width$}  {:<6}  {:<8}  {:<7}  {}\n",
                env.spec.name,
                env.spec.kind.as_str(),
                version,
                if i == self.default { "*" } else { "" },
                env.spec.prefix.display()
            ));
        }
        out
    }
}

/// `platform.python_version()` of an interpreter (bounded to 10 s).
pub(crate) async fn probe_version(python: &Path) -> Option<String> {
    let child = tokio::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import platform; print(platform.python_version())",
        ])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let out = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait_with_output())
        .await
        .ok()?
        .ok()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !version.is_empty()).then_some(version)
}

/// With nothing configured: the active Conda env, else Conda's base env,
/// else `python3` on `PATH` (named `default`).
fn auto_default(host: &HostEnv, candidates: &[(String, PathBuf)]) -> Result<EnvSpec, ConfigError> {
    if let Some(active) = &host.conda_prefix {
        let canonical = active.canonicalize().unwrap_or_else(|_| active.clone());
        let name = candidates
            .iter()
            .find(|(_, p)| *p == canonical)
            .map(|(n, _)| n.clone());
        return EnvSpec::from_prefix(active, name.as_deref());
    }
    if let Some((name, prefix)) = candidates.iter().find(|(n, _)| n == "base") {
        return EnvSpec::from_prefix(prefix, Some(name));
    }
    let python3 = host.which("python3").ok_or_else(|| {
        ConfigError::NoInterpreter(
            "no active Conda environment, no Conda base environment and no python3 on PATH".into(),
        )
    })?;
    EnvSpec::from_interpreter(&python3, Some("default"))
}

fn conda_name(prefix: &Path, root: Option<&Path>) -> String {
    if Some(prefix) == root {
        "base".into()
    } else {
        name_of(prefix)
    }
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let list: Vec<&str> = names.collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

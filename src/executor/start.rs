//! Starting the executor: find the environments, activate each once, start
//! the pools of the configured ones.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use super::envs::{EnvEntry, EnvTable, LiveEnvs, PoolContext, entry, make_entries};
use super::{Executor, pace};
use crate::config::Config;
use crate::egress::{PROXY_PORT, Policy, ProxyContext};
use crate::env::Registry;
use crate::env::registry::EnvPlan;
use crate::error::StartError;
use crate::error::error_chain;
use crate::metrics::Metrics;
use crate::pool::WorkerBudget;
use crate::replica::Replica;
use crate::sandbox::{Sandbox, SandboxStatus};
use crate::session::Sessions;
use crate::worker::EgressSpec;

/// The bootstrap every worker runs, embedded in the binary.
pub const WORKER_SCRIPT: &str = include_str!("../../python/worker.py");

/// Remove what servers killed without a chance to clean up (SIGKILL, a
/// crash) left in `tmp`: their bootstrap and workers' scratch roots. Only
/// directories of this pid namespace's servers that are gone are touched.
fn remove_stale_base_dirs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(crate::sandbox::cgroup::is_stale_server_dir);
        if stale && entry.file_type().is_ok_and(|t| t.is_dir()) {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => {
                    tracing::info!(dir = %entry.path().display(), "removed the temporary directory of a server that is gone")
                }
                Err(e) => {
                    tracing::warn!(dir = %entry.path().display(), "cannot remove the temporary directory of a server that is gone: {e}")
                }
            }
        }
    }
}

/// `/health`'s account of the sandbox: what is enforced and the rlimits
/// every run gets. Each env's scratch quota is added when `/health` is
/// asked, from the environments served then.
fn sandbox_status(sandbox: Option<&Sandbox>, envs: &[Arc<EnvEntry>]) -> SandboxStatus {
    let mut status = sandbox.map(|s| s.status.clone()).unwrap_or_default();
    if sandbox.is_none() {
        status.memory = "rlimit_as";
    }
    if envs.iter().any(|e| e.egress.is_some()) {
        // Only the allow-listed hosts, through the proxy in each worker's
        // network namespace.
        status.mechanisms.push("egress_proxy".into());
    }
    status.rlimits = ["cpu", "memory", "file_size", "open_files", "processes"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    status
}

impl Executor {
    /// Find the environments, activate each once, start the pools of the
    /// configured ones and wait until they are warm. Discovered environments
    /// start their pools on first use. Fails only when the default
    /// environment cannot start a worker.
    pub async fn start(config: &Config) -> Result<Executor, StartError> {
        Self::start_with(config, true).await
    }

    /// [`Executor::start`] that returns before the pools are warm: they
    /// fill in the background, and a request meanwhile waits for its pool's
    /// first worker. What a client that starts its server per session (MCP
    /// over stdio) waits for is then one worker's start, not the whole pool's.
    pub async fn start_warming(config: &Config) -> Result<Executor, StartError> {
        Self::start_with(config, false).await
    }

    async fn start_with(config: &Config, wait_for_warm: bool) -> Result<Executor, StartError> {
        // The host's probe (a launcher start) and the environments' lookup
        // (which may start an interpreter) run side by side: both are on the
        // path to the first worker.
        // The global network is some env's when an env takes the global
        // settings: the default one, or discovered ones.
        let global = config.envs.is_empty()
            || config.env != crate::config::EnvChoice::Default
            || config.discover;
        let networks: Vec<_> = global
            .then_some(config.sandbox.network)
            .into_iter()
            .chain(config.envs.iter().map(|e| e.settings.network))
            .collect();
        let sandbox_config = config.sandbox.clone();
        let probe = tokio::spawn(async move { Sandbox::probe(&sandbox_config, &networks).await });
        let registry = Registry::build(&config.registry()).await?;
        let sandbox = probe.await.map_err(StartError::Probe)??;
        // Off the start's path: the first worker need not wait for it.
        let _ = std::thread::Builder::new()
            .name("stale-dirs".into())
            .spawn(|| remove_stale_base_dirs(&std::env::temp_dir()));
        let base_dir = tempfile::Builder::new()
            .prefix(&format!(
                "{}.",
                crate::sandbox::cgroup::own_server_dir_name()
            ))
            .tempdir()
            .map_err(StartError::TempDir)?;
        if sandbox.as_ref().and_then(Sandbox::owner).is_some() {
            // Workers running as another user must reach their scratch roots
            // (each is theirs alone) and read the bootstrap.
            std::fs::set_permissions(base_dir.path(), std::fs::Permissions::from_mode(0o711))
                .map_err(StartError::TempDir)?;
        }
        let script = match &config.worker_script {
            Some(path) => path.clone(),
            None => {
                let path = base_dir.path().join("worker.py");
                std::fs::write(&path, WORKER_SCRIPT).map_err(|source| StartError::Bootstrap {
                    path: path.clone(),
                    source,
                })?;
                path
            }
        };
        // The compiled bootstrap: staged where workers may read it, and kept
        // in the cache folder across starts.
        let code_dirs = config.worker_script.is_none().then(|| {
            let staged = base_dir.path().join("bootstrap");
            std::fs::create_dir(&staged)
                .and_then(|()| {
                    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
                })
                .ok()?;
            let kept = config
                .cache_dir
                .as_deref()
                .and_then(crate::worker::prepare_cache_dir);
            Some((staged, kept))
        });
        let budget = WorkerBudget::new(config.max_workers);
        let pools = PoolContext {
            script: script.clone(),
            custom_script: config.worker_script.is_some(),
            base_dir: base_dir.path().to_path_buf(),
            sandbox: sandbox.clone(),
            budget: budget.clone(),
            code_dirs: code_dirs.flatten(),
        };
        let plans = registry.envs.clone();
        // An allow-list that cannot be enforced refuses the start.
        for plan in &plans {
            egress_of(plan, sandbox.as_ref(), config)?;
        }
        let count = plans.len();
        let pending = make_entries(
            config,
            &pools,
            plans.into_iter().enumerate().collect(),
            &Default::default(),
        )
        .await;
        let replica = Arc::new(Replica::new(config.replica_id.clone()));
        let sessions = Sessions::start(config.sessions.clone(), config.grace_period, replica.id());
        let metrics = Arc::new(
            Metrics::new(
                pending
                    .iter()
                    .map(|(plan, pool, ..)| (plan.spec.name.clone(), pool.clone()))
                    .collect(),
            )
            .with_replica(replica.clone(), sessions.clone())
            .with_egress(
                pending
                    .iter()
                    .filter_map(|(plan, .., egress, _)| {
                        Some((plan.spec.name.clone(), egress.as_ref()?.ctx.clone()))
                    })
                    .collect(),
            ),
        );
        // A clients file or audit log that cannot be used stops the start
        // before any pool warms.
        let clients = Arc::new(crate::auth::Clients::load(
            crate::auth::ClientsConfig {
                file: config.clients_file.clone(),
                token: config.token.clone(),
                admin_token: config.admin_token.clone(),
                metrics_token: config.metrics_token.is_some(),
            },
            metrics.clone(),
        )?);
        let audit = Arc::new(crate::audit::Audit::start(&config.audit, metrics.clone())?);
        sessions.set_audit(audit.clone());
        let envs: Vec<Arc<EnvEntry>> = pending.into_iter().map(|b| entry(&metrics, b)).collect();
        debug_assert_eq!(envs.len(), count);
        let default_entry = envs[registry.default].clone();
        let warm: Vec<&Arc<EnvEntry>> = envs
            .iter()
            .filter(|e| e.pool.keeps_warm() && e.unavailable.is_none())
            .collect();
        for e in &warm {
            tracing::info!(
                env = %e.spec.name,
                python = %e.spec.python.display(),
                workers = e.settings.pool_size,
                "starting worker pool"
            );
        }
        if !wait_for_warm {
            // Serve at once (an MCP client waits for `initialize`); each
            // pool fills in the background, and the first request waits for
            // its first worker, not for all of them.
            for e in &warm {
                let pool = e.pool.clone();
                tokio::spawn(async move { pool.warm_first_then_rest().await });
            }
        }
        let prewarm = warm
            .iter()
            .filter(|_| wait_for_warm)
            .map(|e| e.pool.prewarm());
        let results = futures_util::future::join_all(prewarm).await;
        for (e, result) in warm.iter().zip(results) {
            if let Err(source) = result {
                if e.id == default_entry.id {
                    return Err(StartError::DefaultEnv {
                        env: e.spec.name.clone(),
                        source,
                    });
                }
                tracing::error!(
                    "environment {:?} cannot start workers: {}",
                    e.spec.name,
                    error_chain(&source)
                );
            }
        }
        for e in envs.iter().filter(|e| !e.pool.keeps_warm()) {
            tracing::info!(env = %e.spec.name, prefix = %e.spec.prefix.display(), "environment found; its workers start on first use");
        }
        let cgroups = sandbox.as_ref().and_then(Sandbox::cgroups);
        let sandbox = sandbox_status(sandbox.as_ref(), &envs);
        let live = LiveEnvs::new(
            config,
            pools,
            metrics.clone(),
            EnvTable {
                entries: envs,
                default: default_entry,
            },
            &registry,
        );
        live.spawn_watcher(config.rescan_interval, config.idle_timeout);
        Ok(Executor {
            envs: live,
            uv: config.uv.clone().or_else(|| config.host_env.which("uv")),
            budget,
            install_timeout: config.install_timeout,
            create_timeout: config.create_timeout,
            activation_timeout: config.activation_timeout,
            create_lock: tokio::sync::Mutex::new(()),
            max_output_bytes: config.max_output_bytes,
            results: config.results,
            base_dir,
            next_id: AtomicU64::new(1),
            closing: AtomicBool::new(false),
            metrics,
            max_grade_cases: config.max_grade_cases,
            sandbox,
            request_limits: config.request_limits,
            artifacts: Arc::new(crate::artifacts::ArtifactStore::new(config.artifacts)),
            sessions,
            pace: pace::Pace::default(),
            cgroups,
            replica,
            audit,
            clients,
        })
    }
}

/// The egress proxy of an environment with `allowed_hosts`, where it can be
/// enforced: each worker needs a network namespace of its own (the
/// namespace tier). Elsewhere the list is refused rather than pretended.
pub(super) fn egress_of(
    plan: &EnvPlan,
    sandbox: Option<&Sandbox>,
    config: &Config,
) -> Result<Option<EgressSpec>, StartError> {
    if plan.settings.allowed_hosts.is_empty() {
        return Ok(None);
    }
    let refuse = |why: &str| StartError::Egress {
        env: plan.spec.name.clone(),
        why: why.to_string(),
    };
    let Some(sandbox) = sandbox else {
        return Err(refuse(
            "the sandbox is disabled, so runs share the host's network",
        ));
    };
    if !sandbox.has_network_namespaces() {
        return Err(refuse(
            "workers get no network namespace of their own here (the container tier): the proxy could not be the only way out",
        ));
    }
    let policy = Policy::parse(&plan.settings.allowed_hosts).map_err(|e| refuse(&e))?;
    Ok(Some(EgressSpec {
        ctx: ProxyContext::new(
            plan.spec.name.clone(),
            config.egress,
            config.network_hosts.clone(),
        ),
        policy: Arc::new(policy),
    }))
}

/// What runs of an environment with an egress proxy see: every proxy
/// variable pointing at it, and nothing that bypasses it.
pub(super) fn proxy_env() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut vars = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        vars.push((name.into(), url.clone().into()));
        vars.push((name.to_ascii_lowercase().into(), url.clone().into()));
    }
    vars.push(("NO_PROXY".into(), "".into()));
    vars.push(("no_proxy".into(), "".into()));
    vars
}

//! The live table of environments: which ones the server serves now. It
//! follows the disk: a request for an unknown name rescans once before it
//! is refused, and a watcher takes a cheap fingerprint of what discovery
//! reads (`environments.txt`, the `envs/` folders, each found prefix) every
//! `rescan_interval` and rescans when it changed. A rescan adds the new
//! environments (their pools start on first use) and drains the pools of
//! the discovered ones that are gone (configured ones stay). A served one
//! whose `conda-meta/` changed since it was read (found while `conda
//! create` was still filling it, or installed into), configured or
//! discovered, is read again: its activation, facts and hash are new, and
//! so is its pool, the old one draining (a configured one's new pool warms
//! at once).
//!
//! The hot path reads the table under a read lock and clones one `Arc`.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::config::Config;
use crate::env::lifecycle::{
    EnvFacts, Stamp, conda_meta_paths, conda_meta_stamp, env_hash, facts, fingerprint,
};
use crate::env::registry::{Clash, EnvPlan};
use crate::env::{EnvSettings, EnvSpec, Registry, ServedName, activate::activate};
use crate::error::error_chain;
use crate::metrics::{EnvMetrics, Metrics};
use crate::pool::{EnvPool, PoolConfig, WorkerBudget};
use crate::sandbox::Sandbox;
use crate::worker::{CodeCache, WorkerSpec, worker_env};

/// Processes and threads of one run when the config sets no limit.
const DEFAULT_PROCESSES: u64 = 256;

/// Memory of a worker besides its run's, in its memory cgroup: the
/// interpreter and its preloads, the warm next child, the launcher, the
/// private `/dev/shm` (64 MiB at most) and kernel memory.
const WORKER_MEMORY: u64 = 256 << 20;

/// Shortest time between two rescans a request for an unknown name
/// triggers: a client sending made-up names cannot make the server scan
/// more often than this.
const MISS_RESCAN_GAP: Duration = Duration::from_millis(500);

/// One environment and its pool.
pub(crate) struct EnvEntry {
    /// Never reused: sessions name their environment by it.
    pub(crate) id: usize,
    pub(crate) spec: EnvSpec,
    /// The name the environment is served under now, shared with the
    /// entries that replace this one (same id) and with its sessions;
    /// `spec.name` is this entry's own, which a rescan's rename leaves.
    pub(crate) served_name: ServedName,
    pub(crate) settings: EnvSettings,
    pub(crate) pool: EnvPool,
    /// Configured (command line, `[[envs]]`): kept when a rescan misses them.
    pub(crate) configured: bool,
    /// Created by `POST /envs`: kept while its prefix exists, even where
    /// discovery does not look (a configured `envs_dir`).
    pub(crate) created: bool,
    /// Why the environment cannot serve (its activation failed), if so.
    pub(crate) unavailable: Option<String>,
    /// The activated environment (scripts included) workers, package
    /// listings and installs run with; built from scratch.
    pub(crate) vars: HashMap<String, String>,
    /// Installs into one environment run one at a time; shared with the
    /// entry that replaces this one when its prefix changes.
    pub(crate) install_lock: Arc<tokio::sync::Mutex<()>>,
    /// This environment's run counters and histograms, resolved once.
    pub(crate) metrics: EnvMetrics,
    /// Python version and platform, read from disk when it was found.
    pub(crate) facts: EnvFacts,
    /// The content hash (see [`env_hash`]), recomputed after each install.
    pub(crate) hash: RwLock<Arc<str>>,
    /// Its egress proxy and allow-list (environments with `allowed_hosts`).
    pub(crate) egress: Option<crate::worker::EgressSpec>,
    /// Its `conda-meta` stamp taken before its activation, facts and hash
    /// were read: a rescan that finds another reads them again.
    pub(crate) conda_meta: Stamp,
}

impl EnvEntry {
    /// The environment's current content hash.
    pub(crate) fn hash(&self) -> Arc<str> {
        self.hash.read().clone()
    }

    /// Read the content hash from disk again (after an install).
    pub(crate) fn rehash(&self) {
        let hash = env_hash(&self.spec.prefix, self.facts.python_version.as_deref());
        *self.hash.write() = hash.into();
    }

    /// An install into it is running: what that changes is read at the
    /// first rescan after it ends (its records still differ from the
    /// entry's, so the scan comes), not at every step of it.
    fn installing(&self) -> bool {
        self.install_lock.try_lock().is_err()
    }

    /// Whether its prefix's records changed since it was read.
    fn stale(&self) -> bool {
        conda_meta_stamp(&self.spec.prefix) != self.conda_meta
    }
}

/// The environments served now.
pub(crate) struct EnvTable {
    pub(crate) entries: Vec<Arc<EnvEntry>>,
    /// Used when a request names none; never removed.
    pub(crate) default: Arc<EnvEntry>,
}

/// What building a pool needs besides the environment.
#[derive(Clone)]
pub(crate) struct PoolContext {
    pub(crate) script: PathBuf,
    /// The bootstrap was given by the operator (it may import its neighbours).
    pub(crate) custom_script: bool,
    pub(crate) base_dir: PathBuf,
    pub(crate) sandbox: Option<Sandbox>,
    pub(crate) budget: Arc<WorkerBudget>,
    /// Where the embedded bootstrap's compiled code is staged for workers
    /// (a folder they may read) and kept across starts; `None` with an
    /// operator's bootstrap.
    pub(crate) code_dirs: Option<(PathBuf, Option<PathBuf>)>,
}

/// The live table and how to rebuild it.
pub(crate) struct LiveEnvs {
    table: RwLock<Arc<EnvTable>>,
    /// The configuration discovery is run again with.
    config: Config,
    pools: PoolContext,
    metrics: Arc<Metrics>,
    next_id: AtomicUsize,
    /// One rescan at a time; holds when the last one finished.
    rescan: tokio::sync::Mutex<Option<Instant>>,
    /// What discovery read at the last scan: watched for changes.
    watched: Mutex<Watched>,
    /// Set at shutdown: no rescan adds pools after it.
    closed: AtomicBool,
    /// Prefixes `POST /envs` is making: a rescan meanwhile must not serve
    /// them half-made.
    creating: Mutex<HashSet<PathBuf>>,
    /// The name clashes the last scan found, already logged: each is
    /// logged once, not at every rescan.
    clashes: Mutex<Vec<Clash>>,
}

/// Marks a prefix as being created until dropped (see [`LiveEnvs::creating`]).
pub(crate) struct CreatingGuard<'a> {
    live: &'a LiveEnvs,
    prefix: PathBuf,
}

impl Drop for CreatingGuard<'_> {
    fn drop(&mut self) {
        self.live.creating.lock().remove(&self.prefix);
    }
}

/// The paths a rescan watches and their fingerprint at the last scan.
#[derive(Default)]
struct Watched {
    paths: Vec<PathBuf>,
    print: Stamp,
    /// Where environments are placed (`envs_dirs`, in discovery order).
    envs_dirs: Vec<PathBuf>,
    /// The Conda front end discovery found.
    conda: Option<PathBuf>,
    /// Every prefix a scan since the start named Conda's root: kept when a
    /// later scan no longer finds it, so that it is never deleted.
    roots: Vec<PathBuf>,
}

impl PoolContext {
    /// The pool of one environment.
    pub(crate) fn pool(
        &self,
        config: &Config,
        plan: &EnvPlan,
        vars: &HashMap<String, String>,
        egress: Option<&crate::worker::EgressSpec>,
    ) -> EnvPool {
        let script = &self.script;
        let mut env = worker_env(vars);
        if !config.learn_imports {
            env.push(("CODE_EXECUTOR_LEARN_IMPORTS".into(), "0".into()));
        }
        if config.hold_programs {
            env.push(("CODE_EXECUTOR_HOLD_PROGRAMS".into(), "1".into()));
        }
        if plan.settings.huge_pages {
            env.push(("CODE_EXECUTOR_HUGE_PAGES".into(), "1".into()));
        }
        if egress.is_some() {
            env.extend(super::start::proxy_env());
        }
        EnvPool::with_budget(
            WorkerSpec {
                python: plan.spec.python.clone(),
                script: script.clone(),
                scratch_parent: self.base_dir.clone(),
                env,
                egress: egress.cloned(),
                preload: plan.settings.preload.clone(),
                start_timeout: config.worker_start_timeout,
                grace_period: config.grace_period,
                sandbox: self.sandbox.as_ref().map(|s| {
                    let mut wrap = s.plan(
                        plan.settings.network,
                        plan.settings.disk_bytes,
                        &plan.spec.python,
                    );
                    wrap.read.push(if self.custom_script {
                        script.parent().unwrap_or(script).to_path_buf()
                    } else {
                        script.clone()
                    });
                    wrap.read.push(plan.spec.prefix.clone());
                    if let Some((staged, _)) = &self.code_dirs {
                        wrap.read.push(staged.clone());
                    }
                    wrap
                }),
                owner: self.sandbox.as_ref().and_then(Sandbox::owner),
                run_processes: plan
                    .settings
                    .run_limits
                    .processes
                    .unwrap_or(DEFAULT_PROCESSES),
                memory_max: plan.settings.run_limits.memory_bytes.map(|m| {
                    // The scratch tmpfs is memory too, charged to the
                    // writer's cgroup.
                    m.saturating_add(WORKER_MEMORY)
                        .saturating_add(plan.settings.disk_bytes)
                }),
                code_cache: self.code_dirs.as_ref().map(|(staged, kept)| {
                    CodeCache::new(
                        super::start::WORKER_SCRIPT.as_bytes(),
                        &plan.spec.python,
                        &plan.spec.prefix,
                        staged,
                        kept.as_deref(),
                    )
                }),
            },
            PoolConfig {
                size: plan.settings.pool_size,
                queue_timeout: config.queue_timeout,
                max_runs: config.max_runs,
            },
            self.budget.clone(),
            plan.configured,
        )
    }
}

/// Activate the environments of `plans` (side by side), read their facts
/// and build their pools; each plan comes with its entry's id. An entry
/// read again under its name keeps its egress (`kept`, by id): the proxy
/// counters `/metrics` reads go on.
pub(crate) async fn make_entries(
    config: &Config,
    pools: &PoolContext,
    plans: Vec<(usize, EnvPlan)>,
    kept: &HashMap<usize, crate::worker::EgressSpec>,
) -> Vec<Built> {
    let prepared = futures_util::future::join_all(plans.iter().map(|(_, plan)| async {
        // Before anything is read: a change meanwhile shows at the next scan.
        let stamp = conda_meta_stamp(&plan.spec.prefix);
        let activation = activate(
            &plan.spec.prefix,
            &plan.spec.activation,
            config.activation_timeout,
        );
        let (activation, facts) = tokio::join!(activation, facts(&plan.spec));
        (activation, facts, stamp)
    }))
    .await;
    plans
        .into_iter()
        .zip(prepared)
        .map(|((id, plan), (activation, facts, stamp))| {
            let (vars, mut unavailable) = match activation {
                Ok(vars) => (vars, None),
                Err(reason) => {
                    tracing::error!(env = %plan.spec.name, "environment unavailable: {reason}");
                    (plan.spec.activation.clone(), Some(reason))
                }
            };
            // Refused at start; an environment found later whose list
            // cannot be enforced serves nothing (and reaches nothing).
            let egress = match kept.get(&id) {
                Some(egress) => Ok(Some(egress.clone())),
                None => super::start::egress_of(&plan, pools.sandbox.as_ref(), config),
            };
            let egress = match egress {
                Ok(egress) => egress,
                Err(e) => {
                    tracing::error!(env = %plan.spec.name, "environment unavailable: {e}");
                    unavailable.get_or_insert(e.to_string());
                    None
                }
            };
            let pool = pools.pool(config, &plan, &vars, egress.as_ref());
            (plan, pool, unavailable, vars, facts, id, egress, stamp)
        })
        .collect()
}

/// What [`make_entries`] builds of one plan: the plan, its pool, why it
/// cannot serve, its activated variables, what disk says of it, its id,
/// its egress proxy and its `conda-meta` stamp.
pub(crate) type Built = (
    EnvPlan,
    EnvPool,
    Option<String>,
    HashMap<String, String>,
    EnvFacts,
    usize,
    Option<crate::worker::EgressSpec>,
    Stamp,
);

/// An entry from what [`make_entries`] built.
pub(crate) fn entry(
    metrics: &Metrics,
    (plan, pool, unavailable, vars, facts, id, egress, conda_meta): Built,
) -> Arc<EnvEntry> {
    let hash = env_hash(&plan.spec.prefix, facts.python_version.as_deref());
    Arc::new(EnvEntry {
        id,
        metrics: metrics.env(&plan.spec.name),
        served_name: ServedName::new(&plan.spec.name),
        configured: plan.configured,
        created: false,
        spec: plan.spec,
        settings: plan.settings,
        pool,
        unavailable,
        vars,
        install_lock: Default::default(),
        facts,
        hash: RwLock::new(hash.into()),
        egress,
        conda_meta,
    })
}

impl LiveEnvs {
    /// The table as built at start.
    pub(crate) fn new(
        config: &Config,
        pools: PoolContext,
        metrics: Arc<Metrics>,
        table: EnvTable,
        registry: &Registry,
    ) -> Arc<LiveEnvs> {
        let next = table.entries.iter().map(|e| e.id + 1).max().unwrap_or(0);
        let live = Arc::new(LiveEnvs {
            table: RwLock::new(Arc::new(table)),
            config: config.clone(),
            pools,
            metrics,
            next_id: AtomicUsize::new(next),
            rescan: tokio::sync::Mutex::new(Some(Instant::now())),
            watched: Mutex::new(Watched::default()),
            closed: AtomicBool::new(false),
            creating: Mutex::new(HashSet::new()),
            clashes: Mutex::new(Vec::new()),
        });
        live.warn_clashes(&registry.clashes);
        live.watch(registry);
        live.publish_pools();
        live
    }

    /// The environments served now.
    pub(crate) fn table(&self) -> Arc<EnvTable> {
        self.table.read().clone()
    }

    /// The entry of a session's environment, while it is served.
    pub(crate) fn by_id(&self, id: usize) -> Option<Arc<EnvEntry>> {
        self.table().entries.iter().find(|e| e.id == id).cloned()
    }

    /// The entry that serves `entry`'s environment after a successful
    /// install into it, called with its install lock still held (an install
    /// waiting for it then starts on the entry this returns). An install that changed
    /// its `conda-meta` (Conda's) is read again now, as the watcher's next
    /// rescan would (activation, facts, `env_hash`, one new pool), so that
    /// rescan finds nothing left to do and its workers restart once.
    /// Otherwise (pip and uv, no discovery, or a rescan that did not get to
    /// it) its workers are replaced and its hash read again.
    pub(crate) async fn after_install(&self, entry: &Arc<EnvEntry>) -> Arc<EnvEntry> {
        if entry.stale() {
            self.rescan_with(Some(entry.id)).await;
            if let Some(fresh) = self.by_id(entry.id).filter(|e| !Arc::ptr_eq(e, entry)) {
                return fresh;
            }
        }
        entry.pool.replace();
        entry.rehash();
        entry.clone()
    }

    /// Where new environments go: the configured `envs_dir`, else the
    /// first writable `envs_dirs` entry discovery found.
    pub(crate) fn placement(&self) -> Option<PathBuf> {
        if let Some(dir) = &self.config.envs_dir {
            return Some(dir.clone());
        }
        let watched = self.watched.lock();
        watched
            .envs_dirs
            .iter()
            .find(|d| {
                let probe = d.join(format!(".code-executor-probe-{}", std::process::id()));
                let _ = std::fs::create_dir_all(d);
                let ok = std::fs::write(&probe, b"").is_ok();
                let _ = std::fs::remove_file(&probe);
                ok
            })
            .cloned()
    }

    /// The folders whose members are environments: the configured
    /// `envs_dir` and the `envs_dirs` discovery found last.
    pub(crate) fn envs_dirs(&self) -> Vec<PathBuf> {
        let watched = self.watched.lock();
        self.config
            .envs_dir
            .iter()
            .chain(&watched.envs_dirs)
            .cloned()
            .collect()
    }

    /// `~/.conda/environments.txt`, where Conda lists prefixes.
    pub(crate) fn environments_txt(&self) -> Option<PathBuf> {
        self.config
            .host_env
            .home
            .as_ref()
            .map(|h| h.join(".conda/environments.txt"))
    }

    /// The Conda front end discovery found last.
    pub(crate) fn conda(&self) -> Option<PathBuf> {
        self.watched.lock().conda.clone()
    }

    /// The prefixes discovery has named Conda's root since the start.
    pub(crate) fn roots(&self) -> Vec<PathBuf> {
        self.watched.lock().roots.clone()
    }

    /// Keep rescans away from `prefix` while it is being made.
    pub(crate) fn creating(&self, prefix: &std::path::Path) -> CreatingGuard<'_> {
        self.creating.lock().insert(prefix.to_path_buf());
        CreatingGuard {
            live: self,
            prefix: prefix.to_path_buf(),
        }
    }

    /// Stop rescanning (shutdown).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Remember what the scan that built `registry` looked at. A served
    /// prefix's `conda-meta` counts as it was when the prefix was read, so
    /// that a change while it was read is a change.
    fn watch(&self, registry: &Registry) {
        let mut paths: Vec<PathBuf> = registry.envs_dirs.clone();
        paths.extend(registry.environments_txt.clone());
        if let Some(dir) = &self.config.envs_dir {
            paths.push(dir.clone());
        }
        let mut print = fingerprint(&paths);
        let table = self.table();
        for e in &table.entries {
            paths.extend(conda_meta_paths(&e.spec.prefix));
            print.extend(e.conda_meta.iter().cloned());
        }
        let mut watched = self.watched.lock();
        let mut roots = std::mem::take(&mut watched.roots);
        if let Some(root) = &registry.root
            && !roots.contains(root)
        {
            roots.push(root.clone());
        }
        *watched = Watched {
            paths,
            print,
            envs_dirs: registry.envs_dirs.clone(),
            conda: registry.conda.clone(),
            roots,
        };
    }

    /// Log the clashes the last scan did not have.
    fn warn_clashes(&self, clashes: &[Clash]) {
        let mut known = self.clashes.lock();
        for clash in clashes.iter().filter(|c| !known.contains(c)) {
            clash.warn();
        }
        *known = clashes.to_vec();
    }

    /// Whether anything discovery reads changed since the last scan.
    fn changed(&self) -> bool {
        let watched = self.watched.lock();
        fingerprint(&watched.paths) != watched.print
    }

    /// Tell the metrics which pools exist now.
    fn publish_pools(&self) {
        let table = self.table();
        self.metrics.set_pools(
            table
                .entries
                .iter()
                .map(|e| (e.spec.name.clone(), e.pool.clone()))
                .collect(),
        );
        self.metrics.set_egress(
            table
                .entries
                .iter()
                .filter_map(|e| Some((e.spec.name.clone(), e.egress.as_ref()?.ctx.clone())))
                .collect(),
        );
    }

    /// Rescan because a request named an unknown environment. A request
    /// that waited for a rescan which finished after it asked uses that
    /// one's result; rescans follow each other [`MISS_RESCAN_GAP`] apart at
    /// the closest, so that made-up names cannot keep discovery busy.
    pub(crate) async fn rescan_for_miss(&self) {
        let asked = Instant::now();
        let mut last = self.rescan.lock().await;
        if last.is_some_and(|t| t > asked) {
            return;
        }
        if let Some(t) = *last {
            tokio::time::sleep(MISS_RESCAN_GAP.saturating_sub(t.elapsed())).await;
        }
        self.rescan_locked(None).await;
        *last = Some(Instant::now());
    }

    /// Rescan now (after a create or delete, or when the watcher saw a
    /// change).
    pub(crate) async fn rescan(&self) {
        self.rescan_with(None).await;
    }

    /// [`LiveEnvs::rescan`], reading entry `installed` if it changed though
    /// its install lock is held: its install is over, and its caller holds
    /// the lock until the entry is read.
    async fn rescan_with(&self, installed: Option<usize>) {
        let mut last = self.rescan.lock().await;
        self.rescan_locked(installed).await;
        *last = Some(Instant::now());
    }

    async fn rescan_locked(&self, installed: Option<usize>) {
        if self.closed.load(Ordering::Acquire) || !self.config.discover {
            return;
        }
        let mut registry = match Registry::build(&self.config.registry()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("rescan of environments failed: {}", error_chain(&e));
                return;
            }
        };
        let current = self.table();
        let known: HashSet<PathBuf> = current
            .entries
            .iter()
            .map(|e| e.spec.prefix.clone())
            .collect();
        let found: HashSet<PathBuf> = registry
            .envs
            .iter()
            .map(|p| p.spec.prefix.clone())
            .collect();
        let kept = |e: &EnvEntry| e.created && crate::env::python_in(&e.spec.prefix).is_some();
        // Names served where no scan looks (made by `POST /envs` in the
        // configured envs_dir) stay theirs; the scan names the rest as a
        // start would.
        let reserved: HashSet<String> = current
            .entries
            .iter()
            .filter(|e| !e.configured && kept(e) && !found.contains(&e.spec.prefix))
            .map(|e| e.spec.name.clone())
            .collect();
        registry.name_discovered(&reserved);
        self.warn_clashes(&registry.clashes);
        let named: HashMap<&PathBuf, &str> = registry
            .envs
            .iter()
            .filter(|p| !p.configured)
            .map(|p| (&p.spec.prefix, p.spec.name.as_str()))
            .collect();
        let creating = self.creating.lock().clone();
        let added: Vec<EnvPlan> = registry
            .envs
            .iter()
            .filter(|p| {
                !p.configured
                    && !known.contains(&p.spec.prefix)
                    && !creating.contains(&p.spec.prefix)
            })
            .cloned()
            .collect();
        let removed: Vec<Arc<EnvEntry>> = current
            .entries
            .iter()
            .filter(|e| !e.configured && !kept(e) && !found.contains(&e.spec.prefix))
            .cloned()
            .collect();
        // Served ones whose records changed since they were read (configured
        // ones too: their name and settings stay), or whose name the scan
        // gives another: read again under the same id, so that sessions
        // keep them.
        let gone: HashSet<usize> = removed.iter().map(|e| e.id).collect();
        let renamed = |e: &EnvEntry| {
            named
                .get(&e.spec.prefix)
                .is_some_and(|name| *name != e.spec.name)
        };
        let stale: Vec<Arc<EnvEntry>> = current
            .entries
            .iter()
            .filter(|e| {
                !gone.contains(&e.id)
                    && !creating.contains(&e.spec.prefix)
                    && (renamed(e) || e.stale())
                    && (!e.installing() || installed == Some(e.id))
            })
            .cloned()
            .collect();
        if added.is_empty() && removed.is_empty() && stale.is_empty() {
            self.watch(&registry);
            return;
        }
        let first = self.next_id.fetch_add(added.len(), Ordering::Relaxed);
        let plans: Vec<(usize, EnvPlan)> = (first..)
            .zip(added)
            .chain(stale.iter().map(|e| {
                let mut spec = e.spec.clone();
                if let Some(name) = named.get(&e.spec.prefix).filter(|n| **n != spec.name) {
                    spec.rename(name.to_string());
                }
                let plan = EnvPlan {
                    spec,
                    settings: e.settings.clone(),
                    configured: e.configured,
                };
                (e.id, plan)
            }))
            .collect();
        // Read again under its name, an environment keeps its egress.
        let kept: HashMap<usize, crate::worker::EgressSpec> = stale
            .iter()
            .filter(|e| !renamed(e))
            .filter_map(|e| Some((e.id, e.egress.clone()?)))
            .collect();
        let built = make_entries(&self.config, &self.pools, plans, &kept).await;
        let mut new: Vec<Arc<EnvEntry>> = Vec::new();
        let mut renewed: HashMap<usize, Arc<EnvEntry>> = HashMap::new();
        for b in built {
            let mut e = entry(&self.metrics, b);
            match stale.iter().find(|old| old.id == e.id) {
                Some(old) => {
                    let fresh = Arc::get_mut(&mut e).expect("not shared yet");
                    fresh.created = old.created;
                    fresh.install_lock = old.install_lock.clone();
                    fresh.served_name = old.served_name.clone();
                    renewed.insert(e.id, e);
                }
                None => {
                    tracing::info!(env = %e.spec.name, prefix = %e.spec.prefix.display(), "environment found; its workers start on first use");
                    new.push(e);
                }
            }
        }
        let mut replaced = Vec::new();
        {
            let mut table = self.table.write();
            let mut entries: Vec<Arc<EnvEntry>> = table
                .entries
                .iter()
                .filter(|e| !gone.contains(&e.id))
                .map(|e| match renewed.remove(&e.id) {
                    Some(fresh) => {
                        // Its sessions show the new name with the table
                        // that serves it.
                        fresh.served_name.set(&fresh.spec.name);
                        replaced.push((e.clone(), fresh.clone()));
                        fresh
                    }
                    None => e.clone(),
                })
                .collect();
            // A create may have served one of them meanwhile.
            let served: HashSet<PathBuf> = entries.iter().map(|e| e.spec.prefix.clone()).collect();
            let (serve, unserved): (Vec<_>, Vec<_>) = new
                .into_iter()
                .partition(|e| !served.contains(&e.spec.prefix));
            entries.extend(serve);
            // The default is configured, and read again like any other.
            let default = entries
                .iter()
                .find(|e| e.id == table.default.id)
                .unwrap_or(&table.default)
                .clone();
            *table = Arc::new(EnvTable { entries, default });
            // What a delete meanwhile took away is not served again.
            renewed.extend(unserved.into_iter().map(|e| (e.id, e)));
        }
        for e in renewed.into_values() {
            tokio::spawn(async move { e.pool.close().await });
        }
        for (e, fresh) in replaced {
            let name = &fresh.spec.name;
            if *name == e.spec.name {
                tracing::info!(env = %name, prefix = %e.spec.prefix.display(), "environment changed on disk; read again, its workers restart");
            } else {
                tracing::info!(env = %name, prefix = %e.spec.prefix.display(), "environment {:?} is served as {:?} now, as a start would name it; its workers restart", e.spec.name, name);
            }
            // A configured pool is kept warm: its new one fills once the old
            // one's workers are gone (they count against max_workers), as at
            // a start that does not wait; a request meanwhile waits for the
            // first worker.
            let warm = fresh.pool.keeps_warm() && fresh.unavailable.is_none();
            tokio::spawn(async move {
                e.pool.close().await;
                if warm {
                    fresh.pool.warm_first_then_rest().await;
                }
            });
        }
        for e in removed {
            tracing::info!(env = %e.spec.name, prefix = %e.spec.prefix.display(), "environment gone; draining its pool");
            tokio::spawn(async move { e.pool.close().await });
        }
        self.watch(&registry);
        self.publish_pools();
    }

    /// Serve a prefix `POST /envs` just made, under `name` (checked free by
    /// the caller, under the create lock). Its pool starts on first use.
    pub(crate) async fn add_created(&self, spec: EnvSpec) -> Arc<EnvEntry> {
        let plan = EnvPlan {
            spec,
            settings: self.config.env_defaults(),
            configured: false,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let built =
            make_entries(&self.config, &self.pools, vec![(id, plan)], &HashMap::new()).await;
        let mut entry = entry(&self.metrics, built.into_iter().next().expect("one plan"));
        Arc::get_mut(&mut entry).expect("not shared yet").created = true;
        {
            let mut table = self.table.write();
            let mut entries = table.entries.clone();
            entries.push(entry.clone());
            *table = Arc::new(EnvTable {
                entries,
                default: table.default.clone(),
            });
        }
        {
            // Its removal or change on disk is noticed like a discovered env's.
            let mut watched = self.watched.lock();
            watched.paths.extend(conda_meta_paths(&entry.spec.prefix));
            watched.print.extend(entry.conda_meta.iter().cloned());
        }
        self.publish_pools();
        entry
    }

    /// Remove one environment from the table now (it was deleted); its
    /// pool drains.
    pub(crate) fn remove(&self, id: usize) -> Option<Arc<EnvEntry>> {
        let mut table = self.table.write();
        let entry = table.entries.iter().find(|e| e.id == id).cloned()?;
        *table = Arc::new(EnvTable {
            entries: table
                .entries
                .iter()
                .filter(|e| e.id != id)
                .cloned()
                .collect(),
            default: table.default.clone(),
        });
        drop(table);
        self.publish_pools();
        let closing = entry.clone();
        tokio::spawn(async move { closing.pool.close().await });
        Some(entry)
    }

    /// Watch the disk every `interval` until the table is dropped or
    /// closed; lazy pools unused for `idle` stop their workers meanwhile.
    pub(crate) fn spawn_watcher(self: &Arc<Self>, interval: Duration, idle: Duration) {
        let weak: Weak<LiveEnvs> = Arc::downgrade(self);
        let idle_tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let tick = if interval.is_zero() {
            idle_tick
        } else {
            interval.min(idle_tick)
        };
        tokio::spawn(async move {
            let mut last_check = Instant::now();
            loop {
                tokio::time::sleep(tick).await;
                let Some(live) = weak.upgrade() else { return };
                if live.closed.load(Ordering::Acquire) {
                    return;
                }
                for e in live.table().entries.iter().filter(|e| !e.pool.keeps_warm()) {
                    e.pool.shrink_if_idle(idle);
                }
                if !interval.is_zero() && last_check.elapsed() >= interval {
                    last_check = Instant::now();
                    if live.config.discover && live.changed() {
                        live.rescan().await;
                    }
                }
            }
        });
    }
}

//! Who is calling, and what they may do: named clients from the clients
//! file (`--clients`, reloaded on SIGHUP), the implicit clients of
//! `--token` / `--admin-token`, their scopes, env allow-lists, quotas
//! (`quota.rs`: in-flight runs, token-bucket rate) and ceilings.
//!
//! A front end authenticates a request into a [`Caller`] once (HTTP: the
//! bearer token; MCP over stdio: the configured `mcp_client`), admits it
//! for a [`Scope`] (scope, concurrency, rate, audit capacity), and runs the
//! executor call inside [`Caller::scope`]. The executor reads the caller
//! with [`current`] where a decision needs the request's content (the env
//! it names, its timeout and limits, the session it calls) and where it
//! writes an audit record. A task-local keeps every executor signature as
//! it was: front ends, grading and tests call the same methods.

mod quota;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::api::RunLimits;
use crate::error::{ClientsError, ExecError};
use crate::metrics::{ClientMetrics, Metrics};

use quota::ClientState;
pub use quota::InFlight;

/// What a client may do. Each HTTP route and MCP tool needs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// `/execute` (clean runs), MCP `execute_code`.
    Execute,
    /// `/sessions`, session calls of `/execute`; MCP session tools.
    Sessions,
    /// `/grade`, `/grade/batch`; MCP `grade_code`.
    Grade,
    /// `/install`; MCP `install_packages`.
    Install,
    /// Creating and deleting environments (`POST /envs`,
    /// `DELETE /envs/{name}`).
    EnvsAdmin,
    /// `GET /metrics`.
    Metrics,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub const ALL: [Scope; 6] = [
        Scope::Execute,
        Scope::Sessions,
        Scope::Grade,
        Scope::Install,
        Scope::EnvsAdmin,
        Scope::Metrics,
    ];

    /// The scope's name in the clients file and in refusals.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Execute => "execute",
            Scope::Sessions => "sessions",
            Scope::Grade => "grade",
            Scope::Install => "install",
            Scope::EnvsAdmin => "envs_admin",
            Scope::Metrics => "metrics",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The front end a request came through, as audit records name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    /// The HTTP/JSON API.
    Http,
    /// MCP over stdin/stdout.
    McpStdio,
    /// MCP over streamable HTTP (`/mcp`).
    McpHttp,
    /// A call made inside the server (tests, benches): no front end.
    Internal,
}

impl FrontEnd {
    /// `http`, `mcp-stdio`, `mcp-http`, `internal`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontEnd::Http => "http",
            FrontEnd::McpStdio => "mcp-stdio",
            FrontEnd::McpHttp => "mcp-http",
            FrontEnd::Internal => "internal",
        }
    }
}

/// One `[[clients]]` table of the clients file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    /// The client's name: in audit records, metrics labels and refusals.
    pub name: String,
    /// SHA-256 of the client's bearer token, 64 hex digits
    /// (`code-executor hash-token`); never the token itself.
    pub token_sha256: String,
    /// What the client may do.
    pub scopes: Vec<Scope>,
    /// Environments the client may use: names or globs (`*`, `?`); all
    /// when absent.
    #[serde(default)]
    pub envs: Option<Vec<String>>,
    /// Runs (executions, gradings, session starts, installs) in flight at
    /// once; past it `429 too_many_requests` at once.
    #[serde(default)]
    pub max_concurrent: Option<usize>,
    /// Requests that run code, per minute (a token bucket refilled
    /// continuously); past it `429 too_many_requests` with `Retry-After`.
    #[serde(default)]
    pub rate_per_minute: Option<u32>,
    /// Size of the rate bucket: requests that may come at once after a
    /// quiet spell (default: `rate_per_minute`).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Live sessions the client may hold at once.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// Largest timeout the client's runs get, seconds (below the server's).
    #[serde(default)]
    pub max_timeout: Option<f64>,
    /// Ceilings on the client's runs' limits (below the server's).
    #[serde(default)]
    pub limits: Option<RunLimits>,
}

/// The clients file: `[[clients]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientsFile {
    #[serde(default)]
    clients: Vec<ClientEntry>,
}

/// A client as the server enforces it.
pub struct Client {
    name: Arc<str>,
    scopes: u8,
    /// `None`: every environment.
    envs: Option<Vec<String>>,
    max_concurrent: Option<usize>,
    /// Tokens per second and bucket size.
    rate: Option<(f64, f64)>,
    max_sessions: Option<usize>,
    max_timeout: Option<f64>,
    limits: Option<RunLimits>,
    /// Counters that outlive a reload (in flight, the rate bucket, metrics).
    state: Arc<ClientState>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("name", &self.name).finish()
    }
}

impl Client {
    /// The client's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client's name, shared.
    pub fn name_arc(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether the client holds `scope`.
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes & scope.bit() != 0
    }

    /// The client's metrics handles.
    pub(crate) fn metrics(&self) -> &ClientMetrics {
        &self.state.metrics
    }

    /// `Ok` when the client holds `scope`, else `403 forbidden` naming it.
    pub fn require(&self, scope: Scope) -> Result<(), ExecError> {
        if self.has(scope) {
            return Ok(());
        }
        self.metrics().refused("scope");
        Err(ExecError::Forbidden(format!(
            "client {:?} lacks the scope `{}`",
            self.name,
            scope.as_str()
        )))
    }

    /// Whether the client may use environment `name` (`also`: another name
    /// of the same environment, e.g. the prefix it was asked by).
    pub fn may_use_env(&self, name: &str, also: Option<&str>) -> bool {
        match &self.envs {
            None => true,
            Some(globs) => globs
                .iter()
                .any(|g| glob_match(g, name) || also.is_some_and(|a| glob_match(g, a))),
        }
    }

    /// `Ok` when the client may use env `name`, else `403 forbidden`.
    pub fn require_env(&self, name: &str, also: Option<&str>) -> Result<(), ExecError> {
        if self.may_use_env(name, also) {
            return Ok(());
        }
        self.metrics().refused("env");
        Err(ExecError::Forbidden(format!(
            "client {:?} may not use environment {name:?} (its envs: {})",
            self.name,
            self.envs.as_deref().unwrap_or_default().join(", ")
        )))
    }

    /// Take one run's quota: a slot under `max_concurrent` (held by the
    /// returned guard) and a token of the rate bucket; `429` otherwise.
    pub fn admit_run(&self) -> Result<Option<InFlight>, ExecError> {
        let guard = match self.max_concurrent {
            None => None,
            Some(max) => match self.state.enter(max) {
                Some(guard) => Some(guard),
                None => {
                    self.metrics().refused("concurrency");
                    return Err(ExecError::TooManyRequests {
                        message: format!(
                            "client {:?} already has its maximum of {max} runs in flight \
                             (max_concurrent); retry when one ends",
                            self.name
                        ),
                        retry_after: 1,
                    });
                }
            },
        };
        if let Some((per_sec, burst)) = self.rate
            && let Err(wait) = self.state.bucket.lock().take(per_sec, burst)
        {
            self.metrics().refused("rate");
            return Err(ExecError::TooManyRequests {
                message: format!(
                    "client {:?} is over its rate of {} runs per minute (rate_per_minute); \
                     retry in {wait} s",
                    self.name,
                    (per_sec * 60.0).round()
                ),
                retry_after: wait,
            });
        }
        Ok(guard)
    }

    /// Live sessions the client may hold, if capped.
    pub fn max_sessions(&self) -> Option<usize> {
        self.max_sessions
    }

    /// The client's timeout ceiling, seconds.
    pub fn max_timeout(&self) -> Option<f64> {
        self.max_timeout
    }

    /// The client's limits ceiling.
    pub fn limits(&self) -> Option<&RunLimits> {
        self.limits.as_ref()
    }
}

/// `*` any run of characters, `?` one; everything else literal.
fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// SHA-256 of a token, as 64 lowercase hex digits.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// SHA-256 of some bytes, as 64 lowercase hex digits.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `bytes` as lowercase hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Name of the implicit client of `--token`.
pub const TOKEN_CLIENT: &str = "default";
/// Name of the implicit client of `--admin-token`.
pub const ADMIN_CLIENT: &str = "admin";
/// Name of the client of a server with no token and no clients file.
pub const ANONYMOUS_CLIENT: &str = "anonymous";

/// The clients in force: looked up by token hash on every request,
/// replaced whole on reload.
struct Table {
    by_hash: HashMap<String, Arc<Client>>,
    by_name: HashMap<String, Arc<Client>>,
    /// Who an unauthenticated request is: only a server with no token and
    /// no clients file has one.
    anonymous: Option<Arc<Client>>,
}

/// How the clients are made: the file and the implicit ones.
#[derive(Debug, Clone, Default)]
pub struct ClientsConfig {
    /// The clients file, re-read on reload.
    pub file: Option<PathBuf>,
    /// `--token`.
    pub token: Option<String>,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `/metrics` has its own token: the implicit clients lack `metrics`.
    pub metrics_token: bool,
}

/// Every known client, reloadable.
pub struct Clients {
    /// The file and the implicit tokens; the tokens are the HTTP router's
    /// (see [`Clients::use_tokens`]).
    config: Mutex<ClientsConfig>,
    /// Swapped whole on reload; a request holds the `Arc<Client>` it
    /// authenticated as until it ends.
    table: ArcSwap<Table>,
    /// Per-name state, kept across reloads so that a reload neither resets
    /// a bucket nor forgets runs in flight.
    states: Mutex<HashMap<String, Arc<ClientState>>>,
    metrics: Arc<Metrics>,
}

impl Clients {
    /// The clients of `config` (reading the file).
    pub fn load(config: ClientsConfig, metrics: Arc<Metrics>) -> Result<Clients, ClientsError> {
        let clients = Clients {
            config: Mutex::new(config),
            table: ArcSwap::from_pointee(Table {
                by_hash: HashMap::new(),
                by_name: HashMap::new(),
                anonymous: None,
            }),
            states: Mutex::new(HashMap::new()),
            metrics,
        };
        clients.reload()?;
        Ok(clients)
    }

    /// Re-read the clients file and swap the table in; on error the old
    /// table stays in force.
    pub fn reload(&self) -> Result<usize, ClientsError> {
        let config = self.config.lock().clone();
        let mut entries = match &config.file {
            Some(path) => read_clients(path)?,
            None => Vec::new(),
        };
        let implicit = |name: &str, token: &str, scopes: Vec<Scope>| ClientEntry {
            name: name.into(),
            token_sha256: hash_token(token),
            scopes,
            envs: None,
            max_concurrent: None,
            rate_per_minute: None,
            burst: None,
            max_sessions: None,
            max_timeout: None,
            limits: None,
        };
        let mut user = vec![Scope::Execute, Scope::Sessions, Scope::Grade];
        if !config.metrics_token {
            user.push(Scope::Metrics);
        }
        if let Some(token) = &config.token {
            entries.push(implicit(TOKEN_CLIENT, token, user.clone()));
        }
        if let Some(token) = &config.admin_token {
            let mut all = vec![Scope::Execute, Scope::Sessions, Scope::Grade];
            all.extend([Scope::Install, Scope::EnvsAdmin]);
            if !config.metrics_token {
                all.push(Scope::Metrics);
            }
            entries.push(implicit(ADMIN_CLIENT, token, all));
        }
        let anonymous_entry = (config.file.is_none() && config.token.is_none())
            .then(|| implicit(ANONYMOUS_CLIENT, "", user));
        let mut by_hash = HashMap::new();
        let mut by_name = HashMap::new();
        for entry in &entries {
            let client = Arc::new(self.build(entry)?);
            if by_name.insert(entry.name.clone(), client.clone()).is_some() {
                return Err(ClientsError::Invalid(format!(
                    "two clients are named {:?}",
                    entry.name
                )));
            }
            if by_hash
                .insert(entry.token_sha256.to_ascii_lowercase(), client)
                .is_some()
            {
                return Err(ClientsError::Invalid(format!(
                    "client {:?} has the token of another client",
                    entry.name
                )));
            }
        }
        let anonymous = match anonymous_entry {
            Some(entry) => {
                let client = Arc::new(self.build(&entry)?);
                by_name.insert(entry.name, client.clone());
                Some(client)
            }
            None => None,
        };
        let count = by_name.len();
        self.table.store(Arc::new(Table {
            by_hash,
            by_name,
            anonymous,
        }));
        Ok(count)
    }

    fn build(&self, entry: &ClientEntry) -> Result<Client, ClientsError> {
        let invalid =
            |what: String| ClientsError::Invalid(format!("client {:?}: {what}", entry.name));
        if entry.name.is_empty()
            || !entry
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        {
            return Err(ClientsError::Invalid(format!(
                "client name {:?} must be ASCII letters, digits and -_.@",
                entry.name
            )));
        }
        if entry.token_sha256.len() != 64
            || !entry.token_sha256.chars().all(|c| c.is_ascii_hexdigit())
        {
            return Err(invalid(
                "token_sha256 must be 64 hex digits (code-executor hash-token prints them)".into(),
            ));
        }
        if entry.max_concurrent == Some(0) || entry.max_sessions == Some(0) {
            return Err(invalid(
                "max_concurrent and max_sessions must be positive".into(),
            ));
        }
        if entry.rate_per_minute == Some(0) || entry.burst == Some(0) {
            return Err(invalid("rate_per_minute and burst must be positive".into()));
        }
        if let Some(t) = entry.max_timeout
            && !(t.is_finite() && t > 0.0)
        {
            return Err(invalid(
                "max_timeout must be a positive number of seconds".into(),
            ));
        }
        let state = self
            .states
            .lock()
            .entry(entry.name.clone())
            .or_insert_with(|| Arc::new(ClientState::new(self.metrics.client(&entry.name))))
            .clone();
        Ok(Client {
            name: Arc::from(entry.name.as_str()),
            scopes: entry.scopes.iter().fold(0, |acc, s| acc | s.bit()),
            envs: entry.envs.clone(),
            max_concurrent: entry.max_concurrent,
            rate: entry
                .rate_per_minute
                .map(|r| (f64::from(r) / 60.0, f64::from(entry.burst.unwrap_or(r)))),
            max_sessions: entry.max_sessions,
            max_timeout: entry.max_timeout,
            limits: entry.limits.clone(),
            state,
        })
    }

    /// Make `token` and `admin_token` the implicit clients (`default`,
    /// `admin`), as the HTTP router's state names them; the server's own
    /// router names the configured ones, so this changes nothing there.
    pub fn use_tokens(
        &self,
        token: Option<&str>,
        admin_token: Option<&str>,
        metrics_token: bool,
    ) -> Result<(), ClientsError> {
        {
            let mut config = self.config.lock();
            let same = config.token.as_deref() == token
                && config.admin_token.as_deref() == admin_token
                && config.metrics_token == metrics_token;
            if same {
                return Ok(());
            }
            config.token = token.map(str::to_string);
            config.admin_token = admin_token.map(str::to_string);
            config.metrics_token = metrics_token;
        }
        self.reload().map(|_| ())
    }

    /// The client a bearer token (or its absence) is, if any.
    pub fn authenticate(&self, bearer: Option<&str>) -> Option<Arc<Client>> {
        let table = self.table.load();
        match bearer.filter(|t| !t.is_empty()) {
            // The table is keyed by the token's hash: a lookup's timing
            // tells nothing about the token itself.
            Some(token) => table.by_hash.get(&hash_token(token)).cloned(),
            None => table.anonymous.clone(),
        }
    }

    /// The client named `name` (MCP over stdio acts as one).
    pub fn by_name(&self, name: &str) -> Option<Arc<Client>> {
        self.table.load().by_name.get(name).cloned()
    }

    /// Who an unauthenticated caller is, if anyone.
    pub fn anonymous(&self) -> Option<Arc<Client>> {
        self.table.load().anonymous.clone()
    }

    /// Whether some client holds `scope`.
    pub fn any_has(&self, scope: Scope) -> bool {
        self.table.load().by_name.values().any(|c| c.has(scope))
    }
}

fn read_clients(path: &Path) -> Result<Vec<ClientEntry>, ClientsError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file: ClientsFile = toml::from_str(&text).map_err(|e| ClientsError::Parse {
        path: path.to_path_buf(),
        message: e.message().trim_end().to_string(),
    })?;
    Ok(file.clients)
}

/// One request's caller: who, from where, through which front end, under
/// which request id, with the run quota it holds.
pub struct Caller {
    /// The client.
    pub client: Arc<Client>,
    /// The request id (`x-request-id`; one per MCP call).
    pub request_id: Arc<str>,
    /// The peer's address (HTTP), if known.
    pub remote: Option<SocketAddr>,
    /// The front end.
    pub front: FrontEnd,
    /// The client's `max_concurrent` slot, held while the request lives
    /// (a streamed answer holds it until its stream ends).
    pub in_flight: Option<InFlight>,
    /// `audit_fail = "closed"`: a queue slot reserved for this request's
    /// record before it ran, so that the record cannot be refused later.
    pub audit_slot: Mutex<Option<crate::audit::Slot>>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("client", &self.client.name)
            .field("request_id", &self.request_id)
            .field("front", &self.front)
            .finish_non_exhaustive()
    }
}

impl Caller {
    /// A caller with no quota held and no audit slot.
    pub fn new(
        client: Arc<Client>,
        request_id: Arc<str>,
        remote: Option<SocketAddr>,
        front: FrontEnd,
    ) -> Caller {
        Caller {
            client,
            request_id,
            remote,
            front,
            in_flight: None,
            audit_slot: Mutex::new(None),
        }
    }

    /// Run `f` as this caller: the executor sees it through [`current`].
    pub async fn scope<F: std::future::Future>(self: Arc<Self>, f: F) -> F::Output {
        CALLER.scope(self, f).await
    }
}

tokio::task_local! {
    static CALLER: Arc<Caller>;
}

/// The caller of the request this task serves, if a front end set one.
pub fn current() -> Option<Arc<Caller>> {
    CALLER.try_with(Arc::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_names() {
        assert!(glob_match("*", "base"));
        assert!(glob_match("ml-*", "ml-gpu"));
        assert!(!glob_match("ml-*", "base"));
        assert!(glob_match("py3?", "py39"));
        assert!(!glob_match("py3?", "py310"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a", "b"));
    }

    #[test]
    fn token_hashes_are_sha256_hex() {
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_example_clients_file_loads() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/clients.toml");
        let clients = Clients::load(
            ClientsConfig {
                file: Some(path.into()),
                ..ClientsConfig::default()
            },
            Arc::new(Metrics::new(Vec::new())),
        )
        .unwrap();
        let grader = clients.by_name("grader").unwrap();
        assert!(grader.has(Scope::Grade) && !grader.has(Scope::Install));
        assert!(grader.may_use_env("py311", None) && !grader.may_use_env("ml", None));
        assert!(clients.anonymous().is_none());
        assert!(clients.authenticate(None).is_none());
        assert!(
            clients
                .authenticate(Some("test"))
                .is_some_and(|c| c.name() == "grader")
        );
    }

    #[test]
    fn a_bad_clients_file_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients.toml");
        std::fs::write(
            &path,
            "[[clients]]\nname = \"a\"\ntoken_sha256 = \"abc\"\nscopes = [\"execute\"]\n",
        )
        .unwrap();
        let metrics = Arc::new(Metrics::new(Vec::new()));
        let config = ClientsConfig {
            file: Some(path.clone()),
            ..ClientsConfig::default()
        };
        let err = Clients::load(config.clone(), metrics.clone())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("64 hex digits"), "{err}");
        std::fs::write(
            &path,
            "[[clients]]\nname = \"a\"\ntoken_sha256 = \"x\"\nscopes = [\"fly\"]\n",
        )
        .unwrap();
        let err = Clients::load(config, metrics).err().unwrap().to_string();
        assert!(err.contains("fly"), "{err}");
    }
}

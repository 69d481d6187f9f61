//! Prometheus metrics (`GET /metrics`), on `prometheus-client`.
//!
//! The hot path stays lean: every environment gets its counters and
//! histograms once, at start-up ([`EnvMetrics`]), so recording a run is a few
//! atomic adds with no lookup, lock or allocation. Worker counts and restarts
//! are not recorded at all: the pools keep them, and [`PoolCollector`] reads
//! them at scrape time.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelSetEncoder,
    LabelValueEncoder,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::outcome::Outcome;
use crate::pool::{EnvPool, RestartCause};
use crate::replica::Replica;
use crate::session::Sessions;

/// Every metric name starts with this.
const PREFIX: &str = "code_executor";

/// How a run ended, as the `outcome` label shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// Exit status 0, no limit hit.
    Ok,
    /// The code failed: non-zero exit status or an uncaught exception.
    Error,
    /// The run hit its wall-clock timeout.
    Timeout,
    /// Another limit stopped the run (CPU, file size, output).
    Limit,
    /// No worker was free within the queue timeout.
    Busy,
    /// The server could not complete the run: the worker crashed, stopped
    /// answering or the environment cannot start workers.
    Failed,
}

impl RunOutcome {
    pub const ALL: [RunOutcome; 6] = [
        RunOutcome::Ok,
        RunOutcome::Error,
        RunOutcome::Timeout,
        RunOutcome::Limit,
        RunOutcome::Busy,
        RunOutcome::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Ok => "ok",
            RunOutcome::Error => "error",
            RunOutcome::Timeout => "timeout",
            RunOutcome::Limit => "limit",
            RunOutcome::Busy => "busy",
            RunOutcome::Failed => "failed",
        }
    }

    /// The label of a run that completed on a worker.
    pub fn of(result: &crate::worker::RunOutput, outcome: &Outcome) -> RunOutcome {
        if result.timed_out {
            RunOutcome::Timeout
        } else if outcome.limit.is_some() {
            RunOutcome::Limit
        } else if outcome.failed {
            RunOutcome::Error
        } else {
            RunOutcome::Ok
        }
    }
}

impl std::fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EncodeLabelValue for RunOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Labels of the per-run metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RunLabels {
    env: Arc<str>,
    outcome: RunOutcome,
}

impl EncodeLabelSet for RunLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ([("env", &*self.env)], [("outcome", self.outcome)]).encode(encoder)
    }
}

/// The `env` label alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EnvLabel(Arc<str>);

impl EncodeLabelSet for EnvLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("env", &*self.0)].encode(encoder)
    }
}

/// Labels of `http_requests_total`: the matched route (never the raw path,
/// which would make one series per URL), the method and the status code.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HttpLabels {
    method: &'static str,
    route: Arc<str>,
    status: u16,
}

impl EncodeLabelSet for HttpLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        (
            [("method", self.method), ("route", &*self.route)],
            [("status", self.status as u64)],
        )
            .encode(encoder)
    }
}

/// Labels of `mcp_tool_calls_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ToolLabels {
    tool: Arc<str>,
    outcome: &'static str,
}

impl EncodeLabelSet for ToolLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("tool", &*self.tool), ("outcome", self.outcome)].encode(encoder)
    }
}

/// Labels of the per-client metrics: the client's name (bounded by the
/// clients file) and one more label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ClientLabels {
    client: Arc<str>,
    key: &'static str,
    value: &'static str,
}

impl EncodeLabelSet for ClientLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("client", &*self.client), (self.key, self.value)].encode(encoder)
    }
}

/// The `client` label alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ClientLabel(Arc<str>);

impl EncodeLabelSet for ClientLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("client", &*self.0)].encode(encoder)
    }
}

/// Why a client's request was refused, as the `reason` label shows it.
pub(crate) const REFUSALS: [&str; 5] = ["scope", "env", "concurrency", "rate", "sessions"];

/// One client's metrics, resolved once per client (at load, kept across
/// reloads), so that recording needs no label lookup.
#[derive(Debug, Clone)]
pub struct ClientMetrics {
    /// `client_runs_total` for each [`RunOutcome`], in [`RunOutcome::ALL`] order.
    runs: [Counter; 6],
    /// `client_refusals_total` for each of [`REFUSALS`].
    refusals: [Counter; 5],
    queue_wait: Histogram,
}

impl ClientMetrics {
    /// A run of this client that ended with `outcome`.
    pub fn run(&self, outcome: RunOutcome) {
        let i = RunOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.runs[i].inc();
    }

    /// A request of this client refused for `reason` (one of [`REFUSALS`]).
    pub fn refused(&self, reason: &str) {
        if let Some(i) = REFUSALS.iter().position(|r| *r == reason) {
            self.refusals[i].inc();
        }
    }

    /// Time a request of this client waited for a worker.
    pub fn queue_wait(&self, seconds: f64) {
        self.queue_wait.observe(seconds);
    }
}

/// One environment's run metrics, resolved once so that recording needs no
/// label lookup.
#[derive(Debug, Clone)]
pub struct EnvMetrics {
    /// `runs_total` for each [`RunOutcome`], in [`RunOutcome::ALL`] order.
    outcomes: [Counter; 6],
    duration: Histogram,
    queue_wait: Histogram,
}

impl EnvMetrics {
    /// A run that ended with `outcome` after `seconds` on a worker.
    pub fn run(&self, outcome: RunOutcome, seconds: f64) {
        self.outcome(outcome);
        self.duration.observe(seconds);
    }

    /// A request that ended with `outcome` without a run (busy, failed).
    pub fn outcome(&self, outcome: RunOutcome) {
        let i = RunOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.outcomes[i].inc();
    }

    /// Time a request waited for a worker.
    pub fn queue_wait(&self, seconds: f64) {
        self.queue_wait.observe(seconds);
    }
}

/// The server's metrics: families recorded by the executor, the HTTP
/// middleware and the MCP tools, plus pool state read at scrape time.
pub struct Metrics {
    /// Encoded at each scrape; the families inside share their values with
    /// the handles below.
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    run_duration: Family<EnvLabel, Histogram, fn() -> Histogram>,
    queue_wait: Family<EnvLabel, Histogram, fn() -> Histogram>,
    http_requests: Family<HttpLabels, Counter>,
    http_in_flight: Gauge,
    mcp_calls: Family<ToolLabels, Counter>,
    client_runs: Family<ClientLabels, Counter>,
    client_refusals: Family<ClientLabels, Counter>,
    client_queue_wait: Family<ClientLabel, Histogram, fn() -> Histogram>,
    audit_dropped: Counter,
    /// Route templates seen so far, shared so that a request's labels cost
    /// a reference count, not a string copy.
    routes: RwLock<HashMap<Box<str>, Arc<str>>>,
    /// The pools read at scrape time; replaced when environments come and go.
    pools: Arc<RwLock<Vec<(String, EnvPool)>>>,
    /// The egress proxies read at scrape time, the same way.
    egress: Arc<RwLock<Proxies>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Run durations: 1 ms to ~5 min.
fn run_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.5, 14))
}

/// Queue waits: 0.1 ms to ~30 s.
fn wait_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 3.0, 13))
}

impl Metrics {
    /// Metrics for the given pools, keyed by environment name.
    pub fn new(pools: Vec<(String, EnvPool)>) -> Metrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let runs = Family::<RunLabels, Counter>::default();
        let run_duration = Family::new_with_constructor(run_buckets as fn() -> Histogram);
        let queue_wait = Family::new_with_constructor(wait_buckets as fn() -> Histogram);
        let http_requests = Family::<HttpLabels, Counter>::default();
        let http_in_flight = Gauge::default();
        let mcp_calls = Family::<ToolLabels, Counter>::default();
        registry.register(
            "runs",
            "Runs by environment and outcome (ok, error, timeout, limit, busy, failed)",
            runs.clone(),
        );
        registry.register_with_unit(
            "run_duration",
            "Time a run held its worker, by environment",
            Unit::Seconds,
            run_duration.clone(),
        );
        registry.register_with_unit(
            "queue_wait",
            "Time a request waited for a free worker, by environment",
            Unit::Seconds,
            queue_wait.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by method, matched route and status code",
            http_requests.clone(),
        );
        registry.register(
            "http_requests_in_flight",
            "HTTP requests being served now",
            http_in_flight.clone(),
        );
        registry.register(
            "mcp_tool_calls",
            "MCP tool calls by tool and outcome (ok, error, failed)",
            mcp_calls.clone(),
        );
        let client_runs = Family::<ClientLabels, Counter>::default();
        let client_refusals = Family::<ClientLabels, Counter>::default();
        let client_queue_wait = Family::new_with_constructor(wait_buckets as fn() -> Histogram);
        let audit_dropped = Counter::default();
        registry.register(
            "client_runs",
            "Runs by client and outcome (ok, error, timeout, limit, busy, failed)",
            client_runs.clone(),
        );
        registry.register(
            "client_refusals",
            "Requests refused by a client's rights or quotas, by client and reason (scope, env, concurrency, rate, sessions)",
            client_refusals.clone(),
        );
        registry.register_with_unit(
            "client_queue_wait",
            "Time a request waited for a free worker, by client",
            Unit::Seconds,
            client_queue_wait.clone(),
        );
        registry.register(
            "audit_dropped",
            "Audit records dropped (audit_fail = \"open\": the queue was full or the sink failed)",
            audit_dropped.clone(),
        );
        let pools = Arc::new(RwLock::new(pools));
        registry.register_collector(Box::new(PoolCollector {
            pools: pools.clone(),
        }));
        let egress = Arc::new(RwLock::new(Vec::new()));
        registry.register_collector(Box::new(EgressCollector {
            proxies: egress.clone(),
        }));
        Metrics {
            pools,
            egress,
            client_runs,
            client_refusals,
            client_queue_wait,
            audit_dropped,
            registry,
            runs,
            run_duration,
            queue_wait,
            http_requests,
            http_in_flight,
            mcp_calls,
            routes: RwLock::new(HashMap::new()),
        }
    }

    /// The pools of the environments served now (after a rescan).
    pub(crate) fn set_pools(&self, pools: Vec<(String, EnvPool)>) {
        *self.pools.write() = pools;
    }

    /// The egress proxies of the environments served now (after a rescan):
    /// those of environments found, created or read again since the start
    /// count too.
    pub(crate) fn set_egress(&self, proxies: Proxies) {
        *self.egress.write() = proxies;
    }

    /// With this replica's own gauges: `replica_info{replica}`, `draining`
    /// and `sessions` (read at scrape time).
    pub fn with_replica(mut self, replica: Arc<Replica>, sessions: Arc<Sessions>) -> Metrics {
        self.registry
            .register_collector(Box::new(ReplicaCollector { replica, sessions }));
        self
    }

    /// Count the egress proxies' connections and bytes, per environment
    /// with `allowed_hosts` (read from the proxies at scrape time).
    pub(crate) fn with_egress(self, proxies: Proxies) -> Metrics {
        self.set_egress(proxies);
        self
    }

    /// The handles of one environment (every outcome shows from the start,
    /// at 0, so that rates work before the first failure).
    pub fn env(&self, name: &str) -> EnvMetrics {
        let env: Arc<str> = Arc::from(name);
        EnvMetrics {
            outcomes: RunOutcome::ALL.map(|outcome| {
                self.runs.get_or_create_owned(&RunLabels {
                    env: env.clone(),
                    outcome,
                })
            }),
            duration: self
                .run_duration
                .get_or_create_owned(&EnvLabel(env.clone())),
            queue_wait: self.queue_wait.get_or_create_owned(&EnvLabel(env)),
        }
    }

    /// Count one answered HTTP request.
    /// The metrics handles of client `name`.
    pub fn client(&self, name: &str) -> ClientMetrics {
        let client: Arc<str> = Arc::from(name);
        ClientMetrics {
            runs: RunOutcome::ALL.map(|outcome| {
                self.client_runs.get_or_create_owned(&ClientLabels {
                    client: client.clone(),
                    key: "outcome",
                    value: outcome.as_str(),
                })
            }),
            refusals: REFUSALS.map(|reason| {
                self.client_refusals.get_or_create_owned(&ClientLabels {
                    client: client.clone(),
                    key: "reason",
                    value: reason,
                })
            }),
            queue_wait: self
                .client_queue_wait
                .get_or_create_owned(&ClientLabel(client)),
        }
    }

    /// An audit record dropped.
    pub fn audit_dropped(&self) {
        self.audit_dropped.inc();
    }

    pub fn http_request(&self, method: &axum::http::Method, route: &str, status: u16) {
        let route = self.route(route);
        let method = match *method {
            axum::http::Method::GET => "GET",
            axum::http::Method::POST => "POST",
            axum::http::Method::DELETE => "DELETE",
            axum::http::Method::PUT => "PUT",
            axum::http::Method::HEAD => "HEAD",
            axum::http::Method::OPTIONS => "OPTIONS",
            axum::http::Method::PATCH => "PATCH",
            _ => "other",
        };
        self.http_requests
            .get_or_create(&HttpLabels {
                method,
                route,
                status,
            })
            .inc();
    }

    /// The gauge of requests being served.
    pub fn http_in_flight(&self) -> &Gauge {
        &self.http_in_flight
    }

    /// Count one MCP tool call.
    pub fn mcp_call(&self, tool: &str, outcome: &'static str) {
        let tool = self.route(tool);
        self.mcp_calls
            .get_or_create(&ToolLabels { tool, outcome })
            .inc();
    }

    /// A shared copy of `name` (routes and tool names are a small set).
    fn route(&self, name: &str) -> Arc<str> {
        if let Some(known) = self.routes.read().get(name) {
            return known.clone();
        }
        self.routes
            .write()
            .entry(name.into())
            .or_insert_with(|| Arc::from(name))
            .clone()
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        if prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry).is_err() {
            // Writing to a String cannot fail; keep what was written.
            let _ = writeln!(out, "# encoding error");
        }
        out
    }
}

/// The egress proxies of the environments served, by environment name.
type Proxies = Vec<(String, Arc<crate::egress::ProxyContext>)>;

/// The egress proxies' counts, read at scrape time (no families where no
/// environment has an allow-list).
#[derive(Debug)]
struct EgressCollector {
    proxies: Arc<RwLock<Proxies>>,
}

impl Collector for EgressCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let proxies = self.proxies.read().clone();
        if proxies.is_empty() {
            return Ok(());
        }
        {
            let counter = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(
                "egress_connections",
                "Connections runs asked the egress proxy for, by environment and decision (allowed, denied)",
                None,
                counter.metric_type(),
            )?;
            for (name, ctx) in &proxies {
                for (decision, n) in [("allowed", &ctx.allowed), ("denied", &ctx.denied)] {
                    let labels = [("env", name.as_str()), ("decision", decision)];
                    ConstCounter::new(n.load(Relaxed)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "egress",
            "Bytes through the egress proxy, by environment and direction (sent, received)",
            Some(&Unit::Bytes),
            counter.metric_type(),
        )?;
        for (name, ctx) in &proxies {
            for (direction, n) in [("sent", &ctx.bytes_sent), ("received", &ctx.bytes_received)] {
                let labels = [("env", name.as_str()), ("direction", direction)];
                ConstCounter::new(n.load(Relaxed)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Pool state read at scrape time: workers by state, restarts by cause.
struct PoolCollector {
    pools: Arc<RwLock<Vec<(String, EnvPool)>>>,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCollector").finish_non_exhaustive()
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pools = self.pools.read().clone();
        let statuses: Vec<_> = pools.iter().map(|(_, p)| p.status()).collect();
        {
            let gauge = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(
                "workers",
                "Live worker processes by environment and state (idle, busy, starting; cleaning: clearing the many files a run left; session_spare: a closed session's worker kept for the next session)",
                None,
                gauge.metric_type(),
            )?;
            for ((name, _), status) in pools.iter().zip(&statuses) {
                for (state, n) in [
                    ("idle", status.idle),
                    ("busy", status.busy),
                    ("starting", status.starting),
                    ("cleaning", status.cleaning),
                    ("session_spare", status.session_spares),
                ] {
                    let labels = [("env", name.as_str()), ("state", state)];
                    ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        {
            let gauge = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(
                "requests_waiting",
                "Requests waiting for a free worker now, by environment (past queue_timeout_secs each is refused with 503 busy)",
                None,
                gauge.metric_type(),
            )?;
            for ((name, _), status) in pools.iter().zip(&statuses) {
                let labels = [("env", name.as_str())];
                ConstGauge::new(status.waiting as i64).encode(family.encode_family(&labels)?)?;
            }
        }
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "worker_restarts",
            "Workers replaced, by environment and cause (timeout, crash, cancelled, recycle, dirty)",
            None,
            counter.metric_type(),
        )?;
        for (name, pool) in &pools {
            for cause in RestartCause::ALL {
                let labels = [("env", name.as_str()), ("cause", cause.as_str())];
                ConstCounter::new(pool.restarts(cause)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "cleared_out_of_turn",
            "Runs that left over 2,048 files and directories, by environment: their worker cleared them out of turn, serving no request meanwhile",
            None,
            counter.metric_type(),
        )?;
        for (name, pool) in &pools {
            let labels = [("env", name.as_str())];
            ConstCounter::new(pool.cleared_out_of_turn()).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// This replica's state, read at scrape time: its id (as a label, so that
/// series of many replicas can be told apart and joined), whether it is
/// draining (an autoscaler should not count it) and its live sessions.
struct ReplicaCollector {
    replica: Arc<Replica>,
    sessions: Arc<Sessions>,
}

impl std::fmt::Debug for ReplicaCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaCollector").finish_non_exhaustive()
    }
}

impl Collector for ReplicaCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        {
            let gauge = ConstGauge::new(1i64);
            let mut family = encoder.encode_descriptor(
                "replica_info",
                "This replica's id (--replica-id, default the host name); always 1",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(family.encode_family(&[("replica", self.replica.id())])?)?;
        }
        let draining = ConstGauge::new(i64::from(self.replica.is_draining()));
        draining.encode(encoder.encode_descriptor(
            "draining",
            "1 while this replica drains after SIGTERM (/health answers 503), else 0",
            None,
            draining.metric_type(),
        )?)?;
        let sessions = ConstGauge::new(self.sessions.live() as i64);
        sessions.encode(encoder.encode_descriptor(
            "sessions",
            "Live sessions on this replica (each holds a worker of its own)",
            None,
            sessions.metric_type(),
        )?)?;
        Ok(())
    }
}

//! The audit log (`--audit-log PATH`, `-` for stderr): one JSON line per
//! run, session call, grading, session start/close/expiry, install, env
//! create/delete, and refused request (authentication, scope, env, quota). The schema is
//! versioned ([`SCHEMA_VERSION`]) and documented field by field in
//! docs/operations.md.
//!
//! Off the request path: a record is built from facts the request already
//! has, and handed to a bounded queue; one writer thread writes each
//! record with one `write(2)` (`O_APPEND`), so a failure is seen on the
//! record it hits.
//!
//! * `audit_fail = "open"` (default): a record that finds the queue full,
//!   or that the sink cannot write, is dropped and counted
//!   (`code_executor_audit_dropped_total`, and a warning in the log).
//! * `audit_fail = "closed"`: a request that will run code reserves its
//!   record's queue slot before it runs ([`Audit::reserve`]); with no slot
//!   free, or while the sink is failing, it is refused with
//!   `503 audit_unavailable` and nothing runs. A record in the queue is
//!   never dropped: the writer retries it (reopening the file) until it is
//!   written, and the queue holds the rest meanwhile.
//!
//! SIGHUP reopens the file (after logrotate moved it); `audit_max_bytes`
//! rotates it in place (`PATH` → `PATH.1`) when it grows past the size.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::auth::Caller;
use crate::error::{ExecError, StartError};

/// The version of the record schema (`v` in every record). Fields may be
/// added within a version; a field's meaning never changes within one.
pub const SCHEMA_VERSION: u32 = 1;

/// How long the writer waits before retrying a record it could not write.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Drops logged one in this many (the first always).
const DROP_LOG_EVERY: u64 = 1000;

/// What an audit record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A clean run (`/execute`, `execute_code`) that reached a worker.
    Run,
    /// A call of a session.
    SessionCall,
    /// One `/grade` request (or one submission of `/grade/batch`).
    Grade,
    /// A session started.
    SessionCreate,
    /// A session closed by its client.
    SessionClose,
    /// A session ended by its idle TTL.
    SessionExpire,
    /// A package install.
    Install,
    /// `POST /envs` ended (an environment created, or the create failed).
    EnvCreate,
    /// `DELETE /envs/{name}` ended (deleted, or refused).
    EnvDelete,
    /// A request refused for its credentials or rights (401, 403).
    AuthFailure,
    /// A request refused by a client's quota (429).
    RateLimited,
}

impl RecordKind {
    /// Every kind, as the docs list them.
    pub const ALL: [RecordKind; 11] = [
        RecordKind::Run,
        RecordKind::SessionCall,
        RecordKind::Grade,
        RecordKind::SessionCreate,
        RecordKind::SessionClose,
        RecordKind::SessionExpire,
        RecordKind::Install,
        RecordKind::EnvCreate,
        RecordKind::EnvDelete,
        RecordKind::AuthFailure,
        RecordKind::RateLimited,
    ];

    /// The kind's name in records.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Run => "run",
            RecordKind::SessionCall => "session_call",
            RecordKind::Grade => "grade",
            RecordKind::SessionCreate => "session_create",
            RecordKind::SessionClose => "session_close",
            RecordKind::SessionExpire => "session_expire",
            RecordKind::Install => "install",
            RecordKind::EnvCreate => "env_create",
            RecordKind::EnvDelete => "env_delete",
            RecordKind::AuthFailure => "auth_failure",
            RecordKind::RateLimited => "rate_limited",
        }
    }
}

/// One audit record. Absent fields are left out of the line.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Schema version.
    pub v: u32,
    /// When the record was made (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// What the record is about.
    pub kind: RecordKind,
    /// The request id (`x-request-id`; each MCP call has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Arc<str>>,
    /// The client's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<Arc<str>>,
    /// The peer's address (HTTP front ends).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// `http`, `mcp-stdio`, `mcp-http` (`internal` for calls made in-process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub front_end: Option<&'static str>,
    /// The environment's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// The environment's content hash, where the server knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_hash: Option<String>,
    /// The session's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// SHA-256 of the code as sent (UTF-8), hex.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_sha256: Option<String>,
    /// Bytes of the code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_bytes: Option<usize>,
    /// How it ended (`ok`, `error`, `timeout`, `limit`, `failed`,
    /// `cancelled`, `refused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'static str>,
    /// The limit that stopped the run (`outcome::Limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<&'static str>,
    /// Exit status (`-N`: signal N).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Wall time, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_ms: Option<f64>,
    /// CPU time (user + system), milliseconds, where measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<f64>,
    /// Peak resident set, KiB, where measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_kb: Option<u64>,
    /// Bytes of stdout and stderr kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// Bytes the run sent over the network, where counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net_bytes_out: Option<u64>,
    /// Bytes the run received over the network, where counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net_bytes_in: Option<u64>,
    /// The HTTP status of a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The error code of a refusal or failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// What the refusal said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Test cases of a grading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cases: Option<usize>,
    /// Cases per verdict of a grading.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdicts: Option<BTreeMap<String, usize>>,
    /// Packages of an install.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages: Option<Vec<String>>,
    /// The code itself (`audit_include_code = true` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The run's stdout (`audit_include_code = true` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// The run's stderr (`audit_include_code = true` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
}

impl Record {
    /// A record of `kind`, now, with the caller's identity when there is one.
    pub fn new(kind: RecordKind, caller: Option<&Caller>) -> Record {
        Record {
            v: SCHEMA_VERSION,
            time: crate::session::clock::rfc3339(SystemTime::now()),
            kind,
            request_id: caller.map(|c| c.request_id.clone()),
            client: caller.map(|c| c.client.name_arc().clone()),
            remote: caller.and_then(|c| c.remote).map(|a| a.to_string()),
            front_end: caller.map(|c| c.front.as_str()),
            env: None,
            env_hash: None,
            session: None,
            code_sha256: None,
            code_bytes: None,
            outcome: None,
            limit: None,
            exit_code: None,
            wall_ms: None,
            cpu_ms: None,
            peak_rss_kb: None,
            output_bytes: None,
            net_bytes_out: None,
            net_bytes_in: None,
            status: None,
            error: None,
            message: None,
            cases: None,
            verdicts: None,
            packages: None,
            code: None,
            stdout: None,
            stderr: None,
        }
    }

    /// Set the code's hash and size (and the code, when it is kept).
    pub fn set_code(&mut self, facts: &CodeFacts) {
        self.code_sha256 = Some(facts.sha256.clone());
        self.code_bytes = Some(facts.bytes);
        self.code = facts.code.clone();
    }
}

/// What the audit log keeps of a request's code, taken when it is checked.
#[derive(Debug, Clone)]
pub struct CodeFacts {
    /// SHA-256, hex.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: usize,
    /// The code, with `audit_include_code`.
    pub code: Option<String>,
}

impl CodeFacts {
    /// The facts of `code`.
    pub fn of(code: &str, include: bool) -> CodeFacts {
        CodeFacts {
            sha256: crate::auth::sha256_hex(code.as_bytes()),
            bytes: code.len(),
            code: include.then(|| code.to_string()),
        }
    }
}

/// Where records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// Standard error (`-`).
    Stderr,
    /// A file, appended to.
    File(PathBuf),
}

impl AuditTarget {
    /// `-` is stderr; anything else a path.
    pub fn parse(text: &std::path::Path) -> AuditTarget {
        if text.as_os_str() == "-" {
            AuditTarget::Stderr
        } else {
            AuditTarget::File(text.to_path_buf())
        }
    }
}

/// What happens when a record cannot be kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditFail {
    /// Serve on; drop the record and count it.
    #[default]
    Open,
    /// Refuse requests (`503 audit_unavailable`) while records cannot be kept.
    Closed,
}

/// The audit settings.
#[derive(Debug, Clone, Default)]
pub struct AuditConfig {
    /// Where records go; `None`: no audit log.
    pub target: Option<AuditTarget>,
    /// Fail open or closed.
    pub fail: AuditFail,
    /// Records carry the code and the output.
    pub include_code: bool,
    /// Records the queue holds before the writer takes them.
    pub queue: usize,
    /// Rotate the file past this size (`PATH` → `PATH.1`).
    pub max_bytes: Option<u64>,
}

/// The default queue size.
pub const DEFAULT_QUEUE: usize = 4096;

enum Msg {
    Record(Box<Record>),
    Flush(oneshot::Sender<()>),
}

/// Queue slots reserved for a request's records (`audit_fail = "closed"`),
/// one per record it will write; each record kept takes one.
pub struct Slot(Vec<mpsc::OwnedPermit<Msg>>);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

/// State shared with the writer thread.
#[derive(Default)]
struct Shared {
    /// The sink failed its last write (or reopen) and has not written since.
    failed: AtomicBool,
    /// A reopen was asked for (SIGHUP).
    reopen: AtomicBool,
    written: AtomicU64,
    dropped: AtomicU64,
}

/// The audit log: the queue's sending side and the writer's state.
pub struct Audit {
    /// `None`: no audit log (every call is a no-op).
    tx: Option<mpsc::Sender<Msg>>,
    fail: AuditFail,
    include_code: bool,
    shared: Arc<Shared>,
    /// Counts dropped records in the metrics.
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl std::fmt::Debug for Audit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Audit")
            .field("enabled", &self.tx.is_some())
            .field("fail", &self.fail)
            .finish_non_exhaustive()
    }
}

impl Audit {
    /// No audit log.
    pub fn disabled() -> Audit {
        Audit {
            tx: None,
            fail: AuditFail::Open,
            include_code: false,
            shared: Arc::default(),
            metrics: None,
        }
    }

    /// Open the sink (an error if it cannot be opened at all) and start
    /// its writer thread.
    pub fn start(
        config: &AuditConfig,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<Audit, StartError> {
        let Some(target) = config.target.clone() else {
            return Ok(Audit::disabled());
        };
        let mut sink = Sink::open(target, config.max_bytes).map_err(StartError::Audit)?;
        let (tx, mut rx) = mpsc::channel::<Msg>(config.queue.max(1));
        let shared = Arc::new(Shared::default());
        let fail = config.fail;
        let writer_shared = shared.clone();
        let writer_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || {
                while let Some(msg) = rx.blocking_recv() {
                    match msg {
                        Msg::Flush(done) => {
                            let _ = done.send(());
                        }
                        Msg::Record(record) => {
                            let mut line = serde_json::to_vec(&*record).unwrap_or_default();
                            line.push(b'\n');
                            sink.write(&line, &writer_shared, fail, &writer_metrics);
                        }
                    }
                }
            })
            .map_err(StartError::Audit)?;
        Ok(Audit {
            tx: Some(tx),
            fail,
            include_code: config.include_code,
            shared,
            metrics: Some(metrics),
        })
    }

    /// Whether records are kept at all.
    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Whether records carry code and output.
    pub fn include_code(&self) -> bool {
        self.include_code
    }

    /// Before a request runs: with `audit_fail = "closed"`, a queue slot
    /// for its record, or `503 audit_unavailable`; `None` otherwise.
    pub fn reserve(&self) -> Result<Option<Slot>, ExecError> {
        self.reserve_n(1, 1)
    }

    /// With `audit_fail = "closed"`: make the slots `caller` holds number
    /// at least `n` (a request that writes `n` records), all or none, or
    /// `503 audit_unavailable`. A no-op otherwise.
    pub fn reserve_records(&self, caller: &Caller, n: usize) -> Result<(), ExecError> {
        let mut held = caller.audit_slot.lock();
        let have = held.as_ref().map_or(0, |s| s.0.len());
        if have >= n {
            return Ok(());
        }
        if let Some(Slot(more)) = self.reserve_n(n - have, n)? {
            held.get_or_insert_with(|| Slot(Vec::new())).0.extend(more);
        }
        Ok(())
    }

    /// `n` more queue slots (closed) for a request writing `total`
    /// records, or none of them.
    fn reserve_n(&self, n: usize, total: usize) -> Result<Option<Slot>, ExecError> {
        let (Some(tx), AuditFail::Closed) = (&self.tx, self.fail) else {
            return Ok(None);
        };
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(ExecError::AuditUnavailable(
                "the audit log cannot be written (audit_fail = \"closed\"): nothing runs until it can"
                    .into(),
            ));
        }
        if total > tx.max_capacity() {
            return Err(ExecError::AuditUnavailable(format!(
                "the request writes {total} audit records, more than the audit queue holds \
                 (audit_queue = {}; audit_fail = \"closed\")",
                tx.max_capacity()
            )));
        }
        let mut permits = Vec::with_capacity(n);
        for _ in 0..n {
            // A slot short: the ones taken go back as `permits` drops.
            let permit = tx.clone().try_reserve_owned().map_err(|_| {
                ExecError::AuditUnavailable(
                    "the audit log is not keeping up (audit_fail = \"closed\"): retry shortly"
                        .into(),
                )
            })?;
            permits.push(permit);
        }
        Ok(Some(Slot(permits)))
    }

    /// Keep `record`: in the caller's reserved slot when it has one, else
    /// in the queue if there is room (dropped and counted if not).
    pub fn emit(&self, record: Record, caller: Option<&Caller>) {
        let Some(tx) = &self.tx else {
            return;
        };
        let msg = Msg::Record(Box::new(record));
        let reserved = caller.and_then(|c| c.audit_slot.lock().as_mut().and_then(|s| s.0.pop()));
        if let Some(permit) = reserved {
            permit.send(msg);
            return;
        }
        if tx.try_send(msg).is_err() {
            note_drop(&self.shared, self.metrics.as_deref(), "the queue is full");
        }
    }

    /// Ask the writer to reopen the file (SIGHUP, after logrotate).
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Ordering::Release);
    }

    /// Records written and dropped so far.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.written.load(Ordering::Relaxed),
            self.shared.dropped.load(Ordering::Relaxed),
        )
    }

    /// Wait (at most `within`) until every record queued so far is written.
    pub async fn flush(&self, within: Duration) {
        let Some(tx) = &self.tx else {
            return;
        };
        let (done, wait) = oneshot::channel();
        let _ = tokio::time::timeout(within, async {
            if tx.send(Msg::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
    }
}

fn note_drop(shared: &Shared, metrics: Option<&crate::metrics::Metrics>, why: &str) {
    let n = shared.dropped.fetch_add(1, Ordering::Relaxed);
    if let Some(m) = metrics {
        m.audit_dropped();
    }
    if n.is_multiple_of(DROP_LOG_EVERY) {
        tracing::warn!(dropped = n + 1, "audit record dropped: {why}");
    }
}

/// The file (or stderr) the writer writes to.
struct Sink {
    target: AuditTarget,
    file: Option<std::fs::File>,
    /// Bytes in the file now (for `max_bytes`).
    size: u64,
    max_bytes: Option<u64>,
}

impl Sink {
    fn open(target: AuditTarget, max_bytes: Option<u64>) -> std::io::Result<Sink> {
        let mut sink = Sink {
            target,
            file: None,
            size: 0,
            max_bytes,
        };
        sink.reopen()?;
        Ok(sink)
    }

    fn reopen(&mut self) -> std::io::Result<()> {
        self.file = None;
        if let AuditTarget::File(path) = &self.target {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
            self.file = Some(file);
        }
        Ok(())
    }

    fn write_once(&mut self, line: &[u8]) -> std::io::Result<()> {
        match &self.target {
            AuditTarget::Stderr => std::io::stderr().lock().write_all(line),
            AuditTarget::File(_) => match &mut self.file {
                Some(file) => {
                    file.write_all(line)?;
                    self.size += line.len() as u64;
                    Ok(())
                }
                None => self.reopen().and_then(|()| self.write_once(line)),
            },
        }
    }

    /// Write one line; closed: until it is written; open: once.
    fn write(
        &mut self,
        line: &[u8],
        shared: &Shared,
        fail: AuditFail,
        metrics: &crate::metrics::Metrics,
    ) {
        loop {
            if shared.reopen.swap(false, Ordering::AcqRel)
                && let Err(e) = self.reopen()
            {
                tracing::error!("cannot reopen the audit log: {e}");
            }
            match self.write_once(line) {
                Ok(()) => {
                    if shared.failed.swap(false, Ordering::AcqRel) {
                        tracing::info!("the audit log is written again");
                    }
                    shared.written.fetch_add(1, Ordering::Relaxed);
                    self.rotate_if_full();
                    return;
                }
                Err(e) => {
                    if !shared.failed.swap(true, Ordering::AcqRel) {
                        tracing::error!("cannot write the audit log: {e}");
                    }
                    match fail {
                        AuditFail::Open => {
                            note_drop(shared, Some(metrics), "the audit log cannot be written");
                            return;
                        }
                        AuditFail::Closed => {
                            std::thread::sleep(RETRY_PAUSE);
                            // The file may have gone (a deleted directory):
                            // the next attempt opens it again.
                            self.file = None;
                        }
                    }
                }
            }
        }
    }

    fn rotate_if_full(&mut self) {
        let (Some(max), AuditTarget::File(path)) = (self.max_bytes, &self.target) else {
            return;
        };
        if self.size < max {
            return;
        }
        let mut rotated = path.clone().into_os_string();
        rotated.push(".1");
        if let Err(e) = std::fs::rename(path, &rotated) {
            tracing::error!("cannot rotate the audit log: {e}");
            return;
        }
        if let Err(e) = self.reopen() {
            tracing::error!("cannot open the audit log after rotating it: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Caller, Clients, ClientsConfig, FrontEnd};

    fn caller(clients: &Clients) -> Caller {
        let client = clients.anonymous().expect("the anonymous client");
        Caller::new(client, "r".into(), None, FrontEnd::Http)
    }

    #[tokio::test]
    async fn a_request_holds_a_slot_for_each_of_its_records_or_none() {
        let metrics = Arc::new(crate::metrics::Metrics::new(Vec::new()));
        let clients = Clients::load(ClientsConfig::default(), metrics.clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = AuditConfig {
            target: Some(AuditTarget::File(dir.path().join("audit.log"))),
            fail: AuditFail::Closed,
            queue: 3,
            ..AuditConfig::default()
        };
        let audit = Audit::start(&config, metrics).unwrap();
        let (other, mine) = (caller(&clients), caller(&clients));
        // Another request holds one slot: two are free, three are asked.
        *other.audit_slot.lock() = audit.reserve().unwrap();
        assert!(matches!(
            audit.reserve_records(&mine, 3),
            Err(ExecError::AuditUnavailable(_))
        ));
        // The refusal kept none: both free slots can still be had.
        audit.reserve_records(&mine, 2).unwrap();
        let held = |c: &Caller| c.audit_slot.lock().as_ref().map_or(0, |s| s.0.len());
        assert_eq!(held(&mine), 2);
        // More than the queue holds is never granted.
        let err = audit.reserve_records(&mine, 4).unwrap_err();
        assert!(err.to_string().contains("audit_queue = 3"), "{err}");
        // Each record kept takes one of the caller's slots.
        for _ in 0..2 {
            audit.emit(Record::new(RecordKind::Run, Some(&mine)), Some(&mine));
        }
        assert_eq!(held(&mine), 0);
        audit.flush(Duration::from_secs(5)).await;
        assert_eq!(audit.counts(), (2, 0));
    }
}

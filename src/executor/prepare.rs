//! Request validation: every refusal of a request happens here, before any
//! worker is involved.

use std::sync::atomic::Ordering;

use super::Executor;
use std::sync::Arc;

use crate::api::{ArtifactSelection, ExecRequest, NetworkRequest, check_file_path, check_file_set};
use crate::egress::Policy;
use crate::env::EnvSettings;
use crate::error::ExecError;
use crate::limits::{RequestLimits, ResultLimits, narrow_limits, run_timeout};
use crate::protocol::{self, ExecFrame, FileEntry, WireLimits, WireSelection};
use crate::session::ActiveCall;

/// A validated request, encoded and bound to its environment.
pub struct PreparedRun {
    /// The environment the run goes to (held even if a rescan drops it
    /// meanwhile: the run ends on its pool).
    pub(super) env: std::sync::Arc<super::EnvEntry>,
    pub(super) frame: Vec<u8>,
    pub(super) timeout: f64,
    /// The address-space limit the run gets (configured, narrowed by the
    /// request), to tell a run that hit it.
    pub(super) memory_bytes: Option<u64>,
    /// The session the run belongs to, held active (it cannot expire)
    /// until the run ends.
    pub(super) session: Option<ActiveCall>,
    /// The run's `processes`, for the worker's pids cgroup, when the
    /// request lowered it.
    pub(super) processes: Option<u64>,
    /// The run's allow-list, for the worker's egress proxy (environments
    /// with `allowed_hosts`).
    pub(super) network: Option<Arc<Policy>>,
    /// What the audit log keeps of the code (`None`: no audit log, or a
    /// grading case, audited with its grading).
    pub(super) audit: Option<crate::audit::CodeFacts>,
}

impl PreparedRun {
    /// The effective wall-clock limit of the run, seconds.
    pub fn timeout(&self) -> f64 {
        self.timeout
    }

    /// The effective address-space limit of the run, bytes.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory_bytes
    }
}

/// What a caller inside the crate may add to a request's run beyond what
/// [`ExecRequest`] carries (grading uses both).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `sys.argv[1:]` of the run.
    pub argv: Vec<String>,
    /// Reap the run before answering and report its CPU time and peak RSS.
    pub rusage: bool,
    /// Caps on the artifacts' content in place of the server's
    /// `max_artifact_bytes` / `max_artifacts_bytes` (MCP keeps artifacts in
    /// its store, so it takes larger ones).
    pub artifacts: Option<ResultLimits>,
    /// Plots are saved at a resolution of at most this many pixels.
    pub max_image_pixels: Option<u64>,
    /// A case of a grading: needs the caller's `grade` scope (checked with
    /// the grading), not `execute`, and is audited with its grading.
    pub graded: bool,
    /// Once the code has run, call this function of it and report its
    /// value (grading's function mode).
    pub call: Option<protocol::EntryCall>,
    /// Input files the worker compiles as Python modules, found by the
    /// run's code in its global `__compiled__` (grading's test-code mode).
    pub compile: Vec<String>,
}

/// What checking a request against one environment needs: no worker, no
/// pool, no session registry.
#[derive(Debug, Clone, Copy)]
pub(super) struct RunContext<'a> {
    /// The environment's timeout, limits and scratch quota.
    pub(super) settings: &'a EnvSettings,
    /// The session's default timeout, for a session call.
    pub(super) session_timeout: Option<f64>,
    /// The session's limits, for a session call: they stand in for the
    /// environment's (narrowed to the caller's when the session began).
    pub(super) session_limits: Option<&'a WireLimits>,
    /// Caps on the request's code and files.
    pub(super) request_limits: &'a RequestLimits,
    /// Workers have a scratch tmpfs of `settings.disk_bytes`, so
    /// `limits.disk_bytes` can be watched (and files can be checked
    /// against it).
    pub(super) disk_quota: bool,
    /// Output kept per stream.
    pub(super) max_output_bytes: u64,
    /// Caps on artifacts and on the `result` repr.
    pub(super) results: ResultLimits,
    /// The environment's allow-list, when it has one.
    pub(super) egress: Option<&'a Arc<Policy>>,
    /// The caller's ceilings on timeout and limits, when it has any.
    pub(super) client: Option<&'a crate::auth::Client>,
}

/// A request checked and encoded as an `exec` frame.
#[derive(Debug)]
pub(super) struct Checked {
    pub(super) frame: Vec<u8>,
    pub(super) timeout: f64,
    pub(super) memory_bytes: Option<u64>,
    pub(super) processes: Option<u64>,
    pub(super) network: Option<Arc<Policy>>,
}

/// Check `req` against `ctx` and encode it as the `exec` frame `id`. Every
/// refusal of a request's content happens here.
pub(super) fn check(
    req: &ExecRequest,
    ctx: &RunContext<'_>,
    options: &RunOptions,
    id: u64,
) -> Result<Checked, ExecError> {
    let settings = ctx.settings;
    let max_timeout = match ctx.client.and_then(|c| c.max_timeout()) {
        Some(ceiling) => settings.max_timeout.min(ceiling),
        None => settings.max_timeout,
    };
    let timeout = run_timeout(
        req.timeout,
        ctx.session_timeout
            .unwrap_or(settings.timeout)
            .min(max_timeout),
        max_timeout,
    )?;
    if let Some(digits @ 1..640) = req.int_max_str_digits {
        return Err(ExecError::BadRequest(format!(
            "int_max_str_digits must be 0 (no limit) or at least 640, got {digits}"
        )));
    }
    let limits = ctx.request_limits;
    if req.code.len() > limits.max_code_bytes {
        return Err(ExecError::TooLarge(format!(
            "code is {} bytes, over the max_code_bytes limit of {}",
            req.code.len(),
            limits.max_code_bytes
        )));
    }
    let count = req.files.as_ref().map_or(0, |f| f.len());
    if count > limits.max_files {
        return Err(ExecError::TooLarge(format!(
            "{count} files, over the max_files limit of {}",
            limits.max_files
        )));
    }
    let mut contents = Vec::new();
    let mut total = 0usize;
    for (path, content) in req.files.iter().flatten() {
        check_file_path(path).map_err(ExecError::BadRequest)?;
        let bytes = content
            .to_bytes()
            .map_err(|e| ExecError::BadRequest(format!("file {path:?}: {e}")))?;
        total += bytes.len();
        if total > limits.max_files_bytes {
            return Err(ExecError::TooLarge(format!(
                "files total over the max_files_bytes limit of {} bytes",
                limits.max_files_bytes
            )));
        }
        contents.push((path.as_str(), bytes));
    }
    check_file_set(contents.iter().map(|(p, _)| *p)).map_err(ExecError::BadRequest)?;
    // Files that cannot fit in the worker's scratch tmpfs never could.
    if ctx.disk_quota && total as u64 > settings.disk_bytes {
        return Err(ExecError::TooLarge(format!(
            "files total {total} bytes, over the disk_bytes quota of {} bytes",
            settings.disk_bytes
        )));
    }
    let artifacts = match &req.artifacts {
        None => WireSelection::All(true),
        Some(ArtifactSelection::All(all)) => WireSelection::All(*all),
        Some(ArtifactSelection::Globs(globs)) => {
            if globs.iter().any(|g| g.is_empty()) {
                return Err(ExecError::BadRequest(
                    "artifact globs must not be empty".into(),
                ));
            }
            WireSelection::Globs(globs)
        }
    };
    let mut run = ctx.session_limits.unwrap_or(&settings.run_limits).clone();
    run.cpu_seconds.get_or_insert(timeout.ceil() as u64 + 1);
    if let Some(ceiling) = ctx.client.and_then(|c| c.limits()) {
        run = narrow_limits(&run, ceiling)?;
    }
    if let Some(asked) = &req.limits {
        run = narrow_limits(&run, asked)?;
    }
    run.disk_bytes = run_disk_bytes(ctx, run.disk_bytes)?;
    if let Some(disk) = run.disk_bytes
        && total as u64 > disk
    {
        // The run's files count against its own limit as well.
        return Err(ExecError::TooLarge(format!(
            "files total {total} bytes, over the request's limits.disk_bytes of {disk} bytes"
        )));
    }
    let network = run_network(ctx.egress, req.network.as_ref())?;
    let results = options.artifacts.unwrap_or(ctx.results);
    let exec = ExecFrame {
        t: "exec",
        id,
        // A byte order mark before the code is dropped, as Python drops it
        // from a source file.
        code: req.code.strip_prefix('\u{feff}').unwrap_or(&req.code),
        stdin: req.stdin.as_deref().map(str::as_bytes),
        files: contents
            .iter()
            .map(|(p, b)| FileEntry(p, b.as_slice()))
            .collect(),
        argv: &options.argv,
        timeout,
        max_output: ctx.max_output_bytes,
        limits: &run,
        stream: req.stream.unwrap_or(false),
        artifacts,
        max_artifact_bytes: results.max_artifact_bytes,
        max_artifacts_bytes: results.max_artifacts_bytes,
        max_image_pixels: options.max_image_pixels,
        max_result_chars: ctx.results.max_result_chars,
        rusage: options.rusage,
        int_max_str_digits: req.int_max_str_digits,
        call: options.call.as_ref(),
        compile: &options.compile,
    };
    // A clean run's frame goes to its worker in marshal, which the worker
    // reads in C; a session call's (`session_timeout` set) in msgpack,
    // which the server reads first (see `protocol`).
    let frame = match ctx.session_timeout {
        None => protocol::encode_marshal_frame(&exec),
        Some(_) => protocol::encode_frame(&exec),
    }
    .map_err(|e| ExecError::BadRequest(format!("request cannot be encoded: {e}")))?;
    Ok(Checked {
        frame,
        timeout,
        memory_bytes: run.memory_bytes,
        processes: req
            .limits
            .as_ref()
            .and_then(|l| l.processes)
            .and(run.processes),
        network,
    })
}

/// A run's allow-list: the environment's, narrowed by the request's own.
/// A request may not ask for a network where the environment has none.
pub(super) fn run_network(
    egress: Option<&Arc<Policy>>,
    asked: Option<&NetworkRequest>,
) -> Result<Option<Arc<Policy>>, ExecError> {
    match (egress, asked) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(ExecError::BadRequest(
            "network.allowed_hosts: this environment has no allowed_hosts, so its runs reach no host a request could narrow to".into(),
        )),
        (Some(policy), None) => Ok(Some(policy.clone())),
        (Some(policy), Some(asked)) => policy
            .narrow(&asked.allowed_hosts)
            .map(|p| Some(Arc::new(p)))
            .map_err(ExecError::BadRequest),
    }
}

/// A run's `limits.disk_bytes`: watched by the worker below the size of its
/// scratch tmpfs (which caps every run anyway); refused where there is no
/// such tmpfs, since usage could not be told from other files there.
fn run_disk_bytes(ctx: &RunContext<'_>, asked: Option<u64>) -> Result<Option<u64>, ExecError> {
    let Some(asked) = asked else {
        return Ok(None);
    };
    if !ctx.disk_quota {
        return Err(ExecError::BadRequest(
            "limits.disk_bytes needs the workers' scratch tmpfs, which this server does not have (see /health sandbox.disk_quota)".into(),
        ));
    }
    Ok((asked < ctx.settings.disk_bytes).then_some(asked))
}

impl Executor {
    /// The name of the environment a prepared run runs in.
    pub(crate) fn env_name<'a>(&self, prepared: &'a PreparedRun) -> &'a str {
        &prepared.env.spec.name
    }

    /// Validate a request and encode its frame; every refusal of a request
    /// happens here, before any worker is involved.
    pub fn prepare(&self, req: &ExecRequest) -> Result<PreparedRun, ExecError> {
        self.prepare_with(req, &RunOptions::default())
    }

    /// [`Executor::prepare`] with extra run options.
    pub fn prepare_with(
        &self,
        req: &ExecRequest,
        options: &RunOptions,
    ) -> Result<PreparedRun, ExecError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ExecError::ShuttingDown);
        }
        let caller = crate::auth::current();
        if let Some(caller) = &caller
            && !options.graded
        {
            let scope = match req.session {
                Some(_) => crate::auth::Scope::Sessions,
                None => crate::auth::Scope::Execute,
            };
            if let Err(err) = caller.client.require(scope) {
                self.audit_refusal(&err, req.env.as_deref());
                return Err(err);
            }
        }
        let session = match &req.session {
            Some(id) => Some(self.session_call(id, req)?),
            None => None,
        };
        let entry = match &session {
            Some(call) => self.session_entry(call.session().env())?,
            None => self.available_entry(req.env.as_deref())?,
        };
        let ctx = RunContext {
            settings: &entry.settings,
            session_timeout: session.as_ref().map(|c| c.session().timeout()),
            session_limits: session.as_ref().map(|c| c.session().limits()),
            request_limits: &self.request_limits,
            disk_quota: self.sandbox.disk_quota,
            max_output_bytes: self.max_output_bytes,
            results: self.results,
            egress: entry.egress.as_ref().map(|e| &e.policy),
            client: caller.as_ref().map(|c| &*c.client),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let checked = check(req, &ctx, options, id)?;
        let audit = (self.audit.enabled() && !options.graded)
            .then(|| crate::audit::CodeFacts::of(&req.code, self.audit.include_code()));
        Ok(PreparedRun {
            env: entry,
            frame: checked.frame,
            timeout: checked.timeout,
            memory_bytes: checked.memory_bytes,
            session,
            processes: checked.processes,
            network: checked.network,
            audit,
        })
    }

    /// The session a request names, checked against the rest of the
    /// request; it stays active (cannot expire) while the call lives.
    fn session_call(&self, id: &str, req: &ExecRequest) -> Result<ActiveCall, ExecError> {
        // Another client's session is not there for this one.
        let caller = crate::auth::current();
        let call = self
            .sessions
            .begin(id, caller.as_ref().map(|c| c.client.name()))?;
        let env = self.session_entry(call.session().env())?;
        if let Some(name) = req.env.as_deref().filter(|n| !n.is_empty()) {
            let asked = self.env_entry(Some(name))?;
            if asked.id != env.id {
                return Err(ExecError::BadRequest(format!(
                    "session {id:?} runs in environment {:?}, not {name:?}; omit env or create a session in {name:?}",
                    env.spec.name
                )));
            }
        }
        fixed_by_session(req)?;
        Ok(call)
    }
}

/// A session call's refusal of what only the session's creation sets.
pub fn fixed_by_session(req: &ExecRequest) -> Result<(), ExecError> {
    if req.limits.is_some() {
        return Err(ExecError::FixedBySession { field: "limits" });
    }
    if req.network.is_some() {
        return Err(ExecError::FixedBySession { field: "network" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::FileContent;
    use crate::api::RunLimits;
    use crate::protocol::WireLimits;

    fn settings() -> EnvSettings {
        EnvSettings {
            pool_size: 1,
            preload: Vec::new(),
            huge_pages: false,
            timeout: 30.0,
            max_timeout: 60.0,
            run_limits: WireLimits {
                memory_bytes: Some(1 << 30),
                ..WireLimits::default()
            },
            network: crate::sandbox::Network::Isolated,
            allowed_hosts: Vec::new(),
            disk_bytes: 1 << 20,
        }
    }

    const REQUEST_LIMITS: RequestLimits = RequestLimits {
        max_code_bytes: 100,
        max_files: 2,
        max_files_bytes: 1000,
    };

    fn check_with(req: &ExecRequest, disk_quota: bool) -> Result<Checked, ExecError> {
        let settings = settings();
        let ctx = RunContext {
            settings: &settings,
            session_timeout: None,
            session_limits: None,
            request_limits: &REQUEST_LIMITS,
            disk_quota,
            max_output_bytes: 1 << 20,
            results: ResultLimits {
                max_artifact_bytes: 1 << 20,
                max_artifacts_bytes: 1 << 20,
                max_result_chars: 100,
            },
            egress: None,
            client: None,
        };
        check(req, &ctx, &RunOptions::default(), 1)
    }

    fn request(code: &str) -> ExecRequest {
        ExecRequest {
            code: code.into(),
            ..ExecRequest::default()
        }
    }

    fn refusal(req: &ExecRequest) -> (&'static str, String) {
        let err = check_with(req, true).unwrap_err();
        (err.code(), err.to_string())
    }

    #[test]
    fn the_timeout_defaults_and_is_capped_by_the_env() {
        assert_eq!(check_with(&request("1"), true).unwrap().timeout, 30.0);
        let long = ExecRequest {
            timeout: Some(600.0),
            ..request("1")
        };
        assert_eq!(check_with(&long, true).unwrap().timeout, 60.0);
        let negative = ExecRequest {
            timeout: Some(-1.0),
            ..request("1")
        };
        assert_eq!(refusal(&negative).0, "bad_request");
    }

    #[test]
    fn code_and_files_over_their_caps_are_too_large() {
        let (code, message) = refusal(&request(&"x".repeat(101)));
        assert_eq!(code, "too_large");
        assert!(message.contains("max_code_bytes limit of 100"), "{message}");
        let file = |n: usize| FileContent::Text("y".repeat(n));
        let three = ExecRequest {
            files: Some(BTreeMap::from([
                ("a".into(), file(1)),
                ("b".into(), file(1)),
                ("c".into(), file(1)),
            ])),
            ..request("1")
        };
        let (code, message) = refusal(&three);
        assert_eq!(code, "too_large");
        assert!(message.contains("max_files limit of 2"), "{message}");
        let big = ExecRequest {
            files: Some(BTreeMap::from([("a".into(), file(1001))])),
            ..request("1")
        };
        assert!(refusal(&big).1.contains("max_files_bytes"));
    }

    #[test]
    fn bad_file_paths_and_content_are_bad_requests() {
        for path in ["/etc/passwd", "../up", "a/../../b", ""] {
            let req = ExecRequest {
                files: Some(BTreeMap::from([(
                    path.into(),
                    FileContent::Text("x".into()),
                )])),
                ..request("1")
            };
            assert_eq!(refusal(&req).0, "bad_request", "{path:?}");
        }
        let req = ExecRequest {
            files: Some(BTreeMap::from([(
                "a.bin".into(),
                FileContent::Base64 {
                    base64: "not base64!".into(),
                },
            )])),
            ..request("1")
        };
        let (code, message) = refusal(&req);
        assert_eq!(code, "bad_request");
        assert!(message.contains("a.bin"), "{message}");
    }

    #[test]
    fn a_disk_limit_needs_the_scratch_tmpfs_and_counts_the_files() {
        let req = ExecRequest {
            limits: Some(RunLimits {
                disk_bytes: Some(10),
                ..RunLimits::default()
            }),
            files: Some(BTreeMap::from([(
                "a".into(),
                FileContent::Text("x".repeat(11)),
            )])),
            ..request("1")
        };
        let err = check_with(&req, false).unwrap_err();
        assert!(err.to_string().contains("sandbox.disk_quota"), "{err}");
        let (code, message) = refusal(&req);
        assert_eq!(code, "too_large");
        assert!(message.contains("limits.disk_bytes"), "{message}");
    }

    #[test]
    fn limits_narrow_and_only_a_lowered_process_cap_reaches_the_cgroup() {
        let checked = check_with(&request("1"), true).unwrap();
        assert_eq!(checked.memory_bytes, Some(1 << 30));
        assert_eq!(checked.processes, None);
        let req = ExecRequest {
            limits: Some(RunLimits {
                memory_bytes: Some(1 << 40),
                processes: Some(4),
                ..RunLimits::default()
            }),
            ..request("1")
        };
        let checked = check_with(&req, true).unwrap();
        assert_eq!(checked.memory_bytes, Some(1 << 30));
        assert_eq!(checked.processes, Some(4));
    }

    #[test]
    fn digit_limits_below_cpythons_floor_and_empty_globs_are_refused() {
        let req = ExecRequest {
            int_max_str_digits: Some(100),
            ..request("1")
        };
        assert!(refusal(&req).1.contains("at least 640"));
        let req = ExecRequest {
            artifacts: Some(ArtifactSelection::Globs(vec![String::new()])),
            ..request("1")
        };
        assert!(refusal(&req).1.contains("globs must not be empty"));
    }
}

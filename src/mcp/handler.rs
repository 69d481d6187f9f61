//! The MCP tools: thin adapters over [`Executor`], with descriptions written
//! for a model (the default environment, the limits, how to pass files, that
//! each call starts from a clean state).

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, JsonObject, ProgressNotificationParam,
    ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::EnvInfo;
use crate::api::SessionInfo;
use crate::api::{ExecRequest, ExecResult, InstallRequest, InstallResult, PackageInfo};
use crate::api::{GradeRequest, GradeResult};
use crate::artifacts::{self, StoredArtifact};
use crate::auth::{Caller, Client, FrontEnd, Scope};
use crate::config::Config;
use crate::error::ExecError;
use crate::executor::{Executor, RunOptions};
use crate::executor::{Output, OutputStream, OutputText};
use crate::limits::ResultLimits;
use crate::mcp::args::{Parameters, refused_arguments};
use crate::mcp::result::{grade_result, refusal, run_result};
use crate::mcp::session::{CloseSessionArgs, CreateSessionArgs, ImplicitSession};

/// Arguments of `list_packages`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPackagesArgs {
    /// Environment name; the default environment if omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

/// Arguments of `list_environments`: none, and an argument given is refused
/// as for every other tool, not ignored.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// What `list_packages` returns (the body of `GET /list-packages`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PackageListing {
    /// Installed distributions, sorted by name.
    pub packages: Vec<PackageInfo>,
}

/// What `list_environments` returns (the body of `GET /list-envs`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnvListing {
    /// Every environment this server serves.
    pub envs: Vec<EnvInfo>,
}

/// The MCP server: one per stdio connection or streamable-HTTP session, all
/// sharing one [`Executor`].
#[derive(Clone)]
pub struct McpHandler {
    executor: Arc<Executor>,
    /// Base64 bytes of images a tool result carries inline.
    inline_image_bytes: usize,
    /// Options of every `execute_code` run: MCP keeps artifacts in the store,
    /// so its runs may return larger ones; plots are kept to a size.
    run_options: RunOptions,
    /// The server's `instructions`: what it is for, the default env, and
    /// whether state carries over from call to call, for a client whose
    /// calls share a connection (see [`shares_a_connection`]).
    instructions: Arc<str>,
    /// What a client whose calls share no connection is told instead: an
    /// implicit session cannot keep state for it. The same as for the
    /// others without implicit sessions.
    unconnected: Arc<UnconnectedTexts>,
    /// The tools, with descriptions naming this server's default environment
    /// and limits. Served by `#[tool_handler(router = self.tool_router)]`.
    tool_router: ToolRouter<McpHandler>,
    /// The connection's implicit session (config `mcp_implicit_session`):
    /// `execute_code` without `session` runs in it. One per connection
    /// (see [`McpHandler::for_connection`]); closed when the connection ends.
    implicit: Option<Arc<ImplicitSession>>,
    /// The client MCP over stdio acts as (`mcp_client`), by name, looked up
    /// at each call so that a reload applies; `None`: the admin client if
    /// there is one, else the token's, else anonymous.
    stdio_client: Option<Arc<str>>,
}

#[tool_router]
impl McpHandler {
    /// A handler over `executor`, with the MCP settings of `config`.
    pub fn new(executor: Arc<Executor>, config: &Config) -> McpHandler {
        let default_env = executor.default_env().to_string();
        let python_version = executor
            .list_envs()
            .into_iter()
            .find(|e| e.default)
            .and_then(|e| e.python_version)
            .map(|v| format!(" (Python {v})"))
            .unwrap_or_default();
        let mut tool_router = Self::tool_router();
        for route in tool_router.map.values_mut() {
            route.attr.input_schema = without_uint_formats(&route.attr.input_schema);
            if let Some(output) = &route.attr.output_schema {
                route.attr.output_schema = Some(without_uint_formats(output));
            }
        }
        for route in tool_router.map.values_mut() {
            count_calls(route);
        }
        let implicit = config.mcp_implicit_session;
        if let Some(route) = tool_router.map.get_mut("execute_code") {
            route.attr.description =
                Some(execute_code_description(config, &default_env, implicit).into());
        }
        // Installing changes an environment for every client: the tool exists
        // only when an admin token is configured (and over HTTP it checks the
        // caller presents it).
        if config.admin_token.is_none() && !executor.clients().any_has(Scope::Install) {
            tool_router.remove_route("install_packages");
        }
        let instructions = |implicit: bool| {
            let state = if implicit {
                "every call of this connection runs in one persistent session (one per \
                 environment): variables, imports and files carry over from call to call"
            } else {
                "every call starts from a clean state (no variables, imports or files carry \
                 over) unless it names a session from `create_session`"
            };
            format!(
                "code-executor runs Python code in isolated, pre-warmed interpreters and returns \
                 its stdout, stderr and exit status. Use `execute_code` to run a script; \
                 {state}. The default environment is `{default_env}`{python_version}; \
                 `list_environments` shows every environment and its Python version."
            )
        };
        let unconnected = UnconnectedTexts {
            instructions: instructions(false),
            execute_code: execute_code_description(config, &default_env, false),
        };
        let instructions = instructions(implicit);
        let implicit = implicit.then(|| Arc::new(ImplicitSession::new(executor.clone())));
        McpHandler {
            executor,
            inline_image_bytes: config.mcp_inline_image_bytes,
            run_options: RunOptions {
                artifacts: Some(ResultLimits {
                    max_artifact_bytes: config.mcp_max_artifact_bytes,
                    max_artifacts_bytes: config.mcp_max_artifact_bytes,
                    max_result_chars: config.results.max_result_chars,
                }),
                max_image_pixels: Some(config.max_image_pixels),
                ..RunOptions::default()
            },
            instructions: instructions.into(),
            unconnected: Arc::new(unconnected),
            tool_router,
            implicit,
            stdio_client: config.mcp_client.as_deref().map(Arc::from),
        }
    }

    /// The name of the default environment.
    pub fn default_env(&self) -> String {
        self.executor.default_env()
    }

    /// A copy for a new connection: the same tools, its own implicit
    /// session (if those are on).
    pub fn for_connection(&self) -> McpHandler {
        let mut handler = self.clone();
        if self.implicit.is_some() {
            handler.implicit = Some(Arc::new(ImplicitSession::new(self.executor.clone())));
        }
        handler
    }

    /// Run Python code in a fresh process and return its output and exit
    /// status.
    #[tool(
        output_schema = schema_for_output::<ExecResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn execute_code(
        &self,
        Parameters(request): Parameters<ExecRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        // A call naming a session is refused as over HTTP: an unknown
        // session (or another client's, answered alike) first, then what
        // the session fixed. In the implicit session, what it fixed is
        // refused before the session is made.
        if request.session.is_none()
            && self.implicit.is_some()
            && let Err(err) = crate::executor::fixed_by_session(&request)
        {
            return refusal(err);
        }
        let implicit = match (&request.session, &self.implicit) {
            (None, Some(implicit)) => implicit,
            _ => {
                return self
                    .execute_once(request, None, &ctx)
                    .await
                    .unwrap_or_else(refusal);
            }
        };
        // A session lost between the look-up and the call (a call the
        // client cancelled just before is still ending it) is replaced
        // once, as one found lost at the look-up is.
        let mut retried = false;
        loop {
            let (id, replaced) = match implicit.id(request.env.as_deref()).await {
                Ok(found) => found,
                Err(err) => return refusal(err),
            };
            // A retry's session replaced a lost one, whichever call made it.
            let note = (replaced || retried).then_some(
                "[the connection's previous session was lost; this call ran in a new, empty one]",
            );
            let mut call = request.clone();
            call.session = Some(id);
            match self.execute_once(call, note, &ctx).await {
                Err(ExecError::UnknownSession { .. }) if !retried => retried = true,
                done => return done.unwrap_or_else(refusal),
            }
        }
    }

    /// One `execute_code` call of `request` (in its session, if it names
    /// one), with `note` before its text: its result, or the error that
    /// refused or failed it.
    async fn execute_once(
        &self,
        mut request: ExecRequest,
        note: Option<&str>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ExecError> {
        let in_session = request.session.is_some();
        // With a progress token, output goes out as progress notifications
        // while the run goes on; the final result is the same.
        let progress = ctx.meta.get_progress_token();
        request.stream = Some(progress.is_some());
        self.executor.find_env(request.env.as_deref()).await;
        let prepared = self.executor.prepare_with(&request, &self.run_options)?;
        let owner = owner_of(ctx);
        // The run's own limit (its env's or session's default, or what it
        // asked for, capped), named if the run hits it.
        let timeout = prepared.timeout();
        drop(request);
        let (sink, mut chunks) = tokio::sync::mpsc::unbounded_channel();
        let run = self
            .executor
            .run(prepared, progress.is_some().then_some(sink));
        tokio::pin!(run);
        // Output goes out coalesced: at most one notification per
        // PROGRESS_INTERVAL, each with all the text since the one before, and
        // whatever is left once the run ended goes before the result.
        // A task sends them, in order: the run never waits for a client
        // slow to read them, or its timeout would wait too. What waits is
        // at most the output the run may write.
        let mut text = OutputText::default();
        let mut pending = ProgressText::default();
        let mut next_send = tokio::time::Instant::now();
        let mut sender = tokio::task::JoinSet::new();
        let messages = progress.clone().map(|token| {
            let (messages, mut queued) = tokio::sync::mpsc::unbounded_channel::<String>();
            let peer = ctx.peer.clone();
            sender.spawn(async move {
                let mut sent = 0u32;
                while let Some(message) = queued.recv().await {
                    sent += 1;
                    let note = ProgressNotificationParam::new(token.clone(), f64::from(sent))
                        .with_message(message);
                    let _ = peer.notify_progress(note).await;
                }
            });
            messages
        });
        let notify = |pending: &mut ProgressText| {
            if let (Some(messages), Some(message)) = (&messages, pending.take()) {
                let _ = messages.send(message);
            }
        };
        // Dropping the run's future on cancellation kills the run's process
        // tree; the pool replaces the worker.
        loop {
            tokio::select! {
                biased;
                _ = ctx.ct.cancelled() => {
                    tracing::info!("execute_code cancelled (by the client or shutdown): run killed");
                    return Ok(CallToolResult::error(vec![ContentBlock::text("cancelled: the run was killed")]));
                }
                Some(chunk) = chunks.recv(), if progress.is_some() => {
                    if let Some(output) = text.decode(chunk) {
                        pending.push(output);
                    }
                    if tokio::time::Instant::now() >= next_send {
                        notify(&mut pending);
                        next_send = tokio::time::Instant::now() + PROGRESS_INTERVAL;
                    }
                }
                _ = tokio::time::sleep_until(next_send), if !pending.is_empty() => {
                    notify(&mut pending);
                    next_send = tokio::time::Instant::now() + PROGRESS_INTERVAL;
                }
                outcome = &mut run => {
                    // Every chunk the run sent reaches the client before
                    // its result, as the result has its text.
                    while let Ok(chunk) = chunks.try_recv() {
                        pending.extend(text.decode(chunk));
                    }
                    if let Ok(result) = &outcome {
                        pending.extend(text.rest(result));
                    }
                    notify(&mut pending);
                    drop(messages);
                    // The notifications go first (dropping `sender` stops
                    // those not yet sent), unless the client cancels.
                    tokio::select! {
                        _ = async { while sender.join_next().await.is_some() {} } => {}
                        _ = ctx.ct.cancelled() => {}
                    }
                    return outcome.map(|mut result| {
                        self.keep_artifacts(&owner, &mut result);
                        let mut out = run_result(&result, timeout, self.inline_image_bytes);
                        let extra = match (&result.session_lost, in_session && result.timed_out) {
                            (Some(lost), _) => Some(format!("[session lost: {lost}]")),
                            (None, true) => Some("[interrupted (KeyboardInterrupt); the session kept its state]".to_string()),
                            (None, false) => None,
                        };
                        if let Some(first) = out.content.first_mut().and_then(|c| c.as_text().map(|t| t.text.clone())) {
                            let mut text = note.map(|n| format!("{n}\n")).unwrap_or_default();
                            text.push_str(&first);
                            if let Some(extra) = extra {
                                text.push('\n');
                                text.push_str(&extra);
                            }
                            out.content[0] = ContentBlock::text(text);
                        }
                        out
                    });
                }
            }
        }
    }

    /// Grade one Python program against many test cases: each case is a
    /// fresh run (stdin, args, files) whose stdout is compared with
    /// `expected_stdout` (`compare`: exact, trim, tokens, float:1e-6), or, with
    /// `entry`, a call of that function with the case's `input` whose return
    /// value is compared with `expected`. Returns a verdict per case (ok,
    /// wrong_answer with a diff, runtime_error, timeout, memory_limit,
    /// output_limit, error, skipped) with CPU time and peak memory, and the
    /// counts.
    #[tool(
        output_schema = schema_for_output::<GradeResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn grade_code(
        &self,
        Parameters(args): Parameters<GradeRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        // Dropping the grading future on cancellation kills the runs in flight.
        tokio::select! {
            biased;
            _ = ctx.ct.cancelled() => {
                tracing::info!("grade_code cancelled (by the client or shutdown): runs killed");
                CallToolResult::error(vec![ContentBlock::text("cancelled: the runs were killed")])
            }
            outcome = self.executor.grade(args) => match outcome {
                Ok(result) => grade_result(&result),
                Err(err) => refusal(err),
            },
        }
    }

    /// Start a persistent Python session and return its id. Pass the id as
    /// `session` to `execute_code`: variables, imports, functions and files
    /// then carry over between calls, as in a notebook. A call that times
    /// out is interrupted (KeyboardInterrupt) and the session keeps its
    /// state when the code stops. Sessions end after an idle TTL (each call
    /// that runs renews it) or with `close_session`.
    #[tool(
        output_schema = schema_for_output::<SessionInfo>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn create_session(
        &self,
        Parameters(args): Parameters<CreateSessionArgs>,
    ) -> CallToolResult {
        match self.executor.create_session(args.into_request()).await {
            Ok(info) => {
                let text = format!(
                    "session {} in environment {} (ends after {} s without a call)",
                    info.id,
                    info.env,
                    crate::limits::readable(info.ttl)
                );
                let mut out = match serde_json::to_value(&info) {
                    Ok(value) => CallToolResult::structured(value),
                    Err(_) => CallToolResult::success(Vec::new()),
                };
                out.content = vec![ContentBlock::text(text)];
                out
            }
            Err(err) => refusal(err),
        }
    }

    /// End a session created by `create_session`: its process and state go.
    #[tool(annotations(
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn close_session(
        &self,
        Parameters(args): Parameters<CloseSessionArgs>,
    ) -> CallToolResult {
        match self.executor.close_session(&args.session) {
            Ok(info) => CallToolResult::success(vec![ContentBlock::text(format!(
                "session {} closed after {} calls",
                info.id, info.calls
            ))]),
            Err(err) => refusal(err),
        }
    }

    /// List the Python environments code can run in: name, kind, prefix,
    /// Python version, which one is the default, and their worker pools.
    #[tool(
        output_schema = schema_for_output::<EnvListing>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_environments(&self, Parameters(_): Parameters<NoArgs>) -> CallToolResult {
        let envs = self.executor.list_envs();
        let text = envs
            .iter()
            .map(|e| {
                format!(
                    "{}{}: Python {}, {} at {}",
                    e.name,
                    if e.default { " (default)" } else { "" },
                    e.python_version.as_deref().unwrap_or("unknown"),
                    e.kind,
                    e.prefix
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let mut out = match serde_json::to_value(EnvListing { envs }) {
            Ok(value) => CallToolResult::structured(value),
            Err(_) => CallToolResult::success(Vec::new()),
        };
        out.content = vec![ContentBlock::text(text)];
        out
    }

    /// List the packages installed in an environment (name and version).
    #[tool(
        output_schema = schema_for_output::<PackageListing>(),
        annotations(read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_packages(
        &self,
        Parameters(args): Parameters<ListPackagesArgs>,
    ) -> CallToolResult {
        match self.executor.list_packages(args.env.as_deref()).await {
            Ok(packages) => {
                let text = packages
                    .iter()
                    .map(|p| format!("{}=={}", p.name, p.version))
                    .collect::<Vec<_>>()
                    .join("\n");
                let mut out = match serde_json::to_value(PackageListing { packages }) {
                    Ok(value) => CallToolResult::structured(value),
                    Err(_) => CallToolResult::success(Vec::new()),
                };
                out.content = vec![ContentBlock::text(text)];
                out
            }
            Err(err) => refusal(err),
        }
    }

    /// Install packages into an environment with pip (default) or conda.
    /// Each package is one requirement (`pkg`, `pkg==1.0`); later runs can
    /// import them.
    #[tool(
        output_schema = schema_for_output::<InstallResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = true)
    )]
    async fn install_packages(
        &self,
        Parameters(args): Parameters<InstallRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        // The caller's `install` scope was checked with the call.
        let outcome = tokio::select! {
            _ = ctx.ct.cancelled() => {
                return CallToolResult::error(vec![ContentBlock::text("cancelled")]);
            }
            outcome = self.executor.install(args) => outcome,
        };
        match outcome {
            Ok(result) => {
                let failed = result.exit_code != 0 || result.timed_out;
                let text = format!(
                    "{}{}[{}]",
                    if result.installed.is_empty() {
                        String::new()
                    } else {
                        format!("installed: {}\n", result.installed.join(", "))
                    },
                    if failed {
                        format!("{}\n", result.stderr.trim_end())
                    } else {
                        String::new()
                    },
                    if result.timed_out {
                        "timed out".to_string()
                    } else {
                        format!("exit code {}", result.exit_code)
                    }
                );
                let mut out = match serde_json::to_value(&result) {
                    Ok(value) if failed => CallToolResult::structured_error(value),
                    Ok(value) => CallToolResult::structured(value),
                    Err(_) => CallToolResult::success(Vec::new()),
                };
                out.content = vec![ContentBlock::text(text)];
                out
            }
            Err(err) => refusal(err),
        }
    }
}

impl McpHandler {
    /// The client of a call: the one the `/mcp` request authenticated as,
    /// or over stdio the configured one.
    fn client_of(&self, ctx: &RequestContext<RoleServer>) -> Option<Arc<Client>> {
        let clients = self.executor.clients();
        if let Some(parts) = ctx.extensions.get::<axum::http::request::Parts>() {
            return parts
                .extensions
                .get::<crate::http::Authenticated>()
                .map(|a| a.0.clone());
        }
        match &self.stdio_client {
            Some(name) => clients.by_name(name),
            None => clients
                .by_name(crate::auth::ADMIN_CLIENT)
                .or_else(|| clients.by_name(crate::auth::TOKEN_CLIENT))
                .or_else(|| clients.anonymous()),
        }
    }

    /// Who a tool call is, with its request id and, for a tool that runs
    /// code, its client's quotas; or the refusal (an `isError` result,
    /// audited).
    fn admit(
        &self,
        tool: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Arc<Caller>, CallToolResult> {
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let (front, request_id): (FrontEnd, Arc<str>) = match parts {
            Some(parts) => (
                FrontEnd::McpHttp,
                parts
                    .headers
                    .get(crate::http::observe::REQUEST_ID)
                    .and_then(|v| v.to_str().ok())
                    .map(Arc::from)
                    .unwrap_or_else(crate::http::observe::new_request_id_str),
            ),
            None => (
                FrontEnd::McpStdio,
                crate::http::observe::new_request_id_str(),
            ),
        };
        let remote = parts.and_then(|p| {
            p.extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0)
        });
        let Some(client) = self.client_of(ctx) else {
            return Err(CallToolResult::error(vec![ContentBlock::text(
                "error (unauthorized): this MCP connection acts as no client (set mcp_client to a \
                 client of the clients file)",
            )]));
        };
        let (scope, runs) = match tool {
            "execute_code" => (None, true),
            "grade_code" => (Some(Scope::Grade), true),
            "create_session" => (Some(Scope::Sessions), true),
            "close_session" => (Some(Scope::Sessions), false),
            "install_packages" => (Some(Scope::Install), true),
            _ => (None, false),
        };
        let mut caller = Caller::new(client.clone(), request_id, remote, front);
        let admitted = scope.map_or(Ok(()), |s| client.require(s)).and_then(|()| {
            if runs {
                crate::http::admit(&self.executor, &client)
            } else {
                Ok((None, None))
            }
        });
        match admitted {
            Ok((in_flight, slot)) => {
                caller.in_flight = in_flight;
                *caller.audit_slot.get_mut() = slot;
                Ok(Arc::new(caller))
            }
            Err(err) => {
                self.executor.audit_refusal_as(Some(&caller), &err, None);
                Err(refusal(err))
            }
        }
    }

    /// Put a run's artifacts in the store (for `owner`) and give each its
    /// `uri`.
    fn keep_artifacts(&self, owner: &str, result: &mut ExecResult) {
        // The artifacts with content, by their place in the result.
        let mut given = Vec::new();
        let files: Vec<StoredArtifact> = result
            .artifacts
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let base64 = a.base64.as_deref()?;
                given.push(i);
                Some(StoredArtifact {
                    path: a.path.clone(),
                    mime: a.mime.clone(),
                    size: a.size,
                    base64: base64.into(),
                })
            })
            .collect();
        if files.is_empty() {
            return;
        }
        let Some(kept) = self.executor.artifacts().put(owner, files) else {
            return;
        };
        for (i, _) in given.into_iter().zip(kept.files).filter(|(_, k)| *k) {
            let a = &mut result.artifacts[i];
            a.uri = Some(artifacts::uri(&kept.run, &a.path));
        }
    }
}

/// Who may read a call's artifacts again: the bearer token's digest over
/// HTTP (`anonymous` without one), `stdio` for the stdio client.
fn owner_of(ctx: &RequestContext<RoleServer>) -> String {
    match ctx.extensions.get::<axum::http::request::Parts>() {
        Some(parts) => artifacts::owner_of_token(
            parts
                .headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ")),
        ),
        None => "stdio".into(),
    }
}

/// The `instructions` and the `execute_code` description for a client whose
/// calls share no connection.
struct UnconnectedTexts {
    instructions: String,
    execute_code: String,
}

/// Whether the calls of the client making this request share a connection,
/// which an implicit session lives in: always over stdio (a launch, or a
/// connection to the `--shared` server); over streamable HTTP only in an MCP
/// session (`Mcp-Session-Id`), which `initialize` opens in the revisions up
/// to 2025-11-25. A request of the stateless 2026-07-28 revision, whose
/// `_meta` carries its protocol version and the client's capabilities (as
/// `server/discover`'s must), has none: rmcp serves it on a handler of its
/// own, so an implicit session made for it ends with it.
fn shares_a_connection(ctx: &RequestContext<RoleServer>) -> bool {
    if ctx.extensions.get::<axum::http::request::Parts>().is_none() {
        return true;
    }
    let inline = ctx
        .meta
        .missing_required_keys(&ProtocolVersion::V_2026_07_28)
        .is_empty();
    !inline && ctx.protocol_version().is_none_or(|v| v.has_initialize())
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for McpHandler {
    /// The server's description for a client of the stateless revision (and
    /// over stdio one that starts without `initialize`), with the
    /// `instructions` for its kind of client.
    async fn discover(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, rmcp::ErrorData> {
        let mut info = self.get_info();
        if !shares_a_connection(&ctx) {
            info.instructions = Some(self.unconnected.instructions.clone());
        }
        Ok(rmcp::model::DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    /// The tools, with the `execute_code` description for the caller's kind
    /// of client.
    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, rmcp::ErrorData> {
        let mut tools = self.tool_router.list_all();
        if !shares_a_connection(&ctx) {
            for tool in tools.iter_mut().filter(|t| t.name == "execute_code") {
                tool.description = Some(self.unconnected.execute_code.clone().into());
            }
        }
        // The cache hints of rmcp's own `list_tools` (`#[tool_handler]`).
        let cache_hints = ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let mut result = rmcp::model::ListToolsResult::with_all_items(tools);
        result.ttl_ms = cache_hints.then_some(0);
        result.cache_scope = cache_hints.then_some(rmcp::model::CacheScope::Public);
        Ok(result)
    }

    /// Every live artifact of the caller's runs.
    async fn list_resources(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, rmcp::ErrorData> {
        let owner = owner_of(&ctx);
        let resources = self
            .executor
            .artifacts()
            .list(&owner)
            .into_iter()
            .map(|(run, a)| {
                rmcp::model::Resource::new(artifacts::uri(&run, &a.path), a.path)
                    .with_mime_type(a.mime)
                    .with_size(a.size)
            })
            .collect();
        Ok(rmcp::model::ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, rmcp::ErrorData> {
        let template = rmcp::model::ResourceTemplate::new("artifact://{run}/{path}", "artifact")
            .with_description(
                "A file a run of execute_code wrote, kept for a while after the run (see its \
                 resource_link)",
            );
        Ok(rmcp::model::ListResourceTemplatesResult::with_all_items(
            vec![template],
        ))
    }

    /// An artifact's bytes, as a blob with its MIME type.
    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, rmcp::ErrorData> {
        let owner = owner_of(&ctx);
        let found = artifacts::parse_uri(&request.uri).and_then(|(run, paths)| {
            paths
                .iter()
                .find_map(|path| self.executor.artifacts().get(&owner, run, path))
        });
        match found {
            Some(a) => Ok(rmcp::model::ReadResourceResult::new(vec![
                rmcp::model::ResourceContents::blob(a.base64.to_string(), request.uri.clone())
                    .with_mime_type(a.mime),
            ])
            .into()),
            None => Err(rmcp::ErrorData::resource_not_found(
                format!(
                    "no artifact {}: it expired, was evicted, or belongs to another client",
                    request.uri
                ),
                None,
            )),
        }
    }

    /// The tool router's call, with a panic in a tool answered as an
    /// internal error instead of ending the client's whole MCP session.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let tool = request.name.to_string();
        let caller = match self.admit(&tool, &context) {
            Ok(caller) => caller,
            Err(refused) => {
                self.executor.metrics().mcp_call(&tool, "error");
                return Ok(refused.into());
            }
        };
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        caller
            .scope(guard_panics(&tool, self.tool_router.call(call)))
            .await
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new(
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(self.instructions.to_string())
    }
}

/// The shortest time between two progress notifications of one run: at
/// most ten a second, however fast the run prints.
pub const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Output of a run not yet sent as a progress notification: `[stdout] ...`
/// and `[stderr] ...` segments, a new one each time the stream changes.
#[derive(Default)]
struct ProgressText {
    text: String,
    /// The stream the text is of.
    stream: Option<OutputStream>,
    /// The next text needs its stream's header (the notification before
    /// took the text so far).
    needs_header: bool,
}

impl ProgressText {
    fn extend(&mut self, outputs: impl IntoIterator<Item = Output>) {
        for output in outputs {
            self.push(output);
        }
    }

    fn push(&mut self, output: Output) {
        if self.stream != Some(output.stream) {
            if !self.text.is_empty() && !self.text.ends_with('\n') {
                self.text.push('\n');
            }
            self.stream = Some(output.stream);
            self.needs_header = true;
        }
        if self.needs_header {
            self.text.push_str(match output.stream {
                OutputStream::Stdout => "[stdout] ",
                OutputStream::Stderr => "[stderr] ",
            });
            self.needs_header = false;
        }
        self.text.push_str(&output.text);
    }

    fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The text so far, for one notification (which starts with its
    /// stream's header).
    fn take(&mut self) -> Option<String> {
        if self.text.is_empty() {
            return None;
        }
        self.needs_header = true;
        Some(std::mem::take(&mut self.text))
    }
}

/// Await `call`; if it panics, log it once and answer JSON-RPC's internal
/// error.
async fn guard_panics<T>(
    tool: &str,
    call: impl std::future::Future<Output = Result<T, rmcp::ErrorData>>,
) -> Result<T, rmcp::ErrorData> {
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(answer) => answer,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(tool, "MCP tool panicked: {what}");
            Err(rmcp::ErrorData::internal_error(
                "internal server error",
                None,
            ))
        }
    }
}

/// The description of `execute_code`, naming this server's defaults;
/// `implicit`: the client's calls share an implicit session.
fn execute_code_description(config: &Config, default_env: &str, implicit: bool) -> String {
    let memory = config
        .run_limits
        .memory_bytes
        .map(|b| format!(", memory {}", human_bytes(b)))
        .unwrap_or_default();
    format!(
        "Run Python code in a fresh process and return its stdout, stderr and exit status.\n\
         \n\
         - The code runs as a script (`python script.py`): print() what you want to see.\n\
         - {state}\n\
         - Environment: `{default_env}` unless `env` names another one from \
         `list_environments`.\n\
         - Limits: {timeout} s wall clock by default (`timeout` may ask for up to {max} s){memory}, \
         output {output} per stream (longer output is cut and flagged).\n\
         - Input files: `files` maps relative paths to UTF-8 text or {{\"base64\": \"...\"}}; \
         they are written into the working directory before the code runs. \
         `stdin` feeds standard input.\n\
         - The result is an error when the code fails (non-zero exit, uncaught exception, \
         timeout); the traceback is in the output.",
        state = if implicit {
            "All calls of this connection share one persistent Python session (one per \
             environment): variables, imports, functions and files carry over from call to call \
             (unless `session` names another one)."
        } else {
            "Every call starts from a clean state: no variables, imports or files carry over \
             from earlier calls. Put everything one run needs into one call, or create a \
             session with `create_session` and pass its id as `session` to keep state."
        },
        timeout = crate::limits::readable(config.timeout),
        max = crate::limits::readable(config.max_timeout),
        output = human_bytes(config.max_output_bytes),
    )
}

/// `schema` without `"format": "uint…"`: schemars emits it for unsigned
/// integers beside `"minimum": 0`, which says the same in standard JSON
/// Schema, and validators such as the MCP Inspector's warn about it.
fn without_uint_formats(schema: &JsonObject) -> Arc<JsonObject> {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                if map
                    .get("format")
                    .and_then(Value::as_str)
                    .is_some_and(|f| f.starts_with("uint"))
                {
                    map.remove("format");
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = Value::Object(schema.clone());
    strip(&mut value);
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(schema.clone()),
    }
}

/// `2 GiB`, `1 MiB`, `512 KiB`, `100 bytes`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    for (size, unit) in UNITS {
        if bytes >= size {
            return format!("{:.1} {unit}", bytes as f64 / size as f64);
        }
    }
    format!("{bytes} bytes")
}

/// Wrap a tool so that refused arguments are its `isError` result (see
/// [`refused_arguments`]) and each call is counted in the metrics by tool
/// and outcome (`ok`, `error` for an `isError` result, `failed` for a
/// protocol error); covers every tool, whoever adds it.
fn count_calls(route: &mut rmcp::handler::server::router::tool::ToolRoute<McpHandler>) {
    use rmcp::model::CallToolResponse;
    let inner = route.call.clone();
    route.call = Arc::new(move |ctx| {
        let inner = inner.clone();
        let metrics = ctx.service.executor.metrics().clone();
        let tool = ctx.name.clone();
        Box::pin(async move {
            let response = refused_arguments(inner(ctx).await);
            let outcome = match &response {
                Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => "error",
                Ok(_) => "ok",
                Err(_) => "failed",
            };
            metrics.mcp_call(&tool, outcome);
            response
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_text_keeps_streams_apart_and_characters_whole() {
        let mut text = OutputText::default();
        let mut p = ProgressText::default();
        let mut push = |p: &mut ProgressText, stream, data: &[u8]| {
            let chunk = crate::executor::OutputChunk {
                stream,
                data: data.to_vec(),
            };
            if let Some(output) = text.decode(chunk) {
                p.push(output);
            }
        };
        push(&mut p, OutputStream::Stdout, b"a\n");
        push(&mut p, OutputStream::Stdout, b"b\n\xc3");
        assert_eq!(p.take().as_deref(), Some("[stdout] a\nb\n"));
        // The other stream between the two halves of a character.
        push(&mut p, OutputStream::Stderr, b"oops");
        push(&mut p, OutputStream::Stdout, b"\xa9\n");
        assert_eq!(
            p.take().as_deref(),
            Some("[stderr] oops\n[stdout] \u{e9}\n")
        );
        assert!(p.is_empty());
        assert_eq!(p.take(), None);
    }

    #[tokio::test]
    async fn a_panicking_tool_answers_an_internal_error() {
        let fine = guard_panics("t", async { Ok::<_, rmcp::ErrorData>(7) }).await;
        assert_eq!(fine.unwrap(), 7);
        let err = guard_panics("t", async {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            Ok::<u8, rmcp::ErrorData>(0)
        })
        .await
        .unwrap_err();
        assert_eq!(err.code, rmcp::model::ErrorCode::INTERNAL_ERROR);
        assert_eq!(err.message, "internal server error");
    }

    #[test]
    fn byte_sizes_read_naturally() {
        assert_eq!(human_bytes(2 << 30), "2 GiB");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100), "100 bytes");
    }

    #[test]
    fn uint_formats_are_dropped_from_schemas() {
        let schema = schema_for_output::<EnvListing>();
        assert!(
            serde_json::to_string(&*schema)
                .unwrap()
                .contains("\"uint\"")
        );
        let cleaned = serde_json::to_string(&*without_uint_formats(&schema)).unwrap();
        assert!(!cleaned.contains("uint"), "{cleaned}");
        assert!(cleaned.contains("\"minimum\":0"), "{cleaned}");
    }

    #[test]
    fn description_names_env_and_limits() {
        let config = Config::default();
        let text = execute_code_description(&config, "ml", config.mcp_implicit_session);
        assert!(text.contains("`ml`"), "{text}");
        assert!(text.contains("30 s wall clock"), "{text}");
        assert!(text.contains("up to 300 s"), "{text}");
        assert!(text.contains("memory 2 GiB"), "{text}");
        assert!(text.contains("output 1 MiB per stream"), "{text}");
    }
}

//! The HTTP/JSON front end (axum): a thin adapter over [`Executor`].

mod error;
mod gate;
pub mod guard;
pub mod observe;
pub mod openapi;
pub(crate) mod own_wakes;
mod stream;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use bytes::Bytes;
pub use error::ApiError;
use gate::RuleKind;
pub(crate) use gate::{Authenticated, admit};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::api::{CreateEnvRequest, CreateEnvResult, DeleteEnvResult, EnvDetails};
use crate::api::{CreateSessionRequest, SessionInfo};
use crate::api::{ExecRequest, ExecResult, InstallRequest, InstallResult};
use crate::api::{GradeBatchRequest, GradeBatchResult, GradeRequest, GradeResult};
use crate::auth::Scope;
use crate::executor::Executor;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The service every handler calls.
    pub executor: Arc<Executor>,
    /// Bearer token required by the execution endpoints, if configured.
    pub token: Option<Arc<str>>,
    /// Bearer token required by `/install`; without one, installs are
    /// refused (403) whatever the request carries.
    pub admin_token: Option<Arc<str>>,
    /// Bearer token required by `/metrics`; without one `token` guards it.
    pub metrics_token: Option<Arc<str>>,
}

/// The HTTP API. `max_body_bytes` bounds every request body (413 above it).
///
/// Each group of routes has its gate ([`gate`]): which scope it needs and
/// whether its `POST`s run code (and so take the client's quotas).
///
/// `state`'s `token` and `admin_token` are the implicit clients `default`
/// and `admin` beside the clients file's.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    if let Err(err) = state.executor.clients().use_tokens(
        state.token.as_deref(),
        state.admin_token.as_deref(),
        state.metrics_token.is_some(),
    ) {
        tracing::error!(
            "the clients file no longer loads; the clients in force stay: {}",
            crate::error::error_chain(&err)
        );
    }
    let gate = |scope, count_posts, kind| {
        middleware::from_fn_with_state(
            gate::Gated {
                state: state.clone(),
                rule: gate::Rule {
                    scope,
                    count_posts,
                    kind,
                },
            },
            gate::gate,
        )
    };
    let runs = Router::new()
        .route("/execute", post(execute))
        .route_layer(gate(None, true, RuleKind::Api));
    let grading = Router::new()
        .route("/grade", post(grade))
        .route("/grade/batch", post(grade_batch))
        .route_layer(gate(Some(Scope::Grade), true, RuleKind::Api));
    let sessions = Router::new()
        .route("/sessions", post(create_session).get(list_sessions))
        .route("/sessions/{id}", delete(close_session))
        .route_layer(gate(Some(Scope::Sessions), true, RuleKind::Api));
    let reads = Router::new()
        .route("/artifacts/{run}/{*path}", get(artifact))
        .route("/list-envs", get(list_envs))
        .route("/list-packages", get(list_packages))
        .route("/envs/{name}", get(env_details))
        .route_layer(gate(None, false, RuleKind::Api));
    let admin = Router::new()
        .route("/install", post(install))
        .route_layer(gate(Some(Scope::Install), true, RuleKind::Install));
    let envs_admin = Router::new()
        .route("/envs", post(create_env))
        .route("/envs/{name}", delete(delete_env))
        .route_layer(gate(Some(Scope::EnvsAdmin), true, RuleKind::Install));
    let scraped = Router::new()
        .route("/metrics", get(metrics))
        .route_layer(gate(Some(Scope::Metrics), false, RuleKind::Metrics));
    Router::new()
        .merge(runs)
        .merge(grading)
        .merge(sessions)
        .merge(reads)
        .merge(admin)
        .merge(envs_admin)
        .merge(scraped)
        .route("/health", get(health))
        .route("/livez", get(livez))
        .route("/openapi.json", get(openapi::serve))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// The gate of `/mcp` (MCP over streamable HTTP): a known bearer token;
/// each tool call is then checked for its scope and quotas.
pub fn mcp_gate(
    state: AppState,
) -> impl Fn(Request, Next) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    let gated = gate::Gated {
        state,
        rule: gate::Rule {
            scope: None,
            count_posts: false,
            kind: RuleKind::Mcp,
        },
    };
    move |req, next| Box::pin(gate::gate(State(gated.clone()), req, next))
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Metrics", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 401, description = "Missing or wrong metrics token, or a client without the `metrics` scope (`unauthorized`)", body = openapi::ErrorBody),
    )
)]
async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.executor.metrics().render(),
    )
        .into_response()
}

/// Run code. With `Accept: text/event-stream` (or `"stream": true`) the
/// answer is a stream of `stdout`/`stderr` events, then one `result` event.
#[utoipa::path(
    post,
    path = "/execute",
    tag = "run",
    request_body = ExecRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The code ran (whatever its exit status). Streamed: `stdout`/`stderr` events (each a JSON string), then one `result` event (this object) or one `error` event (an error body)",
            content((ExecResult = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Malformed request (`bad_request`)", body = openapi::ErrorBody),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client lacks the scope (`forbidden`, naming it) or may not use the environment (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment or session (`unknown_env`, `unknown_session`)", body = openapi::ErrorBody),
        (status = 408, description = "The body did not arrive in time (`request_timeout`)", body = openapi::ErrorBody),
        (status = 409, description = "A session call's input file cannot be written: the session has a directory, link or other non-file there, or a file where a directory of its path goes (`conflict`); the call did not run", body = openapi::ErrorBody),
        (status = 413, description = "Body, code or files over a limit, or a session call's files over what its disk quota has left (`too_large`)", body = openapi::ErrorBody),
        (status = 429, description = "The client's `max_concurrent` or `rate_per_minute` is spent (`too_many_requests`, with `Retry-After`)", body = openapi::ErrorBody),
        (status = 500, description = "The run broke its worker (`internal`)", body = openapi::ErrorBody),
        (status = 503, description = "No worker free in time (`busy`, with `Retry-After`), environment unavailable (`env_unavailable`) or shutting down (`unavailable`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn execute(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(mut req): JsonBody<ExecRequest>,
) -> Result<Response, ApiError> {
    if wants_events(&headers) || req.stream == Some(true) {
        req.stream = Some(true);
        state.executor.find_env(req.env.as_deref()).await;
        return stream::execute_stream(state.executor.clone(), req);
    }
    Ok(Json::<ExecResult>(state.executor.execute(req).await?).into_response())
}

/// `POST /sessions` `{"env"?, "ttl"?, "timeout"?, "limits"?}`: start a
/// persistent session; pass its id as `session` to `/execute`.
#[utoipa::path(
    post,
    path = "/sessions",
    tag = "sessions",
    request_body(content = ref("#/components/schemas/CreateSessionRequest"), content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "The session was created", body = ref("#/components/schemas/SessionInfo")),
        (status = 400, description = "Malformed request (`bad_request`)", body = openapi::ErrorBody),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client lacks the scope (`forbidden`, naming it) or may not use the environment (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 408, description = "The body did not arrive in time (`request_timeout`)", body = openapi::ErrorBody),
        (status = 413, description = "Body over `max_body_bytes` (`too_large`)", body = openapi::ErrorBody),
        (status = 429, description = "A cap on live sessions is reached, the server's or the client's (`too_many_sessions`), or the client's `max_concurrent` or `rate_per_minute` is spent (`too_many_requests`, with `Retry-After`)", body = openapi::ErrorBody),
        (status = 503, description = "No worker free in time (`busy`), environment unavailable (`env_unavailable`), or the replica is draining or shutting down (`draining`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn create_session(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<CreateSessionRequest>,
) -> Result<(StatusCode, Json<SessionInfo>), ApiError> {
    let info = state.executor.create_session(req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /sessions` -> `{"sessions": [...]}`: this replica's live sessions.
#[utoipa::path(
    get,
    path = "/sessions",
    tag = "sessions",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The live sessions", body = ref("#/components/schemas/SessionList")),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client lacks the `sessions` scope (`forbidden`)", body = openapi::ErrorBody),
    )
)]
async fn list_sessions(State(state): State<AppState>) -> Response {
    Json(json!({ "sessions": state.executor.list_sessions() })).into_response()
}

/// `DELETE /sessions/{id}` -> the session as it was, `"closed": true`.
#[utoipa::path(
    delete,
    path = "/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The session ended", body = ref("#/components/schemas/ClosedSession")),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client lacks the `sessions` scope (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "No such live session here (`unknown_session`)", body = openapi::ErrorBody),
        (status = 503, description = "The audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn close_session(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let info = state.executor.close_session(&id)?;
    let mut body = serde_json::to_value(info).unwrap_or_else(|_| json!({ "id": id }));
    body["closed"] = json!(true);
    Ok(Json(body).into_response())
}

/// Grade one program against many test cases, each a clean run.
#[utoipa::path(
    post,
    path = "/grade",
    tag = "grade",
    request_body(content = ref("#/components/schemas/GradeRequest"), content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every case has a verdict (a server fault is the verdict `error`)", body = ref("#/components/schemas/GradeResult")),
        (status = 400, description = "Malformed request (`bad_request`)", body = openapi::ErrorBody),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client lacks the scope (`forbidden`, naming it) or may not use the environment (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 408, description = "The body did not arrive in time (`request_timeout`)", body = openapi::ErrorBody),
        (status = 413, description = "Body, code, files or cases over a limit (`too_large`)", body = openapi::ErrorBody),
        (status = 429, description = "The client's `max_concurrent` or `rate_per_minute` is spent (`too_many_requests`, with `Retry-After`)", body = openapi::ErrorBody),
        (status = 503, description = "Environment unavailable (`env_unavailable`) or shutting down (`unavailable`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn grade(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<GradeRequest>,
) -> Result<Json<GradeResult>, ApiError> {
    Ok(Json(state.executor.grade(req).await?))
}

/// `POST /grade/batch`: with `Accept: text/event-stream`, one `submission`
/// event per submission as it finishes (`{"index", "result"}`), then one
/// `result` event with the whole answer.
#[utoipa::path(
    post,
    path = "/grade/batch",
    tag = "grade",
    request_body(content = ref("#/components/schemas/GradeBatchRequest"), content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every submission graded, in request order. Streamed: `submission` events (`GradeBatchEvent`), then one `result` event (this object)",
            content((ref("#/components/schemas/GradeBatchResult") = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Malformed request (`bad_request`, naming the submission)", body = openapi::ErrorBody),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client lacks the scope (`forbidden`, naming it) or may not use the environment (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 408, description = "The body did not arrive in time (`request_timeout`)", body = openapi::ErrorBody),
        (status = 413, description = "Body, code, files or cases over a limit (`too_large`)", body = openapi::ErrorBody),
        (status = 429, description = "The client's `max_concurrent` or `rate_per_minute` is spent (`too_many_requests`, with `Retry-After`)", body = openapi::ErrorBody),
        (status = 503, description = "Environment unavailable (`env_unavailable`) or shutting down (`unavailable`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn grade_batch(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<GradeBatchRequest>,
) -> Result<Response, ApiError> {
    for sub in &req.submissions {
        state.executor.find_env(sub.env.as_deref()).await;
    }
    let batch = state.executor.prepare_grade_batch(req)?;
    if wants_events(&headers) {
        return Ok(stream::grade_batch_stream(state.executor.clone(), batch));
    }
    Ok(
        Json::<GradeBatchResult>(state.executor.grade_prepared_batch(batch, None).await)
            .into_response(),
    )
}

/// `GET /artifacts/{run}/{path}`: a file an MCP run wrote, while the store
/// keeps it, to the client that ran it (the same bearer token); 404
/// otherwise.
#[utoipa::path(
    get,
    path = "/artifacts/{run}/{path}",
    tag = "artifacts",
    params(
        ("run" = String, Path, description = "The run's id, from the artifact's `uri` (`artifact://{run}/{path}`)"),
        ("path" = String, Path, description = "The file's path in the run's working directory (may hold `/`)"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The file's bytes, with its MIME type as `Content-Type`", content_type = "application/octet-stream"),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 404, description = "Expired, evicted or another client's (`not_found`)", body = openapi::ErrorBody),
    )
)]
async fn artifact(
    State(state): State<AppState>,
    Path((run, path)): Path<(String, String)>,
    req_headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let token = req_headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let owner = crate::artifacts::owner_of_token(token);
    let Some(found) = state.executor.artifacts().get(&owner, &run, &path) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no artifact {path:?} of run {run:?}: it expired, was evicted, or belongs to another client"
            ),
        ));
    };
    let bytes = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        found.base64.as_bytes(),
    )
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, found.mime)], bytes).into_response())
}

/// Whether the client asked for server-sent events: its `Accept` lists
/// `text/event-stream` (in any case), other than with `q=0`, which refuses it.
fn wants_events(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case("text/event-stream")
                && !parts.any(|param| {
                    param.split_once('=').is_some_and(|(name, value)| {
                        name.trim().eq_ignore_ascii_case("q")
                            && value.trim().parse::<f64>().is_ok_and(|q| q <= 0.0)
                    })
                })
        })
}

/// Every environment code can run in, with its pool's counts.
#[utoipa::path(
    get,
    path = "/list-envs",
    tag = "envs",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The environments", body = openapi::EnvList),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
    )
)]
async fn list_envs(State(state): State<AppState>) -> Response {
    Json(json!({ "envs": state.executor.list_envs() })).into_response()
}

/// `GET /list-packages?env=NAME` (default env without `env`).
#[derive(Debug, Deserialize)]
struct PackagesQuery {
    env: Option<String>,
}

/// Installed distributions of an environment.
#[utoipa::path(
    get,
    path = "/list-packages",
    tag = "envs",
    params(("env" = Option<String>, Query, description = "Environment name or prefix; the default one if absent")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The packages, sorted by name", body = openapi::PackageList),
        (status = 400, description = "Malformed query (`bad_request`)", body = openapi::ErrorBody),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 403, description = "The client may not use the environment (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 503, description = "The environment cannot list its packages (`env_unavailable`) or shutting down (`unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn list_packages(
    State(state): State<AppState>,
    query: Result<Query<PackagesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let packages = state.executor.list_packages(query.env.as_deref()).await?;
    Ok(Json(json!({ "packages": packages })).into_response())
}

/// Install packages with pip or Conda (admin token only).
#[utoipa::path(
    post,
    path = "/install",
    tag = "envs",
    request_body = InstallRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The installer ran (whatever its exit status)", body = InstallResult),
        (status = 400, description = "Refused package spec, or no conda for `manager: conda` (`bad_request`)", body = openapi::ErrorBody),
        (status = 403, description = "Installs disabled (no admin token or client with `install` configured), not the admin token, a client without the `install` scope, or an environment outside its `envs` (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 408, description = "The body did not arrive in time (`request_timeout`)", body = openapi::ErrorBody),
        (status = 413, description = "Body over `max_body_bytes` (`too_large`)", body = openapi::ErrorBody),
        (status = 429, description = "The client's `max_concurrent` or `rate_per_minute` is spent (`too_many_requests`, with `Retry-After`)", body = openapi::ErrorBody),
        (status = 500, description = "The installer could not be started (`internal`)", body = openapi::ErrorBody),
        (status = 503, description = "Environment unavailable (`env_unavailable`) or shutting down (`unavailable`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn install(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<InstallRequest>,
) -> Result<Response, ApiError> {
    let executor = state.executor.clone();
    if wants_events(&headers) {
        return Ok(stream::progress_stream(move |progress| async move {
            let _ = progress.send(format!(
                "installing into {}",
                req.env.as_deref().unwrap_or("the default environment")
            ));
            executor.install(req).await
        }));
    }
    stream::to_the_end(async move { executor.install(req).await }).await
}

/// Create an environment from an environment.yml, Conda specs or a clone
/// (admin token only).
#[utoipa::path(
    post,
    path = "/envs",
    tag = "envs",
    request_body = CreateEnvRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Created and served; with `Accept: text/event-stream`, `progress` events then `result` (or `error`)", body = CreateEnvResult),
        (status = 400, description = "Bad name, spec or pip item, no Conda for a spec or environment.yml, no writable envs folder (`bad_request`)", body = openapi::ErrorBody),
        (status = 403, description = "Admin disabled (no admin token configured) or not the admin token (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment to clone (`unknown_env`)", body = openapi::ErrorBody),
        (status = 408, description = "The body did not arrive in time (`request_timeout`)", body = openapi::ErrorBody),
        (status = 409, description = "An environment or folder of that name exists (`conflict`)", body = openapi::ErrorBody),
        (status = 413, description = "Body over `max_body_bytes` or environment_yml over 1 MiB (`too_large`)", body = openapi::ErrorBody),
        (status = 422, description = "A step failed or `create_timeout_secs` passed; nothing was left on disk (`create_failed`)", body = openapi::ErrorBody),
        (status = 429, description = "The client's `max_concurrent` or `rate_per_minute` is spent (`too_many_requests`, with `Retry-After`)", body = openapi::ErrorBody),
        (status = 500, description = "The files could not be laid out (`internal`)", body = openapi::ErrorBody),
        (status = 503, description = "Shutting down (`unavailable`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn create_env(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<CreateEnvRequest>,
) -> Result<Response, ApiError> {
    let executor = state.executor.clone();
    if wants_events(&headers) {
        return Ok(stream::progress_stream(move |progress| async move {
            executor.create_env(req, Some(&progress)).await
        }));
    }
    stream::to_the_end(async move { executor.create_env(req, None).await }).await
}

/// `DELETE /envs/{name}`'s query.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct DeleteEnvQuery {
    /// Delete the default environment, or one with live sessions (they are closed).
    #[serde(default)]
    force: bool,
}

/// Delete an environment: no longer served, its prefix removed (admin token only).
#[utoipa::path(
    delete,
    path = "/envs/{name}",
    tag = "envs",
    params(("name" = String, Path, description = "Environment name or prefix"), DeleteEnvQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Deleted", body = DeleteEnvResult),
        (status = 400, description = "Not a Conda environment, or a bad query (`bad_request`)", body = openapi::ErrorBody),
        (status = 403, description = "Admin disabled (no admin token configured) or not the admin token (`forbidden`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 409, description = "The default environment, one with live sessions (without `force`), Conda's root, or a prefix holding another environment (`conflict`)", body = openapi::ErrorBody),
        (status = 500, description = "The prefix could not be removed (`internal`)", body = openapi::ErrorBody),
        (status = 503, description = "Shutting down (`unavailable`), or the audit log cannot take the record (`audit_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn delete_env(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
    query: Result<Query<DeleteEnvQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<DeleteEnvResult>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    Ok(Json(state.executor.delete_env(&name, query.force).await?))
}

/// One environment with its packages and lock (`requirements.txt`, explicit Conda spec).
#[utoipa::path(
    get,
    path = "/envs/{name}",
    tag = "envs",
    params(("name" = String, Path, description = "Environment name or prefix")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The environment, its packages and its lock", body = EnvDetails),
        (status = 401, description = "Missing or wrong token (`unauthorized`)", body = openapi::ErrorBody),
        (status = 404, description = "Unknown environment (`unknown_env`)", body = openapi::ErrorBody),
        (status = 503, description = "Environment unavailable (`env_unavailable`)", body = openapi::ErrorBody),
    )
)]
async fn env_details(
    State(state): State<AppState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Json<EnvDetails>, ApiError> {
    Ok(Json(state.executor.env_details(&name).await?))
}

/// Liveness: 200 whenever the process can answer at all. It reads no pool,
/// so a server whose environments cannot serve (readiness, `/health` 503) is
/// not restarted for it; only a wedged process fails it.
#[utoipa::path(
    get,
    path = "/livez",
    tag = "meta",
    responses((status = 200, description = "The process answers", content_type = "text/plain"))
)]
async fn livez() -> &'static str {
    "ok\n"
}

/// Readiness: 200 while some environment can serve.
#[utoipa::path(
    get,
    path = "/health",
    tag = "meta",
    responses(
        (status = 200, description = "Serving", body = crate::api::Health),
        (status = 503, description = "No environment can serve, or shutting down", body = crate::api::Health),
    )
)]
async fn health(State(state): State<AppState>) -> Response {
    let health = state.executor.health();
    let status = if health.status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

fn bearer(req: &Request) -> &str {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
}

/// A JSON body parsed whatever its content type, whose every rejection is an
/// [`ApiError`]: 413 over the body limit, 400 for malformed JSON or fields.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    "request body exceeds the size limit (max_body_bytes)",
                )
            } else {
                ApiError::bad_request(format!("unreadable request body: {e}"))
            }
        })?;
        // Every body is a JSON object: serde would also fill a struct from
        // an array of its fields in order, which no client means to send.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(ApiError::bad_request(
                "invalid JSON body: expected a JSON object ({...}), got an array",
            ));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(body_error::<T>(&bytes, e)))
    }
}

/// Why `bytes` is no `T`: ``invalid JSON body: field `limits.memory_bytes`:
/// invalid type: ...`` where the fault is in a field's value (serde's own
/// message names only what it wanted there), else serde's message. The
/// body is read again, tracking where the reader is, only to word a
/// refusal: an accepted body costs nothing more.
fn body_error<T: DeserializeOwned>(bytes: &[u8], e: serde_json::Error) -> String {
    use serde_json::error::Category;
    if matches!(e.classify(), Category::Data | Category::Syntax) {
        let mut again = serde_json::Deserializer::from_slice(bytes);
        if let Err(at) = serde_path_to_error::deserialize::<_, T>(&mut again) {
            let path = at.path();
            let named = path
                .iter()
                .all(|s| !matches!(s, serde_path_to_error::Segment::Unknown));
            if named && path.iter().next().is_some() {
                return format!("invalid JSON body: field `{path}`: {}", at.inner());
            }
        }
    }
    format!("invalid JSON body: {e}")
}

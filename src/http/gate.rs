//! Who may call a route: the bearer token is authenticated into a client
//! ([`crate::auth`]), the route's scope checked, and a request that runs
//! code takes its client's quotas (in-flight runs, rate) and, with
//! `audit_fail = "closed"`, its audit record's queue slot, all before the
//! handler starts. The handler then runs as the [`Caller`], so the executor
//! checks the env and writes records for it. Refusals are audited.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState, bearer};
use crate::audit::{Record, RecordKind};
use crate::auth::{Caller, Client, FrontEnd, Scope};
use crate::error::ExecError;

/// How a group of routes is guarded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    /// The scope every request of the group needs (`None`: any client; the
    /// executor checks what depends on the body, e.g. `/execute`'s
    /// `execute` or `sessions`).
    pub(crate) scope: Option<Scope>,
    /// `POST`s of the group run code: they take the client's quotas.
    pub(crate) count_posts: bool,
    /// How a refusal is answered.
    pub(crate) kind: RuleKind,
}

/// Refusals that keep the shape they had before named clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuleKind {
    /// 401 for a missing or unknown token, 403 for a missing scope.
    Api,
    /// `/install`: 403 for every refusal, saying when installs are off.
    Install,
    /// `/metrics`: the metrics token too; 401 for every refusal.
    Metrics,
    /// `/mcp`: authentication only (tools check their scope per call).
    Mcp,
}

/// The gate's state: the app's and the rule of the routes it guards.
#[derive(Clone)]
pub(crate) struct Gated {
    pub(crate) state: AppState,
    pub(crate) rule: Rule,
}

/// The client a `/mcp` request authenticated as, for the MCP tools (they
/// read it from the request's parts).
#[derive(Clone)]
pub(crate) struct Authenticated(pub(crate) Arc<Client>);

/// The middleware (see the module's docs).
pub(crate) async fn gate(State(gated): State<Gated>, mut req: Request, next: Next) -> Response {
    let Gated { state, rule } = gated;
    let executor = &state.executor;
    if rule.kind == RuleKind::Metrics
        && let Some(token) = &state.metrics_token
        && bool::from(bearer(&req).as_bytes().ct_eq(token.as_bytes()))
    {
        return next.run(req).await;
    }
    let request_id: Arc<str> = req
        .headers()
        .get(super::observe::REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .into();
    let remote = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let front = match rule.kind {
        RuleKind::Mcp => FrontEnd::McpHttp,
        _ => FrontEnd::Http,
    };
    let given = bearer(&req);
    let Some(client) = executor
        .clients()
        .authenticate((!given.is_empty()).then_some(given))
    else {
        let refusal = unauthenticated(&state, rule.kind);
        audit_refusal(&state, None, &request_id, remote, front, &refusal);
        return refusal.into_response();
    };
    if let Some(scope) = rule.scope
        && let Err(err) = client.require(scope)
    {
        let refusal = match rule.kind {
            RuleKind::Metrics => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token for /metrics",
            ),
            _ => ApiError::from(err),
        };
        audit_refusal(&state, Some(&client), &request_id, remote, front, &refusal);
        return refusal.into_response();
    }
    let mut caller = Caller::new(client.clone(), request_id, remote, front);
    if rule.count_posts && req.method() == Method::POST {
        match admit(executor, &client) {
            Ok((in_flight, slot)) => {
                caller.in_flight = in_flight;
                *caller.audit_slot.get_mut() = slot;
            }
            Err(err) => {
                let refusal = ApiError::from(err);
                audit_refusal(
                    &state,
                    Some(&client),
                    &caller.request_id,
                    remote,
                    front,
                    &refusal,
                );
                return refusal.into_response();
            }
        }
    }
    if rule.kind == RuleKind::Mcp {
        req.extensions_mut().insert(Authenticated(client));
    }
    Arc::new(caller).scope(next.run(req)).await
}

/// A run's quotas: the client's in-flight slot and rate token, then (fail
/// closed) the audit record's queue slot.
pub(crate) fn admit(
    executor: &crate::executor::Executor,
    client: &Client,
) -> Result<(Option<crate::auth::InFlight>, Option<crate::audit::Slot>), ExecError> {
    let in_flight = client.admit_run()?;
    let slot = executor.audit().reserve()?;
    Ok((in_flight, slot))
}

/// The answer to a request without a known token.
fn unauthenticated(state: &AppState, kind: RuleKind) -> ApiError {
    match kind {
        RuleKind::Api | RuleKind::Mcp => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        ),
        RuleKind::Metrics => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token for /metrics",
        ),
        RuleKind::Install if !state.executor.clients().any_has(Scope::Install) => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "installs are disabled: the server has no admin token (start it with --admin-token)",
        ),
        RuleKind::Install => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this endpoint needs the admin bearer token",
        ),
    }
}

/// The audit record of a refusal made here (401, 403, 429).
fn audit_refusal(
    state: &AppState,
    client: Option<&Arc<Client>>,
    request_id: &Arc<str>,
    remote: Option<SocketAddr>,
    front: FrontEnd,
    refusal: &ApiError,
) {
    let audit = state.executor.audit();
    if !audit.enabled() {
        return;
    }
    let kind = match refusal.status {
        StatusCode::TOO_MANY_REQUESTS => RecordKind::RateLimited,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => RecordKind::AuthFailure,
        _ => return,
    };
    let mut record = Record::new(kind, None);
    record.request_id = Some(request_id.clone());
    record.client = client.map(|c| c.name_arc().clone());
    record.remote = remote.map(|r| r.to_string());
    record.front_end = Some(front.as_str());
    record.outcome = Some("refused");
    record.status = Some(refusal.status.as_u16());
    record.error = Some(refusal.code);
    record.message = Some(refusal.message.clone());
    audit.emit(record, None);
}

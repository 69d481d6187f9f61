//! Integration tests: one binary, one module per behaviour.

mod common;

mod adversarial;
mod balancer;
mod codec;
mod concurrency;
mod container;
mod crashes;
mod docs;
mod drain;
mod envs;
mod envs_admin;
mod envs_discovery;
mod execute;
mod forking;
mod grading;
mod grading_code;
mod http_api;
mod install;
mod isolation;
mod manifests;
mod mcp;
mod mcp_artifacts;
mod mcp_packages;
mod mcp_protocol;
mod mcp_python;
mod mcp_sessions;
mod ops;
mod python_client;
mod readme;
mod results;
mod router;
mod sessions;
mod shutdown;
mod streaming;
mod timeouts;

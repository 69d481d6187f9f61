//! Integration tests: one binary, one module per behaviour.

mod common;

mod adversarial;
mod audit;
mod balancer;
mod clients;
mod codec;
mod concurrency;
mod container;
mod crashes;
mod docs;
mod drain;
mod egress;
mod envs;
mod execute;
mod forking;
mod grading;
mod grading_code;
mod http_api;
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

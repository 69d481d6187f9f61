//! Integration tests: one binary, one module per behaviour.

mod common;


mod envs;
mod execute;

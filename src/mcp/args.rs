//! Tool arguments: the extractor the tools take them with. rmcp's own
//! (`rmcp::handler::server::wrapper::Parameters`) answers a refused argument
//! with `failed to deserialize parameters: ...`, naming no argument when a
//! value has the wrong type; this one names it and answers in the format of
//! every other refusal, `error (bad_request): ...`.

use rmcp::ErrorData;
use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResponse, ErrorCode};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::error::ExecError;
use crate::mcp::result::refusal;

/// A tool's arguments, deserialized into `P`. Named `Parameters` as rmcp's
/// is, so that `#[tool]` takes the tool's input schema from `P`.
#[derive(Debug, Clone)]
pub struct Parameters<P>(pub P);

impl<P: JsonSchema> JsonSchema for Parameters<P> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        P::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        P::json_schema(generator)
    }
}

/// Marks the protocol error of refused arguments, which
/// [`refused_arguments`] turns into the tool's result: an extractor can
/// only answer with a protocol error.
const REFUSED_ARGUMENTS: &str = "code-executor: refused arguments";

impl<S, P: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Parameters<P> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let arguments = context.arguments.take().unwrap_or_default();
        serde_path_to_error::deserialize(serde_json::Value::Object(arguments))
            .map(Parameters)
            .map_err(|e| {
                ErrorData::invalid_params(
                    argument_error(&e),
                    Some(serde_json::Value::String(REFUSED_ARGUMENTS.into())),
                )
            })
    }
}

/// ``invalid argument `timeout`: invalid type: ...`` (`limits.memory_bytes`
/// for a nested one), or ``invalid arguments: missing field `code` `` where
/// the error is about the arguments as a whole.
fn argument_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    if path == "." {
        format!("invalid arguments: {}", e.inner())
    } else {
        format!("invalid argument `{path}`: {}", e.inner())
    }
}

/// A tool call's answer with refused arguments as the tool's `isError`
/// result (`error (bad_request): ...`); any other answer as it is.
pub fn refused_arguments(
    answer: Result<CallToolResponse, ErrorData>,
) -> Result<CallToolResponse, ErrorData> {
    match answer {
        Err(err)
            if err.code == ErrorCode::INVALID_PARAMS
                && err.data.as_ref().and_then(|d| d.as_str()) == Some(REFUSED_ARGUMENTS) =>
        {
            Ok(refusal(ExecError::BadRequest(err.message.into_owned())).into())
        }
        other => other,
    }
}

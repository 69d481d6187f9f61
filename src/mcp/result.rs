//! Tool results: what a model reads (one text block) and what a program reads
//! (`structuredContent`, the same fields as `POST /execute`).
//!
//! A run that happened is a result whatever its exit status; it is flagged
//! `isError` when the code failed (non-zero exit, signal, timeout). A request
//! the executor refused (unknown environment, bad argument, busy) is an
//! `isError` result whose text carries the same code and message as the HTTP
//! error body. Protocol errors are left to `rmcp` for protocol faults.

use rmcp::model::{CallToolResult, ContentBlock};

use crate::api::ExecResult;
use crate::api::{GradeResult, Verdict};
use crate::error::{ExecError, error_chain, too_many_sessions};
use crate::outcome::Limit;

/// Text of artifacts one tool result may embed as resources (beside their
/// links), so that a small CSV or log is read without another request.
const MAX_TEXT_CONTENT: usize = 16 << 10;

/// The tool result of a run. `timeout` is the effective wall-clock limit of
/// the run in seconds, named in the status line when the run hit it.
///
/// Every artifact kept in the store (its `uri` set) comes as a
/// `resource_link`; images also come inline while their base64 fits in
/// `inline_image_bytes`, and small text files as embedded resources. The
/// text block lists every artifact, so a client that shows neither links
/// nor structured content still tells the model what there is.
/// `structuredContent` carries the same fields as `/execute`, without the
/// content of artifacts it did not inline (their `uri` says where it is).
pub fn run_result(result: &ExecResult, timeout: f64, inline_image_bytes: usize) -> CallToolResult {
    let failed = result.exit_code != 0 || result.timed_out;
    let mut result = result.clone();
    let mut text = run_text(&result, timeout);
    let mut links = Vec::new();
    let mut inline = Vec::new();
    let (mut images, mut texts) = (0usize, 0usize);
    for artifact in &mut result.artifacts {
        let (Some(b64), Some(uri)) = (artifact.base64.take(), artifact.uri.clone()) else {
            text.push_str(&format!(
                "\n[artifact {} ({} bytes, {}): too large to return or keep]",
                artifact.path, artifact.size, artifact.mime
            ));
            artifact.omitted = true;
            continue;
        };
        links.push(ContentBlock::resource_link(
            rmcp::model::Resource::new(uri.clone(), artifact.path.clone())
                .with_mime_type(artifact.mime.clone())
                .with_size(artifact.size),
        ));
        let mut shown = "";
        if artifact.mime.starts_with("image/") {
            if images + b64.len() <= inline_image_bytes {
                images += b64.len();
                inline.push(ContentBlock::image(b64.clone(), artifact.mime.clone()));
                artifact.base64 = Some(b64);
                shown = ", shown as an image";
            }
        } else if artifact.size as usize + texts <= MAX_TEXT_CONTENT
            && let Some(content) =
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &b64)
                    .ok()
                    .and_then(|bytes| String::from_utf8(bytes).ok())
        {
            texts += content.len();
            inline.push(ContentBlock::embedded_text(uri.clone(), content));
            artifact.base64 = Some(b64);
            shown = ", embedded";
        }
        text.push_str(&format!(
            "\n[artifact {} ({} bytes, {}{shown}): {uri}]",
            artifact.path, artifact.size, artifact.mime
        ));
    }
    if result.artifacts_truncated {
        text.push_str("\n[more files than listed: the artifact listing was cut]");
    }
    let mut content = vec![ContentBlock::text(text)];
    content.extend(inline);
    content.extend(links);
    let mut out = match serde_json::to_value(&result) {
        Ok(value) if failed => CallToolResult::structured_error(value),
        Ok(value) => CallToolResult::structured(value),
        // `ExecResult` is plain data; serializing it cannot fail. Should it,
        // the text still tells the whole story.
        Err(_) if failed => CallToolResult::error(Vec::new()),
        Err(_) => CallToolResult::success(Vec::new()),
    };
    out.content = content;
    out
}

/// The tool result of a request the executor refused or could not run.
pub fn refusal(err: ExecError) -> CallToolResult {
    let message = message(&err);
    if err.status() >= 500 {
        tracing::error!(code = err.code(), "execute_code failed: {message}");
    }
    CallToolResult::error(vec![ContentBlock::text(format!(
        "error ({}): {message}",
        err.code()
    ))])
}

/// The message of `err` as an MCP client reads it: the HTTP API's, except
/// that where that names the route which opens or closes a session, this
/// names the tool.
fn message(err: &ExecError) -> String {
    match err {
        ExecError::UnknownSession {
            message,
            create_one: true,
        } => format!("{message}; create one with the `create_session` tool"),
        ExecError::FixedBySession { field: "limits" } => {
            "a session's limits are fixed when it is created, and over MCP they are the \
             environment's (`create_session` takes none); a call in a session cannot change \
             them: omit `limits`"
                .into()
        }
        ExecError::FixedBySession { field } => format!(
            "a session's {field} is fixed when it is created (the `{field}` argument of the \
             `create_session` tool); a call in a session cannot change it: omit `{field}`"
        ),
        ExecError::TooManySessions { env, client, limit } => too_many_sessions(
            env.as_deref(),
            client.as_deref(),
            *limit,
            "with the `close_session` tool",
        ),
        _ => error_chain(err),
    }
}

/// stdout, then stderr under a `[stderr]` line, then one bracketed status
/// line such as `[exit code 1]`, `[timed out after 5 s]` or
/// `[exit code 0, output truncated]`.
pub fn run_text(result: &ExecResult, timeout: f64) -> String {
    let mut text = String::with_capacity(result.stdout.len() + result.stderr.len() + 48);
    let push_stream = |text: &mut String, stream: &str| {
        text.push_str(stream);
        if !stream.ends_with('\n') {
            text.push('\n');
        }
    };
    if !result.stdout.is_empty() {
        push_stream(&mut text, &result.stdout);
    }
    if !result.stderr.is_empty() {
        text.push_str("[stderr]\n");
        push_stream(&mut text, &result.stderr);
    }
    if let Some(value) = &result.result {
        text.push_str("[result]\n");
        push_stream(&mut text, value);
    }
    if result.stdout.is_empty() && result.stderr.is_empty() && result.result.is_none() {
        text.push_str("(no output)\n");
    }
    text.push('[');
    text.push_str(&status_line(result, timeout));
    text.push(']');
    text
}

/// One line saying how the run ended.
pub fn status_line(result: &ExecResult, timeout: f64) -> String {
    let mut line = if result.timed_out {
        format!("timed out after {} s", crate::limits::readable(timeout))
    } else if let Some(signal) = &result.signal {
        match result.limit {
            Some(limit) if limit != Limit::Output => format!("killed by {signal} ({limit} limit)"),
            _ => format!("killed by {signal}"),
        }
    } else {
        format!("exit code {}", result.exit_code)
    };
    if result.truncated {
        line.push_str(", output truncated");
    }
    line
}

/// Failed cases listed one per line in the text of a grading result.
const MAX_LISTED_CASES: usize = 20;

/// `text` on one line of a grading result: its line breaks written as
/// `\n` and `\r` (an exception's message or a case's name may hold them).
fn one_line(text: &str) -> String {
    text.replace('\r', "\\r").replace('\n', "\\n")
}

/// The tool result of a grading request: the summary and one line per case
/// that is not `ok` as text, the whole [`GradeResult`] as
/// `structuredContent`. Grading that ran is never `isError`, whatever the
/// verdicts: they are the answer.
pub fn grade_result(result: &GradeResult) -> CallToolResult {
    let mut text = result.summary();
    let failed: Vec<_> = result
        .cases
        .iter()
        .filter(|c| c.verdict != Verdict::Ok)
        .collect();
    for case in failed.iter().take(MAX_LISTED_CASES) {
        let name = case
            .name
            .as_ref()
            .map(|n| format!(" ({})", one_line(n)))
            .unwrap_or_default();
        let detail = case
            .diff
            .as_ref()
            .or(case.message.as_ref())
            .map(|d| format!(": {}", one_line(d)))
            .unwrap_or_default();
        text.push_str(&format!(
            "\ntest {}{name}: {}{detail}",
            case.index,
            case.verdict.as_str()
        ));
    }
    if failed.len() > MAX_LISTED_CASES {
        text.push_str(&format!(
            "\n... and {} more not ok (see structuredContent)",
            failed.len() - MAX_LISTED_CASES
        ));
    }
    let mut out = match serde_json::to_value(result) {
        Ok(value) => CallToolResult::structured(value),
        Err(_) => CallToolResult::success(Vec::new()),
    };
    out.content = vec![ContentBlock::text(text)];
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(result: &CallToolResult) -> &str {
        result.content[0]
            .as_text()
            .map(|t| t.text.as_str())
            .unwrap_or("")
    }

    #[test]
    fn artifacts_come_as_links_with_small_images_inline_and_big_ones_only_linked() {
        let artifact = |path: &str, mime: &str, size: usize| crate::api::Artifact {
            path: path.into(),
            size: size as u64,
            mime: mime.into(),
            base64: Some("A".repeat(size)),
            omitted: false,
            uri: Some(format!("artifact://r/{path}")),
        };
        let run = ExecResult {
            artifacts: vec![
                artifact("small.png", "image/png", 100),
                artifact("big.png", "image/png", 200_000),
                crate::api::Artifact {
                    uri: None,
                    ..artifact("huge.bin", "application/octet-stream", 10)
                },
            ],
            ..ExecResult::default()
        };
        let out = run_result(&run, 30.0, 1 << 16);
        let text = text_of(&out);
        assert!(text.contains("[artifact small.png (100 bytes, image/png, shown as an image): artifact://r/small.png]"), "{text}");
        assert!(
            text.contains("[artifact big.png (200000 bytes, image/png): artifact://r/big.png]"),
            "{text}"
        );
        assert!(
            text.contains("huge.bin (10 bytes, application/octet-stream): too large"),
            "{text}"
        );
        let kinds: Vec<&str> = out
            .content
            .iter()
            .skip(1)
            .map(|c| match c {
                ContentBlock::Image(_) => "image",
                ContentBlock::ResourceLink(_) => "link",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["image", "link", "link"]);
        let structured = out.structured_content.unwrap();
        assert!(structured["artifacts"][0]["base64"].is_string());
        assert!(
            structured["artifacts"][1].get("base64").is_none(),
            "{structured}"
        );
        assert_eq!(structured["artifacts"][1]["uri"], "artifact://r/big.png");
    }

    #[test]
    fn success_is_stdout_then_status() {
        let run = ExecResult {
            stdout: "4\n".into(),
            ..ExecResult::default()
        };
        let out = run_result(&run, 30.0, 1 << 16);
        assert_eq!(out.is_error, Some(false));
        assert_eq!(text_of(&out), "4\n[exit code 0]");
        assert_eq!(out.structured_content.as_ref().unwrap()["stdout"], "4\n");
    }

    #[test]
    fn a_cut_listing_of_artifacts_says_so_in_text_and_structure() {
        let run = ExecResult {
            stdout: "made\n".into(),
            artifacts_truncated: true,
            ..ExecResult::default()
        };
        let out = run_result(&run, 30.0, 1 << 16);
        assert_eq!(
            text_of(&out),
            "made\n[exit code 0]\n[more files than listed: the artifact listing was cut]"
        );
        let structured = out.structured_content.as_ref().unwrap();
        assert_eq!(structured["artifacts_truncated"], true);
        let whole = run_result(&ExecResult::default(), 30.0, 1 << 16);
        assert!(
            whole.structured_content.as_ref().unwrap()["artifacts_truncated"].is_null(),
            "absent when false"
        );
    }

    #[test]
    fn failures_are_errors_with_stderr_and_status() {
        let run = ExecResult {
            stdout: "partial".into(),
            stderr: "Traceback\nZeroDivisionError: division by zero\n".into(),
            exit_code: 1,
            ..ExecResult::default()
        };
        let out = run_result(&run, 30.0, 1 << 16);
        assert_eq!(out.is_error, Some(true));
        assert_eq!(
            text_of(&out),
            "partial\n[stderr]\nTraceback\nZeroDivisionError: division by zero\n[exit code 1]"
        );
        assert_eq!(out.structured_content.as_ref().unwrap()["exit_code"], 1);
    }

    #[test]
    fn status_names_timeouts_signals_and_truncation() {
        let timed_out = ExecResult {
            timed_out: true,
            exit_code: -9,
            signal: Some("SIGKILL".into()),
            ..ExecResult::default()
        };
        assert_eq!(status_line(&timed_out, 5.0), "timed out after 5 s");
        assert_eq!(status_line(&timed_out, 0.5), "timed out after 0.5 s");
        assert_eq!(status_line(&timed_out, 1e-300), "timed out after 1e-300 s");
        let cpu = ExecResult {
            exit_code: -24,
            signal: Some("SIGXCPU".into()),
            limit: Some(Limit::Cpu),
            ..ExecResult::default()
        };
        assert_eq!(status_line(&cpu, 5.0), "killed by SIGXCPU (cpu limit)");
        let truncated = ExecResult {
            truncated: true,
            limit: Some(Limit::Output),
            ..ExecResult::default()
        };
        assert_eq!(
            status_line(&truncated, 5.0),
            "exit code 0, output truncated"
        );
        assert_eq!(
            text_of(&run_result(&ExecResult::default(), 1.0, 1 << 16)),
            "(no output)\n[exit code 0]"
        );
    }

    #[test]
    fn refusals_carry_the_http_error_code_and_message() {
        let out = refusal(ExecError::UnknownEnv {
            name: "nope".into(),
            known: "base, ml".into(),
        });
        assert_eq!(out.is_error, Some(true));
        assert!(out.structured_content.is_none());
        assert_eq!(
            text_of(&out),
            "error (unknown_env): unknown environment \"nope\"; known environments: base, ml"
        );
    }
}

//! `POST /execute` as server-sent events: `stdout` / `stderr` events carry
//! output chunks as the run produces them (each a JSON string, so newlines
//! survive the SSE framing exactly), then one `result` event carries
//! the whole result (the JSON of the non-streaming answer), or one `error`
//! event the JSON error body. A client that disconnects cancels its run.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::ApiError;
use crate::api::ExecRequest;
use crate::executor::Executor;
use crate::executor::{OutputChunk, OutputStream, Progress};
use crate::grade::PreparedBatch;

/// Events buffered towards a slow client before the run waits for it.
const EVENT_BUFFER: usize = 64;

pub(super) fn execute_stream(
    executor: Arc<Executor>,
    req: ExecRequest,
) -> Result<Response, ApiError> {
    // Refusals keep their HTTP status: they happen before the stream starts.
    let prepared = executor.prepare(&req)?;
    let (events, rx) = mpsc::channel::<Event>(EVENT_BUFFER);
    let run_and_send = async move {
        let (sink, mut chunks) = mpsc::unbounded_channel::<OutputChunk>();
        let run = executor.run(prepared, Some(sink));
        tokio::pin!(run);
        let mut text = TextDecoder::default();
        let outcome = loop {
            tokio::select! {
                Some(chunk) = chunks.recv() => {
                    if let Some(event) = text.event(chunk)
                        && events.send(event).await.is_err()
                    {
                        return; // the client left: dropping `run` kills it
                    }
                }
                outcome = &mut run => break outcome,
                _ = events.closed() => return,
            }
        };
        while let Ok(chunk) = chunks.try_recv() {
            if let Some(event) = text.event(chunk) {
                let _ = events.send(event).await;
            }
        }
        let last = match outcome {
            Ok(result) => Event::default()
                .event("result")
                .json_data(&result)
                .unwrap_or_else(|_| Event::default().event("result")),
            Err(err) => {
                let err = ApiError::from(err);
                Event::default().event("error").data(err.body().to_string())
            }
        };
        let _ = events.send(last).await;
    };
    // The run goes on in its own task; it keeps the request's span (its id).
    tokio::spawn(tracing::Instrument::instrument(
        with_caller(run_and_send),
        tracing::Span::current(),
    ));
    Ok(sse(rx))
}

/// `POST /grade/batch` as server-sent events: one `submission` event per
/// submission as it finishes, then the whole answer as `result`. A client
/// that disconnects cancels the batch's runs.
pub(super) fn grade_batch_stream(executor: Arc<Executor>, batch: PreparedBatch) -> Response {
    let (events, rx) = mpsc::channel::<Event>(EVENT_BUFFER);
    let run_and_send = async move {
        let (done, mut finished) = mpsc::unbounded_channel();
        let run = executor.grade_prepared_batch(batch, Some(&done));
        tokio::pin!(run);
        let send = |(index, result)| {
            Event::default()
                .event("submission")
                .json_data(serde_json::json!({"index": index, "result": result}))
                .unwrap_or_else(|_| Event::default().event("submission"))
        };
        let answer = loop {
            tokio::select! {
                Some(one) = finished.recv() => {
                    if events.send(send(one)).await.is_err() {
                        return; // the client left: dropping `run` kills its runs
                    }
                }
                answer = &mut run => break answer,
                _ = events.closed() => return,
            }
        };
        while let Ok(one) = finished.try_recv() {
            let _ = events.send(send(one)).await;
        }
        let last = Event::default()
            .event("result")
            .json_data(&answer)
            .unwrap_or_else(|_| Event::default().event("result"));
        let _ = events.send(last).await;
    };
    tokio::spawn(tracing::Instrument::instrument(
        with_caller(run_and_send),
        tracing::Span::current(),
    ));
    sse(rx)
}

/// `f` as the request's caller when spawned on a task of its own (the
/// caller is read now, in the request's task; the spawned one has none):
/// its audit record names the client, and the client's `max_concurrent`
/// slot stays held until `f` ends.
pub(super) fn with_caller<F: std::future::Future>(
    f: F,
) -> impl std::future::Future<Output = F::Output> {
    let caller = crate::auth::current();
    async move {
        match caller {
            Some(caller) => caller.scope(f).await,
            None => f.await,
        }
    }
}

/// Run `work` to its end in a task of its own, as the request's caller: a
/// client that leaves does not cut it short (an install or a create left
/// half-done). The answer is `work`'s as JSON.
pub(super) async fn to_the_end<T, F>(work: F) -> Result<Response, ApiError>
where
    T: serde::Serialize + Send + 'static,
    F: std::future::Future<Output = Result<T, crate::error::ExecError>> + Send + 'static,
{
    let answer = tokio::spawn(with_caller(work)).await.map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
    })??;
    Ok(axum::Json(answer).into_response())
}

/// A long admin operation (create, install) as server-sent events: one
/// `progress` event per step (a JSON string), then `result` with the JSON
/// of the non-streaming answer, or `error` with the JSON error body. The
/// operation runs in its own task to its end even if the client leaves:
/// cut short, it could leave a half-made environment behind.
pub(super) fn progress_stream<T, F>(work: impl FnOnce(Progress) -> F) -> Response
where
    T: serde::Serialize + Send + 'static,
    F: std::future::Future<Output = Result<T, crate::error::ExecError>> + Send + 'static,
{
    let (events, rx) = mpsc::channel::<Event>(EVENT_BUFFER);
    let (progress, mut lines) = mpsc::unbounded_channel::<String>();
    let task = tokio::spawn(tracing::Instrument::instrument(
        with_caller(work(progress)),
        tracing::Span::current(),
    ));
    let send = async move {
        let line_event = |line: String| {
            Event::default()
                .event("progress")
                .data(serde_json::Value::String(line).to_string())
        };
        // The sender side closes when the work ends.
        while let Some(line) = lines.recv().await {
            let _ = events.send(line_event(line)).await;
        }
        let last = match task.await {
            Ok(Ok(answer)) => Event::default()
                .event("result")
                .json_data(&answer)
                .unwrap_or_else(|_| Event::default().event("result")),
            Ok(Err(err)) => {
                let err = ApiError::from(err);
                Event::default().event("error").data(err.body().to_string())
            }
            Err(_) => Event::default()
                .event("error")
                .data(r#"{"error":{"code":"internal","message":"internal error"}}"#),
        };
        let _ = events.send(last).await;
    };
    tokio::spawn(send);
    sse(rx)
}

/// The response streaming what `rx` receives.
fn sse(rx: mpsc::Receiver<Event>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|event| (Ok::<_, Infallible>(event), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Turns byte chunks into text events without splitting a UTF-8 character
/// across two events: an incomplete tail waits for the next chunk.
#[derive(Default)]
struct TextDecoder {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl TextDecoder {
    fn event(&mut self, chunk: OutputChunk) -> Option<Event> {
        let (name, pending) = match chunk.stream {
            OutputStream::Stdout => ("stdout", &mut self.stdout),
            OutputStream::Stderr => ("stderr", &mut self.stderr),
        };
        pending.extend_from_slice(&chunk.data);
        let valid = complete_prefix(pending);
        if valid == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&pending[..valid]).into_owned();
        pending.drain(..valid);
        Some(
            Event::default()
                .event(name)
                .data(serde_json::Value::String(text).to_string()),
        )
    }
}

/// How much of `bytes` can be sent now: all of it but an incomplete UTF-8
/// sequence at its end, which waits for the rest of its character. Invalid
/// bytes anywhere before it are sent (and replaced), so a character that
/// follows them is never split.
fn complete_prefix(bytes: &[u8]) -> usize {
    let mut end = 0;
    loop {
        match std::str::from_utf8(&bytes[end..]) {
            Ok(_) => return bytes.len(),
            Err(e) => match e.error_len() {
                Some(invalid) => end += e.valid_up_to() + invalid,
                None => return end + e.valid_up_to(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_wait_for_their_tail() {
        let mut d = TextDecoder::default();
        let bytes = "é!".as_bytes();
        let chunk = |data: &[u8]| OutputChunk {
            stream: OutputStream::Stdout,
            data: data.to_vec(),
        };
        assert!(d.event(chunk(&bytes[..1])).is_none());
        assert!(d.event(chunk(&bytes[1..])).is_some());
        assert!(d.stdout.is_empty());
    }

    #[test]
    fn a_character_after_an_invalid_byte_is_not_split() {
        let mut d = TextDecoder::default();
        let chunk = |data: &[u8]| OutputChunk {
            stream: OutputStream::Stdout,
            data: data.to_vec(),
        };
        // An invalid byte, then the first two bytes of "€": the invalid
        // byte goes now, the partial "€" waits for its last byte.
        assert!(d.event(chunk(b"\xff\xe2\x82")).is_some());
        assert_eq!(d.stdout, b"\xe2\x82");
        assert!(d.event(chunk(b"\xacz")).is_some());
        assert!(d.stdout.is_empty());
        assert_eq!(complete_prefix(b"a\xffb\xe2"), 3);
        assert_eq!(complete_prefix(b"\xff\xfe"), 2);
        assert_eq!(complete_prefix("€".as_bytes()), 3);
    }
}

//! `POST /execute` as server-sent events: `stdout` / `stderr` events carry
//! output chunks as the run produces them (each a JSON string, so newlines
//! survive the SSE framing exactly), then one `result` event carries
//! the whole result (the JSON of the non-streaming answer), or one `error`
//! event the JSON error body. A client that disconnects cancels its run.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::ApiError;
use crate::api::{ExecRequest, ExecResult};
use crate::executor::{Executor, complete_prefix};
use crate::executor::{OutputChunk, OutputStream, Progress};
use crate::grade::PreparedBatch;

/// Events buffered towards a slow client (an `/execute` run's output
/// queues behind them; the runs of a batch wait for the client).
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
        // Output the client has not taken yet. The run never waits for a
        // slow client, or its timeout would wait too: this holds at most
        // what the run may write, `max_output_bytes` a stream.
        let mut queued = VecDeque::new();
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                Some(chunk) = chunks.recv() => queued.extend(text.decode(chunk)),
                Ok(permit) = events.reserve(), if !queued.is_empty() => {
                    permit.send(output_event(queued.pop_front().expect("output is queued")));
                }
                // The client left: dropping `run` kills it.
                _ = events.closed() => return,
            }
        };
        while let Ok(chunk) = chunks.try_recv() {
            queued.extend(text.decode(chunk));
        }
        let last = match outcome {
            Ok(result) => {
                queued.extend(text.rest(&result));
                Event::default()
                    .event("result")
                    .json_data(&result)
                    .unwrap_or_else(|_| Event::default().event("result"))
            }
            Err(err) => {
                let err = ApiError::from(err);
                Event::default().event("error").data(err.body().to_string())
            }
        };
        for output in queued {
            if events.send(output_event(output)).await.is_err() {
                return;
            }
        }
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

/// Text of one stream, for one `stdout` or `stderr` event.
struct Output {
    stream: OutputStream,
    text: String,
}

/// The event carrying `output`, its text as a JSON string.
fn output_event(output: Output) -> Event {
    let name = match output.stream {
        OutputStream::Stdout => "stdout",
        OutputStream::Stderr => "stderr",
    };
    Event::default()
        .event(name)
        .data(serde_json::Value::String(output.text).to_string())
}

/// Turns byte chunks into text without splitting a UTF-8 character across
/// two events: an incomplete tail waits for the next chunk. The text of a
/// stream's events joined is the result's text of that stream.
#[derive(Default)]
struct TextDecoder {
    stdout: Stream,
    stderr: Stream,
}

/// One stream's bytes waiting for the rest of their character, and how
/// much text was made of it so far.
#[derive(Default)]
struct Stream {
    pending: Vec<u8>,
    decoded: usize,
}

impl TextDecoder {
    fn decode(&mut self, chunk: OutputChunk) -> Option<Output> {
        let stream = match chunk.stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        stream.pending.extend_from_slice(&chunk.data);
        let valid = complete_prefix(&stream.pending);
        if valid == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&stream.pending[..valid]).into_owned();
        stream.pending.drain(..valid);
        stream.decoded += text.len();
        Some(Output {
            stream: chunk.stream,
            text,
        })
    }

    /// The text of `result` no event has carried: an incomplete character
    /// the run ended its output with (replaced in the result, as its other
    /// invalid bytes are). Nothing where the stream was cut at the output
    /// cap: the result drops the part of a character cut there.
    fn rest(&self, result: &ExecResult) -> impl Iterator<Item = Output> {
        let rest = |stream: OutputStream, sent: &Stream, whole: &str| {
            let tail = whole.get(sent.decoded..).filter(|tail| !tail.is_empty())?;
            Some(Output {
                stream,
                text: tail.to_string(),
            })
        };
        let stdout = rest(OutputStream::Stdout, &self.stdout, &result.stdout);
        let stderr = rest(OutputStream::Stderr, &self.stderr, &result.stderr);
        stdout.into_iter().chain(stderr)
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
        assert!(d.decode(chunk(&bytes[..1])).is_none());
        assert_eq!(d.decode(chunk(&bytes[1..])).unwrap().text, "é!");
        assert!(d.stdout.pending.is_empty());
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
        assert_eq!(d.decode(chunk(b"\xff\xe2\x82")).unwrap().text, "\u{fffd}");
        assert_eq!(d.stdout.pending, b"\xe2\x82");
        assert_eq!(d.decode(chunk(b"\xacz")).unwrap().text, "€z");
        assert!(d.stdout.pending.is_empty());
        assert_eq!(complete_prefix(b"a\xffb\xe2"), 3);
        assert_eq!(complete_prefix(b"\xff\xfe"), 2);
        assert_eq!(complete_prefix("€".as_bytes()), 3);
    }
}

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
use crate::api::ExecRequest;
use crate::executor::{Executor, Output, OutputText};
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
        let mut text = OutputText::default();
        // Output the client has not taken yet. The run never waits for a
        // slow client, or its timeout would wait too: this holds at most
        // what the run may write, `max_output_bytes` a stream (as text: up
        // to 3 bytes for an invalid byte), in one piece a stream change.
        let mut queued = VecDeque::new();
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                Some(chunk) = chunks.recv() => queue(&mut queued, text.decode(chunk)),
                Ok(permit) = events.reserve(), if !queued.is_empty() => {
                    permit.send(output_event(queued.pop_front().expect("output is queued")));
                }
                // The client left: dropping `run` kills it.
                _ = events.closed() => return,
            }
        };
        while let Ok(chunk) = chunks.try_recv() {
            queue(&mut queued, text.decode(chunk));
        }
        let last = match outcome {
            Ok(result) => {
                for output in text.rest(&result) {
                    queue(&mut queued, Some(output));
                }
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

/// `output` queued behind what waits: joined to the last piece when that
/// is of the same stream, so that what waits is one piece a stream change,
/// however small the run's writes.
fn queue(queued: &mut VecDeque<Output>, output: Option<Output>) {
    let Some(output) = output else { return };
    match queued.back_mut() {
        Some(last) if last.stream == output.stream => last.text.push_str(&output.text),
        _ => queued.push_back(output),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_output_is_one_piece_a_stream_change() {
        let piece = |stream: OutputStream, text: &str| {
            Some(Output {
                stream,
                text: text.to_string(),
            })
        };
        let mut queued = VecDeque::new();
        for text in ["a", "b", "c"] {
            queue(&mut queued, piece(OutputStream::Stdout, text));
        }
        queue(&mut queued, None);
        queue(&mut queued, piece(OutputStream::Stderr, "e"));
        queue(&mut queued, piece(OutputStream::Stdout, "d"));
        let pieces: Vec<(OutputStream, String)> =
            queued.into_iter().map(|o| (o.stream, o.text)).collect();
        assert_eq!(
            pieces,
            [
                (OutputStream::Stdout, "abc".to_string()),
                (OutputStream::Stderr, "e".to_string()),
                (OutputStream::Stdout, "d".to_string()),
            ]
        );
    }
}

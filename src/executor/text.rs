//! A run's output as text, the same wherever it is shown: in the result, in
//! its streamed events (HTTP server-sent events, MCP progress), in its audit
//! record. Only whole UTF-8 characters: a character split across two chunks
//! waits for its tail, one cut at the output cap is dropped, and an invalid
//! byte is shown as U+FFFD.

use std::borrow::Cow;

use crate::api::ExecResult;
use crate::worker::{OutputChunk, OutputStream};

/// Bytes as text without a copy when they are valid UTF-8. A stream `cut`
/// at the output cap may end inside a character: that part of a character
/// is dropped, not replaced, so the text is the output as written (and
/// within the cap), as its streamed events have it.
pub(crate) fn utf8(mut bytes: Vec<u8>, cut: bool) -> String {
    if cut {
        bytes.truncate(complete_prefix(&bytes));
    }
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// [`utf8`] of borrowed bytes.
pub(crate) fn utf8_lossy(bytes: &[u8], cut: bool) -> Cow<'_, str> {
    let end = if cut {
        complete_prefix(bytes)
    } else {
        bytes.len()
    };
    String::from_utf8_lossy(&bytes[..end])
}

/// How much of `bytes` is whole: all of it but an incomplete UTF-8
/// sequence at its end, which waits for (or, at a cut, lost) the rest of
/// its character. Invalid bytes before it count as whole (they are
/// replaced), so a character that follows them is never split.
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

/// Text of one stream, for one event.
pub(crate) struct Output {
    pub(crate) stream: OutputStream,
    pub(crate) text: String,
}

/// Turns a run's output chunks into text without splitting a UTF-8
/// character across two pieces. The text of a stream's pieces joined, with
/// [`OutputText::rest`], is the result's text of that stream.
#[derive(Default)]
pub(crate) struct OutputText {
    stdout: Pending,
    stderr: Pending,
}

/// One stream's bytes waiting for the rest of their character, and how
/// much text was made of it so far.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    decoded: usize,
}

impl OutputText {
    /// The whole characters `chunk` completes, if any.
    pub(crate) fn decode(&mut self, chunk: OutputChunk) -> Option<Output> {
        let pending = match chunk.stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        pending.bytes.extend_from_slice(&chunk.data);
        let valid = complete_prefix(&pending.bytes);
        if valid == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&pending.bytes[..valid]).into_owned();
        pending.bytes.drain(..valid);
        pending.decoded += text.len();
        Some(Output {
            stream: chunk.stream,
            text,
        })
    }

    /// The text of `result` no piece has carried: an incomplete character
    /// the run ended its output with (replaced in the result, as its other
    /// invalid bytes are). Nothing where the stream was cut at the output
    /// cap: the result drops the part of a character cut there.
    pub(crate) fn rest(&self, result: &ExecResult) -> impl Iterator<Item = Output> {
        let rest = |stream: OutputStream, sent: &Pending, whole: &str| {
            debug_assert!(whole.is_char_boundary(sent.decoded.min(whole.len())));
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

    fn chunk(stream: OutputStream, data: &[u8]) -> OutputChunk {
        OutputChunk {
            stream,
            data: data.to_vec(),
        }
    }

    #[test]
    fn split_characters_wait_for_their_tail() {
        let mut d = OutputText::default();
        let bytes = "é!".as_bytes();
        assert!(d.decode(chunk(OutputStream::Stdout, &bytes[..1])).is_none());
        let out = d.decode(chunk(OutputStream::Stdout, &bytes[1..])).unwrap();
        assert_eq!(out.text, "é!");
        assert!(d.stdout.bytes.is_empty());
    }

    #[test]
    fn a_character_after_an_invalid_byte_is_not_split() {
        let mut d = OutputText::default();
        // An invalid byte, then the first two bytes of "€": the invalid
        // byte goes now, the partial "€" waits for its last byte.
        let out = d.decode(chunk(OutputStream::Stdout, b"\xff\xe2\x82"));
        assert_eq!(out.unwrap().text, "\u{fffd}");
        assert_eq!(d.stdout.bytes, b"\xe2\x82");
        let out = d.decode(chunk(OutputStream::Stdout, b"\xacz"));
        assert_eq!(out.unwrap().text, "€z");
        assert!(d.stdout.bytes.is_empty());
        assert_eq!(complete_prefix(b"a\xffb\xe2"), 3);
        assert_eq!(complete_prefix(b"\xff\xfe"), 2);
        assert_eq!(complete_prefix("€".as_bytes()), 3);
    }

    #[test]
    fn the_other_stream_between_two_halves_of_a_character_does_not_split_it() {
        let mut d = OutputText::default();
        let euro = "€".as_bytes();
        assert!(d.decode(chunk(OutputStream::Stdout, &euro[..2])).is_none());
        let err = d.decode(chunk(OutputStream::Stderr, b"e")).unwrap();
        assert_eq!((err.stream, err.text.as_str()), (OutputStream::Stderr, "e"));
        let out = d.decode(chunk(OutputStream::Stdout, &euro[2..])).unwrap();
        assert_eq!((out.stream, out.text.as_str()), (OutputStream::Stdout, "€"));
    }

    #[test]
    fn a_cut_stream_drops_its_part_of_a_character() {
        let bytes = "a€".as_bytes();
        assert_eq!(utf8(bytes[..3].to_vec(), true), "a");
        assert_eq!(utf8(bytes[..3].to_vec(), false), "a\u{fffd}");
        assert_eq!(utf8_lossy(&bytes[..3], true), "a");
        assert_eq!(utf8_lossy(&bytes[..3], false), "a\u{fffd}");
        assert_eq!(utf8_lossy(b"a\xff", true), "a\u{fffd}");
    }
}

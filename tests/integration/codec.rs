//! The worker's own msgpack codec and rmp-serde agree, in both directions;
//! and what the server sends in marshal (a clean run's `exec` frame) reaches
//! the worker as the same values.

use std::collections::BTreeMap;

use code_executor::testing::Worker;
use code_executor::testing::{encode_frame, encode_marshal_frame};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::common;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Sample {
    empty_text: String,
    empty_bin: ByteBuf,
    empty_list: Vec<i64>,
    empty_map: BTreeMap<String, i64>,
    text: String,
    small: Vec<i64>,
    extremes: Vec<i64>,
    edges: Vec<i64>,
    unsigned_max: u64,
    floats: Vec<f64>,
    flags: Vec<bool>,
    nothing: Option<i64>,
    nested: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    bin: ByteBuf,
    // Long values last: the worker's repr is cut at 4 KiB.
    long_text: String,
    long_list: Vec<u32>,
}

#[derive(Serialize)]
struct Echo<'a, T> {
    t: &'a str,
    value: &'a T,
}

#[derive(Deserialize)]
struct EchoReply<T> {
    t: String,
    value: T,
    repr: String,
}

async fn pure_codec_worker() -> (Worker, tempfile::TempDir) {
    common::bare_worker(&[("CODE_EXECUTOR_PURE_CODEC", "1")]).await
}

/// How a frame is encoded: msgpack, or marshal (a clean run's `exec`).
#[derive(Clone, Copy)]
enum Encoding {
    Msgpack,
    Marshal,
}

async fn echo<T: Serialize + for<'de> Deserialize<'de>>(
    worker: &mut Worker,
    value: &T,
) -> (T, String) {
    echo_as(worker, value, Encoding::Msgpack).await
}

async fn echo_as<T: Serialize + for<'de> Deserialize<'de>>(
    worker: &mut Worker,
    value: &T,
    encoding: Encoding,
) -> (T, String) {
    let echo = Echo { t: "echo", value };
    let frame = match encoding {
        Encoding::Msgpack => encode_frame(&echo).unwrap(),
        Encoding::Marshal => encode_marshal_frame(&echo).unwrap(),
    };
    let body = worker.echo_raw(&frame).await.unwrap();
    let reply: EchoReply<T> = rmp_serde::from_slice(&body).expect("worker's encoding decodes");
    assert_eq!(reply.t, "echo");
    (reply.value, reply.repr)
}

#[tokio::test]
async fn values_round_trip_through_the_worker_codec() {
    let (mut worker, _dir) = pure_codec_worker().await;
    round_trip(&mut worker, Encoding::Msgpack).await;
}

#[tokio::test]
async fn values_sent_in_marshal_reach_the_worker_as_they_were() {
    let (mut worker, _dir) = pure_codec_worker().await;
    round_trip(&mut worker, Encoding::Marshal).await;
}

/// Every kind of value a frame holds, sent to the worker `encoding` and
/// echoed back in its msgpack: the same values, and Python saw them as
/// expected.
async fn round_trip(worker: &mut Worker, encoding: Encoding) {
    let mut nested = BTreeMap::new();
    nested.insert(
        "outer ключ".to_string(),
        BTreeMap::from([("inner".to_string(), vec!["a".to_string(), String::new()])]),
    );
    let sample = Sample {
        empty_text: String::new(),
        empty_bin: ByteBuf::new(),
        empty_list: vec![],
        empty_map: BTreeMap::new(),
        text: "héllo wörld ✓ 日本".into(),
        long_text: "é".repeat(40_000),
        small: vec![
            0, 1, 127, 128, 255, 256, 65535, 65536, -1, -32, -33, -128, -129, -32768, -32769,
        ],
        extremes: vec![i64::MIN, i64::MAX, i32::MIN as i64, u32::MAX as i64],
        edges: vec![
            i32::MAX as i64,
            i32::MAX as i64 + 1,
            i32::MIN as i64 - 1,
            1 << 45,
            -(1 << 45),
            0,
        ],
        unsigned_max: u64::MAX,
        floats: vec![0.0, -1.5, 1e300, f64::MIN_POSITIVE],
        flags: vec![true, false],
        nothing: None,
        nested,
        bin: ByteBuf::from((0..=255u8).collect::<Vec<_>>()),
        long_list: (0..70_000).collect(),
    };
    let (back, repr) = echo_as(worker, &sample, encoding).await;
    assert_eq!(back, sample);
    // What Python decoded, seen through its repr.
    for part in [
        "'text': 'héllo wörld ✓ 日本'",
        "'empty_bin': b''",
        "'extremes': [-9223372036854775808, 9223372036854775807, -2147483648, 4294967295]",
        "'edges': [2147483647, 2147483648, -2147483649, 35184372088832, -35184372088832, 0]",
        "'unsigned_max': 18446744073709551615",
        "'nothing': None",
        "'flags': [True, False]",
        "'outer ключ': {'inner': ['a', '']}",
        "'floats': [0.0, -1.5, 1e+300, 2.2250738585072014e-308]",
    ] {
        assert!(
            repr.contains(part),
            "python saw {repr:.400}, expected {part}"
        );
    }
}

/// Also the frame-size limit's lower side: 10 MiB is over the 8 MiB that
/// `LengthDelimitedCodec` allows unless told otherwise (the upper side is
/// `crashes::a_frame_over_the_size_limit_is_refused_by_its_length_at_once`).
#[tokio::test]
async fn ten_megabytes_of_binary_round_trip_intact() {
    let (mut worker, _dir) = pure_codec_worker().await;
    let data: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let (back, repr) = echo(&mut worker, &ByteBuf::from(data.clone())).await;
    assert_eq!(back.len(), data.len());
    assert!(back == data, "binary payload changed in transit");
    assert!(repr.starts_with("b'\\x00\\x07"), "{:.40}", repr);
}

/// Decodes reports with the worker's `report_unpackb`, run by `python`
/// (with `env`): a legitimate one, and forged ones past its item budget
/// in each shape a budget could miss. Prints which codec decoded and what
/// each payload came to.
const REPORT_BUDGET: &str = r#"
import json, sys
import worker as w

def outcome(data):
    try:
        value = w.report_unpackb(data)
    except ValueError as e:
        return str(e)
    return value

def header(byte, n, width):
    return bytes([byte]) + n.to_bytes(width, "big")

report = {"status": 1, "result": "'x'", "cpu_ms": 1.5, "peak_rss_kb": 9000,
          "error": {"type": "E", "message": "m", "traceback": "t", "line": 3, "errno": None},
          "imported": ["json.decoder"] * 64,
          "artifacts": [{"path": "a", "mime": "text/plain", "size": 1, "data": b"x"}] * 1000}
forged = {
    # One array longer than the budget.
    "wide": header(0xDD, 70000, 4) + b"\x80" * 70000,
    # 90,000 one-item arrays, 300 to an array.
    "nested": header(0xDC, 300, 2) + (header(0xDC, 300, 2) + b"\x91\x00" * 300) * 300,
    # 64 maps of 4,096 pairs, every pair the same key: each dict is short.
    "repeated keys": header(0xDC, 64, 2) + (header(0xDE, 4096, 2) + b"\xa1k\x00" * 4096) * 64,
}
print(json.dumps({
    "codec": w.report_unpackb.__name__,
    "msgpack": "msgpack" in sys.modules,
    "report": outcome(w.pure_packb(report)) == report,
    **{name: outcome(data) for name, data in forged.items()},
}))
"#;

async fn report_budget(python: &std::path::Path, env: &[(&str, &str)]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("worker.py"),
        code_executor::executor::WORKER_SCRIPT,
    )
    .unwrap();
    let out = tokio::process::Command::new(python)
        .args(["-c", REPORT_BUDGET])
        .env("PYTHONPATH", dir.path())
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_forged_reports_refused(found: &serde_json::Value) {
    assert_eq!(found["report"], true, "a real report decodes: {found}");
    for name in ["wide", "nested", "repeated keys"] {
        let said = found[name].as_str().unwrap_or_default();
        assert!(
            said == "msgpack data holds too many items" || said.contains("exceeds max_"),
            "{name}: {found}"
        );
    }
}

#[tokio::test]
async fn the_worker_codec_refuses_reports_past_its_item_budget() {
    let found = report_budget(&common::python(), &[("CODE_EXECUTOR_PURE_CODEC", "1")]).await;
    assert_eq!(found["codec"], "pure_report_unpackb", "{found}");
    assert_forged_reports_refused(&found);
}

#[tokio::test]
async fn the_msgpack_package_refuses_reports_past_the_item_budget() {
    let python = common::pyenvs::codec_python().await;
    let found = report_budget(&python, &[]).await;
    assert_eq!(found["codec"], "report_unpackb", "{found}");
    assert_eq!(found["msgpack"], true, "{found}");
    assert_forged_reports_refused(&found);
}

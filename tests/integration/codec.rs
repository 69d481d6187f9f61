//! The worker's own msgpack codec and rmp-serde agree, in both directions.

use std::collections::BTreeMap;

use code_executor::testing::Worker;
use code_executor::testing::encode_frame;
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

async fn echo<T: Serialize + for<'de> Deserialize<'de>>(
    worker: &mut Worker,
    value: &T,
) -> (T, String) {
    let frame = encode_frame(&Echo { t: "echo", value }).unwrap();
    let body = worker.echo_raw(&frame).await.unwrap();
    let reply: EchoReply<T> = rmp_serde::from_slice(&body).expect("worker's encoding decodes");
    assert_eq!(reply.t, "echo");
    (reply.value, reply.repr)
}

#[tokio::test]
async fn values_round_trip_through_the_worker_codec() {
    let (mut worker, _dir) = pure_codec_worker().await;
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
        unsigned_max: u64::MAX,
        floats: vec![0.0, -1.5, 1e300, f64::MIN_POSITIVE],
        flags: vec![true, false],
        nothing: None,
        nested,
        bin: ByteBuf::from((0..=255u8).collect::<Vec<_>>()),
        long_list: (0..70_000).collect(),
    };
    let (back, repr) = echo(&mut worker, &sample).await;
    assert_eq!(back, sample);
    // What Python decoded, seen through its repr.
    for part in [
        "'text': 'héllo wörld ✓ 日本'",
        "'empty_bin': b''",
        "'extremes': [-9223372036854775808, 9223372036854775807, -2147483648, 4294967295]",
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

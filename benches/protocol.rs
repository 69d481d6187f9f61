//! Frame encode/decode across payload sizes (100 B … 10 MB).

use std::hint::black_box;

use bytes::BytesMut;
use code_executor::testing::{
    ExecFrame, FileEntry, WireLimits, WireSelection, decode_frame, encode_frame,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde::Serialize;

#[derive(Serialize)]
struct ResultFrame<'a> {
    t: &'a str,
    id: u64,
    #[serde(with = "serde_bytes")]
    stdout: &'a [u8],
    #[serde(with = "serde_bytes")]
    stderr: &'a [u8],
    exit_code: i32,
    signal: Option<&'a str>,
    timed_out: bool,
    stdout_truncated: bool,
    stderr_truncated: bool,
    duration_ms: f64,
}

const SIZES: [(&str, usize); 5] = [
    ("100B", 100),
    ("10KB", 10_000),
    ("100KB", 100_000),
    ("1MB", 1_000_000),
    ("10MB", 10_000_000),
];

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode_exec");
    let limits = WireLimits::default();
    for (name, size) in SIZES {
        let payload = vec![b'x'; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(name, |b| {
            b.iter(|| {
                let frame = ExecFrame {
                    t: "exec",
                    id: 1,
                    code: "print(2+2)",
                    stdin: None,
                    files: vec![FileEntry("data.bin", &payload)],
                    argv: &[],
                    timeout: 30.0,
                    max_output: 1 << 20,
                    limits: &limits,
                    stream: false,
                    artifacts: WireSelection::All(true),
                    max_artifact_bytes: 10 << 20,
                    max_artifacts_bytes: 32 << 20,
                    max_result_chars: 10_000,
                    rusage: false,
                    int_max_str_digits: None,
                    max_image_pixels: None,
                    call: None,
                    compile: &[],
                };
                black_box(encode_frame(black_box(&frame)).unwrap())
            })
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_result");
    for (name, size) in SIZES {
        let stdout = vec![b'x'; size];
        let frame = encode_frame(&ResultFrame {
            t: "result",
            id: 1,
            stdout: &stdout,
            stderr: b"",
            exit_code: 0,
            signal: None,
            timed_out: false,
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 0.5,
        })
        .unwrap();
        let body = BytesMut::from(&frame[4..]);
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(name, |b| {
            b.iter(|| black_box(decode_frame(black_box(&body)).unwrap()))
        });
    }
    group.finish();
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);

//! Interop with the deployed Python producers and ASR service, both directions.
//!
//! - `golden/*.bin` are packets written byte for byte by the deployed producer code
//!   (`golden/generate.py`: `json.dumps(meta, ensure_ascii=False)` +
//!   `struct.pack(">I", ...)`); every one must decode to what `golden/vectors.json`
//!   says, or be refused with the listed error kind.
//! - `golden_files_are_what_python_writes` re-runs the generator in `--check` mode, so
//!   the committed bytes are provably Python's, not hand-made.
//! - `python_reads_what_the_encoder_writes` encodes packets with this crate and reads
//!   them back with the deployed reading code (`golden/read_packets.py`: `struct` +
//!   `json`).
//!
//! Python: `support::python` (only the standard library is needed here). No Python at
//! all fails the test with a message.

use crate::support;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::Value;
use weir_protocol::WireName;
use weir_protocol::audio::{DecodeOptions, Gap, GapReason, Packet, PacketBody, decode};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn run_python(args: &[&std::ffi::OsStr]) -> String {
    support::run_python(args, None)
}

/// A scratch directory removed on drop (the crate has no tempfile dependency).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("weir-golden-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create temp dir");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn python_written_packets_decode() {
    let manifest = std::fs::read_to_string(golden_dir().join("vectors.json"))
        .expect("golden/vectors.json (regenerate with golden/generate.py)");
    let vectors: Vec<Value> = serde_json::from_str(&manifest).expect("manifest JSON");
    assert!(vectors.len() >= 15, "expected the full golden set");
    let opts = DecodeOptions::default();
    for v in &vectors {
        let name = v["name"].as_str().expect("name");
        let file = v["file"].as_str().expect("file");
        let data = Bytes::from(std::fs::read(golden_dir().join(file)).expect("golden file"));
        let expect = &v["expect"];
        let result = decode(&data, &opts);
        if let Some(kind) = expect["error"].as_str() {
            let err = result.expect_err(name);
            assert_eq!(err.kind().as_str(), kind, "{name}: {err}");
            continue;
        }
        let packet = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(packet.type_name(), expect["type"], "{name}");
        assert_eq!(Some(packet.seq), expect["seq"].as_u64(), "{name}");
        assert_eq!(
            packet.session_id.as_deref(),
            expect["session_id"].as_str(),
            "{name}"
        );
        assert_eq!(Some(packet.samples()), expect["samples"].as_u64(), "{name}");
        assert_eq!(hex(packet.pcm()), expect["pcm_hex"], "{name}");
        assert_eq!(packet.format.sample_rate, 16_000, "{name}");
        assert_eq!(
            packet.captured_at_ms,
            expect["captured_at_ms"].as_u64(),
            "{name}"
        );
    }
}

#[test]
fn golden_files_are_what_python_writes() {
    let script = golden_dir().join("generate.py");
    let out = run_python(&[script.as_os_str(), "--check".as_ref()]);
    assert!(out.contains("golden files match"), "{out}");
}

#[test]
fn python_reads_what_the_encoder_writes() {
    let dir = TempDir::new();
    let pcm: Vec<u8> = (0..640u32).map(|i| (i % 251) as u8).collect();
    let packets = [
        Packet::frame(1, Bytes::from(pcm.clone())),
        Packet::frame(2, Bytes::from(pcm.clone())).with_session(Some("s-é1 \"q\"".into())),
        Packet::frame(3, Bytes::new()),
        // The capture-time extension: the deployed reader must read these frames as
        // before (the unknown key is ignored).
        Packet::frame(4, Bytes::from(pcm.clone())).with_captured_at_ms(Some(1_764_500_000_123)),
        Packet::frame(5, Bytes::from(pcm.clone()))
            .with_session(Some("s-é1".into()))
            .with_captured_at_ms(Some(0)),
        Packet::gap(Gap {
            first_seq: 6,
            last_seq: 10,
            samples: 1_600,
            reason: GapReason::QueueFull,
        }),
        Packet::end(11),
    ];
    let mut paths = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        let path = dir.path().join(format!("{i}.bin"));
        std::fs::write(&path, p.encode().expect("encodable")).expect("write");
        paths.push(path);
    }
    let reader = golden_dir().join("read_packets.py");
    let mut args = vec![reader.as_os_str()];
    args.extend(paths.iter().map(|p| p.as_os_str()));
    let out = run_python(&args);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("reader JSON"))
        .collect();
    assert_eq!(lines.len(), packets.len());
    for (p, seen) in packets.iter().zip(&lines) {
        let meta = &seen["meta"];
        assert_eq!(meta["type"], p.type_name());
        assert_eq!(meta["seq"].as_u64(), Some(p.seq));
        assert_eq!(meta["sample_rate"], 16_000);
        assert_eq!(meta["sample_width"], 2);
        assert_eq!(meta["channels"], 1);
        assert_eq!(meta["session_id"].as_str(), p.session_id.as_deref());
        assert_eq!(meta["captured_at_ms"].as_u64(), p.captured_at_ms);
        assert_eq!(seen["pcm_hex"], hex(p.pcm()));
        match &p.body {
            PacketBody::Frame { pcm } => {
                assert_eq!(seen["samples"].as_u64(), Some(pcm.len() as u64 / 2))
            }
            PacketBody::End => assert_eq!(seen["samples"], 0),
            PacketBody::Gap(g) => {
                assert_eq!(meta["first_seq"].as_u64(), Some(g.first_seq));
                assert_eq!(meta["frames"].as_u64(), Some(g.frames()));
                assert_eq!(meta["samples"].as_u64(), Some(g.samples));
                assert_eq!(meta["reason"], "queue_full");
            }
        }
    }
}

/// The golden frames that carry `captured_at_ms`, written by Python, read by the
/// deployed reading code: same type, seq, samples and PCM as without the key — the
/// deployed ASR service keeps working when weir's producer adds it. (Our decoder's side
/// is `python_written_packets_decode`.)
#[test]
fn deployed_reader_ignores_captured_at_ms() {
    let names = [
        ("frame_captured_at_ms", 10, Some(1_764_500_000_123u64)),
        ("frame_captured_at_ms_no_session", 11, Some(0)),
        ("frame_captured_at_ms_string", 12, None),
        ("frame_captured_at_ms_float", 13, None),
    ];
    let reader = golden_dir().join("read_packets.py");
    let files: Vec<PathBuf> = names
        .iter()
        .map(|(n, _, _)| golden_dir().join(format!("{n}.bin")))
        .collect();
    let mut args = vec![reader.as_os_str()];
    args.extend(files.iter().map(|p| p.as_os_str()));
    let out = run_python(&args);
    let plain = Bytes::from(std::fs::read(golden_dir().join("frame_plain.bin")).expect("golden"));
    let plain = decode(&plain, &DecodeOptions::default()).expect("decodes");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("reader JSON"))
        .collect();
    assert_eq!(lines.len(), names.len());
    for ((name, seq, ours), seen) in names.iter().zip(&lines) {
        let meta = &seen["meta"];
        assert_eq!(meta["type"], "frame", "{name}");
        assert_eq!(meta["seq"].as_u64(), Some(*seq), "{name}");
        assert_eq!(seen["samples"], 320, "{name}");
        assert_eq!(seen["pcm_hex"], hex(plain.pcm()), "{name}");
        let data =
            Bytes::from(std::fs::read(golden_dir().join(format!("{name}.bin"))).expect("golden"));
        let packet = decode(&data, &DecodeOptions::default()).expect("decodes");
        assert_eq!(packet.captured_at_ms, *ours, "{name}");
        assert_eq!(packet.pcm(), plain.pcm(), "{name}");
    }
}

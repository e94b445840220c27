//! Runs the `weir` package's pytest files (python/tests/test_*.py) as tests of the
//! workspace suite, one test per file, so nextest schedules them beside the Rust tests
//! (and its test groups keep the timing-sensitive ones apart).
//!
//! Each test first makes sure the installed wheel is current (`scripts/build-python-wheel`:
//! a hash check when `scripts/test` already built it, a maturin build reusing the
//! workspace's artifacts otherwise; flock'd, so parallel tests build it once), then runs
//! pytest on its file with the project's Python (`WEIR_PYTHON`) and `NATS_SERVER_BIN`.
//! Invariant: every `tests/test_*.py` is listed here ([`every_pytest_file_is_listed`]),
//! so no Python test is silently left out of the suite.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds and installs the wheel when its inputs changed; once per test process.
fn wheel() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = Command::new("bash")
            .arg(root().join("scripts/build-python-wheel"))
            .output()
            .expect("run scripts/build-python-wheel");
        assert!(
            out.status.success(),
            "scripts/build-python-wheel failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Runs pytest on one file of python/tests and fails with its output when it fails.
fn pytest(file: &str) {
    wheel();
    let python = weir_testkit::python::python();
    let mut cmd = Command::new(python);
    cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        // -P: the working directory (python/) is not put on sys.path, so `import weir`
        // is the installed package, not the source folder without its native module.
        .args([
            "-P",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=short",
        ])
        .arg(format!("tests/{file}"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    if let Ok(bin) = weir_testkit::binary::nats_server_bin() {
        cmd.env("NATS_SERVER_BIN", bin);
    }
    let out = cmd.output().expect("run pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "pytest tests/{file} failed:\n{text}");
}

macro_rules! pytest_files {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                pytest($file);
            }
        )*
        const LISTED: &[&str] = &[$($file),*];
    };
}

pytest_files! {
    package => "test_package.py",
    types => "test_types.py",
    consumer_order => "test_consumer_order.py",
    consumer_leases => "test_consumer_leases.py",
    consumer_gil => "test_consumer_gil.py",
    consumer_bad_input => "test_consumer_bad_input.py",
    consumer_events => "test_consumer_events.py",
    consumer_progress => "test_consumer_progress.py",
    consumer_handover => "test_consumer_handover.py",
    consumer_lifecycle => "test_consumer_lifecycle.py",
    producer_stall => "test_producer_stall.py",
    producer_bad_input => "test_producer_bad_input.py",
    producer_cancel => "test_producer_cancel.py",
    producer_gil => "test_producer_gil.py",
    producer_config => "test_producer_config.py",
    producer_events => "test_producer_events.py",
    llm_session_cap => "test_llm_session_cap.py",
    examples => "test_examples.py",
}

#[test]
fn every_pytest_file_is_listed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("python/tests") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.starts_with("test_") && name.ends_with(".py") && !LISTED.contains(&name.as_str()) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "pytest files not run by python/tests/pytest.rs: {missing:?}"
    );
}

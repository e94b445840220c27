//! Support shared by this crate's integration tests.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Python for interop scripts: `WEIR_PYTHON`, else what `scripts/ensure-python-env`
/// prints, else `python3` on PATH. Found here rather than through weir-testkit, which
/// depends on this crate.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("WEIR_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-python-env");
    if let Ok(out) = Command::new(&script).output()
        && out.status.success()
    {
        let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !path.is_empty() {
            return PathBuf::from(path);
        }
    }
    if Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return PathBuf::from("python3");
    }
    panic!(
        "no Python found for the interop check: set WEIR_PYTHON, or make \
         scripts/ensure-python-env work (needs python3 with venv: apt-get install python3-venv)"
    );
}

/// Runs Python with `args` (and `stdin`, if given); panics with its output unless it
/// succeeds. Returns its stdout.
pub fn run_python(args: &[&OsStr], stdin: Option<&[u8]>) -> String {
    let py = python();
    let mut child = Command::new(&py)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", py.display()));
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default())
        .expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "{} {:?} failed: {}{}",
        py.display(),
        args,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("python prints UTF-8")
}

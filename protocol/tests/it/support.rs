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

/// The Python with the `weir` package (python/) installed, for scripts importing
/// `weir.llm`: runs `scripts/build-python-wheel` (idempotent: a stamp of its inputs and
/// an flock; a no-op when the wheel is current, as after `scripts/test` built it) and
/// returns the interpreter it installed into, `target/py/bin/python`. Once per process.
/// (weir-testkit has the same, `weir_testkit::python::weir_python`.)
pub fn weir_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let out = Command::new("bash")
                .arg(root.join("scripts/build-python-wheel"))
                .current_dir(&root)
                .output()
                .unwrap_or_else(|e| panic!("cannot run scripts/build-python-wheel: {e}"));
            assert!(
                out.status.success(),
                "scripts/build-python-wheel failed (the weir package is needed):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            root.join("target/py/bin/python")
        })
        .clone()
}

/// Runs Python with `args` (and `stdin`, if given); panics with its output unless it
/// succeeds. Returns its stdout.
pub fn run_python(args: &[&OsStr], stdin: Option<&[u8]>) -> String {
    run_python_with(&python(), args, stdin)
}

/// [`run_python`] in the Python of [`weir_python`] (the `weir` package installed).
pub fn run_weir_python(args: &[&OsStr], stdin: Option<&[u8]>) -> String {
    run_python_with(&weir_python(), args, stdin)
}

fn run_python_with(py: &Path, args: &[&OsStr], stdin: Option<&[u8]>) -> String {
    let mut child = Command::new(py)
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

//! The Python interpreter for interop tests (the deployed services are Python).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Python to run interop scripts with: `WEIR_PYTHON` (what `scripts/test` exports,
/// the virtual environment with nats-py), else the path `scripts/ensure-python-env`
/// prints (it creates that environment), else `python3` on PATH. Panics with how to
/// fix it when there is none.
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
    let probe = Command::new("python3").arg("--version").output();
    if probe.is_ok_and(|o| o.status.success()) {
        return PathBuf::from("python3");
    }
    panic!(
        "no Python found for the interop check: set WEIR_PYTHON, or make \
         scripts/ensure-python-env work (needs python3 with venv: apt-get install python3-venv)"
    );
}

/// The Python with the `weir` package (python/) installed, for tests that run scripts
/// importing it (the `weir.llm` client checks): runs `scripts/build-python-wheel`
/// (idempotent: a stamp of its inputs and an flock, so it is a no-op when the wheel is
/// current, as after `scripts/test` built it, and parallel tests build it once) and
/// returns the interpreter it installed into, `target/py/bin/python`. Once per process.
/// Panics with the script's output when the build fails.
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

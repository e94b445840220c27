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

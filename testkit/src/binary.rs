//! Finding the `nats-server` binary and asking it for its version.
//!
//! Lookup order (the first hit wins, later places are not consulted):
//! 1. `NATS_SERVER_BIN` — when set and non-empty it must name an executable file; a
//!    wrong value is an error, never silently replaced by another binary;
//! 2. `nats-server` on `PATH`;
//! 3. `/usr/sbin/nats-server` (Debian's package; a non-root `PATH` often lacks `/usr/sbin`);
//! 4. `target/py/bin/nats-server` in this workspace (where `scripts/ensure-nats-server`
//!    puts the PyPI build when it cannot use apt).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, ErrorKind};

/// The environment variable that names the binary explicitly.
pub const NATS_SERVER_BIN_ENV: &str = "NATS_SERVER_BIN";

/// Debian's install location.
const DEBIAN_PATH: &str = "/usr/sbin/nats-server";

/// Where `scripts/ensure-nats-server` installs the PyPI build (relative to the workspace).
const VENV_RELATIVE: &str = "target/py/bin/nats-server";

/// The hint every "not found" message ends with.
const INSTALL_HINT: &str = "run `scripts/ensure-nats-server` (installs Debian's nats-server \
     with apt, or a pinned PyPI build into target/py), or set NATS_SERVER_BIN to the binary";

/// The `nats-server` binary to run, found as described in the [module docs](self).
///
/// The error (kind [`ErrorKind::BinaryNotFound`]) says where it looked and how to install
/// one.
pub fn nats_server_bin() -> Result<PathBuf, Error> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    find_binary(
        std::env::var_os(NATS_SERVER_BIN_ENV),
        std::env::var_os("PATH"),
        // The fixed places tried after `PATH`.
        &[PathBuf::from(DEBIAN_PATH), workspace.join(VENV_RELATIVE)],
    )
}

/// The lookup itself, with its inputs passed in so that it can be tested without
/// touching the process environment.
fn find_binary(
    explicit: Option<OsString>,
    path_var: Option<OsString>,
    fixed: &[PathBuf],
) -> Result<PathBuf, Error> {
    if let Some(explicit) = explicit.filter(|v| !v.is_empty()) {
        let path = PathBuf::from(&explicit);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(Error::new(
                ErrorKind::BinaryNotFound,
                format!(
                    "{NATS_SERVER_BIN_ENV}={} is not an executable file; {INSTALL_HINT}",
                    path.display()
                ),
            ))
        };
    }
    if let Some(found) = path_var.as_deref().and_then(search_path) {
        return Ok(found);
    }
    if let Some(found) = fixed.iter().find(|p| is_executable(p)) {
        return Ok(found.clone());
    }
    let places: Vec<String> = fixed.iter().map(|p| p.display().to_string()).collect();
    Err(Error::new(
        ErrorKind::BinaryNotFound,
        format!(
            "nats-server not found ({NATS_SERVER_BIN_ENV} unset, not on PATH, not at {}); {INSTALL_HINT}",
            places.join(", ")
        ),
    ))
}

/// The first executable `nats-server` in a `PATH`-style list.
fn search_path(path_var: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| is_executable(candidate))
}

/// A regular file (after following links) with an execute bit.
fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A nats-server release number, e.g. `2.9.10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NatsServerVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl NatsServerVersion {
    /// Whether this version is `major.minor` or newer.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Parses the output of `nats-server --version` (`nats-server: v2.9.10`) or a bare
    /// `2.9.10` / `v2.10.0-beta.1` (the pre-release suffix is ignored).
    pub fn parse(output: &str) -> Option<Self> {
        let text = output.trim();
        let text = text.strip_prefix("nats-server:").unwrap_or(text).trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let core = text.split(['-', '+', ' ', '\n']).next()?;
        let parts: Vec<u32> = core
            .split('.')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [major, minor, patch] = parts[..] else {
            return None;
        };
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for NatsServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of the binary [`nats_server_bin`] finds (runs `nats-server --version`).
pub fn nats_server_version() -> Result<NatsServerVersion, Error> {
    version_of(&nats_server_bin()?)
}

/// The version of a specific `nats-server` binary.
pub fn version_of(binary: &Path) -> Result<NatsServerVersion, Error> {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Spawn,
                format!("could not run `{} --version`", binary.display()),
                e,
            )
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    NatsServerVersion::parse(&stdout).ok_or_else(|| {
        Error::new(
            ErrorKind::Version,
            format!(
                "`{} --version` printed {:?} (exit status {}), not a version",
                binary.display(),
                stdout.trim(),
                output.status
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executable_in(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").expect("write fake binary");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod fake binary");
        path
    }

    #[test]
    fn explicit_variable_wins_and_must_be_valid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let explicit = executable_in(dir.path(), "my-nats");
        let on_path = tempfile::tempdir().expect("tempdir");
        executable_in(on_path.path(), "nats-server");

        let found = find_binary(
            Some(explicit.clone().into_os_string()),
            Some(on_path.path().as_os_str().to_owned()),
            &[],
        )
        .expect("explicit binary");
        assert_eq!(found, explicit);

        let err = find_binary(
            Some(dir.path().join("missing").into_os_string()),
            Some(on_path.path().as_os_str().to_owned()),
            &[],
        )
        .expect_err("a wrong NATS_SERVER_BIN is an error, not a fallback");
        assert_eq!(err.kind(), ErrorKind::BinaryNotFound);
        assert!(err.to_string().contains("NATS_SERVER_BIN"), "{err}");
        assert!(
            err.to_string().contains("scripts/ensure-nats-server"),
            "{err}"
        );
    }

    #[test]
    fn path_then_fixed_places() {
        let on_path = tempfile::tempdir().expect("tempdir");
        let fixed_dir = tempfile::tempdir().expect("tempdir");
        let fixed = executable_in(fixed_dir.path(), "nats-server");

        // Empty NATS_SERVER_BIN counts as unset; nothing on PATH → the fixed place.
        let found = find_binary(
            Some(OsString::new()),
            Some(on_path.path().as_os_str().to_owned()),
            std::slice::from_ref(&fixed),
        )
        .expect("fixed place");
        assert_eq!(found, fixed);

        let path_bin = executable_in(on_path.path(), "nats-server");
        let found = find_binary(
            None,
            Some(on_path.path().as_os_str().to_owned()),
            std::slice::from_ref(&fixed),
        )
        .expect("PATH");
        assert_eq!(found, path_bin);
    }

    #[test]
    fn non_executable_files_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = dir.path().join("nats-server");
        std::fs::write(&plain, "").expect("write");
        let err = find_binary(None, Some(dir.path().as_os_str().to_owned()), &[plain])
            .expect_err("no executable anywhere");
        assert_eq!(err.kind(), ErrorKind::BinaryNotFound);
        assert!(
            err.to_string().contains("scripts/ensure-nats-server"),
            "{err}"
        );
    }

    #[test]
    fn parses_versions() {
        let v = |major, minor, patch| NatsServerVersion {
            major,
            minor,
            patch,
        };
        assert_eq!(
            NatsServerVersion::parse("nats-server: v2.9.10\n"),
            Some(v(2, 9, 10))
        );
        assert_eq!(NatsServerVersion::parse("2.15.1"), Some(v(2, 15, 1)));
        assert_eq!(
            NatsServerVersion::parse("nats-server: v2.10.0-beta.1"),
            Some(v(2, 10, 0))
        );
        assert_eq!(NatsServerVersion::parse("nats-server: dev"), None);
        assert_eq!(NatsServerVersion::parse("1.2.3.4"), None);
        assert_eq!(NatsServerVersion::parse(""), None);
        assert!(v(2, 9, 10).at_least(2, 8));
        assert!(v(2, 10, 0).at_least(2, 10));
        assert!(!v(2, 9, 10).at_least(2, 10));
        assert!(v(2, 10, 0) > v(2, 9, 10));
        assert_eq!(v(2, 9, 10).to_string(), "2.9.10");
    }
}

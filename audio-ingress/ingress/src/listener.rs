//! The open-file limit the ingress's listeners need: `max_connections` +
//! `admin_max_connections` + [`FD_RESERVE`] must fit under `RLIMIT_NOFILE` (checked and,
//! if needed, raised at start). The accept loop itself is `weir_service::http::serve`.

use crate::error::{ConfigError, ConfigErrorKind};

/// File descriptors kept free beyond both listeners' caps: the NATS connection, the
/// listening sockets, stdio, log and configuration files, the runtime's own.
pub const FD_RESERVE: u64 = 64;

/// The process's open-file limit as checked at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// Soft limit after the check (raised if it was below what is needed).
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
    /// What the configuration needs: both caps plus [`FD_RESERVE`].
    pub needed: u64,
    /// The soft limit before, when it was raised.
    pub raised_from: Option<u64>,
}

/// Checks `RLIMIT_NOFILE` against `max_connections + admin_max_connections +`
/// [`FD_RESERVE`]: a soft limit below that is raised up to the hard limit; a hard
/// limit below it refuses the configuration (key `max_connections`).
pub fn check_fd_limit(
    max_connections: usize,
    admin_max_connections: usize,
) -> Result<FdLimit, ConfigError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let refuse = |kind, message| ConfigError::new("max_connections", kind, message);
    let needed = max_connections as u64 + admin_max_connections as u64 + FD_RESERVE;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| {
        refuse(
            ConfigErrorKind::Invalid,
            format!("cannot read RLIMIT_NOFILE: {e}"),
        )
    })?;
    if needed > hard {
        return Err(refuse(
            ConfigErrorKind::OutOfRange,
            format!(
                "max_connections {max_connections} + admin.max_connections \
                 {admin_max_connections} + {FD_RESERVE} reserved file descriptors = {needed} \
                 exceeds the open-file limit (RLIMIT_NOFILE soft {soft}, hard {hard}); lower \
                 max_connections or raise the limit (ulimit -n, systemd LimitNOFILE)"
            ),
        ));
    }
    let raised_from = if needed <= soft {
        None
    } else {
        setrlimit(Resource::RLIMIT_NOFILE, needed, hard).map_err(|e| {
            refuse(
                ConfigErrorKind::OutOfRange,
                format!(
                    "{needed} file descriptors needed, RLIMIT_NOFILE soft limit {soft} could \
                     not be raised: {e}"
                ),
            )
        })?;
        Some(soft)
    };
    Ok(FdLimit {
        soft: soft.max(needed),
        hard,
        needed,
        raised_from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_limit_above_the_hard_limit_is_a_config_error() {
        let e = check_fd_limit(usize::MAX / 4, 1).expect_err("cannot fit");
        assert_eq!(e.key(), "max_connections");
        assert!(e.message().contains("RLIMIT_NOFILE"), "{e}");
    }

    #[test]
    fn fd_limit_within_the_soft_limit_is_left_alone() {
        let l = check_fd_limit(1, 1).expect("fits");
        assert_eq!(l.needed, 2 + FD_RESERVE);
        assert!(l.soft >= l.needed);
    }
}

# Shared helpers for weir's scripts. Source it; it defines functions and variables only.
#
#   WEIR_ROOT   absolute path of the repository
#   WEIR_VENV   the Python virtual environment the scripts share (target/py, git-ignored)
#
# Conventions: messages go to stderr (prefixed with the script's name), so that a script
# can print a single machine-readable result on stdout.

WEIR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WEIR_VENV="$WEIR_ROOT/target/py"
WEIR_SCRIPT="scripts/$(basename "$0")"

say() { printf '%s: %s\n' "$WEIR_SCRIPT" "$*" >&2; }
die() { printf '%s: error: %s\n' "$WEIR_SCRIPT" "$*" >&2; exit 1; }

is_root() { [[ "$(id -u)" == 0 ]]; }

# Runs "$@" while holding an exclusive lock on target/.<name>.lock (when flock exists), so
# that scripts started in parallel (e.g. by several tests) do not build the same thing
# twice at the same time.
with_lock() {
    local name="$1"
    shift
    mkdir -p "$WEIR_ROOT/target"
    if command -v flock >/dev/null 2>&1; then
        (
            flock 9
            "$@"
        ) 9>"$WEIR_ROOT/target/.$name.lock"
    else
        "$@"
    fi
}

# Prints the nats-server the tests will use, in the order weir-testkit looks:
# NATS_SERVER_BIN, PATH, /usr/sbin/nats-server, target/py/bin/nats-server.
# Returns 1 when there is none; returns 2 when NATS_SERVER_BIN is set but wrong.
find_nats_server() {
    if [[ -n "${NATS_SERVER_BIN:-}" ]]; then
        if [[ -f "$NATS_SERVER_BIN" && -x "$NATS_SERVER_BIN" ]]; then
            printf '%s\n' "$NATS_SERVER_BIN"
            return 0
        fi
        return 2
    fi
    local found
    if found="$(command -v nats-server 2>/dev/null)" && [[ -n "$found" ]]; then
        printf '%s\n' "$found"
        return 0
    fi
    local candidate
    for candidate in /usr/sbin/nats-server "$WEIR_VENV/bin/nats-server"; do
        if [[ -f "$candidate" && -x "$candidate" ]]; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 1
}

# "2.9.10" for a nats-server binary, or nothing when it does not answer.
nats_server_version_of() {
    "$1" --version 2>/dev/null | sed -n 's/^nats-server: v\{0,1\}\([0-9][0-9.]*\).*/\1/p' | head -n 1
}

# Runs an apt-get command ("$@", e.g. `sudo -n apt-get update`) waiting for the package
# system's locks: scripts/test runs the set-up scripts side by side, so on a fresh
# machine two of them may call apt-get at once. dpkg's lock is waited for
# (DPkg::Lock::Timeout, given here); the package lists' lock of `apt-get update` is
# not, so a failed command is retried (6 tries, 10 s apart).
apt_locked() {
    local try
    for try in 1 2 3 4 5 6; do
        "$@" && return 0
        ((try < 6)) && sleep 10
    done
    return 1
}

# The apt-get options of apt_locked's commands.
APT_WAIT=(-o DPkg::Lock::Timeout=300)

# Creates the shared virtual environment target/py if it is missing or broken.
ensure_venv() {
    if [[ -x "$WEIR_VENV/bin/python" ]] && "$WEIR_VENV/bin/python" -c 'import sys' 2>/dev/null; then
        return 0
    fi
    command -v python3 >/dev/null 2>&1 ||
        die "python3 is not installed; install it (Debian: apt-get install python3 python3-venv)"
    say "creating a Python virtual environment in ${WEIR_VENV#"$WEIR_ROOT"/}"
    rm -rf "$WEIR_VENV"
    if ! python3 -m venv "$WEIR_VENV" >&2; then
        rm -rf "$WEIR_VENV"
        if is_root && command -v apt-get >/dev/null 2>&1; then
            say "python3 -m venv failed; installing Debian's python3-venv"
            { apt_locked apt-get "${APT_WAIT[@]}" update >&2 &&
                apt_locked env DEBIAN_FRONTEND=noninteractive apt-get "${APT_WAIT[@]}" install -y python3-venv >&2; } ||
                die "apt-get install python3-venv failed"
            python3 -m venv "$WEIR_VENV" >&2 || die "python3 -m venv $WEIR_VENV failed"
        else
            die "python3 -m venv failed; install the venv module (Debian: sudo apt-get install python3-venv)"
        fi
    fi
}

# pip install into the shared virtual environment, quietly unless it fails.
venv_pip_install() {
    local log
    log="$(mktemp)"
    if ! "$WEIR_VENV/bin/python" -m pip install --disable-pip-version-check --no-input "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "pip install $* failed (is PyPI reachable?)"
    fi
    rm -f "$log"
}

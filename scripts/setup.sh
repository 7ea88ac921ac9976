#!/usr/bin/env bash
# Installs what building and testing e8kv needs on Debian/Ubuntu, and nothing that is already there:
#   1. system packages, found missing with dpkg-query and installed with apt-get (through sudo when not
#      root); a machine that has them all never calls apt-get;
#   2. the Python packages of the reference checks (requirements-dev.txt) for the python3 on PATH, which
#      scripts/test.sh hands to CMake so that ctest runs the same interpreter.
# scripts/demo.sh and scripts/test.sh run it first. Safe to run again.
# Usage: scripts/setup.sh [--sanitize] [--no-python-tests]
#   --sanitize          also clang and its sanitizer runtime (scripts/test.sh --sanitize)
#   --no-python-tests   system packages only (the demo needs no Python package)
# Environment: E8KV_SKIP_SETUP=1 does nothing (a machine set up by hand).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=0
python_tests=1
for arg in "$@"; do
    case "$arg" in
        --sanitize) sanitize=1 ;;
        --no-python-tests) python_tests=0 ;;
        -h | --help)
            sed -n '2,11s/^# \{0,1\}//p' "$0"
            exit 0
            ;;
        *)
            echo "setup.sh: unknown option '$arg' (see --help)" >&2
            exit 2
            ;;
    esac
done
[ "${E8KV_SKIP_SETUP:-0}" = 1 ] && exit 0

say() { echo "setup: $*" >&2; }

# ---------------------------------------------------------------- system packages
packages=(build-essential cmake pkg-config git libopenblas-dev libcmocka-dev libzstd-dev libxxhash-dev
    python3 python3-pip)
[ $sanitize = 1 ] && packages+=(clang)

missing_packages() {
    local p
    for p in "$@"; do
        [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || echo "$p"
    done
}

# root commands run as root or through sudo; without either, say what to install and stop
sudo_=""
need_root() {
    [ "$(id -u)" = 0 ] && return 0
    if command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
        sudo_="sudo"
        return 0
    fi
    say "missing system packages: $*"
    say "installing them needs root: this user is not root, and sudo is missing or asks a password with no terminal."
    say "run this as root (or ask an administrator): apt-get install $*"
    say "then run the command again (E8KV_SKIP_SETUP=1 skips this step)."
    exit 1
}

# run a root command quietly; on failure show its output and stop
apt_log=""
root_quiet() {
    apt_log=${apt_log:-$(mktemp)}
    if $sudo_ env DEBIAN_FRONTEND=noninteractive "$@" >"$apt_log" 2>&1; then
        return 0
    fi
    tail -n 25 "$apt_log" >&2
    say "failed: ${sudo_:+sudo }$*"
    exit 1
}

# the package lists of a new machine or container are often empty or stale: refreshed once, before use
apt_updated=0
apt_update() {
    [ $apt_updated = 1 ] || root_quiet apt-get update -q
    apt_updated=1
}

apt_install() {
    need_root "$@"
    say "installing with ${sudo_:+sudo }apt-get: $*"
    apt_update
    root_quiet apt-get install -y -q --no-install-recommends "$@"
}

# can clang link a program with AddressSanitizer and UBSan? (the runtime is libclang-rt-N-dev on Debian 12,
# inside libclang-common-N-dev, which clang depends on, on older releases)
clang_links_sanitizers() {
    local dir
    dir=$(mktemp -d)
    echo 'int main(void) { return 0; }' >"$dir/t.c"
    clang -fsanitize=address,undefined "$dir/t.c" -o "$dir/t" >/dev/null 2>&1
    local rc=$?
    rm -rf "$dir"
    return $rc
}

if ! command -v dpkg-query >/dev/null 2>&1; then
    say "not a Debian/Ubuntu system (no dpkg-query): install the equivalents of ${packages[*]}"
    say "yourself; continuing with what is there."
else
    mapfile -t missing < <(missing_packages "${packages[@]}")
    [ ${#missing[@]} = 0 ] || apt_install "${missing[@]}"
    if [ $sanitize = 1 ] && ! clang_links_sanitizers; then
        apt_install "libclang-rt-$(clang -dumpversion | cut -d. -f1)-dev"
    fi
fi
[ -z "$apt_log" ] || rm -f "$apt_log"

# ---------------------------------------------------------------- Python packages of the reference checks
[ $python_tests = 1 ] || exit 0
# satisfied already? (lines "name" or "name>=version" only; anything else is left to pip)
requirements_met() {
    python3 - requirements-dev.txt <<'PY' 2>/dev/null
import re, sys
from importlib.metadata import version
def key(v):
    return [int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3]]
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9][0-9.]*))?", line)
    if not m or (m[2] and key(version(m[1])) < key(m[2])):
        sys.exit(1)
    version(m[1])  # raises (exit 1) when not installed
PY
}
requirements_met && exit 0
say "installing the Python test packages with pip: $(grep -v '^#' requirements-dev.txt | tr '\n' ' ')"
pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@" -r requirements-dev.txt 2>&1
}
if ! out=$(pip_install); then
    if grep -q externally-managed-environment <<<"$out"; then
        # PEP 668 (Debian 12, Ubuntu 23.04 and newer): the distribution's python refuses pip unless asked.
        # Asked, pip puts the packages in /usr/local (root) or ~/.local (a user, by itself), never in
        # the directories apt manages, and skips what an apt package already satisfies.
        out=$(pip_install --break-system-packages) || {
            echo "$out" >&2
            say "pip failed: the Python reference checks will be skipped (pip install -r requirements-dev.txt)"
        }
    else
        echo "$out" >&2
        say "pip failed: the Python reference checks will be skipped (pip install -r requirements-dev.txt)"
    fi
fi
exit 0

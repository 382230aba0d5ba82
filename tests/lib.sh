# Helpers for tests/system/*.sh: TAP output and the guest. Sourced, not run.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tap_n=0

ok() { tap_n=$((tap_n + 1)); echo "ok $tap_n - $1"; }

# not_ok DESCRIPTION [DIAGNOSTIC...]
not_ok() {
	tap_n=$((tap_n + 1))
	echo "not ok $tap_n - $1"
	shift
	local line
	for line in "$@"; do printf '%s\n' "$line" | sed 's/^/# /'; done
}

# check DESCRIPTION COMMAND...: ok when COMMAND succeeds
check() {
	local desc=$1
	shift
	if "$@"; then ok "$desc"; else not_ok "$desc" "failed: $*"; fi
}

# guest [qemu/run options] -- CMD...: the test guest, with artifacts already built by make
guest() { PEERDIRECT_PREBUILT=1 "$ROOT/qemu/run" "$@"; }

# Helpers for tests/system/*.sh: TAP output and the guest. Sourced, not run.
#
# The plan: tests/run sums every plan line ("1..N" at the start of a line) of a suite's output
# and fails the suite when the checks it reports ("ok ..." / "not ok ...") are not as many, or
# when it declares none. So each suite declares, with `plan N` before its checks run, how many
# checks it prints itself: a literal, or counted from the list of cases it is about to run,
# never from what ran. A guest program whose TAP a suite passes through unchanged (its own
# "1..N" at the start of a line, as peerdirect-guest-tests prints before its tests) declares
# its own plan; the suite's plan leaves its checks out. A check printed only when something
# else failed already (a guest run that did not end cleanly, say) is in no plan: it can only
# add a failure to a failed run. Never print an `ok` that is not planned.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tap_n=0

# plan N: the TAP plan of the checks this script prints itself, before any of them runs.
plan() {
	[[ $1 =~ ^[0-9]+$ ]] || { echo "plan: '$1' is not a number" >&2; exit 2; }
	echo "1..$1"
}

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

# guest [qemu/run options] -- CMD...: the test guest. qemu/run builds what it needs first (make
# guest-KERNEL) unless PEERDIRECT_PREBUILT=1 (make test and tests/run set it: make guest ran),
# so a suite run by hand after a change to kmod/ or userspace/ tests the change.
guest() { PEERDIRECT_PREBUILT=${PEERDIRECT_PREBUILT:-0} "$ROOT/qemu/run" "$@"; }

# in_trixie DIR CMD: runs the shell command CMD on the host, chrooted in the guests' trixie
# userland (scripts/build-userland trixie: the gcc, g++, pkg-config, headers and libraries the
# guest has), in /mnt/host, which is DIR, in a mount namespace of its own with a scratch /tmp;
# the cached userland is never written. For what needs the guest's toolchain but no guest: C
# builds take a second here and half a minute under TCG.
in_trixie() {
	local userland
	userland=$("$ROOT/scripts/build-userland" trixie) || { echo "scripts/build-userland trixie failed" >&2; return 1; }
	unshare -m --propagation private sh -c 'mount --bind "$1" "$2/mnt/host" && mount -t tmpfs tmpfs "$2/tmp" &&
		exec chroot "$2" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 \
			PKG_CONFIG_PATH="$PKG_CONFIG_PATH" PKG_CONFIG_SYSROOT_DIR="$PKG_CONFIG_SYSROOT_DIR" \
			sh -c "cd /mnt/host && $3"' sh "$1" "$userland" "$2"
}

# capi_install DIR: `make install` of the C ABI into DIR/stage (PREFIX=/usr/local), as a user
# installs it; its output on failure. DIR is what in_capi shares with the userland.
capi_install() {
	make -s -C "$ROOT" install KDIR="$("$ROOT/scripts/build-kernel")" DESTDIR="$1/stage" PREFIX=/usr/local 2>&1
}

# in_capi DIR CMD: in_trixie DIR CMD with pkg-config pointed at capi_install's DIR/stage, so
# that `pkg-config --cflags --libs peerdirect` gives the installed header and library.
in_capi() {
	PKG_CONFIG_PATH=/mnt/host/stage/usr/local/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=/mnt/host/stage \
		in_trixie "$1" "$2"
}

# prebuild [KERNEL]: builds what guests of KERNEL (default: PEERDIRECT_KERNEL, else default)
# need once, unless PEERDIRECT_PREBUILT=1, and has the guests that follow take it as built:
# for suites that start guests side by side, whose builds would otherwise run at once.
prebuild() {
	if [ "${PEERDIRECT_PREBUILT:-0}" != 1 ]; then
		make -s -C "$ROOT" "guest-${1:-${PEERDIRECT_KERNEL:-default}}" >&2 || return
	fi
	export PEERDIRECT_PREBUILT=1
}

# guest_status DESCRIPTION STATUS FILE: judges a guest run whose command prints TAP, its output
# in FILE: status 0, or 1 with its failures reported (a `not ok` line in FILE), is the command's
# own verdict; any other (99: kernel splat, 98: guest died, 124: timeout, a command that failed
# without saying which test) fails a check of its own, "DESCRIPTION: the guest run ends
# cleanly" (DESCRIPTION may be empty). Returns STATUS.
guest_status() {
	local desc=$1 r=$2 file=$3
	case $r in
	0) ;;
	1) grep -q '^not ok ' "$file" ||
		not_ok "${desc:+$desc: }the guest run ends cleanly" "its command exited 1 without reporting a failed test" ;;
	*) not_ok "${desc:+$desc: }the guest run ends cleanly" "qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" ;;
	esac
	return "$r"
}

# guest_tap DESCRIPTION PROGRAMS [qemu/run options] -- CMD...: a guest whose command runs
# PROGRAMS programs that print TAP, each with its plan first (peerdirect-guest-tests); their
# output passes through unchanged, plans included, with $tap_prefix (if set) put before each
# test's description; this script's numbering runs on after their tests. Fewer plan lines than
# PROGRAMS (a program that never started, or died first) fails a check of its own, as does a
# run that did not end cleanly (guest_status). Returns qemu/run's status.
guest_tap() {
	local desc=$1 programs=$2 out r plans
	shift 2
	out=$(mktemp)
	guest "$@" | awk -v p="${tap_prefix:-}" '
		match($0, /^(not )?ok [0-9]+ - /) { $0 = substr($0, 1, RLENGTH) p substr($0, RLENGTH + 1) }
		{ print; fflush() }' | tee "$out"
	r=${PIPESTATUS[0]}
	tap_n=$((tap_n + $(grep -cE '^(not )?ok ' "$out")))
	plans=$(grep -cE '^1\.\.[0-9]+$' "$out")
	[ "$plans" -ge "$programs" ] ||
		not_ok "${desc:+$desc: }every program of the guest run reports its tests" "$plans of $programs TAP plans in its output"
	guest_status "$desc" "$r" "$out"
	r=$?
	rm -f "$out"
	return $r
}

# guest_each: a guest command (qemu/run ... -- "${guest_each[@]}" CMD...) that runs each CMD, a
# shell command line, whatever the others' outcome, and exits with the worst of their statuses
# (worst, below): several programs in one boot.
# shellcheck disable=SC2016
guest_each=(sh -c 'w=0
for c in "$@"; do
	sh -c "$c"
	s=$?
	case $s in 0) ;; 1) [ $w != 0 ] || w=1 ;; *) [ $w -gt 1 ] || w=$s ;; esac
done
exit $w' sh)

# relay [PREFIX] <FILE: a guest program's TAP, read from a file the guest left, renumbered into
# this script's, with its plan line as it came (a plan of its own, which tests/run adds to
# this script's); other lines as comments. PREFIX goes before each description. Returns 1 if
# any test failed.
relay() {
	local line r=0
	while IFS= read -r line; do
		case $line in
		"ok "*) ok "${1-}${line#ok [0-9]* - }" ;;
		"not ok "*) r=1; tap_n=$((tap_n + 1)); echo "not ok $tap_n - ${1-}${line#not ok [0-9]* - }" ;;
		"#"*) echo "$line" ;;
		*) if [[ $line =~ ^1\.\.[0-9]+$ ]]; then echo "$line"; else echo "# $line"; fi ;;
		esac
	done
	return $r
}

# hbm_reported FILE MARKER: the "# MARKER offset=O length=L seed=S" lines of FILE (a guest
# program's report of HBM it filled with tests/hbm-pattern's pattern), as "O L S" lines.
hbm_reported() {
	sed -n "s/^# $2 offset=\(0x[0-9a-f]*\) length=\(0x[0-9a-f]*\) seed=\(0x[0-9a-f]*\)\$/\1 \2 \3/p" "$1" 2>/dev/null
}

# worst STATUS...: the status a run of several commands ends with: the first that is neither 0
# nor 1 (a failure no test reported), else 1 if any is 1 (failed tests), else 0.
worst() {
	local s w=0
	for s in "$@"; do
		case $s in
		0) ;;
		1) [ $w != 0 ] || w=1 ;;
		*) [ $w -gt 1 ] || w=$s ;;
		esac
	done
	echo $w
}

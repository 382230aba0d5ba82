#!/usr/bin/env bash
# The module's KUnit suites (built in with `make module-kunit`), run at load in the guest.
# Each KUnit case becomes one TAP line; a missing suite is a failure.
. "$(dirname "$0")/../lib.sh"

suites=(peerdirect_heap peerdirect_index peerdirect_requests peerdirect_uapi peerdirect_p2p_verdicts peerdirect_handles)
out=$(guest --kunit -- sh -c 'for s in /sys/kernel/debug/kunit/peerdirect_*; do
	echo "suite ${s##*/}"; cat "$s/results"; done' 2>&1)
rc=$?
for s in "${suites[@]}"; do
	grep -qx "suite $s" <<<"$out" || not_ok "KUnit suite $s ran" "$out"
done
# Nested KTAP case lines ("    ok 1 name") under "suite NAME" headers.
awk '/^suite / { suite = $2; next }
     /^    (not )?ok [0-9]+ / {
	verdict = ($1 == "not") ? "not ok" : "ok"
	name = $0; sub(/^ *(not )?ok [0-9]+ /, "", name)
	print verdict " - kunit " suite ": " name
     }' <<<"$out" | while read -r line; do
	case $line in
	"not ok"*) not_ok "${line#not ok - }" ;;
	*) ok "${line#ok - }" ;;
	esac
done
[ $rc = 0 ] || { not_ok "the KUnit guest run exited 0" "qemu/run exited $rc" "$out"; exit 1; }

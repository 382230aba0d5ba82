#!/usr/bin/env bash
# The module's KUnit suites (built in with `make module-kunit` and `make module-kunit-kasan`),
# run at load in the guest: once on the test kernel and once on its KASAN flavour, where the
# suites' own races (peerdirect_p2p_verdicts) run with every access checked and kmemleak scans
# afterwards. Each KUnit case becomes one TAP line per kernel; a missing suite is a failure.
. "$(dirname "$0")/../lib.sh"

suites=(peerdirect_heap peerdirect_index peerdirect_requests peerdirect_uapi peerdirect_p2p_verdicts peerdirect_handles)
for kernel in default kasan; do
	extra=()
	[ $kernel = default ] || extra=(--kmemleak)
	out=$(guest --kernel $kernel --kunit "${extra[@]}" -- sh -c 'for s in /sys/kernel/debug/kunit/peerdirect_*; do
		echo "suite ${s##*/}"; cat "$s/results"; done' 2>&1)
	rc=$?
	for s in "${suites[@]}"; do
		grep -qx "suite $s" <<<"$out" || not_ok "KUnit suite $s ran ($kernel kernel)" "$out"
	done
	# Nested KTAP case lines ("    ok 1 name") under "suite NAME" headers; read in this shell
	# (not a piped subshell), so that the TAP numbering runs on across both kernels.
	while read -r line; do
		case $line in
		"not ok"*) not_ok "${line#not ok - }" ;;
		*) ok "${line#ok - }" ;;
		esac
	done < <(awk -v kernel=$kernel '/^suite / { suite = $2; next }
	     /^    (not )?ok [0-9]+ / {
		verdict = ($1 == "not") ? "not ok" : "ok"
		name = $0; sub(/^ *(not )?ok [0-9]+ /, "", name)
		print verdict " - kunit " suite ": " name (kernel == "default" ? "" : " (" kernel " kernel)")
	     }' <<<"$out")
	[ $rc = 0 ] || { not_ok "the KUnit guest run exited 0 ($kernel kernel)" "qemu/run exited $rc" "$out"; exit 1; }
done

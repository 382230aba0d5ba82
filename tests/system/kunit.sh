#!/usr/bin/env bash
# The module's KUnit suites (built in with `make module-kunit` and `make module-kunit-kasan`),
# run at load in the guest: once on the test kernel and once on its KASAN flavour, where the
# suites' own races (peerdirect_p2p_verdicts) run with every access checked and kmemleak scans
# afterwards. Each KUnit case becomes one TAP line per kernel; a missing suite is a failure.
. "$(dirname "$0")/../lib.sh"

suites=(peerdirect_heap peerdirect_index peerdirect_requests peerdirect_uapi peerdirect_p2p_verdicts peerdirect_handles peerdirect_global)
# PEERDIRECT_KUNIT_KERNELS: which (tests/run --quick: the test kernel's only).
read -ra kernels <<<"${PEERDIRECT_KUNIT_KERNELS:-default kasan}"
# The plan, before anything runs: one check per KUnit case per kernel, the cases being the
# #[test] functions of each #[kunit_tests(SUITE)] module in kmod/ (what the KUnit build runs;
# the guest lists every peerdirect_* suite), each module from that line to its closing brace
# at column 0. KUnit's own count of a suite's cases (its "    1..N" line) is compared with it
# below, to say which suite differs.
declare -A cases
while read -r suite n; do cases[$suite]=$n; done < <(awk '
	/^#\[kunit_tests\(/ { suite = $0; sub(/^#\[kunit_tests\(/, "", suite); sub(/\).*/, "", suite); n[suite] = 0; next }
	suite != "" && /^[[:space:]]*#\[test\]/ { n[suite]++ }
	suite != "" && /^}/ { suite = "" }
	END { for (s in n) print s, n[s] }' "$ROOT"/kmod/*.rs "$ROOT"/kmod/sys/*.rs)
total=0
for s in "${!cases[@]}"; do total=$((total + cases[$s])); done
plan $((total * ${#kernels[@]}))
for kernel in "${kernels[@]}"; do
	extra=()
	[ $kernel = default ] || extra=(--kmemleak)
	out=$(guest --kernel $kernel --kunit "${extra[@]}" -- sh -c 'for s in /sys/kernel/debug/kunit/peerdirect_*; do
		echo "suite ${s##*/}"; cat "$s/results"; done' 2>&1)
	rc=$?
	for s in "${suites[@]}"; do
		grep -qx "suite $s" <<<"$out" || not_ok "KUnit suite $s ran ($kernel kernel)" "$out"
	done
	# Each suite's count of cases, as KUnit printed it before running them, against kmod/'s.
	for s in "${!cases[@]}"; do
		n=$(awk -v s="$s" '/^suite / { in_suite = ($2 == s); next } in_suite && /^    1\.\.[0-9]+$/ { sub(/^ *1\.\./, ""); print; exit }' <<<"$out")
		[ -z "$n" ] || [ "$n" = "${cases[$s]}" ] ||
			not_ok "KUnit suite $s runs the ${cases[$s]} cases kmod/ declares ($kernel kernel)" "KUnit counts $n"
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

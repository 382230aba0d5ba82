#!/usr/bin/env bash
# Revocation (Documentation/exporter.md, "Removal and revocation"): with a dynamic, a revocable
# and a pinned importer holding mappings of three dma-bufs and CPU mappings of one, the HBM
# device goes away, by unbind and then by a PCIe hot-unplug (QEMU device_del on the guest's
# request, qemu/run --hotplug); kmemleak scans after each run.
. "$(dirname "$0")/../lib.sh"

rc=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# run_guest DESCRIPTION [qemu/run options] -- CMD...: the TAP passes through (and numbers the
# lines of this script after it); a guest that does not end cleanly is a failure of its own.
run_guest() {
	local desc=$1 r
	shift
	echo "# $desc"
	guest "$@" | tee "$out"
	r=${PIPESTATUS[0]}
	tap_n=$(grep -cE '^(not )?ok ' "$out")
	case $r in
	0) ;;
	1) [ $rc != 0 ] || rc=1 ;; # failed tests, reported above
	*) rc=$r; not_ok "$desc: the guest run ends cleanly" "qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" ;;
	esac
}

run_guest "revocation by unbind" --kmemleak -- peerdirect-guest-tests --revoke unbind

# qemu/run --hotplug answers the guest's `@@peerdirect-unplug hbm0` with QMP device_del.
run_guest "revocation by hot-unplug" --kmemleak --hotplug -- peerdirect-guest-tests --revoke unplug
exit $rc

#!/usr/bin/env bash
# Unbind, rebind, removal and rescan, module unload with files open; kmemleak scans after.
# Plan: 1 check of this script's own; peerdirect-guest-tests --lifecycle declares its own.
. "$(dirname "$0")/../lib.sh"
plan 1
guest_tap "peerdirect-guest-tests --lifecycle" 1 --kmemleak -- peerdirect-guest-tests --lifecycle
rc=$?

# Without driver_override nothing is bound, even with the module loaded: no /dev/peerdirectN
# (the control device /dev/peerdirect-ctl is the module's, not a device's).
# Its stdout alone: qemu/run's notes (a boot retried) go to stderr, and hold colons too.
err=$(mktemp)
trap 'rm -f "$err"' EXIT
out=$(guest --no-bind -- sh -c 'insmod /lib/peerdirect/peerdirect.ko && ls /sys/bus/pci/drivers/peerdirect/ && ls /dev/ | grep -c "^peerdirect[0-9]"' 2>"$err")
r=$?
# grep -c finds no line: the command's status is 1, its output 0. Any other status is a failure
# (qemu/run: 99 a kernel splat, 98 the guest died, 124 a timeout).
if [ $r = 1 ] && grep -qx 0 <<<"$out" && ! grep -q ':' <<<"$out"; then
	ok "without driver_override, loading peerdirect binds nothing"
else
	not_ok "without driver_override, loading peerdirect binds nothing" \
		"qemu/run exited $r (expected 1: grep -c counted no device node)" "$out" "$(cat "$err")"
	[ $rc != 0 ] || rc=1
fi
exit $rc

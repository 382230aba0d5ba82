#!/usr/bin/env bash
# Unbind, rebind, removal and rescan, module unload with files open; kmemleak scans after.
. "$(dirname "$0")/../lib.sh"
guest --kmemleak -- peerdirect-guest-tests --lifecycle
rc=$?

# Without driver_override nothing is bound, even with the module loaded: no /dev/peerdirectN
# (the control device /dev/peerdirect-ctl is the module's, not a device's).
# Its stdout alone: qemu/run's notes (a boot retried) go to stderr, and hold colons too.
err=$(mktemp)
trap 'rm -f "$err"' EXIT
out=$(guest --no-bind -- sh -c 'insmod /lib/peerdirect/peerdirect.ko && ls /sys/bus/pci/drivers/peerdirect/ && ls /dev/ | grep -c "^peerdirect[0-9]"' 2>"$err")
if grep -qx 0 <<<"$out" && ! grep -q ':' <<<"$out"; then
	echo "ok - without driver_override, loading peerdirect binds nothing"
else
	echo "not ok - without driver_override, loading peerdirect binds nothing"
	sed 's/^/# /' <<<"$out"
	sed 's/^/# /' "$err"
fi
exit $rc

#!/usr/bin/env bash
# Unbind, rebind, removal and rescan, module unload with files open; kmemleak scans after.
# Then `peerdirect export --hold` meeting a reset of its device and then an unbind.
# Plan: 2 checks of this script's own; peerdirect-guest-tests --lifecycle declares its own.
. "$(dirname "$0")/../lib.sh"
plan 2
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

# `peerdirect export --hold 60` whose export the module revokes while it holds: by a reset of
# the device (sysfs reset; the device stays), then by an unbind. Each time the command must
# notice (the status page) within seconds, exit 1 and say that the export was revoked and why.
work=$(mktemp -d)
trap 'rm -f "$err"; rm -rf "$work"' EXIT
cat >"$work/hold.sh" <<'EOS'
cd /mnt/host
addr=$(ls /sys/bus/pci/drivers/peerdirect | grep '^0000:')
# held NAME CMD: an export held for 60 s; CMD once it has printed; its status and seconds after CMD
held() {
	peerdirect export --size 2M --hold 60 >"$1.out" 2>"$1.err" &
	pid=$!
	n=0
	while [ ! -s "$1.out" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
	start=$(date +%s)
	sh -c "$2"
	wait $pid
	echo $? >"$1.rc"
	echo $(($(date +%s) - start)) >"$1.secs"
}
held reset "echo 1 >/sys/bus/pci/devices/$addr/reset"
held unbind "echo $addr >/sys/bus/pci/drivers/peerdirect/unbind"
EOS
out=$(guest --share "$work" -- sh /mnt/host/hold.sh 2>&1)
r=$?
held_ok() { # held_ok NAME WHY: exit 1 within 10 s, saying the export was revoked and WHY
	[ "$(cat "$work/$1.rc" 2>/dev/null)" = 1 ] && [ "$(cat "$work/$1.secs" 2>/dev/null)" -lt 10 ] &&
		grep -q '^holding the dma-buf for 60 s$' "$work/$1.out" &&
		grep -q "^peerdirect: the export of /dev/peerdirect0 was revoked [0-9.]* s into the 60 s hold: $2" "$work/$1.err"
}
desc="peerdirect export --hold 60 exits 1 within seconds when its export is revoked, saying so and why: by a reset of the device (the device stays), then by an unbind"
if [ $r = 0 ] && held_ok reset 'the device was reset (1 reset since the export)' &&
	held_ok unbind 'the HBM device is going away: unbound from peerdirect'; then
	ok "$desc"
	sed 's/^/# /' "$work/reset.err" "$work/unbind.err"
else
	not_ok "$desc" "qemu/run exited $r" "$out" \
		"$(for f in reset unbind; do echo "$f: exit $(cat "$work/$f.rc" 2>/dev/null) after $(cat "$work/$f.secs" 2>/dev/null) s"; cat "$work/$f.out" "$work/$f.err" 2>/dev/null; done)"
	[ $rc != 0 ] || rc=1
fi
exit $rc

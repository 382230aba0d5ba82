#!/usr/bin/env bash
# The QEMU harness itself: exit status, shared folder, HBM backing file, that it catches
# a kernel splat (a test-only module provokes a WARN; this passes when the run is failed), and
# how it treats boots that go wrong under TCG: a boot that never reaches /init is done again
# and then given up (exit 124), and a known upstream report is dropped only where it is known.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "1..7"

guest -- sh -c 'exit 7' >/dev/null 2>&1
rc=$?
if [ $rc = 7 ]; then ok "qemu/run exits with the command's status"; else not_ok "qemu/run exits with the command's status" "expected 7, got $rc"; fi

echo "from the host $RANDOM" > "$work/in"
out=$(guest --share "$work" -- sh -c 'cat /mnt/host/in; cp /mnt/host/in /mnt/host/out; echo guest-was-here >> /mnt/host/out' 2>"$work/err")
if [ "$out" = "$(cat "$work/in")" ] && [ "$(tail -1 "$work/out" 2>/dev/null)" = guest-was-here ]; then
	ok "--share DIR is /mnt/host in the guest, both ways"
else
	not_ok "--share DIR is /mnt/host in the guest, both ways" "guest printed: $out" "$(cat "$work/err")"
fi

out=$(guest --hbm 64M --hbm-backing "$work/hbm" -- peerdirect devices --json 2>"$work/err")
size=$(stat -c %s "$work/hbm" 2>/dev/null)
if [ "$size" = 67108864 ] && jq -e '.[0].hbm_bytes == 67108864' <<<"$out" >/dev/null 2>&1; then
	ok "--hbm-backing FILE backs the 64 MiB HBM BAR"
else
	not_ok "--hbm-backing FILE backs the 64 MiB HBM BAR" "backing size ${size:-none}" "$out$(printf '\n'; cat "$work/err")"
fi

out=$(guest -- insmod /lib/peerdirect/tests/peerdirect_splat_selftest.ko 2>&1)
rc=$?
if [ $rc = 99 ] && grep -q 'kernel splat' <<<"$out" && grep -q 'WARNING:' <<<"$out"; then
	ok "a WARN in the guest fails the run (exit 99, splat shown)"
else
	not_ok "a WARN in the guest fails the run (exit 99, splat shown)" "qemu/run exited $rc" "$out"
fi

# A boot limit no kernel meets: three boots, each said, then a timeout. Events go to a file of
# this test's own, not to tests/run's (which would retry the suite).
out=$(PEERDIRECT_BOOT_LIMIT=1 PEERDIRECT_GUEST_EVENTS=$work/events guest -- sh -c 'echo ran' 2>&1)
rc=$?
if [ $rc = 124 ] && [ "$(grep -c 'no /init after 1s' "$work/events")" = 3 ] &&
	[ "$(grep -c 'booting again' "$work/events")" = 2 ] && grep -q '^qemu/run: guest timed out' "$work/events" &&
	! grep -q '^ran$' <<<"$out"; then
	ok "a boot that never reaches /init is done again up to 3 times, said each time, then times out (exit 124)"
else
	not_ok "a boot that never reaches /init is done again up to 3 times, said each time, then times out (exit 124)" \
		"qemu/run exited $rc" "$out" "$(cat "$work/events" 2>/dev/null)"
fi

# qemu/known-splats on a kernel log with the early-boot KASAN report it knows: dropped and the
# run void (3) at 0.004 s; at 5 s (not where it is known to come) kept, and the run checked.
early_report() {
	cat <<-LOG
	[    0.000000] Linux version 7.3.0 (peerdirect test kernel)
	[    $1] ==================================================================
	[    $1] BUG: KASAN: wild-memory-access in do_raw_spin_lock+0x6c/0x250
	[    $1] Read of size 4 at addr 1fffffff8a9a1c04 by task swapper/0/0
	[    $1] CPU: 0 UID: 0 PID: 0 Comm: swapper/0 Not tainted 7.3.0 #1
	[    $1] Call Trace:
	[    $1]  <IRQ>
	[    $1]  handle_edge_irq+0x4e/0x7e0
	[    $1]  </IRQ>
	[    $1]  <TASK>
	[    $1]  identify_cpu+0x123/0x800
	[    $1]  </TASK>
	[    $1] ==================================================================
	[    6.508856] Run /init as init process
	LOG
}
early_report 0.004123 > "$work/early.log"
"$ROOT/qemu/known-splats" "$work/early.log" > "$work/early.out" 2>"$work/early.err"
rc=$?
if [ $rc = 3 ] && ! grep -q 'KASAN' "$work/early.out" && grep -q 'Run /init' "$work/early.out" &&
	grep -q 'ignoring a known kernel report: early-boot' "$work/early.err"; then
	ok "known-splats drops the known early-boot KASAN report at 0.004 s and calls the run unchecked (3)"
else
	not_ok "known-splats drops the known early-boot KASAN report at 0.004 s and calls the run unchecked (3)" \
		"exit $rc" "$(cat "$work/early.out" "$work/early.err")"
fi
early_report 5.004123 > "$work/late.log"
"$ROOT/qemu/known-splats" "$work/late.log" > "$work/late.out" 2>"$work/late.err"
rc=$?
if [ $rc = 0 ] && grep -q 'BUG: KASAN: wild-memory-access' "$work/late.out" && [ ! -s "$work/late.err" ]; then
	ok "the same report at 5 s is kept (a splat), and the run counts as checked (0)"
else
	not_ok "the same report at 5 s is kept (a splat), and the run counts as checked (0)" \
		"exit $rc" "$(cat "$work/late.out" "$work/late.err")"
fi

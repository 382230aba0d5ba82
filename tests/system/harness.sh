#!/usr/bin/env bash
# The harness itself, each check shown to fail on a harness that lies:
# - qemu/run: exit status, shared folder, HBM backing file; that it catches each kind of kernel
#   report (a test-only module, tests/kmod/peerdirect_splat_selftest.rs, provokes a WARN, a leak,
#   a use after free on the KASAN kernel, a hung task, a lock inversion after a PCIe hot-unplug;
#   each passes when the run is failed); that a hang fails once, with the kernel's stacks, and is
#   never run again; how it treats boots that go wrong under TCG (a boot that never reaches
#   /init is done again and then given up, exit 124); that a known upstream report is dropped
#   only where it is known, and lockdep stays on through a hot-unplug; that /init gets the
#   answer to its ready line also when it comes before /init reads;
# - tests/run: a suite that reports fewer checks than its plan fails, an undeclared skip fails,
#   `-k` with no match fails, a sibling guest's splat counts when another guest timed out, and
#   the end of the output names the failures and the splat's head.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plan 22
selftest=/lib/peerdirect/tests/peerdirect_splat_selftest.ko

# ran BOOTLOG EVENTS: how each guest of a boot log started (boot or restore), without one boot
# for each that qemu/run did again before /init (QEMU 10.0's TCG aborts now and then while the
# kernel enumerates PCI; each said "booting again" in EVENTS): the guests that ran the command
# ("in one boot" below: one of them, booted or restored). A boot only to save a snapshot
# (qemu/run's save_first) is "save".
ran() {
	local again
	again=$(grep -c 'booting again' "$2" 2>/dev/null) || again=0
	awk -v n="$again" '$4 == "boot" && n > 0 { n--; next } { printf "%s ", $4 }' "$1"
}

# One boot for three things qemu/run does: the command's exit status, the shared folder both
# ways, the HBM backing file.
echo "from the host $RANDOM" > "$work/in"
out=$(guest --share "$work" --hbm 64M --hbm-backing "$work/hbm" -- sh -c 'cat /mnt/host/in
	cp /mnt/host/in /mnt/host/out; echo guest-was-here >> /mnt/host/out
	peerdirect devices --json >/mnt/host/devices.json; exit 7' 2>"$work/err")
rc=$?
if [ $rc = 7 ]; then ok "qemu/run exits with the command's status"; else not_ok "qemu/run exits with the command's status" "expected 7, got $rc" "$(cat "$work/err")"; fi
if [ "$out" = "$(cat "$work/in")" ] && [ "$(tail -1 "$work/out" 2>/dev/null)" = guest-was-here ]; then
	ok "--share DIR is /mnt/host in the guest, both ways"
else
	not_ok "--share DIR is /mnt/host in the guest, both ways" "guest printed: $out" "$(cat "$work/err")"
fi
size=$(stat -c %s "$work/hbm" 2>/dev/null)
if [ "$size" = 67108864 ] && jq -e '.[0].hbm_bytes == 67108864' "$work/devices.json" >/dev/null 2>&1; then
	ok "--hbm-backing FILE backs the 64 MiB HBM BAR"
else
	not_ok "--hbm-backing FILE backs the 64 MiB HBM BAR" "backing size ${size:-none}" "$(cat "$work/devices.json" "$work/err" 2>&1)"
fi

# Snapshots (qemu/run): a configuration's first run saves the guest at /init's ready line, the
# next ones restore it. Three runs of one configuration, with a snapshot folder of this test's
# own, each with a share of its own: the first boots, the other two are restored, and each runs its
# own command with its own settings and share, on the host's clock (within 15 s), drawing random
# bytes none of the others drew; the third with modules and programs of another build (a copy
# of this build's with a file added: PEERDIRECT_PAYLOAD), which it has, restored all the same.
: >"$work/snap.boots"
snap_ok=1 snap_out=
cp -a "$ROOT/build/initramfs.payload" "$work/payload"
echo "another build" >"$work/payload/usr/bin/peerdirect-build-mark"
for i in 1 2 3; do
	mkdir -p "$work/snap$i"
	echo "run $i" >"$work/snap$i/in"
	mark=none payload=
	[ $i != 3 ] || mark="another build" payload=$work/payload
	o=$(PEERDIRECT_PAYLOAD=$payload PEERDIRECT_SNAPSHOT_DIR=$work/snapshots PEERDIRECT_BOOT_LOG=$work/snap.boots PEERDIRECT_GUEST_EVENTS=$work/snap.events guest --hbm 128M --share "$work/snap$i" -- sh -c 'cat /mnt/host/in
		peerdirect devices --json | grep -o "\"hbm_bytes\": *[0-9]*" | tr -d " "
		date +%s; head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"; echo
		cat /usr/bin/peerdirect-build-mark 2>/dev/null || echo none' 2>&1)
	r=$?
	host_now=$(date +%s)
	mapfile -t l <<<"$o"
	snap_out+="run $i (exit $r):"$'\n'"$o"$'\n'
	[ $r = 0 ] && [ "${l[0]}" = "run $i" ] && [ "${l[1]}" = '"hbm_bytes":134217728' ] &&
		[ -n "${l[2]}" ] && [ $((host_now - l[2])) -ge 0 ] && [ $((host_now - l[2])) -le 15 ] &&
		[ ${#l[3]} = 32 ] && [ "${l[4]}" = "$mark" ] || snap_ok=0
	echo "${l[3]:-}" >>"$work/snap.random"
	# The snapshot ages 30 s before it is restored: a guest on the saved boot's clock would
	# be that far behind (without /init's date -s, 95 s behind after 90 s).
	[ $i != 1 ] || sleep 30
done
if [ $snap_ok = 1 ] && [ "$(ran "$work/snap.boots" "$work/snap.events")" = "boot restore restore " ] &&
	[ "$(sort -u "$work/snap.random" | wc -l)" = 3 ]; then
	ok "a configuration's first guest boots and is saved, the next two are restored: each runs its own command with its own share and HBM size, on the host's clock, with random bytes of its own, the last with another build's modules and programs"
else
	not_ok "a configuration's first guest boots and is saved, the next two are restored: each runs its own command with its own share and HBM size, on the host's clock, with random bytes of its own, the last with another build's modules and programs" \
		"boots: $(cat "$work/snap.boots")" "$snap_out"
fi

# Snapshots of a guest with --hbm-backing, of 1 GiB (more than the guest's RAM): the first
# run boots on HBM of QEMU's own only to be saved, then is restored on the file, as the second
# run is. In each, the guest reads what the host wrote into the file before it started, what
# it writes reaches the file, and nothing else of the file is written or read by the save and
# the restore: a marker in its last page is still there, and the file (in /dev/shm, where a
# page read through QEMU's mapping is a page allocated) holds no page besides those.
hbm_file=/dev/shm/peerdirect-harness-backed-$$
backed_ok=1 backed_out=
: >"$work/backed.boots"
for i in 1 2; do
	rm -f "$hbm_file"
	truncate -s 1G "$hbm_file"
	"$ROOT/tests/hbm-pattern" write "$hbm_file" 0 2097152 $((0x5eed00 + i))
	printf 'marker %s' $i | dd of="$hbm_file" bs=4096 seek=$(((1 << 30) / 4096 - 1)) conv=notrunc status=none
	o=$(PEERDIRECT_SNAPSHOT_DIR=$work/snapshots PEERDIRECT_BOOT_LOG=$work/backed.boots PEERDIRECT_GUEST_EVENTS=$work/backed.events \
		guest --hbm 1G --hbm-backing "$hbm_file" -- sh -c "peerdirect export --size 2M --verify $((0x5eed00 + i)) >/dev/null &&
			peerdirect export --size 2M --pattern $((0x5eed10 + i)) --json" 2>&1)
	r=$?
	off=$(jq -r .export.hbm_offset <<<"$o" 2>/dev/null) kib=$(du -k "$hbm_file" | cut -f1)
	backed_out+="run $i (exit $r, pattern at ${off:-?}, ${kib} KiB of the file allocated):"$'\n'"$o"$'\n'
	[ $r = 0 ] && [ -n "$off" ] && "$ROOT/tests/hbm-pattern" check "$hbm_file" "$off" 2097152 $((0x5eed10 + i)) &&
		[ "$(tail -c 4096 "$hbm_file" | head -c 8)" = "marker $i" ] && [ "$kib" -le 2200 ] || backed_ok=0
done
rm -f "$hbm_file"
if [ $backed_ok = 1 ] && [ "$(ran "$work/backed.boots" "$work/backed.events")" = "save restore restore " ]; then
	ok "a guest with --hbm-backing (1 GiB) is restored on the file, the first after a boot only to save the snapshot: it reads what the host wrote, its writes reach the file, and nothing else of the file is read or written"
else
	not_ok "a guest with --hbm-backing (1 GiB) is restored on the file, the first after a boot only to save the snapshot: it reads what the host wrote, its writes reach the file, and nothing else of the file is read or written" \
		"boots: $(cat "$work/backed.boots")" "$backed_out" "$(cat "$work/backed.events" 2>/dev/null)"
fi

# Two first runs of one configuration at once, with no snapshot yet: both boot, and each may
# save the snapshot (to a temporary file of its own, renamed into place) while the other does.
# Both pass, the folder ends with one snapshot and no temporary file, and a third run restores
# it. Met: both booted (neither found a snapshot), so both reached the save with none there.
: >"$work/pair.boots"
for i in 1 2; do
	(PEERDIRECT_SNAPSHOT_DIR=$work/pair-snapshots PEERDIRECT_BOOT_LOG=$work/pair.boots PEERDIRECT_GUEST_EVENTS=$work/pair.events \
		guest --hbm 32M -- sh -c "echo pair $i" >"$work/pair$i.out" 2>"$work/pair$i.err"
	echo $? >"$work/pair$i.rc") &
done
wait
# The runs' own output on stdout; what qemu/run reports (a boot done again after QEMU crashed
# while booting, which ran() accounts for) on stderr.
o3=$(PEERDIRECT_SNAPSHOT_DIR=$work/pair-snapshots PEERDIRECT_BOOT_LOG=$work/pair.boots PEERDIRECT_GUEST_EVENTS=$work/pair.events \
	guest --hbm 32M -- sh -c 'echo pair 3' 2>"$work/pair3.err")
r3=$?
snaps=$(find "$work/pair-snapshots" -type f | sed "s|^$work/pair-snapshots/||" | sort)
if [ "$(cat "$work/pair1.rc" "$work/pair2.rc")" = "$(printf '0\n0')" ] && [ $r3 = 0 ] &&
	[ "$(cat "$work/pair1.out")" = "pair 1" ] && [ "$(cat "$work/pair2.out")" = "pair 2" ] && [ "$o3" = "pair 3" ] &&
	[ "$(ran "$work/pair.boots" "$work/pair.events")" = "boot boot restore " ] &&
	[ "$(wc -l <<<"$snaps")" = 1 ] && [[ $snaps == */*.vmstate ]]; then
	ok "two first runs of a configuration at once both boot and pass, the folder keeps one whole snapshot and no temporary file, and the next run restores it"
else
	not_ok "two first runs of a configuration at once both boot and pass, the folder keeps one whole snapshot and no temporary file, and the next run restores it" \
		"boots: $(cat "$work/pair.boots")" "files: $snaps" \
		"run 1 (exit $(cat "$work/pair1.rc")): $(cat "$work/pair1.out" "$work/pair1.err")" \
		"run 2 (exit $(cat "$work/pair2.rc")): $(cat "$work/pair2.out" "$work/pair2.err")" \
		"run 3 (exit $r3): $o3 $(cat "$work/pair3.err")" "$(cat "$work/pair.events" 2>/dev/null)"
fi

out=$(guest -- insmod $selftest 2>&1)
rc=$?
if [ $rc = 99 ] && grep -q 'kernel splat' <<<"$out" && grep -q 'WARNING:' <<<"$out"; then
	ok "a WARN in the guest fails the run (exit 99, splat shown)"
else
	not_ok "a WARN in the guest fails the run (exit 99, splat shown)" "qemu/run exited $rc" "$out"
fi

# A boot that never reaches /init (qemu/run made blind to the kernel's start of /init: a short
# limit alone was once met by a fast boot): three boots, each said with where the kernel was
# (its answer to the NMI: a panic with every CPU's backtrace), then a timeout. Events go to a
# file of this test's own, not to tests/run's (which would retry the suite).
out=$(PEERDIRECT_SNAPSHOTS=0 PEERDIRECT_BOOT_LIMIT=10 PEERDIRECT_BOOT_STALL=1 PEERDIRECT_GUEST_EVENTS=$work/events \
	guest -- sh -c 'echo ran' 2>&1)
rc=$?
if [ $rc = 124 ] && [ "$(grep -c 'no /init after 10s' "$work/events")" = 3 ] &&
	[ "$(grep -c 'booting again' "$work/events")" = 2 ] && grep -q '^qemu/run: guest timed out' "$work/events" &&
	[ "$(grep -c 'Kernel panic - not syncing: NMI' "$work/events")" -ge 2 ] && ! grep -q '^ran$' <<<"$out"; then
	ok "a boot that never reaches /init is done again up to 3 times, said each time with the kernel's backtraces, then times out (exit 124)"
else
	not_ok "a boot that never reaches /init is done again up to 3 times, said each time with the kernel's backtraces, then times out (exit 124)" \
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
# kept NAME PATTERN DESCRIPTION: known-splats on $work/NAME.log keeps the report PATTERN matches,
# drops nothing and calls the run checked (0).
kept() {
	"$ROOT/qemu/known-splats" "$work/$1.log" >"$work/$1.out" 2>"$work/$1.err"
	local r=$?
	if [ $r = 0 ] && grep -q "$2" "$work/$1.out" && [ ! -s "$work/$1.err" ]; then
		ok "$3"
	else
		not_ok "$3" "exit $r" "$(cat "$work/$1.out" "$work/$1.err")"
	fi
}
early_report 5.004123 > "$work/late.log"
kept late 'BUG: KASAN: wild-memory-access' "the same report at 5 s is kept (a splat), and the run counts as checked (0)"

# A leak: two kmemleak scans after the command find the selftest's 1000 bytes (kmalloc-1k).
out=$(guest --kmemleak -- insmod $selftest mode=1 2>&1)
rc=$?
if [ $rc = 99 ] && grep -q 'unreferenced object .*(size 1024)' <<<"$out"; then
	ok "a leak fails the run: kmemleak's two scans report it (exit 99)"
else
	not_ok "a leak fails the run: kmemleak's two scans report it (exit 99)" "qemu/run exited $rc" "$out"
fi

# A read of freed memory, on the KASAN kernel.
out=$(guest --kernel kasan -- insmod $selftest mode=2 2>&1)
rc=$?
if [ $rc = 99 ] && grep -q 'BUG: KASAN: .*use-after-free' <<<"$out" && grep -q 'peerdirect_splat_selftest' <<<"$out"; then
	ok "a use after free fails the run on the KASAN kernel (exit 99, KASAN's report shown)"
else
	not_ok "a use after free fails the run on the KASAN kernel (exit 99, KASAN's report shown)" "qemu/run exited $rc" "$out"
fi

# A command blocked in the kernel for good (D state): the hung task detector reports it with its
# stack and the kernel panics; one boot, a splat, nothing run again.
: >"$work/hang.boots"
out=$(PEERDIRECT_HUNG_TASK_SECS=10 PEERDIRECT_BOOT_LOG=$work/hang.boots PEERDIRECT_GUEST_EVENTS=$work/hang.events guest --timeout 200 -- insmod $selftest mode=3 2>&1)
rc=$?
boots=$(wc -l <"$work/hang.boots")
if [ $rc = 99 ] && grep -q 'INFO: task insmod:[0-9]* blocked for more than' <<<"$out" &&
	grep -q 'task:insmod .*state:D' <<<"$out" && grep -q '\[peerdirect_splat_selftest\]' <<<"$out" &&
	[ "$(ran "$work/hang.boots" "$work/hang.events" | wc -w)" = 1 ]; then
	ok "a command hung in the kernel fails once (exit 99) with the hung task's stack, in one boot"
else
	not_ok "a command hung in the kernel fails once (exit 99) with the hung task's stack, in one boot" \
		"qemu/run exited $rc after $boots boot(s)" "$out"
fi

# A command that never ends but is not blocked in the kernel: the timeout sends an NMI, the
# kernel's answer (every CPU's backtrace) is in the report, which starts by saying where the
# guest was and what the command printed last; one boot, exit 124.
: >"$work/timeout.boots"
out=$(PEERDIRECT_BOOT_LOG=$work/timeout.boots PEERDIRECT_GUEST_EVENTS=$work/timeout.events guest --timeout 20 -- sh -c 'echo spinning now; while :; do :; done' 2>&1)
rc=$?
boots=$(wc -l <"$work/timeout.boots")
if [ $rc = 124 ] && grep -q 'guest timed out: the command ran for more than 20s' "$work/timeout.events" &&
	grep -q '^    output: spinning now$' "$work/timeout.events" &&
	grep -q 'NMI' "$work/timeout.events" && grep -q 'Call Trace' "$work/timeout.events" &&
	[ "$(ran "$work/timeout.boots" "$work/timeout.events" | wc -w)" = 1 ]; then
	ok "a command that runs past its timeout fails once (exit 124), its report saying where and its last output, with the kernel's backtraces, in one boot"
else
	not_ok "a command that runs past its timeout fails once (exit 124), its report saying where and its last output, with the kernel's backtraces, in one boot" \
		"qemu/run exited $rc after $boots boot(s)" "$out"
fi

# /init's handshake: the answer to its ready line (qemu/run, on ttyS2) reaches it also when it
# comes before /init reads it (PEERDIRECT_READY_DELAY: /init waits 3 s in between). An 8250
# port drops what arrives while it is closed or being opened: /init read a line cut short, or
# none and waited for good, until it held the port open from before its ready line.
out=$(PEERDIRECT_SNAPSHOTS=0 PEERDIRECT_READY_DELAY=3 guest --no-bind --log "$work/ready.log" -- echo ran 2>&1)
rc=$?
if [ $rc = 0 ] && [ "$out" = ran ] && tr -d '\r' <"$work/ready.log" | grep -q '\] guest: go booted$'; then
	ok "the answer to /init's ready line reaches it whole also when it comes before /init reads"
else
	not_ok "the answer to /init's ready line reaches it whole also when it comes before /init reads" \
		"qemu/run exited $rc; /init read: $(tr -d '\r' <"$work/ready.log" 2>/dev/null | grep -o 'guest: go.*')" "$out"
fi

# Lockdep through a hot-unplug: peerdirect's HBM device is hot-unplugged (pciehp removes it and
# peerdirect's removal runs), lockdep must still be on afterwards (the upstream pciehp report,
# now fixed in qemu/patches, turned it off), and a lock inversion after it is reported.
out=$(guest --hotplug -- sh -c "echo @@peerdirect-unplug hbm0
	i=0; while [ -e /dev/peerdirect0 ] && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i + 1)); done
	[ ! -e /dev/peerdirect0 ] || { echo 'peerdirect0 still there'; exit 3; }
	grep 'debug_locks:' /proc/lockdep_stats
	insmod $selftest mode=4" 2>&1)
rc=$?
if [ $rc = 99 ] && grep -q 'debug_locks: *1' <<<"$out" && grep -q 'possible circular locking dependency' <<<"$out" &&
	grep -q 'peerdirect_selftest_' <<<"$out"; then
	ok "after a hot-unplug of peerdirect's device lockdep is still on, and a lock inversion fails the run (exit 99)"
else
	not_ok "after a hot-unplug of peerdirect's device lockdep is still on, and a lock inversion fails the run (exit 99)" \
		"qemu/run exited $rc" "$out"
fi

# known-splats keeps every lockdep report on pciehp's path: one that names pciehp's locks and one
# of peerdirect's is a splat.
cat >"$work/lockdep.log" <<-LOG
	[   12.000000] ======================================================
	[   12.000000] WARNING: possible circular locking dependency detected
	[   12.000000] irq/24-pciehp/60 is trying to acquire lock:
	[   12.000000] (&ctrl->reset_lock){++++}-{4:4}, at: pciehp_unconfigure_device+0x1a0/0x230
	[   12.000000] but task is already holding lock:
	[   12.000000] (pci_rescan_remove_lock){+.+.}-{4:4}, at: pciehp_unconfigure_device+0x50/0x230
	[   12.000000] -> #1 (&hbm->unmapped_lock){+.+.}-{4:4}:
	[   12.000000]  <TASK>
	[   12.000000]  </TASK>
LOG
kept lockdep 'possible circular locking dependency' \
	"known-splats keeps a lockdep report on pciehp's removal path that names a peerdirect lock"

# tests/run on suites of this test's own (PEERDIRECT_SUITES), with logs of their own.
# run_harness NAME FAILURE CLOSING DESCRIPTION: tests/run -k NAME over $work/suites must fail,
# print the line FAILURE (a regular expression) and close with the line CLOSING.
mkdir -p "$work/suites" "$work/logs"
run_harness() {
	local r
	chmod +x "$work"/suites/*.sh
	PEERDIRECT_SUITES=$work/suites PEERDIRECT_TEST_LOGS=$work/logs "$ROOT/tests/run" -k "$1" >"$work/$1.out" 2>&1
	r=$?
	if [ $r != 0 ] && grep -q "$2" "$work/$1.out" && grep -qx "$3" "$work/$1.out"; then
		ok "$4"
	else
		not_ok "$4" "tests/run exited $r" "$(cat "$work/$1.out")"
	fi
}

cat >"$work/suites/short-plan.sh" <<-'SUITE'
	echo 1..3
	echo "ok 1 - one"
	echo "ok 2 - two"
SUITE
run_harness short-plan '^not ok - short-plan: planned 3 checks, reported 2$' '2 passed, 1 failed' \
	"tests/run fails a suite that reports fewer checks than its plan"

cat >"$work/suites/undeclared-skip.sh" <<-'SUITE'
	echo 1..2
	echo "ok 1 - runs"
	echo "ok 2 - is skipped # SKIP for no declared reason"
SUITE
run_harness undeclared-skip '^not ok - undeclared-skip: is skipped$' '1 passed, 1 failed' \
	"tests/run fails a skip that tests/expected-skips does not declare"

run_harness no-such-check-anywhere "^not ok - no check matches 'no-such-check-anywhere'" '0 passed, 1 failed' \
	"tests/run -k with no match fails"

# Two guests in one suite: the first times out, the second's kernel splats (on the first run of
# the suite only, so a harness that ran the suite again would see no splat).
cat >"$work/suites/sibling.sh" <<SUITE
. "$ROOT/tests/lib.sh"
plan 2
guest --timeout 15 -- sh -c 'while :; do :; done' >/dev/null 2>&1
r=\$?
if [ \$r = 124 ]; then ok "the first guest times out"; else not_ok "the first guest times out" "qemu/run exited \$r"; fi
if [ ! -e "$work/sibling.ran" ]; then
	touch "$work/sibling.ran"
	guest -- insmod $selftest >/dev/null 2>&1
else
	guest -- true >/dev/null 2>&1
fi
r=\$?
if [ \$r = 0 ]; then ok "the second guest passes"; else not_ok "the second guest passes" "qemu/run exited \$r"; fi
SUITE
run_harness sibling '^not ok - sibling: the second guest passes$' '1 passed, 1 failed' \
	"tests/run counts a sibling guest's splat in a suite where another guest timed out"
# The end of the output (all a CI log shown by its head and tail may keep) says it again: the
# failure, and the head of the splat qemu/run reported.
tail -n 24 "$work/sibling.out" >"$work/sibling.tail"
if grep -qx '# what failed (1):' "$work/sibling.tail" && grep -qx '#   sibling: the second guest passes' "$work/sibling.tail" &&
	grep -q '^#   sibling: qemu/run: kernel splat' "$work/sibling.tail" && grep -q '^#   sibling: .*WARNING:' "$work/sibling.tail"; then
	ok "the end of tests/run's output names each failure and the head of the splat behind it"
else
	not_ok "the end of tests/run's output names each failure and the head of the splat behind it" "$(cat "$work/sibling.out")"
fi

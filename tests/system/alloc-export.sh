#!/usr/bin/env bash
# PEERDIRECT_IOC_ALLOC, FREE and EXPORT: their ABI rules and dma-bufs from the guest
# (peerdirect-guest-tests --alloc-export) and the `peerdirect alloc|export|stats` commands, in
# one boot with a kmemleak scan after; then data through a dma-buf checked on the host, both
# ways, in the HBM backing file.
# Plan: this script's own 8 checks (2 of data through dma-bufs, 6 of the commands), declared
# first; peerdirect-guest-tests --alloc-export declares its own. Exits non-zero if anything failed.
. "$(dirname "$0")/../lib.sh"
plan 8
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# fail DESCRIPTION [DIAGNOSTIC...]: not_ok, remembered for the exit status
fail() { failed=1; not_ok "$@"; }

# pattern fill FILE SEED | check FILE OFFSET LENGTH SEED | zero FILE OFFSET LENGTH (tests/hbm-pattern)
pattern() { "$ROOT/tests/hbm-pattern" "$@"; }

# (a) The guest's own tests, passed through with their plan (guest_tap), and in the same boot
# (c) the commands: alloc, export of a sub-range, a failed --verify, stats; results land in
# the shared folder, checked below.
cat >"$work/cmds.sh" <<'EOF'
cd /mnt/host
peerdirect alloc --size 5000 --align 4K --json >alloc.json
echo $? >alloc.rc
peerdirect alloc --size 0 >size0.err 2>&1
echo $? >size0.rc
peerdirect alloc --size 1T >sizebig.err 2>&1
echo $? >sizebig.rc
peerdirect alloc --size 4K --align 3K >align.err 2>&1
echo $? >align.rc
peerdirect export --size 1M --offset 256K --length 128K --pattern 7 --verify 7 --json >sub.json
echo $? >sub.rc
peerdirect export --size 1M --verify 0x5eed0003 --json >mismatch.json 2>mismatch.err
echo $? >mismatch.rc
peerdirect stats --json >stats.json
echo $? >stats.rc
peerdirect export --size 2M --hold 3 >/dev/null &
holder=$!
sleep 1
cat /sys/kernel/debug/peerdirect/peerdirect0/allocations >held.txt
echo "$holder" >holder.pid
wait
EOF
guest_tap "peerdirect-guest-tests --alloc-export and the commands" 1 --kmemleak --share "$work" -- \
	"${guest_each[@]}" "peerdirect-guest-tests --alloc-export" "sh /mnt/host/cmds.sh"
rc=$?

# (b) Data both ways through dma-bufs, checked in the HBM backing file, in one boot. Host to
# guest: the host fills all of HBM with a pattern before boot; the first allocation (default
# alignment) lands at offset 0 and reads it through a dma-buf of all of HBM. Then guest to host:
# a pattern written through a dma-buf's mapping is in the backing file at the hbm_offset the
# command reports, and nothing outside the exported range changed.
host_seed=0x5eed0002 guest_seed=0x5eed0001
truncate -s 64M "$work/hbm"
pattern fill "$work/hbm" $host_seed
cp "$work/hbm" "$work/hbm.before"
guest --hbm 64M --hbm-backing "$work/hbm" --share "$work" -- sh -c "
	peerdirect export --size 64M --verify $host_seed --json >/mnt/host/verify.json 2>/mnt/host/verify.err
	peerdirect export --size 4M --pattern $guest_seed --json >/mnt/host/pattern.json 2>/mnt/host/pattern.err" 2>"$work/err"
r=$?
desc="export --verify: a pattern the host wrote over the 64 MiB backing file reads back in the guest through a dma-buf of all of HBM at hbm_offset 0"
if [ $r = 0 ] && jq -e '.allocation.hbm_offset == 0 and .export.hbm_offset == 0
	and .verify.bytes_verified == 67108864 and .verify.mismatch == null' "$work/verify.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "qemu/run exited $r" "$(cat "$work/verify.json" "$work/verify.err" "$work/err" 2>&1)"
fi
desc="export --pattern: the 4 MiB written through the dma-buf are in the HBM backing file at the reported hbm_offset, and the rest of HBM is as the host wrote it"
out=$(cat "$work/pattern.json" "$work/pattern.err" "$work/err" 2>&1)
if [ $r != 0 ]; then
	fail "$desc" "qemu/run exited $r" "$out"
elif ! read -r offset length written < <(jq -er '[.export.hbm_offset, .export.length, .pattern.bytes_written] | select(all(.[]; type == "number")) | @tsv' "$work/pattern.json" 2>/dev/null); then
	fail "$desc" "no export.hbm_offset, export.length and pattern.bytes_written in the output:" "$out"
elif [ "$length" != 4194304 ] || [ "$written" != 4194304 ]; then
	fail "$desc" "expected export.length and pattern.bytes_written 4194304, got $length and $written" "$out"
elif ! diag=$(pattern check "$work/hbm" "$offset" "$length" $guest_seed 2>&1); then
	fail "$desc" "$diag" "$out"
elif ! cmp -s <(head -c "$offset" "$work/hbm") <(head -c "$offset" "$work/hbm.before") ||
	! cmp -s <(tail -c +$((offset + length + 1)) "$work/hbm") <(tail -c +$((offset + length + 1)) "$work/hbm.before"); then
	fail "$desc" "bytes outside [$offset, $((offset + length))) changed" "$out"
else
	ok "$desc"
fi

# (c) What the commands left in the shared folder.
rc_of() { cat "$work/$1.rc" 2>/dev/null || echo none; }
show() { echo "exit status $(rc_of "$1"):"; cat "$work/$1.json" "$work/$1.err" 2>/dev/null; }

desc="alloc --size 5000 --align 4K --json: 8192 bytes at a 4 KiB-aligned hbm_offset, a nonzero handle"
if [ "$(rc_of alloc)" = 0 ] && jq -e '.length == 8192 and .hbm_offset % 4096 == 0 and .handle > 0
	and .device == "/dev/peerdirect0"' "$work/alloc.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(show alloc)"
fi

desc="alloc --size 0 and --size 1T: exit 1 saying to ask for 1 byte to the device's HBM (its size named); --align 3K: a usage error (exit 2) saying an alignment is a power of two of at least 4K"
if [ "$(rc_of size0)" = 1 ] && grep -q '^peerdirect: --size 0 B: ask for 1 byte to the [0-9.]* [KMGT]iB of HBM /dev/peerdirect0 has$' "$work/size0.err" &&
	[ "$(rc_of sizebig)" = 1 ] && grep -q '^peerdirect: --size 1 TiB: ask for 1 byte to the ' "$work/sizebig.err" &&
	[ "$(rc_of align)" = 2 ] && grep -q '"3K": an alignment is a power of two of at least 4K (4096)' "$work/align.err"; then
	ok "$desc"
else
	fail "$desc" "$(cat "$work/size0.err" "$work/sizebig.err" "$work/align.err" 2>/dev/null)"
fi

desc="export --offset 256K --length 128K: the sub-range at the allocation's hbm_offset + 256 KiB, read-write, pattern written and verified"
if [ "$(rc_of sub)" = 0 ] && jq -e '.allocation.length == 1048576 and .export.offset == 262144
	and .export.length == 131072 and .export.hbm_offset == .allocation.hbm_offset + 262144
	and .export.writable and .export.fd >= 0 and .pattern.bytes_written == 131072
	and .verify.bytes_verified == 131072 and .verify.mismatch == null' "$work/sub.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(show sub)"
fi

desc="debugfs allocations lists a held allocation with its owner's pid"
holder=$(cat "$work/holder.pid" 2>/dev/null)
if [ -n "$holder" ] && grep -q "length=0x200000 pid=$holder\$" "$work/held.txt" 2>/dev/null; then
	ok "$desc"
else
	fail "$desc" "holder pid: ${holder:-none}" "$(cat "$work/held.txt" 2>/dev/null)"
fi

desc="export --verify of a pattern that is not in HBM exits 3 and reports the first mismatching byte"
if [ "$(rc_of mismatch)" = 3 ] && jq -e '.export.writable == false and .verify.mismatch.offset >= 0
	and .verify.bytes_verified == .verify.mismatch.offset' "$work/mismatch.json" >/dev/null 2>&1 &&
	grep -q 'does not hold the pattern' "$work/mismatch.err"; then
	ok "$desc"
else
	fail "$desc" "$(show mismatch)"
fi

desc="stats --json after the commands: peerdirect0 with allocations 0, allocated_bytes 0, exports 0"
if [ "$(rc_of stats)" = 0 ] && jq -e 'length == 1 and .[0].path == "/dev/peerdirect0"
	and .[0].allocations == 0 and .[0].allocated_bytes == 0 and .[0].exports == 0
	and .[0].hbm_bytes == 268435456' "$work/stats.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(show stats)"
fi

[ $rc = 0 ] && [ $failed = 0 ]

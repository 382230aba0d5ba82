#!/usr/bin/env bash
# PEERDIRECT_IOC_ALLOC, FREE and EXPORT: their ABI rules and dma-bufs from the guest
# (peerdirect-guest-tests --alloc-export, kmemleak scan after), then data through a dma-buf
# checked on the host, both ways, in the HBM backing file; and the `peerdirect alloc|export|stats`
# commands.
# TAP with the plan at the end; exits non-zero if anything failed.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# fail DESCRIPTION [DIAGNOSTIC...]: not_ok, remembered for the exit status
fail() { failed=1; not_ok "$@"; }

# pattern fill FILE SEED | check FILE OFFSET LENGTH SEED | zero FILE OFFSET LENGTH
# The test pattern of `peerdirect export --pattern` (peerdirect::pattern), recomputed here
# independently: byte o is byte o % 8 of the little-endian word o / 8, and word i is output i
# of SplitMix64 seeded with SEED. `fill` writes it over all of FILE; `check` compares FILE's
# bytes OFFSET..OFFSET+LENGTH with pattern bytes 0..LENGTH; `zero` checks that those bytes are
# zero. Prints the first mismatch and fails on one.
pattern() {
	python3 - "$@" <<'PY'
import os, struct, sys

M = (1 << 64) - 1
CHUNK = 1 << 20

def pattern(seed, start, length):
    """Pattern bytes start..start+length; both multiples of 8."""
    words = []
    for i in range(start // 8, (start + length) // 8):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        words.append(z ^ (z >> 31))
    return struct.pack("<%dQ" % len(words), *words)

def compare(path, offset, length, expect):
    with open(path, "rb") as f:
        f.seek(offset)
        for start in range(0, length, CHUNK):
            n = min(CHUNK, length - start)
            got, want = f.read(n), expect(start, n)
            if got != want:
                k = next((k for k in range(min(len(got), n)) if got[k] != want[k]), len(got))
                found = "end of file" if k >= len(got) else "%#04x" % got[k]
                sys.exit("byte %#x of the file (range byte %#x): expected %#04x, found %s"
                         % (offset + start + k, start + k, want[k], found))

cmd, path = sys.argv[1], sys.argv[2]
args = [int(a, 0) for a in sys.argv[3:]]
if cmd == "fill":
    (seed,) = args
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for start in range(0, size, CHUNK):
            f.write(pattern(seed, start, min(CHUNK, size - start)))
elif cmd == "check":
    offset, length, seed = args
    compare(path, offset, length, lambda start, n: pattern(seed, start, n))
elif cmd == "zero":
    offset, length = args
    compare(path, offset, length, lambda start, n: bytes(n))
else:
    sys.exit("pattern: unknown command " + cmd)
PY
}

# (a) The guest's own tests, passed through without their plan (it comes at the end).
guest --kmemleak -- peerdirect-guest-tests --alloc-export >"$work/tap" 2>"$work/err"
rc=$?
grep -v '^1\.\.[0-9]*$' "$work/tap"
tap_n=$(grep -cE '^(not )?ok ' "$work/tap")
mapfile -t err <"$work/err"
if [ $rc != 0 ] && ! grep -q '^not ok ' "$work/tap"; then
	fail "peerdirect-guest-tests --alloc-export ends cleanly" \
		"qemu/run exited $rc (99: kernel splat, 98: guest died, 124: timeout)" "${err[@]}"
elif [ -s "$work/err" ]; then
	sed 's/^/# /' "$work/err"
fi

# (b) Guest to host: a pattern written through a dma-buf's mapping is in the backing file at
# the hbm_offset the command reports, and nothing beyond the exported range changed.
seed=0x5eed0001
desc="export --pattern: the 4 MiB written through the dma-buf are in the HBM backing file at the reported hbm_offset, and the next 4 MiB are untouched"
out=$(guest --hbm 64M --hbm-backing "$work/hbm" -- peerdirect export --size 4M --pattern $seed --json 2>&1)
r=$?
if [ $r != 0 ]; then
	fail "$desc" "qemu/run exited $r" "$out"
elif ! read -r offset length written < <(jq -er '[.export.hbm_offset, .export.length, .pattern.bytes_written] | select(all(.[]; type == "number")) | @tsv' <<<"$out" 2>/dev/null); then
	fail "$desc" "no export.hbm_offset, export.length and pattern.bytes_written in the output:" "$out"
elif [ "$length" != 4194304 ] || [ "$written" != 4194304 ]; then
	fail "$desc" "expected export.length and pattern.bytes_written 4194304, got $length and $written" "$out"
elif ! diag=$(pattern check "$work/hbm" "$offset" "$length" $seed 2>&1); then
	fail "$desc" "$diag" "$out"
elif [ $((offset + 2 * length)) -le $((64 << 20)) ] && ! diag=$(pattern zero "$work/hbm" $((offset + length)) "$length" 2>&1); then
	fail "$desc" "past the exported range: $diag" "$out"
else
	ok "$desc"
fi

# (b) Host to guest: the host fills all of HBM with a pattern before boot; the first
# allocation (default alignment) lands at offset 0 and reads the pattern through a dma-buf.
seed=0x5eed0002
desc="export --verify: a pattern the host wrote over the 64 MiB backing file reads back in the guest through a dma-buf of all of HBM at hbm_offset 0"
rm -f "$work/hbm"
truncate -s 64M "$work/hbm"
pattern fill "$work/hbm" $seed
out=$(guest --hbm 64M --hbm-backing "$work/hbm" -- peerdirect export --size 64M --verify $seed --json 2>&1)
r=$?
if [ $r = 0 ] && jq -e '.allocation.hbm_offset == 0 and .export.hbm_offset == 0
	and .verify.bytes_verified == 67108864 and .verify.mismatch == null' <<<"$out" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "qemu/run exited $r" "$out"
fi

# (c) The commands: alloc, export of a sub-range, a failed --verify, stats; results land in
# the shared folder.
cat >"$work/cmds.sh" <<'EOF'
cd /mnt/host
peerdirect alloc --size 5000 --align 4K --json >alloc.json
echo $? >alloc.rc
peerdirect export --size 1M --offset 256K --length 128K --pattern 7 --verify 7 --json >sub.json
echo $? >sub.rc
peerdirect export --size 1M --verify 0x5eed0003 --json >mismatch.json 2>mismatch.err
echo $? >mismatch.rc
peerdirect stats --json >stats.json
echo $? >stats.rc
EOF
out=$(guest --share "$work" -- sh /mnt/host/cmds.sh 2>&1)
r=$?
rc_of() { cat "$work/$1.rc" 2>/dev/null || echo none; }
show() { echo "exit status $(rc_of "$1"):"; cat "$work/$1.json" "$work/$1.err" 2>/dev/null; }
[ $r = 0 ] || fail "the guest runs the peerdirect commands" "qemu/run exited $r" "$out"

desc="alloc --size 5000 --align 4K --json: 8192 bytes at a 4 KiB-aligned hbm_offset, a nonzero handle"
if [ "$(rc_of alloc)" = 0 ] && jq -e '.length == 8192 and .hbm_offset % 4096 == 0 and .handle > 0
	and .device == "/dev/peerdirect0"' "$work/alloc.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(show alloc)"
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

echo "1..$tap_n"
[ $rc = 0 ] && [ $failed = 0 ]

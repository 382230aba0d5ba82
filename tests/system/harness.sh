#!/usr/bin/env bash
# The QEMU harness itself: exit status, shared folder, HBM backing file, and that it catches
# a kernel splat (a test-only module provokes a WARN; this passes when the run is failed).
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "1..4"

guest -- sh -c 'exit 7' >/dev/null 2>&1
rc=$?
if [ $rc = 7 ]; then ok "qemu/run exits with the command's status"; else not_ok "qemu/run exits with the command's status" "expected 7, got $rc"; fi

echo "from the host $RANDOM" > "$work/in"
out=$(guest --share "$work" -- sh -c 'cat /mnt/host/in; cp /mnt/host/in /mnt/host/out; echo guest-was-here >> /mnt/host/out' 2>&1)
if [ "$out" = "$(cat "$work/in")" ] && [ "$(tail -1 "$work/out" 2>/dev/null)" = guest-was-here ]; then
	ok "--share DIR is /mnt/host in the guest, both ways"
else
	not_ok "--share DIR is /mnt/host in the guest, both ways" "guest printed: $out"
fi

out=$(guest --hbm 64M --hbm-backing "$work/hbm" -- peerdirect devices --json 2>&1)
size=$(stat -c %s "$work/hbm" 2>/dev/null)
if [ "$size" = 67108864 ] && jq -e '.[0].hbm_bytes == 67108864' <<<"$out" >/dev/null 2>&1; then
	ok "--hbm-backing FILE backs the 64 MiB HBM BAR"
else
	not_ok "--hbm-backing FILE backs the 64 MiB HBM BAR" "backing size ${size:-none}" "$out"
fi

out=$(guest -- insmod /lib/peerdirect/tests/peerdirect_splat_selftest.ko 2>&1)
rc=$?
if [ $rc = 99 ] && grep -q 'kernel splat' <<<"$out" && grep -q 'WARNING:' <<<"$out"; then
	ok "a WARN in the guest fails the run (exit 99, splat shown)"
else
	not_ok "a WARN in the guest fails the run (exit 99, splat shown)" "qemu/run exited $rc" "$out"
fi

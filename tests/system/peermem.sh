#!/usr/bin/env bash
# Contract test of the PeerDirect peer-memory client (peerdirect_peermem.ko, kmod/peermem/): the
# test-only module peerdirect_peermem_core.ko stands in for an MLNX_OFED ib_core's peer-memory
# API (upstream ib_core has none) and exports it with plain EXPORT_SYMBOL, as MLNX_OFED does;
# the client is linked against it and drives through register / DMA-map / invalidate (unbind)
# / release; in the split topology dma_map must be refused. Then, without that core,
# peerdirect must load and work as usual while the client cannot load (its API is missing).
. "$(dirname "$0")/../lib.sh"

# Plan: 1 check of this script's own; peerdirect-guest-tests --peermem declares its own, per
# topology (a guest run that does not end cleanly adds a failure: guest_tap).
plan 1
rcs=()
for topology in switch split; do
	echo "# topology $topology"
	guest_tap "topology $topology" 1 --no-bind --topology "$topology" -- peerdirect-guest-tests --peermem "$topology"
	rcs+=($?)
done
rc=$(worst "${rcs[@]}")

echo "# no peer-memory API (upstream ib_core): peerdirect loads unchanged, the client does not load"
out=$(guest -- sh -c 'test -e /dev/peerdirect0 || exit 3
insmod /lib/peerdirect/peerdirect_peermem.ko 2>/dev/null && exit 4
dmesg | grep -q "peerdirect_peermem: Unknown symbol ib_register_peer_memory_client" || exit 5
peerdirect export --size 2M --json >/dev/null || exit 6
test ! -e /sys/module/peerdirect_peermem' 2>&1)
r=$?
desc="without the API, peerdirect binds and exports as usual, and peerdirect_peermem.ko refuses to load (unknown symbol ib_register_peer_memory_client)"
if [ $r = 0 ]; then
	ok "$desc"
elif [ $r -ge 1 ] && [ $r -le 6 ]; then
	not_ok "$desc" "step $r failed (3: no device, 4: the client loaded, 5: no unknown-symbol message, 6: export failed)" "$out"
	rc=$(worst "$rc" 1)
else
	not_ok "$desc" "qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" "$out"
	rc=$(worst "$rc" "$r")
fi
exit $rc

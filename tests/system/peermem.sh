#!/usr/bin/env bash
# Contract test of the PeerDirect peer-memory client (kmod/peer_mem.c): the test-only module
# peerdirect_peermem_core.ko stands in for an MLNX_OFED ib_core's peer-memory API (upstream
# ib_core has none) and drives the client through register / DMA-map / invalidate (unbind) /
# release; in the split topology dma_map must be refused. Then, without that module, peerdirect
# must load as usual and say it registered no client.
. "$(dirname "$0")/../lib.sh"

rc=0
status() { # status DESCRIPTION EXIT
	case $2 in
	0) ;;
	1) rc=1 ;; # failed tests, reported above
	*) rc=$2; not_ok "$1: the guest run ends cleanly" "qemu/run exited $2 (99: kernel splat, 98: guest died, 124: timeout)" ;;
	esac
}

for topology in switch split; do
	echo "# topology $topology"
	guest --no-bind --topology "$topology" -- peerdirect-guest-tests --peermem "$topology"
	status "topology $topology" $?
done

echo "# no peer-memory API (upstream ib_core): peerdirect loads unchanged"
out=$(guest -- sh -c 'test -e /dev/peerdirect0 && dmesg | grep -c "offers no PeerDirect peer-memory API"' 2>&1)
r=$?
if [ $r = 0 ]; then
	ok "without the API, peerdirect binds and logs that it registered no peer-memory client"
elif [ $r = 1 ]; then
	not_ok "without the API, peerdirect binds and logs that it registered no peer-memory client" "$out"
	rc=1
else
	status "no peer-memory API" $r
	echo "$out" | sed 's/^/#   /'
fi
exit $rc

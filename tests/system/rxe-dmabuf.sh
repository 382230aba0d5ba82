#!/usr/bin/env bash
# HBM through HCL's own path, end to end: ibv_reg_dmabuf_mr of peerdirect dma-bufs, ib_uverbs,
# ib_core's umem_dmabuf and an RDMA device's data path. The RDMA device is soft-RoCE with the
# test kernel's qemu/patches/0002-rxe-dmabuf-mr.patch (rxe registers dma-bufs and copies
# through the exporter's kernel mapping, vmap, where a NIC's DMA engine would read and write
# the BAR) and rdma-core's rxe provider with qemu/rdma-core's patch (scripts/build-rxe-provider),
# bound over the userland's own in the guest. tests/rxe_dmabuf.c, built with the userland's gcc,
# does the verbs work.
#
# On the test kernel, one boot: first with Debian's provider, whose missing reg_dmabuf_mr
# refuses (EOPNOTSUPP, the control: it is the patched provider that registers); then with the
# patched one, three 4 MiB ranges of HBM (A with a pattern, B and C zeroed) registered, an RDMA
# WRITE of A into B and an RDMA READ of A into C between two RC queue pairs of rxe0 (one rxe
# device; the two pairs loop back inside it: what moves the bytes is rxe's requester and
# responder, each copying to or from HBM), both checked in the guest and, on the host, in the
# HBM backing file with an independent implementation of the pattern; remote atomic access is
# granted on a dma-buf MR (libfabric's verbs provider asks it with every remote write) but an
# atomic into it ends in a remote access error (rxe's atomics work on pages); then the HBM device is
# unbound while they are registered, and copies out of and into the revoked HBM must fail with
# error completions. Then revocation during transfers: rounds (6; 4 on KASAN) in which the
# device is bound, two ranges registered, a thread streams 64 KiB RDMA WRITEs (READs in odd
# rounds) between them and the device is unbound a few milliseconds in: the unbind returns,
# the stream ends in an error completion, every posted request completes and everything is
# released (kmemleak scans afterwards). The same transfers, revocation and rounds again on the
# KASAN flavour of the test kernel (patched alike), so that KASAN and kmemleak watch rxe's
# copies through the exporter's kernel mapping and its teardown at revocation, also while
# copies are in flight.
#
# Two hosts, on the test kernel and again on KASAN: two guests whose NICs are linked (qemu/run
# --link), rxe0 on each with the patched provider. Each registers three 4 MiB ranges of its own
# HBM, RDMA WRITEs its pattern into the other's and RDMA READs the other's (two rxe devices,
# each one's requester and the other's responder moving the bytes between the two HBMs across
# the link); both check in the guest, and the host checks both HBM backing files. Then node 1
# streams RDMA READs out of node 0's HBM and node 0 unbinds its HBM device in the middle: the
# unbind returns and node 1's stream ends in an error completion (node 0's rxe answers with a
# remote access error and moves its queue pair to the error state), every request completed.
# On the test kernel the link runs through tests/lossy-link, which drops node 0's NAKs while
# node 1 streams, as a lossy Ethernet fabric may: node 0's queue pair, in the error state,
# answers nothing more, and node 1's stream must end in retries exceeded, not a stall (its
# queue pairs retry 6 times: rxe retries forever at 7). Then the same through libfabric, as HCL
# moves bytes (`peerdirect-guest-tests --fabric-peer`, node 0's device bound again first): each
# registers three more ranges through the crate's RegCache and LibfabricRegistrar on
# verbs;ofi_rxm, every one FI_MR_DMABUF with host bounce disallowed, exchanges its endpoint's
# address and the RMA addresses and keys over TCP, fi_writes its pattern into the other's HBM
# and fi_reads the other's (both checked in the guests and in both backing files); then node 1
# streams 1 MiB fi_reads out of node 0's HBM while node 0 unbinds: the unbind returns within
# 10 s and node 1's stream ends in an fi_read completion error (ofi_rxm reports rxe's remote
# access error as FI_EIO; FI_LOG_LEVEL=warn puts its line in the log), not a stall, every read
# accounted for; everything closes and node 0's device rebinds idle.
#
# On Debian's stock kernel (no patch), the same registration with the patched provider fails
# with EOPNOTSUPP: the kernel's rxe has no reg_user_mr_dmabuf.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
# The lossy link's relay, while it runs: it goes with the suite, however that ends.
relay=
trap '[ -z "$relay" ] || kill "$relay" 2>/dev/null; rm -rf "$work"' EXIT
# Plan: the builds (1), the backing file (2, and 2 of the dynamic import's run), the two
# hosts' backing files (8 on each kernel: rxe_dmabuf peer's B and C and the libfabric run's,
# on both hosts), the lossy link's dropped NAK (1); the guest programs print their own plans.
plan 22
failed=0
fail() { failed=1; not_ok "$@"; }

cp "$ROOT/tests/rxe_dmabuf.c" "$ROOT/include/uapi/peerdirect.h" "$work/"
desc="rdma-core's rxe provider with qemu/rdma-core's patch (scripts/build-rxe-provider) and tests/rxe_dmabuf.c (trixie's gcc, libibverbs) build"
if provider=$("$ROOT/scripts/build-rxe-provider" 2>"$work/provider.err") &&
	cp "$provider" "$work/" &&
	out=$(in_trixie "$work" "gcc -O2 -Wall -Wextra -Werror -o rxe_dmabuf rxe_dmabuf.c -libverbs -pthread" 2>&1); then
	ok "$desc"
else
	fail "$desc" "$(cat "$work/provider.err")" "${out:-}"
	exit 1
fi
lib=${provider##*/}

# The guest binds the patched provider over the userland's (read-only, shared) one.
# transfer.sh [dynamic]: the first run finds the device bound and notes its address; later
# runs bind it again (the runs before leave it unbound).
cat >"$work/transfer.sh" <<EOF
set -e
mount --bind /mnt/host/$lib /usr/lib/x86_64-linux-gnu/libibverbs/$lib
[ -s /mnt/host/pci ] || basename "\$(ls -d /sys/bus/pci/drivers/peerdirect/0000:*)" >/mnt/host/pci
exec /mnt/host/rxe_dmabuf transfer /mnt/host "\$(cat /mnt/host/pci)" \$1
EOF
# race.sh ROUNDS [dynamic]: revocation during transfers (transfer.sh leaves the device
# unbound: each round binds it first).
cat >"$work/race.sh" <<EOF
set -e
mount --bind /mnt/host/$lib /usr/lib/x86_64-linux-gnu/libibverbs/$lib
exec /mnt/host/rxe_dmabuf race "\$(cat /mnt/host/pci)" "\$1" \$2
EOF
cat >"$work/refused.sh" <<EOF
set -e
mount --bind /mnt/host/$lib /usr/lib/x86_64-linux-gnu/libibverbs/$lib
exec /mnt/host/rxe_dmabuf refused /mnt/host "patched provider"
EOF

truncate -s 64M "$work/hbm"
tap_prefix="test kernel: " guest_tap "" 5 --rxe --hbm 64M --hbm-backing "$work/hbm" \
	--share "$work" --kmemleak --timeout 300 -- "${guest_each[@]}" \
	"/mnt/host/rxe_dmabuf refused /mnt/host \"Debian's provider\"" "sh /mnt/host/transfer.sh" \
	"sh /mnt/host/race.sh 6" "sh /mnt/host/race.sh 4 dynamic" "sh /mnt/host/transfer.sh dynamic" \
	2>"$work/err" || failed=1

# check_range WHICH OFFSETS: the backing file, read on the host: B (1) or C (2) holds A's
# pattern (the same function as rxe_dmabuf.c's, written again here), at the offsets in OFFSETS.
check_range() {
	python3 - "$work/hbm" "$2" "$1" <<'EOF'
import struct, sys
hbm, offsets, which = sys.argv[1], sys.argv[2], int(sys.argv[3])
a, b, c, seed, length = (int(x) for x in open(offsets).read().split())
off = (a, b, c)[which]
M = 0xffffffff
def pattern(i):
    x = seed ^ ((i * 0x9e3779b1) & M)
    x ^= x >> 16
    x = (x * 0x85ebca6b) & M
    x ^= x >> 13
    return x
with open(hbm, "rb") as f:
    f.seek(off)
    data = f.read(length)
words = struct.unpack("<%dI" % (length // 4), data)
for i, w in enumerate(words):
    if w != pattern(i):
        sys.exit("word %d at hbm_offset %#x: %#010x, expected %#010x" % (i, off, w, pattern(i)))
EOF
}
for offsets in offsets offsets-dynamic; do
	for which in 1 2; do
		name=$([ $which = 1 ] && echo "B (the RDMA WRITE's target)" || echo "C (the RDMA READ's target)")
		desc="on the host, the HBM backing file holds A's pattern at $name's hbm_offset"
		[ $offsets = offsets ] || desc="$desc (the dynamic import's run)"
		diag=
		if [ -s "$work/$offsets" ] && diag=$(check_range $which "$work/$offsets" 2>&1); then
			ok "$desc"
		else
			fail "$desc" "${diag:-no offsets from the guest}" "$(tail -20 "$work/err")"
		fi
	done
done

# two_hosts LABEL KERNEL TIMEOUT [lossy]: two guests on KERNEL, their NICs linked (qemu/run --link),
# rxe0 on each with the patched provider (--rxe-dmabuf); `rxe_dmabuf peer` in both, side by
# side: each RDMA WRITEs its pattern into the other's HBM and RDMA READs the other's, then node
# 1 streams READs out of node 0's HBM while node 0 unbinds its device; then node 0's device is
# bound again and `peerdirect-guest-tests --fabric-peer` does the same through libfabric
# (verbs;ofi_rxm: fi_write, fi_read, and fi_reads streamed during the unbind). Each guest's TAPs
# go to its share; the host then checks both backing files (8 checks). With lossy, the link
# runs through tests/lossy-link, and node 1 has it drop node 0's NAKs while it streams: the
# stream must end in retries exceeded, not a stall, and the host checks that the relay dropped
# a NAK (1 check more).
two_hosts() {
	local label=$1 kernel=$2 timeout=$3 lossy=${4:-} dir=$work/$2 port0 port1 to0 to1 pid0 pid1 rc0=0 rc1=0 rc node range
	local what desc offset length seed diag tap lose_nak=
	# Both guests boot side by side: what they need is built once, first.
	[ "${PEERDIRECT_PREBUILT:-0}" = 1 ] || make -s -C "$ROOT" "guest-$kernel" >&2
	read -r port0 port1 < <("$ROOT/scripts/free-udp-ports" 2)
	to0=$port1 to1=$port0
	mkdir -p "$dir/node1"
	if [ "$lossy" = lossy ]; then
		coproc LOSSY { exec "$ROOT/tests/lossy-link" "$port0" "$port1" "$dir/node1/lose-naks" "$dir/naks-dropped"; }
		relay=$LOSSY_PID lose_nak=lose-nak
		read -r to0 to1 <&"${LOSSY[0]}"
	fi
	for node in 0 1; do
		mkdir -p "$dir/node$node"
		cp "$work/rxe_dmabuf" "$dir/node$node/"
		truncate -s 64M "$dir/hbm$node"
		# rxe_dmabuf peer leaves node 0's device unbound: bound again for the libfabric run.
		cat >"$dir/node$node/run.sh" <<EOF
pci=\$(basename "\$(ls -d /sys/bus/pci/drivers/peerdirect/0000:*)")
/mnt/host/rxe_dmabuf peer "\$pci" $node 10.0.9.$((2 - node)) $([ $node = 0 ] || echo $lose_nak) >/mnt/host/tap 2>&1
verbs=\$?
[ -e /sys/bus/pci/drivers/peerdirect/\$pci ] || echo "\$pci" >/sys/bus/pci/drivers/peerdirect/bind
i=0
while [ ! -e /dev/peerdirect0 ] && [ \$i -lt 10 ]; do sleep 1; i=\$((i + 1)); done
FI_LOG_LEVEL=warn peerdirect-guest-tests --fabric-peer $node 10.0.9.$((2 - node)) >/mnt/host/fabric-tap 2>&1
fabric=\$?
case \$verbs.\$fabric in 0.0) exit 0 ;; [01].[01]) exit 1 ;; 0.*|1.*) exit \$fabric ;; *) exit \$verbs ;; esac
EOF
	done
	PEERDIRECT_PREBUILT=1 guest --kernel "$kernel" --rxe-dmabuf --link "$port0:$to0" --addr 10.0.9.1/24 --name node0 \
		--hbm 64M --hbm-backing "$dir/hbm0" --share "$dir/node0" --kmemleak --timeout "$timeout" -- \
		sh /mnt/host/run.sh >"$dir/node0.log" 2>&1 &
	pid0=$!
	PEERDIRECT_PREBUILT=1 guest --kernel "$kernel" --rxe-dmabuf --link "$port1:$to1" --addr 10.0.9.2/24 --name node1 \
		--hbm 64M --hbm-backing "$dir/hbm1" --share "$dir/node1" --kmemleak --timeout "$timeout" -- \
		sh /mnt/host/run.sh >"$dir/node1.log" 2>&1 &
	pid1=$!
	wait $pid0 || rc0=$?
	wait $pid1 || rc1=$?
	if [ -n "$relay" ]; then
		kill "$relay" 2>/dev/null || true
		wait "$relay" 2>/dev/null || true
		relay=
		desc="$label on the host: the link dropped node 0's NAK on its way to node 1 while node 1 streamed"
		if [ "$(cat "$dir/naks-dropped" 2>/dev/null || echo 0)" -gt 0 ]; then
			ok "$desc"
		else
			fail "$desc" "tests/lossy-link dropped $(cat "$dir/naks-dropped" 2>/dev/null || echo none)"
		fi
	fi
	for node in 0 1; do
		rc=$([ $node = 0 ] && echo $rc0 || echo $rc1)
		grep -qE '^1\.\.[0-9]+$' "$dir/node$node/tap" 2>/dev/null ||
			fail "$label node$node: rxe_dmabuf peer reports its tests" "no TAP plan in its output" \
				"$(tail -20 "$dir/node$node.log")"
		relay "$label node$node: " <"$dir/node$node/tap" 2>/dev/null || failed=1
		grep -qE '^1\.\.[0-9]+$' "$dir/node$node/fabric-tap" 2>/dev/null ||
			fail "$label node$node: peerdirect-guest-tests --fabric-peer reports its tests" "no TAP plan in its output" \
				"$(tail -20 "$dir/node$node.log")"
		relay "$label node$node (libfabric): " <"$dir/node$node/fabric-tap" 2>/dev/null || failed=1
		case $rc in
		0) ;;
		1) failed=1 ;;
		*) fail "$label node$node: the guest run ends cleanly" \
			"qemu/run exited $rc (99: kernel splat, 98: guest died, 124: timeout)" "$(tail -20 "$dir/node$node.log")" ;;
		esac
	done
	# Each host's B (the peer's RDMA WRITE, then its fi_write) and C (its RDMA READ of the
	# peer's A, then its fi_read) hold the peer's pattern, read out of its backing file: the
	# libfabric run's ranges lie past rxe_dmabuf peer's (it allocates 12 MiB first).
	for node in 0 1; do
		for range in b c fabric-b fabric-c; do
			case $range in
			b) what="B (the peer's RDMA WRITE's target)" tap=tap ;;
			c) what="C (its RDMA READ of the peer's A)" tap=tap ;;
			fabric-b) what="the libfabric run's B (the peer's fi_write's target)" tap=fabric-tap ;;
			fabric-c) what="the libfabric run's C (its fi_read of the peer's A)" tap=fabric-tap ;;
			esac
			desc="$label on the host: node$node's HBM backing file holds node$((1 - node))'s pattern at $what"
			offset= length= seed= diag=
			read -r offset length seed < <(hbm_reported "$dir/node$node/$tap" "hbm-${range#fabric-}") || true
			if [ -n "$seed" ] && diag=$("$ROOT/tests/hbm-pattern" check "$dir/hbm$node" "$offset" "$length" "$seed" 2>&1); then
				ok "$desc"
			else
				fail "$desc" "reported: '$offset $length $seed'" "$diag"
			fi
		done
	done
}
two_hosts "two hosts (test kernel)," default 300 lossy

# The KASAN kernel: the same transfers and revocation, both ways of importing (the backing
# file is read above). Its first transfer notes the device's address anew.
rm -f "$work/pci"
tap_prefix="KASAN kernel: " guest_tap "" 4 --kernel kasan --rxe --hbm 64M \
	--share "$work" --kmemleak --timeout 900 -- "${guest_each[@]}" "sh /mnt/host/transfer.sh" \
	"sh /mnt/host/race.sh 4" "sh /mnt/host/race.sh 3 dynamic" "sh /mnt/host/transfer.sh dynamic" \
	2>>"$work/err" || failed=1
two_hosts "two hosts (KASAN kernel)," kasan 900

# Debian's stock kernel: its rxe has no reg_user_mr_dmabuf.
tap_prefix="Debian's kernel: " guest_tap "" 1 --kernel debian --rxe \
	--share "$work" --timeout 240 -- sh /mnt/host/refused.sh || failed=1
exit $failed

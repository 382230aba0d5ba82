#!/usr/bin/env bash
# ib_core importing peerdirect's dma-bufs with its own functions (tests/kmod/peerdirect_ibimport.c):
# EFA's pinned path (ib_umem_dmabuf_get_pinned_with_dma_device, rxe's ib_device, the NIC's PCI
# device), irdma's revocable pinned path and mlx5's dynamic path, for 64 MiB (2 MiB- and 64 MiB-
# aligned), 1, 3 and 5 GiB exports of an 8 GiB HBM in the switch topology, with the page size
# ib_umem_find_best_pgsz picks and the DMA blocks; imports held across an unbind of the HBM device.
# Then ibv_reg_dmabuf_mr on rxe0 through the crate's ibverbs registrar and cache
# (peerdirect-guest-tests --ibverbs), in each boot with what its rxe provider must do: in the same
# boot (qemu/run --rxe, Debian's provider) refused with EOPNOTSUPP, the documented error; in a
# second boot with the test kernel's patched rxe and provider (qemu/run --rxe-dmabuf, flag
# --rxe-dmabuf) registered, a cache hit on the second request, and the NIC under rxe0 attached to
# the export and pinned in peerdirect's debugfs while registered, gone after; then in that boot the
# HBM device goes while a RegCache holds verbs registrations of it (peerdirect-guest-tests
# --ibverbs-revoke): unbound, the unbind returns without waiting (rxe imports revocably) and the
# cache lets go by itself (its watcher: listener told, entry gone, ibv_dereg_mr witnessed in the
# dma-buf core's bufinfo), a new request fails with ENODEV naming the device; rounds of unbinds
# while two threads request and drop registrations (race); before those removals, an ofi_rxm
# endpoint closed while its provider holds a message for it that nobody asked for
# (peerdirect-guest-tests --fabric-close, glibc's heap perturbed): the program goes on (libfabric
# 2.1's ofi_rxm frees the connection's endpoint before it handles that message; the crate's endpoint
# reads its queue before closing); then unbound while libfabric's verbs;ofi_rxm streams fi_reads and
# tagged rendezvous messages between HBM buffers registered through the cache
# (peerdirect-guest-tests --fabric-revoke): the unbind returns, both streams end with an error
# within 15 s of it (the crate's TransferRevoked where ofi_rxm reports nothing), later transfers are
# refused at once, the cache lets go, a new registration fails with ENODEV naming the device, and
# what the stranded rendezvous keeps goes with the process (--idle after it); last a PCIe hot-unplug
# (--hotplug), the same as the unbind. The unbind, the race, the libfabric streams and the
# hot-unplug again on the KASAN kernel (fewer rounds; the endpoint closed with a message unread
# first), so that KASAN and kmemleak watch ib_core's and rxe's teardown of the revoked imports as
# the cache deregisters them. A fourth boot runs the libfabric streams on a companion (the HBM
# device owned by vfio-pci, the buffers ranges of its BAR) whose owner unbinds: the same ends, the
# companion gone once the unbind returned, and peerdirect unloads after the program exits; a fifth
# boot does the same on the KASAN kernel.
# Only the test kernels carry the patched rxe (qemu/patches/0002): on Debian's kernel
# (tests/system/debian-kernel.sh runs this suite with PEERDIRECT_KERNEL=debian) its rxe refuses
# dma-bufs whatever the provider (tests/system/rxe-dmabuf.sh checks that), so the boots after the
# first are the test kernels' only.
. "$(dirname "$0")/../lib.sh"

# Plan: the checks are peerdirect-guest-tests', with their own plans; none of this script's own.
failed=0
guest_tap "" 2 --topology switch --hbm 8G --mem 2G --rxe --kmemleak -- "${guest_each[@]}" \
	"peerdirect-guest-tests --ibimport" "peerdirect-guest-tests --ibverbs" || failed=1
if [ "${PEERDIRECT_KERNEL:-default}" != debian ]; then
	# glibc's heap perturbed, so that libfabric 2.1's use of a freed endpoint crashes.
	fabric_close="GLIBC_TUNABLES=glibc.malloc.perturb=165 peerdirect-guest-tests --fabric-close"
	guest_tap "" 7 --rxe-dmabuf --hotplug --kmemleak -- "${guest_each[@]}" \
		"peerdirect-guest-tests --ibverbs --rxe-dmabuf" "$fabric_close" \
		"peerdirect-guest-tests --ibverbs-revoke unbind" \
		"peerdirect-guest-tests --ibverbs-revoke race" "peerdirect-guest-tests --fabric-revoke" \
		"peerdirect-guest-tests --idle" "peerdirect-guest-tests --ibverbs-revoke unplug" ||
		failed=1
	tap_prefix="KASAN kernel: " guest_tap "" 6 --kernel kasan --rxe-dmabuf --hotplug --kmemleak --timeout 900 -- \
		"${guest_each[@]}" "$fabric_close" "peerdirect-guest-tests --ibverbs-revoke unbind" \
		"peerdirect-guest-tests --ibverbs-revoke race --rounds 3" \
		"peerdirect-guest-tests --fabric-revoke" "peerdirect-guest-tests --idle" \
		"peerdirect-guest-tests --ibverbs-revoke unplug" || failed=1
	# The HBM device (0000:03:00.0 in the switch topologies) bound to vfio-pci as its owner,
	# peerdirect loaded with companion=1 and the device named (Documentation/companion.md).
	companion='hbm=0000:03:00.0
echo vfio-pci >/sys/bus/pci/devices/$hbm/driver_override && echo $hbm >/sys/bus/pci/drivers_probe &&
insmod /usr/lib/peerdirect/peerdirect.ko companion=1 && peerdirect companion add $hbm --bar 2 >/dev/null'
	unload='echo 1..1
d="after the program exited, peerdirect unloads: nothing of the companion is left"
if out=$(rmmod peerdirect 2>&1); then echo "ok 1 - $d"; else echo "not ok 1 - $d"; echo "# $out"; fi'
	tap_prefix="companion: " guest_tap "" 2 --topology switch-iommu --no-bind --rxe-dmabuf --kmemleak -- \
		"${guest_each[@]}" "$companion" "peerdirect-guest-tests --fabric-revoke --companion" "$unload" ||
		failed=1
	tap_prefix="companion, KASAN kernel: " guest_tap "" 2 --kernel kasan --topology switch-iommu --no-bind \
		--rxe-dmabuf --kmemleak --timeout 900 -- "${guest_each[@]}" "$companion" \
		"peerdirect-guest-tests --fabric-revoke --companion" "$unload" || failed=1
fi
exit $failed

#!/usr/bin/env bash
# An RDMA NIC's view of peerdirect's dma-bufs: the test module peerdirect_importer.ko attaches
# them to the guest's NIC (dynamic, pinned, revocable; 2 MiB, 64 MiB, 1 GiB; behind the switch
# also 5 GiB with EFA's max segment) in each topology,
# and the result must agree with the kernel's P2P verdict (acs: refused because the root port
# redirects P2P; host-bridge: allowed through the host bridge and mapped through the IOMMU, one
# entry whatever the NIC's max segment; host-bridge-direct: the same without the IOMMU, mapped
# with dma_map_phys at the BAR's physical address, and unmapped at that address whatever the
# importer wrote in its sg table), as must PEERDIRECT_IOC_P2P about the NIC. Prints `# timing:`
# lines.
. "$(dirname "$0")/../lib.sh"

# Plan: the checks are peerdirect-guest-tests', one run per topology, each with its own plan;
# none of this script's own (a guest run that does not end cleanly adds a failure: guest_tap).
rcs=()
for topology in switch split iommu acs host-bridge host-bridge-direct; do
	echo "# topology $topology"
	# Behind the switch a BAR of 8 GiB: an export longer than the core's 4 GiB entries.
	hbm=2G
	[ $topology != switch ] || hbm=8G
	guest_tap "topology $topology" 1 --topology "$topology" --hbm $hbm -- \
		peerdirect-guest-tests --importer --topology "$topology"
	rcs+=($?)
done
exit "$(worst "${rcs[@]}")"

#!/usr/bin/env bash
# `peerdirect devices --json` in the guest reports the HBM device in every topology and size.
. "$(dirname "$0")/../lib.sh"

# devices_case TOPOLOGY HBM BYTES
devices_case() {
	local topo=$1 hbm=$2 bytes=$3 out rc
	out=$(guest --topology "$topo" --hbm "$hbm" -- peerdirect devices --json 2>&1)
	rc=$?
	local desc="topology $topo, --hbm $hbm: one device, BAR 2, hbm_bytes $bytes"
	if [ $rc != 0 ]; then
		not_ok "$desc" "qemu/run exited $rc" "$out"
		return
	fi
	if jq -e --argjson bytes "$bytes" '
		length == 1 and .[0].hbm_bytes == $bytes and .[0].bar_index == 2
		and (.[0].pci_address | test("^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$"))
		and .[0].vendor_id == 6900 and .[0].device_id == 4368 and .[0].path == "/dev/peerdirect0"
		and .[0].provider == "owned" and .[0].hbm_bus_addr > 0' <<<"$out" >/dev/null 2>&1; then
		ok "$desc"
	else
		not_ok "$desc" "$out"
	fi
}

echo "1..4"
devices_case switch 256M 268435456
devices_case switch 1G 1073741824
devices_case split 256M 268435456
devices_case iommu 256M 268435456

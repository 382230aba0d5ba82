#!/usr/bin/env bash
# `peerdirect devices --json` in the guest reports the HBM device in every topology and size;
# `peerdirect topo --json` reports the kernel's P2P verdict for the NIC in each topology, with
# the bridge where the paths meet checked against the guest's sysfs tree (its lowest common
# PCI ancestor, computed here), and a reason that says why not and what to do.
. "$(dirname "$0")/../lib.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/guest.sh" <<'EOS'
cd /mnt/host
peerdirect devices --json >devices.json 2>devices.err; echo $? >devices.rc
peerdirect topo --json >topo.json 2>topo.err; echo $? >topo.rc
for d in /sys/bus/pci/devices/*; do echo "${d##*/} $(readlink -f "$d")"; done >pci-paths
EOS

# lca A B: the lowest PCI function that is an ancestor of (or is) both A and B in pci-paths,
# or nothing when their paths meet only at the host bridge.
lca() {
	local a b
	a=$(awk -v d="$1" '$1 == d { print $2 }' "$work/pci-paths")
	b=$(awk -v d="$2" '$1 == d { print $2 }' "$work/pci-paths")
	[ -n "$a" ] && [ -n "$b" ] || return 1
	while [ "$a" != / ]; do
		case ${a##*/} in
		[0-9a-f][0-9a-f][0-9a-f][0-9a-f]:*)
			case $b/ in "$a"/*) echo "${a##*/}"; return 0 ;; esac ;;
		esac
		a=${a%/*}
		[ -n "$a" ] || a=/
	done
}

# devices_case TOPOLOGY HBM BYTES [P2P-EXPECTATION]
devices_case() {
	local topo=$1 hbm=$2 bytes=$3 expect=${4:-} out rc
	rm -f "$work"/*.json "$work"/*.rc "$work"/*.err "$work/pci-paths"
	out=$(guest --topology "$topo" --hbm "$hbm" --share "$work" -- sh /mnt/host/guest.sh 2>&1)
	rc=$?
	local desc="topology $topo, --hbm $hbm: one device, BAR 2, hbm_bytes $bytes"
	if [ $rc != 0 ] || [ "$(cat "$work/devices.rc" 2>/dev/null)" != 0 ]; then
		not_ok "$desc" "qemu/run exited $rc" "$out" "$(cat "$work/devices.err" 2>/dev/null)"
		[ -z "$expect" ] || not_ok "topology $topo: peerdirect topo --json" "not run"
		return
	fi
	if jq -e --argjson bytes "$bytes" '
		length == 1 and .[0].hbm_bytes == $bytes and .[0].bar_index == 2
		and (.[0].pci_address | test("^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]$"))
		and .[0].vendor_id == 6900 and .[0].device_id == 4368 and .[0].path == "/dev/peerdirect0"
		and .[0].provider == "owned" and .[0].hbm_bus_addr > 0' "$work/devices.json" >/dev/null 2>&1; then
		ok "$desc"
	else
		not_ok "$desc" "$(cat "$work/devices.json")"
	fi
	[ -n "$expect" ] || return 0

	local hbm_bdf nic_bdf common filter
	hbm_bdf=$(jq -r '.[0].pci_address' "$work/devices.json")
	# The NIC: virtio-net, 1af4:1000 (transitional) or 1af4:1041 (modern).
	nic_bdf=$(jq -r '.[0].peers[] | select(.vendor_id == 6900 and (.device_id == 4096 or .device_id == 4161)) | .pci_address' "$work/topo.json" 2>/dev/null)
	common=$(lca "$hbm_bdf" "$nic_bdf")
	case $expect in
	bus_address) filter='.p2p and .distance == 4 and .mapping == "bus_address"
		and .common_bridge == $common and .acs_bridge == null and .peer_iommu == $iommu
		and (.why | test("meet at " + $common + " below the host bridge"))' ;;
	no_common) filter='(.p2p | not) and .distance == null and .mapping == null
		and .common_bridge == null and $common == "" and .peer_iommu == $iommu
		and (.why | test("meet only at the host bridge \\[8086:29c0\\], which is not on the kernel.s P2P allowlist"))' ;;
	acs) filter='(.p2p | not) and .distance == null and .common_bridge == $common
		and .acs_bridge == $common and .acs_bridges == 1 and .peer_iommu == $iommu
		and (.why | test("pci=disable_acs_redir=" + $common))' ;;
	esac
	local iommu=false
	case $topo in iommu|acs|switch-iommu) iommu=true ;; esac
	desc="topology $topo: peerdirect topo --json: the NIC ($nic_bdf) $expect, bridge where the paths meet '${common}' as sysfs has it"
	if [ "$(cat "$work/topo.rc")" = 0 ] && [ -n "$nic_bdf" ] &&
		jq -e --arg nic "$nic_bdf" --arg common "$common" --argjson iommu "$iommu" \
			"length == 1 and .[0].device == \"/dev/peerdirect0\" and .[0].host_bridge == \"8086:29c0\"
			and (.[0].peers | map(.pci_address) | index(\"$hbm_bdf\") == null)
			and (.[0].peers[] | select(.pci_address == \$nic) | .kind == \"network\" and ($filter))" \
			"$work/topo.json" >/dev/null; then
		ok "$desc: $(jq -r --arg nic "$nic_bdf" '.[0].peers[] | select(.pci_address == $nic) | .why' "$work/topo.json")"
	else
		not_ok "$desc" "$(cat "$work/topo.json" "$work/topo.err" "$work/pci-paths" 2>/dev/null)"
	fi
}

# The cases: TOPOLOGY HBM BYTES [P2P-EXPECTATION]. Plan: one check per case, and one more
# (peerdirect topo) per case with a P2P expectation.
cases=(
	"switch 256M 268435456 bus_address"
	"switch 1G 1073741824"
	"split 256M 268435456 no_common"
	"iommu 256M 268435456 no_common"
	"acs 256M 268435456 acs"
)
n=0
for c in "${cases[@]}"; do
	read -ra args <<<"$c"
	n=$((n + 1 + (${#args[@]} > 3)))
done
plan $n
for c in "${cases[@]}"; do
	read -ra args <<<"$c"
	devices_case "${args[@]}"
done

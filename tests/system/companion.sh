#!/usr/bin/env bash
# Companion devices (Documentation/companion.md): the HBM device stays bound to another driver
# (vfio-pci here, in the place of habanalabs) and peerdirect, loaded with companion=1, serves
# its BAR as /dev/peerdirectN when an administrator names it on /dev/peerdirect-ctl
# (`peerdirect companion add`). Checked: what `peerdirect devices`, `companion list` and `topo`
# show; every refusal with its errno (mode off, no CAP_SYS_ADMIN, no such device, a device
# peerdirect owns, one no driver owns, a companion already, an I/O BAR, a BAR smaller than a page, a BAR index above 5, no default BAR, remove
# of a non-companion); ALLOC refused on a companion; the companion goes when its owner unbinds
# (open files then get ENODEV) and does not come back when the owner is bound again; remove;
# and unload with a companion; kmemleak scans after. Exports of companion ranges
# (EXPORT_RANGE): every refusal with its errno, a pattern written through one found at its
# place in the host's HBM backing file, the NIC mapping one by bus address in the switch
# topology and refused in the split one; ADD, REMOVE, RESET_PREPARE and RESET_DONE whose
# answer cannot be written (a read-only argument), and each with each of its copies of user
# memory failed in turn (fault injection), fail with EFAULT and do nothing. Last, 10 s
# of races on the KASAN kernel (longer until every loop has met the others:
# tests/companion/race.sh). Revocation of exports in use: tests/system/companion-revoke.sh.
# The guest scripts: tests/companion/.
. "$(dirname "$0")/../lib.sh"
. "$ROOT/tests/companion/host-lib.sh"
# Plan: this script's own checks, declared first: of the owner's run 26, of the exports' 19,
# of the owned device's 8, of the split topology's 3, of the races 8 (the run, and one per loop
# that the sides met). A guest run that does not end cleanly adds a failure (guest_run).
race_loops=(add_remove owner import pinned info list reset)
plan $((26 + 19 + 8 + 3 + 1 + ${#race_loops[@]}))

# One boot for two scripts: the owner's (its records in owner.out, written by the guest), then
# the exports' (exports.out), with the HBM's backing file kept to check the data. owner.sh
# ends with peerdirect unloaded and the device bound to vfio-pci, where exports.sh begins.
guest_run exports "HBM owned by vfio-pci, and exports of a companion" --topology switch-iommu \
	--no-bind --userland trixie --kmemleak --share "$share" --hbm-backing "$share/hbm" -- \
	bash -c 'bash /mnt/host/owner.sh >/mnt/host/owner.out; bash /mnt/host/exports.sh'

expect "the HBM device is bound to vfio-pci, standing in for habanalabs" owner owner 0 'drivers/vfio-pci$'
expect "companion add without companion=1: EOPNOTSUPP, and told to load the module with companion=1" \
	owner mode_off 1 'os error 95\); companion mode is off: load the module with companion=1'
expect "/dev/peerdirect-ctl is root's alone (0600)" owner ctl_mode 0 '^600 root'
expect "root without CAP_SYS_ADMIN: EPERM, and told why" owner no_cap 1 'os error 1\); companion devices are for administrators'
expect "another user cannot open the control device: EACCES, told it is for administrators" \
	owner not_root 1 'os error 13\); the control device is for administrators: run as root'
expect "companion add 0000:03:00.0 --bar 2 serves /dev/peerdirect0 beside vfio-pci" owner add 0 '^/dev/peerdirect0'
expect "the same device again: EEXIST" owner again 1 'os error 17\); that device is a companion already'
expect "a PCI address with no device: ENXIO" owner none 1 'os error 6\); no PCI device has that address'
expect "the NIC's BAR 0, an I/O BAR: EINVAL" owner io_bar 1 'os error 22\); the HBM BAR must be a memory BAR'
expect "a device outside the ID table without --bar (no default BAR): EINVAL" owner no_default 1 'os error 22\)'
expect "a BAR index above 5 (raw request; the CLI refuses it itself): EINVAL" owner bar6 0 'EINVAL'
devices=$(out_of devices owner | tr '|' '\n')
desc="peerdirect devices --json: provider companion, driver vfio-pci, BAR 2, 256 MiB, the device's bus address"
if [ "$(rc_of devices owner)" = 0 ] &&
   [ "$(jq -r '.[0] | [.provider, .driver, .bar_index, .hbm_bytes, .pci_address] | @tsv' <<<"$devices" 2>/dev/null)" = \
     "$(printf 'companion\tvfio-pci\t2\t268435456\t0000:03:00.0')" ]; then
	ok "$desc"
else
	fail "$desc" "$devices"
fi
expect "peerdirect companion list names it" owner list 0 '^/dev/peerdirect0  0000:03:00.0  BAR2  companion of vfio-pci'
topo=$(out_of topo owner | tr '|' '\n')
desc="peerdirect topo on the companion: the NIC reaches it peer-to-peer (the kernel's verdict, 4 hops)"
if [ "$(jq -r '.[0].peers[] | select(.pci_address == "0000:04:00.0") | [.p2p, .distance] | @tsv' <<<"$topo" 2>/dev/null)" = "$(printf 'true\t4')" ]; then
	ok "$desc"
else
	fail "$desc" "$topo"
fi
expect "ALLOC on a companion: EOPNOTSUPP, told that its owner owns the memory" owner alloc 1 'os error 95\); a companion device has no allocator'
desc="peerdirect doctor --provider tcp on the companion: fi_mr_dmabuf registers the first page of its BAR (a companion has no allocator), path dma_buf, ok; verbs_dmabuf_mr does not fail"
if jq -e '(map(select(.name == "fi_mr_dmabuf"))[0] | .status == "ok" and (.detail | test("took path dma_buf, nothing staged")))
		and (map(select(.name == "verbs_dmabuf_mr"))[0] | .status != "fail")' "$share/doctor.json" >/dev/null 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(jq -c 'map(select(.name == "fi_mr_dmabuf" or .name == "verbs_dmabuf_mr"))' "$share/doctor.json" 2>&1)" \
		"$(cat "$share/doctor.err" 2>/dev/null)"
fi
desc="the owner's unbind removes the companion: /dev/peerdirect0 is gone"
if [ "$(rc_of after_unbind owner)" = 0 ] && ! out_of after_unbind owner | tr '|' '\n' | grep -qx 'peerdirect0'; then
	ok "$desc"
else
	fail "$desc" "$(out_of after_unbind owner)"
fi
expect "a file opened before the owner's unbind gets ENODEV" owner info_after_unbind 0 'ENODEV'
expect "the owner is bound again" owner rebound 0 'drivers/vfio-pci$'
desc="rebinding the owner brings no companion back"
if [ "$(rc_of list_rebound owner)" = 0 ] && [ -z "$(out_of list_rebound owner)" ]; then ok "$desc"; else fail "$desc" "$(out_of list_rebound owner)"; fi
expect "named again, it is a new /dev/peerdirect0" owner add2 0 '^/dev/peerdirect0'
expect "companion remove stops serving it" owner remove 0 '^$'
expect "remove of a device that is not a companion: ENOENT" owner remove_again 1 'os error 2\); that device is not a companion'
expect "a BAR smaller than a page (the device's 256-byte register BAR 0): EINVAL, told it must hold at least a page" \
	owner small_bar 1 'os error 22\); the HBM BAR must be a memory BAR 0-5 of the device of at least a page'
expect "rmmod with a companion in place unloads cleanly" owner rmmod 0 '^$'
expect "the kernel log says each companion's start and end" owner log 0 'companion 0000:03:00.0: its driver unbinds or it is being removed.*companion 0000:03:00.0: removed on request'

# Exports of companion ranges (the boot above), and control commands whose answer cannot be
# written (the probe's ctl-ro: the argument in a read-only page).
expect "COMPANION_ADD from a read-only argument (its answer cannot be written): EFAULT, and no companion is listed; ADD from writable memory then serves /dev/peerdirect0" \
	exports ro_add 0 '^EFAULT\|/dev/peerdirect0$'
expect "COMPANION_RESET_DONE from a read-only argument during a reset: EFAULT, and the reset goes on: EXPORT_RANGE fails with EBUSY until a RESET_DONE from writable memory" \
	exports ro_reset_done 0 '^EFAULT\|EBUSY\|OK$'
expect "COMPANION_RESET_PREPARE from a read-only argument: EFAULT, and no reset begins: EXPORT_RANGE still succeeds" \
	exports ro_reset_prepare 0 '^EFAULT\|OK$'
expect "COMPANION_REMOVE from a read-only argument: EFAULT, and the companion stays listed" \
	exports ro_remove 0 '^EFAULT\|/dev/peerdirect0  0000:03:00.0  BAR2  companion of vfio-pci$'
# The probe's ctl-failnth: OUTCOME/STATE for each run, the N-th copy of user memory failed
# in the N-th (/proc/thread-self/fail-nth), until a run has none failed.
expect "COMPANION_RESET_PREPARE with each of its 3 copies of user memory failed in turn (fault injection): EFAULT each time and no reset begun (EXPORT_RANGE succeeds); with none failed the reset begins (EBUSY)" \
	exports fi_reset_prepare 0 '^EFAULT/OK EFAULT/OK EFAULT/OK OK/EBUSY$'
expect "COMPANION_RESET_DONE with each of its 3 copies of user memory failed in turn: EFAULT each time and the reset goes on (EBUSY); with none failed it ends" \
	exports fi_reset_done 0 '^EFAULT/EBUSY EFAULT/EBUSY EFAULT/EBUSY OK/OK$'
expect "COMPANION_REMOVE with each of its 3 copies of user memory failed in turn: EFAULT each time and the companion kept; with none failed it goes" \
	exports fi_remove 0 '^EFAULT/1 EFAULT/1 EFAULT/1 OK/0$'
expect "COMPANION_ADD with each of its 4 copies of user memory failed in turn, the answer with the new index last (the companion taken back): EFAULT each time and no companion left; with none failed it is added" \
	exports fi_add 0 '^EFAULT/0 EFAULT/0 EFAULT/0 EFAULT/0 OK/1$'
expect "EXPORT_RANGE at an unaligned BAR offset: EINVAL" exports unaligned 0 '^EINVAL$'
expect "EXPORT_RANGE of an unaligned length: EINVAL" exports unaligned_len 0 '^EINVAL$'
expect "EXPORT_RANGE of length 0: EINVAL" exports zero 0 '^EINVAL$'
expect "EXPORT_RANGE across the BAR's end: EINVAL" exports past_end 0 '^EINVAL$'
expect "EXPORT_RANGE outside the BAR: EINVAL" exports outside 0 '^EINVAL$'
expect "EXPORT_RANGE whose end overflows 64 bits: EOVERFLOW" exports overflow 0 '^EOVERFLOW$'
expect "EXPORT_RANGE without CAP_SYS_ADMIN: EPERM" exports no_cap 0 '^EPERM$'
expect "companion export --pattern writes 4 MiB through the dma-buf's mapping and reads it back" \
	exports pattern 0 '"bytes_verified": 4194304'
desc="the pattern written through the companion's dma-buf is in the HBM backing file at BAR offset 8 MiB, and the next 4 MiB are untouched"
if "$ROOT/tests/hbm-pattern" check "$share/hbm" $((8 << 20)) $((4 << 20)) 0x5eed0002 >"$share/check" 2>&1 &&
   "$ROOT/tests/hbm-pattern" zero "$share/hbm" $((12 << 20)) $((4 << 20)) >>"$share/check" 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(cat "$share/check")"
fi
# The BAR's bus address (0xd0000000 in this topology) plus the offset: DMA by bus address.
expect "a dynamic importer (the NIC, below the same switch) maps 64 MiB at BAR offset 32 MiB by bus address 0xd2000000, in entries no longer than its max segment" \
	exports dynamic 0 'attach=0 .*map=0 .*sg0=0xd2000000\+.*dma_total=67108864 .*over_max_seg=0 .*id=1'
expect "rmmod afterwards unloads cleanly" exports rmmod 0 '^$'

guest_run owned "a second HBM device peerdirect owns" --topology switch-iommu --second-hbm --no-bind \
	--userland trixie --share "$share" -- bash /mnt/host/owned.sh
expect "a device peerdirect is the driver of: EBUSY" owned owned 1 'os error 16\); peerdirect is that device'"'"'s driver already'
expect "EXPORT_RANGE on a device peerdirect owns: EOPNOTSUPP (allocate and export there)" owned owned_xr 0 '^EOPNOTSUPP$'
expect "a device no driver owns: ENODEV (a companion serves a BAR beside its owner driver), and told to bind it" \
	owned unowned 1 'os error 19\); no driver owns that device .*bind that driver first'
expect "once vfio-pci owns it, it can be a companion" owned bound 0 '^/dev/peerdirect1'
expect "peerdirect devices lists both: owned and companion of vfio-pci" owned devices 0 'peerdirect0 .* owned.*peerdirect1 .* companion of vfio-pci'
expect "INFO on the owned device: driver peerdirect (size 96: the struct with driver)" owned info_owned 0 '^size=96 driver=peerdirect$'
expect "INFO on the companion names its owner: vfio-pci" owned info_bound 0 '^size=96 driver=vfio-pci$'
expect "rmmod with an owned device and a companion unloads cleanly" owned rmmod 0 '^$'
# The split topology with an IOMMU: vfio-pci, the owner, binds only behind one.
guest_run split "split topology" --topology iommu --no-bind --userland trixie --share "$share" -- \
	bash /mnt/host/split.sh
expect "split topology: the HBM device (bound to vfio-pci) is a companion" split add 0 '^/dev/peerdirect0$'
expect "split topology: the NIC on another root port is refused at attach (EOPNOTSUPP, the kernel's P2P verdict: -1)" \
	split import 0 'p2p_distance=-1 .*attach=-95'
expect "split topology: rmmod afterwards unloads cleanly" split rmmod 0 '^$'

# The loops race for $race s, and on for at most 180 s more until each has met its other sides
# (tests/companion/race.sh): the guest's timeout allows for that.
race=${PEERDIRECT_RACE_SECONDS:-10}
guest --kernel kasan --topology switch-iommu --no-bind --userland trixie --kmemleak --share "$share" \
	--timeout $((race + 180 + 360)) -- bash /mnt/host/race.sh "$race" >"$share/race.out" 2>"$share/race.err"
r=$?
# Each loop's record: "@loop_NAME 0 runs=N OUTCOME=N..." (tests/companion/race.sh).
# outcomes LOOP OUTCOME: how often; 0 when never (or no record)
outcomes() { sed -n "s/^@loop_$1 0 //p" "$share/race.out" 2>/dev/null | head -1 | tr ' ' '\n' | sed -n "s/^$2=\([0-9][0-9]*\)$/\1/p" | head -1 | grep . || echo 0; }
counts= short=
for loop in "${race_loops[@]}"; do
	counts+="${counts:+ }$loop=$(outcomes "$loop" runs)"
	[ "$(outcomes "$loop" runs)" -ge 2 ] || short+=" $loop"
done
sed -n -e 's/^@loop_\([a-z_]*\) 0 /# race: \1: /p' -e 's/^@race_seconds 0 \([0-9]*\)/# race: raced for \1 s/p' "$share/race.out" 2>/dev/null
desc="${race} s of racing on the KASAN kernel (add/remove, owner unbind/bind, imports, opens, listing, announced resets: $counts) end without a KASAN or other kernel report and no leak, and the module unloads"
if [ $r = 0 ] && [ "$(rc_of rmmod race)" = 0 ] && [ "$(grep -c '^@loop_' "$share/race.out")" = ${#race_loops[@]} ] &&
   [ -z "$short" ]; then
	ok "$desc"
else
	fail "$desc" "qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" \
		"loops that ran fewer than 2 times:${short:- none}" "$(cat "$share/race.err")" "$(cat "$share/race.out")"
fi
# met DESCRIPTION LOOP OUTCOME...: the sides met: each OUTCOME of LOOP came at least once (the
# guest's race.sh keeps its loops going, for a while, until they have: the same OUTCOMEs)
met() {
	local desc=$1 loop=$2 outcome seen= missing=
	shift 2
	for outcome in "$@"; do
		seen+=" $outcome=$(outcomes "$loop" "$outcome")"
		[ "$(outcomes "$loop" "$outcome")" -ge 1 ] || missing+=" $outcome"
	done
	if [ -z "$missing" ]; then
		ok "$desc"
	else
		fail "$desc" "never:$missing; of $(outcomes "$loop" runs) runs:$seen" "@loop_$loop: $(sed -n "s/^@loop_$loop 0 //p" "$share/race.out")"
	fi
}
met "races: companion add and remove both succeed while the owner, imports, opens and listing race them" \
	add_remove added removed
met "races: the owner unbinds and binds again while the companion is added and removed" owner unbound bound
met "races: dynamic imports of a companion range both map it and find the companion gone (ENODEV, or no device file)" \
	import mapped gone
met "races: revocable pinned imports of a companion range both map it and find the companion gone" pinned mapped gone
met "races: INFO on a freshly opened device file both answers and finds the companion gone" info answered gone
met "races: peerdirect devices both lists the companion and lists none" list listed none
met "races: announced resets (reset-prepare, then reset-done) both complete and find no companion" \
	reset reset refused

exit $failed

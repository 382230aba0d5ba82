#!/usr/bin/env bash
# Revocation of a companion's exports (Documentation/companion.md, "Lifetime"): with a dynamic,
# a revocable pinned and a pinned importer (the NIC, through the test importer module) each
# mapping a dma-buf of the companion's BAR, and a process mapping a fourth, the companion goes
# in each of the three ways it can (tests/companion/revoke.sh): its owner driver unbinds, the
# device is hot-unplugged, or the administrator removes it (rmmod being refused while the
# exports are in use). Each time: the removal waits for the pinned importer and the kernel log
# names it; the dynamic importer is invalidated and the revocable one revoked meanwhile; the
# removal completes once the pinned importer lets go; the CPU mapping faults with SIGBUS;
# revoked imports cannot map again; nothing comes back; the module unloads; kmemleak scans
# after, and the run fails on any kernel splat (qemu/run exits 99). While the owner's unbind or
# the remove waits, a PCI rescan and the load of a module that registers a PCI bus notifier
# return (the wait is outside the bus's notifier chain); a remove killed while it waits returns
# and leaves the companion in place.
. "$(dirname "$0")/../lib.sh"
. "$ROOT/tests/companion/host-lib.sh"
# Plan: this script's own checks, declared first: the 18 every way shares (checks) for each of
# the 3 ways, and those of one way: 3 + 3 of the owner's unbind, 1 of the hot-unplug, 9 + 3 + 2
# of companion remove, 32 of the reset (tests/companion/reset.sh). A guest run that does not
# end cleanly adds a failure (guest_run).
plan $((3 * 18 + 3 + 3 + 1 + 9 + 3 + 2 + 32))

# meanwhile WAY WHAT: while the removal waits, the host's other PCI work goes on
meanwhile() {
	local way=$1 what=$2
	expect "$way: while $what waits for the pinned importer, a PCI rescan returns" "$way" rescan 0 '^returned'
	expect "$way: and loading a module that registers a PCI bus notifier returns" "$way" notifier 0 '^returned'
	expect "$way: and the removal still waits" "$way" pending_after 0 '^waiting$'
}

# checks WAY WHAT: the checks every way shares; WHAT says how the companion went.
checks() {
	local way=$1 what=$2
	expect "$way: the companion is named" "$way" add 0 '^/dev/peerdirect0$'
	expect "$way: its device link to the owner's device is active (the owner's unbind waits for the companion's consumer device)" \
		"$way" link 0 '^active$'
	expect "$way: a dynamic importer (the NIC, below the same switch) maps 64 MiB at BAR offset 32 MiB by bus address" \
		"$way" dynamic 0 'attach=0 .*map=0 .*sg0=0xd2000000\+.*dma_total=67108864 .*id=1'
	expect "$way: a revocable pinned importer maps 2 MiB" "$way" revocable 0 'attach=0 .*pin=0 .*map=0 .*sg0=0xd6000000\+.*id=2'
	expect "$way: a pinned importer (EFA's way) maps 2 MiB" "$way" pinned 0 'attach=0 .*pin=0 .*map=0 .*sg0=0xd6200000\+.*id=3'
	expect "$way: $what: the removal says in the kernel log that it waits for the pinned mapping" "$way" waits_log 0 '^$'
	expect "$way: and it has not completed while the pinned importer maps the BAR" "$way" pending 0 '^waiting$'
	expect "$way: meanwhile the dynamic importer was invalidated and dropped its mapping" "$way" status1 0 'invalidations=[1-9].*mapped=0 '
	expect "$way: and the revocable pinned one was revoked" "$way" status2 0 'invalidations=[1-9].*mapped=0 .*pinned=0 .*revoked=1'
	expect "$way: the pinned one still maps it" "$way" status3 0 'mapped=1 .*pinned=1'
	expect "$way: the kernel log names the process that exported the held range and the importing NIC" \
		"$way" log_names 0 'exported by pid [0-9]+.*0000:04:00.0'
	expect "$way: releasing the pinned import lets the removal complete" "$way" removed 0 '^$'
	expect "$way: /dev/peerdirect0 is gone" "$way" dev_gone 0 '^gone$'
	expect "$way: a CPU mapping of a companion export faults with SIGBUS once the companion is gone" "$way" cpu 135 '^mapped a5\|$'
	expect "$way: a revoked import cannot map again (ENODEV)" "$way" remap1 0 'map=-19'
	expect "$way: no companion is listed afterwards" "$way" list 0 '^$'
	expect "$way: and its consumer device (and with it the link) is gone" "$way" link_gone 0 '^$'
	expect "$way: rmmod afterwards unloads cleanly" "$way" rmmod 0 '^$'
}

# The three ways in one boot, hot-unplug last (the device is gone after it), each way's records
# in its own file; revoke.sh leaves the device on vfio-pci and peerdirect unloaded, as it
# starts, and reads only its own way's kernel log.
guest_run unplug "revocation by the owner's unbind, companion remove and hot-unplug" \
	--topology switch-iommu --no-bind --hotplug --userland trixie --kmemleak --share "$share" -- \
	bash -c 'bash /mnt/host/revoke.sh unbind >/mnt/host/unbind.out
		bash /mnt/host/revoke.sh remove >/mnt/host/remove.out
		bash /mnt/host/revoke.sh unplug'
checks unbind "the owner driver unbinds"
expect "unbind: the owner's unbind returned only after the removal" unbind removal_rc 0 '^$'
expect "unbind: the owner bound again, still no companion (it must be named again)" unbind rebound_list 0 '^.*drivers/vfio-pci$'
expect "unbind: the kernel log says why the companion went" unbind log 0 'companion 0000:03:00.0: its driver unbinds or it is being removed'
meanwhile unbind "the owner's unbind"

checks unplug "the device is hot-unplugged (QEMU device_del)"
expect "unplug: the kernel log says why the companion went" unplug log 0 'companion 0000:03:00.0: its driver unbinds or it is being removed'

expect "remove: rmmod while the exports are in use is refused: their files hold the module" \
	remove rmmod_busy 1 'Module peerdirect is in use'
expect "remove: and the dynamic import still maps the BAR" remove busy_status 0 'mapped=1 '
expect "remove: a remove killed while it waits for the pinned importer returns" remove killed_returns 0 '^$'
expect "remove: and leaves the companion in place (its device file), saying so in the kernel log" \
	remove killed_stays 0 'removal cut short by a signal: it stays'
meanwhile remove "companion remove"
checks remove "companion remove"
expect "remove: companion remove returned only after the removal, successfully" remove removal_rc 0 '^$'
expect "remove: rmmod is still refused while the importers hold the revoked dma-bufs" \
	remove rmmod_held 1 'Module peerdirect is in use'
expect "remove: the owner keeps its device while the companion goes" remove owner_during 0 'drivers/vfio-pci$'
expect "remove: the owner's unbind meanwhile waits for the removal (the BAR stays until every export is revoked)" \
	remove owner_waits 0 '^waiting$'
expect "remove: and completes after it" remove owner_unbound 0 '^unbound$'
expect "remove: the owner binds again" remove owner 0 'drivers/vfio-pci$'
expect "remove: the kernel log says why the companion went" remove log 0 'companion 0000:03:00.0: removing it on request'

# The owner's reset, announced, and a vfio user turning memory decoding off
# (tests/companion/reset.sh), in a boot of its own.
guest_run reset "the owner's reset, announced" --topology switch-iommu --no-bind --userland trixie \
	--kmemleak --share "$share" -- bash /mnt/host/reset.sh
expect "reset: the companion is named" reset add 0 '^/dev/peerdirect0$'
expect "reset: a dynamic, a revocable pinned and a pinned importer map ranges of it" reset pinned 0 'attach=0 .*pin=0 .*map=0 .*id=3'
expect "reset: reset-done with no reset announced: EINVAL, and told so" reset done_early 1 'os error 22\); no reset of that companion was announced'
expect "reset: reset-prepare returns at once although a pinned importer maps the BAR" reset prepare 0 '^$'
expect "reset: debugfs counts the reset, under way" reset stats 0 '^resets: 1 resetting: 1 $'
expect "reset: the dynamic importer was invalidated and dropped its mapping" reset status1 0 'invalidations=[1-9].*mapped=0 '
expect "reset: the revocable pinned one was revoked" reset status2 0 'invalidations=[1-9].*mapped=0 .*pinned=0 .*revoked=1'
expect "reset: the pinned one keeps its mapping (a reset cannot wait)" reset status3 0 'mapped=1 .*pinned=1'
expect "reset: and the kernel log names it: the exporting process and the importing NIC" reset log_names 0 'exported by pid [0-9]+.*0000:04:00.0'
expect "reset: the CPU mapping faults with SIGBUS before the device is reset" reset cpu 135 '^mapped a5\|$'
expect "reset: peerdirect companion export --hold 60 ends at once, exit 1, saying its export was revoked by the reset its owner announced" \
	reset held 1 '^peerdirect: the export of /dev/peerdirect0 was revoked [0-9.]* s into the 60 s hold: the device was reset \(1 reset since the export, announced by its owner\)'
expect "reset: a new export while the reset is under way: EBUSY" reset busy 0 '^EBUSY$'
expect "reset: a vfio user opens the device, which vfio-pci resets" reset vfio 0 '^opened reset_works=1$'
expect "reset: the PCI core reset it (the kernel log)" reset vfio_log 0 '^[1-9]'
expect "reset: reset-done" reset done 0 '^$'
expect "reset: debugfs: 1 reset, none under way" reset stats_done 0 '^resets: 1 resetting: 0 $'
expect "reset: the dynamic importer's revoked import cannot map again (ENODEV)" reset remap1 0 'map=-19'
expect "reset: a new export maps for the NIC" reset new_export 0 'attach=0 .*map=0 .*id=4'
expect "reset: a vfio user turns the device's memory decoding off through vfio's config region" reset decode_off 0 'decode=off$'
expect "reset: meanwhile a map of a new export fails with EIO" reset off_import 0 'attach=0 .*map=-5 '
expect "reset: and a CPU mapping of one faults with SIGBUS" reset off_cpu 135 '^$'
expect "reset: once the user closes the device (vfio-pci restores its config space, decoding on), maps work again" \
	reset on_import 0 'attach=0 .*map=0 '
expect "reset: root moves the BAR by 4 GiB behind the kernel's back (a write to the BAR register through sysfs config)" reset moved 0 '^moved 0x'
expect "reset: while the BAR is elsewhere, a map of a new export fails with EIO" reset moved_import 0 'attach=0 .*map=-5 '
expect "reset: and a CPU mapping of one faults with SIGBUS instead of writing to nothing" reset moved_cpu 135 '^$'
expect "reset: moved back to where it was found, maps work again" reset back 0 '^moved 0x'
expect "reset: a map of a new export succeeds" reset back_import 0 'attach=0 .*map=0 '
expect "reset: and a CPU mapping writes and reads" reset back_cpu 0 '^mapped a5\|read a5'
expect "reset: reset-done again: EINVAL" reset done_again 1 'os error 22\)'
expect "reset: reset-prepare of a device that is not a companion: ENOENT" reset not_companion 1 'os error 2\); that device is not a companion'
expect "reset: companion remove afterwards" reset remove 0 '^$'
expect "reset: rmmod afterwards unloads cleanly" reset rmmod 0 '^$'

exit $failed

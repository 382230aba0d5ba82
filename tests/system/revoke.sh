#!/usr/bin/env bash
# Revocation (Documentation/exporter.md, "Removal and revocation"): with a dynamic, a revocable
# and a pinned importer holding mappings of three dma-bufs and CPU mappings of one, the HBM
# device goes away, by unbind and then by a PCIe hot-unplug (QEMU device_del on the guest's
# request, qemu/run --hotplug), in one boot; between the two, the same holders meet a reset of
# the device (sysfs reset: a secondary bus reset), which revokes them and keeps the device;
# kmemleak scans after all three.
. "$(dirname "$0")/../lib.sh"

# Plan: the checks are peerdirect-guest-tests', each run with its own plan; none of this
# script's own (a guest run that does not end cleanly adds a failure: guest_tap).
# One boot: unbind (the device rebound, the module unloaded at its end), then, the module
# loaded again, reset (the module unloaded at its end), then, loaded again, hot-unplug.
# qemu/run --hotplug answers the guest's `@@peerdirect-unplug hbm0` with QMP device_del.
guest_tap "revocation by unbind, by reset, then by hot-unplug" 3 --kmemleak --hotplug -- "${guest_each[@]}" \
	"peerdirect-guest-tests --revoke unbind" \
	"insmod /lib/peerdirect/peerdirect.ko && peerdirect-guest-tests --revoke reset" \
	"insmod /lib/peerdirect/peerdirect.ko && peerdirect-guest-tests --revoke unplug"

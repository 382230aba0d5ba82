#!/usr/bin/env bash
# Revocation (Documentation/exporter.md, "Removal and revocation"): with a dynamic, a revocable
# and a pinned importer holding mappings of three dma-bufs and CPU mappings of one, the HBM
# device goes away, by unbind and then by a PCIe hot-unplug (QEMU device_del on the guest's
# request, qemu/run --hotplug); kmemleak scans after each run.
. "$(dirname "$0")/../lib.sh"

# Plan: the checks are peerdirect-guest-tests', each run with its own plan; none of this
# script's own (a guest run that does not end cleanly adds a failure: guest_tap).
rcs=()
echo "# revocation by unbind"
guest_tap "revocation by unbind" 1 --kmemleak -- peerdirect-guest-tests --revoke unbind
rcs+=($?)

# qemu/run --hotplug answers the guest's `@@peerdirect-unplug hbm0` with QMP device_del.
echo "# revocation by hot-unplug"
guest_tap "revocation by hot-unplug" 1 --kmemleak --hotplug -- peerdirect-guest-tests --revoke unplug
rcs+=($?)
exit "$(worst "${rcs[@]}")"

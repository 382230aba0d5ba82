#!/bin/bash
# A device peerdirect owns cannot be a companion; one no driver owns can, and INFO names the
# driver bound to it later (tests/system/companion.sh).
. /mnt/host/guest-lib.sh
build_probe
# hbm1 (0000:05:00.0) is peerdirect's own; hbm0 has no driver at all.
echo peerdirect >/sys/bus/pci/devices/0000:05:00.0/driver_override
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
run owned peerdirect companion add 0000:05:00.0 --bar 2
run owned_xr /tmp/probe xr /dev/peerdirect0 0 0x200000
run unowned peerdirect companion add 0000:03:00.0 --bar 2
run devices peerdirect devices
run info_owned /tmp/probe driver /dev/peerdirect0
run info_none /tmp/probe driver /dev/peerdirect1
echo vfio-pci >/sys/bus/pci/devices/0000:03:00.0/driver_override
echo 0000:03:00.0 >/sys/bus/pci/drivers_probe
run info_bound /tmp/probe driver /dev/peerdirect1
run devices_bound peerdirect devices
run rmmod rmmod peerdirect

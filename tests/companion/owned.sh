#!/bin/bash
# A device peerdirect owns cannot be a companion, nor can one no driver owns; once vfio-pci
# binds to the latter it can, and INFO names vfio-pci (tests/system/companion.sh).
. /mnt/host/guest-lib.sh
build_probe
# hbm1 (0000:05:00.0) is peerdirect's own; hbm0 has no driver at all.
echo peerdirect >/sys/bus/pci/devices/0000:05:00.0/driver_override
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
run owned peerdirect companion add 0000:05:00.0 --bar 2
run owned_xr /tmp/probe xr /dev/peerdirect0 0 0x200000
run unowned peerdirect companion add 0000:03:00.0 --bar 2
owned_by_vfio 0000:03:00.0
run bound peerdirect companion add 0000:03:00.0 --bar 2
run devices peerdirect devices
run info_owned /tmp/probe driver /dev/peerdirect0
run info_bound /tmp/probe driver /dev/peerdirect1
run rmmod rmmod peerdirect

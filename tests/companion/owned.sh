#!/bin/bash
# A device peerdirect owns cannot be a companion; one no driver owns can (tests/system/companion.sh).
. /mnt/host/guest-lib.sh
gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
# hbm1 (0000:05:00.0) is peerdirect's own; hbm0 has no driver at all.
echo peerdirect >/sys/bus/pci/devices/0000:05:00.0/driver_override
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
run owned peerdirect companion add 0000:05:00.0 --bar 2
run owned_xr /tmp/probe xr /dev/peerdirect0 0 0x200000
run unowned peerdirect companion add 0000:03:00.0 --bar 2
run devices peerdirect devices
run rmmod rmmod peerdirect

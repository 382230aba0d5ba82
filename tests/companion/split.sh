#!/bin/bash
# Split topology: the NIC has no P2P path to the companion (tests/system/companion.sh).
. /mnt/host/guest-lib.sh
build_probe
load_companion_mode
owned_by_vfio 0000:01:00.0
run add peerdirect companion add 0000:01:00.0 --bar 2
run import /tmp/probe imp /dev/peerdirect0 0 0x200000 "dev=0000:02:00.0 mode=dynamic hbm=0000:01:00.0"
rmmod peerdirect_importer
run rmmod rmmod peerdirect

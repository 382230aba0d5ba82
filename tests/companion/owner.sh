#!/bin/bash
# The HBM device bound to vfio-pci and named as a companion: listing, refusals, the owner's
# unbind and rebind, remove, unload (tests/system/companion.sh).
hbm=0000:03:00.0 nic=0000:04:00.0
. /mnt/host/guest-lib.sh
build_probe
owned_by_vfio $hbm
run owner readlink /sys/bus/pci/devices/$hbm/driver
insmod /usr/lib/peerdirect/peerdirect.ko
run mode_off peerdirect companion add $hbm --bar 2
rmmod peerdirect
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
run ctl_mode stat -c '%a %U' /dev/peerdirect-ctl
run no_cap setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin peerdirect companion add $hbm --bar 2
run not_root setpriv --reuid=65534 --regid=65534 --clear-groups peerdirect companion add $hbm --bar 2
run add peerdirect companion add $hbm --bar 2
run again peerdirect companion add $hbm --bar 2
run none peerdirect companion add 0000:7f:00.0 --bar 2
run io_bar peerdirect companion add $nic --bar 0
run no_default peerdirect companion add $nic
run bar6 /tmp/probe add-bar 6 0000 04 00 0
run devices peerdirect devices --json
run list peerdirect companion list
run topo peerdirect topo --json
# doctor's probes on a companion: a page of its BAR, not an allocation (it has no allocator).
peerdirect doctor --provider tcp --json >/mnt/host/doctor.json 2>/mnt/host/doctor.err
run alloc peerdirect alloc --size 2M
# A file open across the owner's unbind.
exec 7</dev/peerdirect0
echo $hbm >/sys/bus/pci/drivers/vfio-pci/unbind
run after_unbind ls /dev/
run info_after_unbind /tmp/probe info 7
exec 7<&-
echo $hbm >/sys/bus/pci/drivers_probe
run rebound readlink /sys/bus/pci/devices/$hbm/driver
run list_rebound peerdirect companion list
run add2 peerdirect companion add $hbm --bar 2
run remove peerdirect companion remove $hbm
run remove_again peerdirect companion remove $hbm
run small_bar peerdirect companion add $hbm --bar 0
run add3 peerdirect companion add $hbm --bar 2
run rmmod rmmod peerdirect
run log sh -c 'dmesg | grep "peerdirect.*companion\|peerdirect0: removed"'

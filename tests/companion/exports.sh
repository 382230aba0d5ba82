#!/bin/bash
# EXPORT_RANGE of a companion: refusals, a pattern, the NIC importing by bus address; and
# each control device command whose answer cannot be written (its argument in a read-only
# page), and each with each of its copies of user memory failed in turn (fault injection):
# EFAULT, having done nothing (tests/system/companion.sh).
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0
. /mnt/host/guest-lib.sh
build_probe
owned_by_vfio $hbm
load_companion_mode
run ro_add sh -c "/tmp/probe ctl-ro add $hbm 2; peerdirect companion list; peerdirect companion add $hbm --bar 2"
run unaligned /tmp/probe xr $dev 0x1000800 0x200000
run unaligned_len /tmp/probe xr $dev 0x1000000 0x1800
run zero /tmp/probe xr $dev 0x1000000 0
run past_end /tmp/probe xr $dev 0xfe00000 0x400000
run outside /tmp/probe xr $dev 0x10000000 0x200000
run overflow /tmp/probe xr $dev 0x1000 0xfffffffffffff000
run no_cap setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin /tmp/probe xr $dev 0x1000000 0x200000
run ro_reset_done sh -c "peerdirect companion reset-prepare $hbm && /tmp/probe ctl-ro reset-done $hbm &&
	/tmp/probe xr $dev 0x1000000 0x200000 && peerdirect companion reset-done $hbm && /tmp/probe xr $dev 0x1000000 0x200000"
run ro_reset_prepare sh -c "/tmp/probe ctl-ro reset-prepare $hbm; /tmp/probe xr $dev 0x1000000 0x200000"
# Ends the reset a RESET_PREPARE that failed may have begun all the same (resets nest), so that
# the checks that follow do not depend on it.
peerdirect companion reset-done $hbm >/dev/null 2>&1
run pattern peerdirect companion export --bar-offset 8M --size 4M --pattern 0x5eed0002 --verify 0x5eed0002
run dynamic /tmp/probe imp $dev 0x2000000 0x4000000 "dev=$nic mode=dynamic hbm=$hbm hold=1"
/tmp/probe cmd "release all" >/dev/null
rmmod peerdirect_importer
run ro_remove sh -c "/tmp/probe ctl-ro remove $hbm; peerdirect companion list"
# Each command with each of its copies of user memory failed in turn (fault injection): a reset
# begun and ended, the companion removed, then added again.
run fi_reset_prepare /tmp/probe ctl-failnth reset-prepare $hbm $dev
run fi_reset_done /tmp/probe ctl-failnth reset-done $hbm $dev
run fi_remove /tmp/probe ctl-failnth remove $hbm $dev
run fi_add /tmp/probe ctl-failnth add $hbm $dev 2
run rmmod rmmod peerdirect

#!/bin/bash
# race.sh SECONDS: the companion, its owner, exports, imports, opens and listing raced on the
# KASAN kernel (tests/system/companion.sh).
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0 secs=$1
. /mnt/host/guest-lib.sh
build_probe
owned_by_vfio $hbm
load_companion_mode
end=$(($(date +%s) + secs))
loop() { # loop NAME CMD...: runs CMD until the end, counts runs
	local name=$1 n=0
	shift
	while [ "$(date +%s)" -lt $end ]; do "$@" >/dev/null 2>&1; n=$((n + 1)); done
	echo "@loop_$name 0 $n"
}
loop add_remove sh -c "peerdirect companion add $hbm --bar 2; peerdirect companion remove $hbm" &
loop owner sh -c "echo $hbm >/sys/bus/pci/drivers/vfio-pci/unbind; echo $hbm >/sys/bus/pci/drivers_probe" &
loop import /tmp/probe imp $dev 0x200000 0x400000 "dev=$nic mode=dynamic hbm=$hbm" &
loop pinned /tmp/probe imp $dev 0x800000 0x200000 "dev=$nic mode=revocable hbm=$hbm" &
loop info sh -c "exec 7<$dev && /tmp/probe info 7" &
loop list peerdirect devices --json &
wait
/tmp/probe cmd "release all" >/dev/null
rmmod peerdirect_importer
rmmod peerdirect
echo "@rmmod $? "

#!/bin/bash
# revoke.sh WAY: a companion's exports, in use, when the companion goes. Three dma-bufs of its
# BAR are imported by the NIC through the test importer, each holding a mapped attachment:
# dynamic (mlx5's way), revocable pinned (irdma's) and pinned (EFA's); a fourth is mapped by
# a process (the probe's `cpu`), which touches it again once the companion is gone. WAY:
#   unbind  the owner driver unbinds (sysfs unbind of vfio-pci)
#   unplug  the device is hot-unplugged (QEMU device_del, answered by qemu/run --hotplug)
#   remove  the administrator removes the companion, after rmmod was refused while the
#           exports were in use (their files hold the module), and after a first remove was
#           killed while it waited; while the removal waits, the owner unbinds too, and must
#           wait for it (the BAR stays until all is revoked)
# While the owner's unbind or the remove waits, the rest of the host's PCI work goes on: a
# rescan, and loading a module that registers a PCI bus notifier, return.
# Records for the host (tests/system/companion-revoke.sh).
way=$1
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0
. /mnt/host/guest-lib.sh
# The ways run one after another in one boot: each reads only the kernel log of its own (the
# host checks the console, which keeps everything, for splats).
companion_of_vfio
# The driver core's record of the link that makes the owner's unbind wait for the companion
run link sh -c "cat /sys/class/devlink/pci:$hbm--faux:peerdirect-companion.*/status"
hold_exports

# removed: whether the removal has completed: the unbind or remove returned, or the unplugged
# device is gone
removed() {
	if [ $way = unplug ]; then [ ! -e /sys/bus/pci/devices/$hbm ]; else ! kill -0 $pid 2>/dev/null; fi
}
state() { if removed; then echo done; else echo waiting; fi; }
exited() { ! kill -0 "$1" 2>/dev/null; }
# returns NAME CMD...: runs CMD in the background; records whether it returned within 20 s
# ("returned", with its status and output) or not ("stuck": it may finish later)
returns() {
	local name=$1 p
	shift
	"$@" >/tmp/$name.out 2>&1 &
	p=$!
	if wait_for 20 exited $p; then
		wait $p
		echo "@$name $? returned $(tr '\n' '|' </tmp/$name.out)"
	else
		echo "@$name 0 stuck"
	fi
}
# wait_for SECONDS CMD...: polls CMD every 0.1 s; its status
wait_for() {
	local n=$(($1 * 10))
	shift
	while ! "$@"; do
		n=$((n - 1))
		[ $n -gt 0 ] || return 1
		sleep 0.1
	done
}

case $way in
unbind)
	echo $hbm >/sys/bus/pci/drivers/vfio-pci/unbind &
	pid=$! ;;
unplug)
	echo "@@peerdirect-unplug hbm0" ;;
remove)
	run rmmod_busy rmmod peerdirect
	run busy_status /tmp/probe cmd "status id=1"
	# A removal its caller gives up on: killed while it waits for the pinned importer
	peerdirect companion remove $hbm >/tmp/killed.out 2>&1 &
	pid=$!
	wait_for 30 sh -c 'dmesg | grep -q "peerdirect0: removal waits"'
	kill -KILL $pid
	run killed_returns wait_for 10 exited $pid
	run killed_stays sh -c "test -e $dev && dmesg | grep 'companion $hbm: removal cut short'"
	peerdirect companion remove $hbm >/tmp/remove.out 2>&1 &
	pid=$! ;;
esac
# The removal starts (pciehp takes 5 s to act on the unplug request) and says in the kernel
# log that it waits for the pinned importer.
run waits_log wait_for 30 sh -c 'dmesg | grep -q "peerdirect0: removal waits"'
run pending state
if [ $way != unplug ]; then
	returns rescan sh -c 'echo 1 >/sys/bus/pci/rescan'
	returns notifier insmod /usr/lib/peerdirect/tests/peerdirect_busnotifier.ko
	run pending_after state
fi
if [ $way = remove ]; then
	run owner_during readlink /sys/bus/pci/devices/$hbm/driver
	echo $hbm >/sys/bus/pci/drivers/vfio-pci/unbind &
	owner_unbind=$!
	sleep 2
	run owner_waits sh -c "kill -0 $owner_unbind 2>/dev/null && echo waiting || echo returned"
fi
run status1 /tmp/probe cmd "status id=1"
run status2 /tmp/probe cmd "status id=2"
run status3 /tmp/probe cmd "status id=3"
run log_names sh -c 'dmesg | grep -A3 "peerdirect0: removal waits" | tr -s " "'
run release3 /tmp/probe cmd "release id=3"
run removed wait_for 30 removed
run dev_gone sh -c "test ! -e $dev && echo gone"
[ -z "$pid" ] || { wait $pid; echo "@removal_rc $? $(cat /tmp/remove.out 2>/dev/null | tr '\n' '|')"; }
touch /tmp/go
wait $cpu
echo "@cpu $? $(tr '\n' '|' </tmp/cpu.out)"
run remap1 /tmp/probe cmd "remap id=1"
run list peerdirect companion list
run link_gone sh -c 'wait_gone() { for i in $(seq 50); do ls /sys/bus/faux/devices | grep -q peerdirect-companion || return 0; sleep 0.1; done; ls /sys/bus/faux/devices; }; wait_gone'
[ $way = unplug ] || rmmod peerdirect_busnotifier 2>/dev/null
[ $way != remove ] || run rmmod_held rmmod peerdirect
run release_all /tmp/probe cmd "release all"
case $way in
unbind) echo $hbm >/sys/bus/pci/drivers_probe
	run rebound_list sh -c "readlink /sys/bus/pci/devices/$hbm/driver; peerdirect companion list" ;;
remove) wait $owner_unbind
	run owner_unbound sh -c "test ! -e /sys/bus/pci/devices/$hbm/driver && echo unbound"
	echo $hbm >/sys/bus/pci/drivers_probe
	run owner readlink /sys/bus/pci/devices/$hbm/driver ;;
esac
rmmod peerdirect_importer
run rmmod wait_for 5 rmmod peerdirect
run log sh -c 'dmesg | grep "companion 0000:03:00.0"'

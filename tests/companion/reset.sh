#!/bin/bash
# reset.sh: the owner of a companion resets the device, announced to peerdirect with
# `companion reset-prepare` and `reset-done` (the PCI core tells only the owner's driver).
# vfio-pci, habanalabs' stand-in, resets the device when a user opens it (a secondary bus reset
# of the switch's downstream port here) and again at close; a vfio user may turn the device's
# memory decoding off meanwhile. A dynamic, a revocable pinned and a pinned importer (the NIC, through
# the test importer), a process mapping a fourth range and `peerdirect companion export
# --hold` of a fifth hold exports when the reset is announced. Records for the host
# (tests/system/companion-revoke.sh).
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0
stats=/sys/kernel/debug/peerdirect/peerdirect0/stats
. /mnt/host/guest-lib.sh
companion_of_vfio
hold_exports
# The CLI holding an export across the reset: it ends when reset-prepare revokes the export.
peerdirect companion export --bar-offset 0xa000000 --size 2M --hold 60 >/tmp/held.out 2>/tmp/held.err &
held=$!
while ! grep -q . /tmp/held.out 2>/dev/null; do sleep 0.1; done
resets() { grep -E '^(resets|resetting):' $stats | tr '\n' ' '; }

run done_early peerdirect companion reset-done $hbm
run prepare peerdirect companion reset-prepare $hbm
wait $held
echo "@held $? $(tr '\n' '|' </tmp/held.err)"
run stats resets
run status1 /tmp/probe cmd "status id=1"
run status2 /tmp/probe cmd "status id=2"
run status3 /tmp/probe cmd "status id=3"
run log_names sh -c 'dmesg | grep -A3 "peerdirect0: reset with 1 mapping" | tr -s " "'
touch /tmp/go
wait $cpu
echo "@cpu $? $(tr '\n' '|' </tmp/cpu.out)"
run busy /tmp/probe xr $dev 0x8000000 0x200000
# The owner's reset: a vfio user opens the device (and closes it)
run vfio /tmp/probe vfio-open $hbm
run vfio_log sh -c "dmesg | grep -c 'vfio-pci $hbm: reset done'"
run done peerdirect companion reset-done $hbm
run stats_done resets
run remap1 /tmp/probe cmd "remap id=1"
run new_export /tmp/probe imp $dev 0x8000000 0x200000 "dev=$nic mode=dynamic hbm=$hbm hold=1"
# A vfio user turns the device's memory decoding off (as a VM's driver does) and keeps it open
# until /tmp/vgo: nothing may map the BAR meanwhile (peerdirect reads the command register at
# every map and CPU fault)
rm -f /tmp/vgo
/tmp/probe vfio-open $hbm /tmp/vgo decode-off >/tmp/vfio.out 2>&1 &
vfio=$!
while ! grep -q . /tmp/vfio.out 2>/dev/null; do sleep 0.1; done
run decode_off cat /tmp/vfio.out
run off_import /tmp/probe imp $dev 0x8200000 0x200000 "dev=$nic mode=dynamic hbm=$hbm"
touch /tmp/go2
run off_cpu /tmp/probe cpu $dev 0x8400000 0x200000 /tmp/go2
# The user closes the device: vfio-pci restores the config space it saved at open
touch /tmp/vgo
wait $vfio
run on_import /tmp/probe imp $dev 0x8200000 0x200000 "dev=$nic mode=dynamic hbm=$hbm"
# Root moves the BAR behind the kernel's back (setpci's way: a write to the BAR register):
# nothing may map the old range meanwhile (peerdirect compares the register with where it found
# the BAR at every map and CPU fault); moved back, maps work again
run moved /tmp/probe bar-move $hbm 2 0x100000000
run moved_import /tmp/probe imp $dev 0x8600000 0x200000 "dev=$nic mode=dynamic hbm=$hbm"
touch /tmp/go3
run moved_cpu /tmp/probe cpu $dev 0x8800000 0x200000 /tmp/go3
run back /tmp/probe bar-move $hbm 2 -0x100000000
run back_import /tmp/probe imp $dev 0x8600000 0x200000 "dev=$nic mode=dynamic hbm=$hbm"
run back_cpu /tmp/probe cpu $dev 0x8800000 0x200000 /tmp/go3
run done_again peerdirect companion reset-done $hbm
run not_companion peerdirect companion reset-prepare $nic
/tmp/probe cmd "release all" >/dev/null
run remove peerdirect companion remove $hbm
rmmod peerdirect_importer
run rmmod rmmod peerdirect

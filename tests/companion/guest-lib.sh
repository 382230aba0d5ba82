# Sourced by the guest scripts of tests/system/companion*.sh.
run() { # run NAME CMD...: one record
	local name=$1 out rc
	shift
	out=$("$@" 2>&1)
	rc=$?
	printf '@%s %s %s\n' "$name" "$rc" "$(printf '%s' "$out" | tr '\n' '|')"
}
build_probe() { # the probe of probe.c, as /tmp/probe: the host's build (host-lib.sh), else one here
	cp /mnt/host/probe /tmp/probe 2>/dev/null ||
		gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
}
owned_by_vfio() { # owned_by_vfio BDF: binds the device to vfio-pci, habanalabs' stand-in
	# (a module on Debian's kernel, built in on ours)
	modprobe vfio-pci 2>/dev/null
	echo vfio-pci >/sys/bus/pci/devices/$1/driver_override
	echo $1 >/sys/bus/pci/drivers_probe
}
load_companion_mode() { # peerdirect with companion=1, and the test importer
	insmod /usr/lib/peerdirect/peerdirect.ko companion=1
	insmod /usr/lib/peerdirect/tests/peerdirect_importer.ko
}
# hold_exports: with $dev, $nic and $hbm set, the companion's exports held the four ways
# (records dynamic, revocable, pinned): the NIC maps ranges dynamically (mlx5's way, id 1),
# revocable pinned (irdma's, id 2) and pinned (EFA's, id 3) through the test importer, and a
# process (pid $cpu) maps a fourth and waits for /tmp/go to read it again (its output in
# /tmp/cpu.out)
hold_exports() {
	run dynamic /tmp/probe imp $dev 0x2000000 0x4000000 "dev=$nic mode=dynamic hbm=$hbm hold=1"
	run revocable /tmp/probe imp $dev 0x6000000 0x200000 "dev=$nic mode=revocable hbm=$hbm hold=1"
	run pinned /tmp/probe imp $dev 0x6200000 0x200000 "dev=$nic mode=pinned hbm=$hbm hold=1"
	rm -f /tmp/go
	/tmp/probe cpu $dev 0x6400000 0x200000 /tmp/go >/tmp/cpu.out 2>&1 &
	cpu=$!
	while ! grep -q mapped /tmp/cpu.out 2>/dev/null; do sleep 0.1; done
}
# companion_of_vfio: with $hbm set, a fresh kernel log, the probe, $hbm bound to vfio-pci and
# named a companion (record add) by peerdirect loaded with companion=1 and the test importer:
# where the scripts that share one boot (revoke.sh, reset.sh) each start
companion_of_vfio() {
	dmesg -C
	build_probe
	owned_by_vfio $hbm
	load_companion_mode
	run add peerdirect companion add $hbm --bar 2
}

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
	echo vfio-pci >/sys/bus/pci/devices/$1/driver_override
	echo $1 >/sys/bus/pci/drivers_probe
}
load_companion_mode() { # peerdirect with companion=1, and the test importer
	insmod /usr/lib/peerdirect/peerdirect.ko companion=1
	insmod /usr/lib/peerdirect/tests/peerdirect_importer.ko
}

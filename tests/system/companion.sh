#!/usr/bin/env bash
# Companion devices (Documentation/companion.md): the HBM device stays bound to another driver
# (vfio-pci here, in the place of habanalabs) and peerdirect, loaded with companion=1, serves
# its BAR as /dev/peerdirectN when an administrator names it on /dev/peerdirect-ctl
# (`peerdirect companion add`). Checked: what `peerdirect devices`, `companion list` and `topo`
# show; every refusal with its errno (mode off, no CAP_SYS_ADMIN, no such device, a device
# peerdirect owns, a companion already, an I/O BAR, a BAR index above 5, no default BAR, remove
# of a non-companion); ALLOC refused on a companion; the companion goes when its owner unbinds
# (open files then get ENODEV) and does not come back when the owner is bound again; remove;
# and unload with a companion; kmemleak scans after. Exports of companion ranges come next
# (not part of this suite yet).
. "$(dirname "$0")/../lib.sh"
failed=0
fail() { failed=1; not_ok "$@"; }
share=$(mktemp -d)
trap 'rm -rf "$share"' EXIT

# Raw requests the CLI does not make (it refuses a BAR above 5 itself) and INFO on a file
# held open across the owner's unbind: a small C program against the uapi header, built in
# the guest's userland.
cp "$ROOT/include/uapi/peerdirect.h" "$share/"
cat >"$share/probe.c" <<'EOF'
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include "peerdirect.h"

/*
 * probe info FD | probe add-bar BAR DOMAIN BUS SLOT FUNC | probe xr DEV OFFSET LENGTH:
 *	prints OK or the errno's name
 * probe imp DEV OFFSET LENGTH "IMPORTER COMMAND": exports the range, then has the test
 *	importer run the command with fd=N prepended; prints its answer on one line
 * probe cmd "IMPORTER COMMAND": the same without an export
 * probe cpu DEV OFFSET LENGTH GOFILE: exports and maps the range, writes it, says "mapped",
 *	waits for GOFILE, then reads the mapping again (SIGBUS once revoked)
 */
static const char *errname(int e)
{
	switch (e) {
	case ENODEV: return "ENODEV";
	case EINVAL: return "EINVAL";
	case EPERM: return "EPERM";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EOVERFLOW: return "EOVERFLOW";
	default: return strerror(e);
	}
}

static int report(int rc)
{
	printf("%s\n", rc == 0 ? "OK" : errname(errno));
	return 0;
}

static int export_range(const char *dev, const char *off, const char *len)
{
	struct peerdirect_export_range x = {
		.size = sizeof(x), .flags = PEERDIRECT_EXPORT_RDWR,
		.bar_offset = strtoull(off, 0, 0), .length = strtoull(len, 0, 0),
	};
	int fd = open(dev, O_RDWR);

	if (fd < 0 || ioctl(fd, PEERDIRECT_IOC_EXPORT_RANGE, &x))
		return -1;
	return x.fd;
}

static int importer(const char *line)
{
	char buf[8192];
	int fd = open("/sys/kernel/debug/peerdirect_importer/run", O_RDWR);
	ssize_t n;

	if (fd < 0 || write(fd, line, strlen(line)) < 0)
		return printf("importer: %s\n", strerror(errno)), 1;
	n = read(fd, buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = 0;
	for (char *c = buf; *c; c++)
		if (*c == '\n')
			*c = ' ';
	printf("%s\n", buf);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "info")) {
		struct peerdirect_info info = { .size = sizeof(info) };
		return report(ioctl(atoi(argv[2]), PEERDIRECT_IOC_INFO, &info));
	}
	if (argc == 7 && !strcmp(argv[1], "add-bar")) {
		struct peerdirect_companion c = {
			.size = sizeof(c), .bar = atoi(argv[2]), .pci_domain = strtoul(argv[3], 0, 16),
			.pci_bus = strtoul(argv[4], 0, 16), .pci_slot = strtoul(argv[5], 0, 16),
			.pci_func = strtoul(argv[6], 0, 16),
		};
		int fd = open("/dev/" PEERDIRECT_CONTROL_DEVICE, O_RDWR);
		return report(fd < 0 ? fd : ioctl(fd, PEERDIRECT_IOC_COMPANION_ADD, &c));
	}
	if (argc == 5 && !strcmp(argv[1], "xr")) {
		int fd = export_range(argv[2], argv[3], argv[4]);
		return report(fd < 0 ? -1 : 0);
	}
	if (argc == 6 && !strcmp(argv[1], "imp")) {
		char line[512];
		int fd = export_range(argv[2], argv[3], argv[4]);

		if (fd < 0)
			return printf("export: %s\n", errname(errno)), 1;
		snprintf(line, sizeof(line), "fd=%d %s", fd, argv[5]);
		return importer(line);
	}
	if (argc == 3 && !strcmp(argv[1], "cmd"))
		return importer(argv[2]);
	if (argc == 6 && !strcmp(argv[1], "cpu")) {
		size_t len = strtoull(argv[4], 0, 0);
		int fd = export_range(argv[2], argv[3], argv[4]);
		volatile unsigned char *p;

		if (fd < 0)
			return printf("export: %s\n", errname(errno)), 1;
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			return printf("mmap: %s\n", errname(errno)), 1;
		p[0] = 0xa5;
		printf("mapped %x\n", p[0]);
		fflush(stdout);
		while (access(argv[5], F_OK))
			usleep(10000);
		printf("read %x\n", p[0]);
		return 0;
	}
	return 2;
}
EOF

# What every guest script below uses: run NAME CMD... prints the record "@NAME RC OUTPUT"
# (output lines joined by |) that the host checks.
cat >"$share/lib.sh" <<'EOF'
run() { # run NAME CMD...: one record
	local name=$1 out rc
	shift
	out=$("$@" 2>&1)
	rc=$?
	printf '@%s %s %s\n' "$name" "$rc" "$(printf '%s' "$out" | tr '\n' '|')"
}
EOF

# The guest's half: runs the commands, prints "@name rc output..." records the host checks.
cat >"$share/owner.sh" <<'EOF'
gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
hbm=0000:03:00.0 nic=0000:04:00.0
. /mnt/host/lib.sh
echo vfio-pci >/sys/bus/pci/devices/$hbm/driver_override
echo $hbm >/sys/bus/pci/drivers_probe
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
run add3 peerdirect companion add $hbm --bar 2
run rmmod rmmod peerdirect
run log sh -c 'dmesg | grep "peerdirect.*companion\|peerdirect0: removed"'
EOF

cat >"$share/exports.sh" <<'EOF'
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0
. /mnt/host/lib.sh
gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
echo vfio-pci >/sys/bus/pci/devices/$hbm/driver_override
echo $hbm >/sys/bus/pci/drivers_probe
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
insmod /usr/lib/peerdirect/tests/peerdirect_importer.ko
peerdirect companion add $hbm --bar 2 >/dev/null
run unaligned /tmp/probe xr $dev 0x1000800 0x200000
run unaligned_len /tmp/probe xr $dev 0x1000000 0x1800
run zero /tmp/probe xr $dev 0x1000000 0
run past_end /tmp/probe xr $dev 0xfe00000 0x400000
run outside /tmp/probe xr $dev 0x10000000 0x200000
run overflow /tmp/probe xr $dev 0x1000 0xfffffffffffff000
run no_cap setpriv --inh-caps=-sys_admin --bounding-set=-sys_admin /tmp/probe xr $dev 0x1000000 0x200000
run pattern peerdirect companion export --bar-offset 8M --size 4M --pattern 0x5eed0002 --verify 0x5eed0002
run dynamic /tmp/probe imp $dev 0x2000000 0x4000000 "dev=$nic mode=dynamic hbm=$hbm hold=1"
run revocable /tmp/probe imp $dev 0x6000000 0x200000 "dev=$nic mode=revocable hbm=$hbm hold=1"
run pinned /tmp/probe imp $dev 0x6200000 0x200000 "dev=$nic mode=pinned hbm=$hbm hold=1"
rm -f /tmp/go
/tmp/probe cpu $dev 0x6400000 0x200000 /tmp/go >/tmp/cpu.out 2>&1 &
cpu=$!
while ! grep -q mapped /tmp/cpu.out 2>/dev/null; do sleep 0.1; done
# The owner unbinds: the companion goes, revoking first; the pinned import holds it up.
echo $hbm >/sys/bus/pci/drivers/vfio-pci/unbind &
unbind=$!
sleep 2
run unbind_waits sh -c "kill -0 $unbind && echo waiting"
run status1 /tmp/probe cmd "status id=1"
run status2 /tmp/probe cmd "status id=2"
run status3 /tmp/probe cmd "status id=3"
run release3 /tmp/probe cmd "release id=3"
wait $unbind
run unbind_done sh -c "test ! -e $dev && echo gone"
touch /tmp/go
wait $cpu
echo "@cpu $? $(tr '\n' '|' </tmp/cpu.out)"
run remap1 /tmp/probe cmd "remap id=1"
run release_all /tmp/probe cmd "release all"
echo $hbm >/sys/bus/pci/drivers_probe
run rebound_list peerdirect companion list
rmmod peerdirect_importer
run rmmod rmmod peerdirect
EOF

# Split topology: the HBM and the NIC on two root ports, which the kernel gives no P2P path.
cat >"$share/split.sh" <<'EOF'
. /mnt/host/lib.sh
gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
insmod /usr/lib/peerdirect/tests/peerdirect_importer.ko
run add peerdirect companion add 0000:01:00.0 --bar 2
run import /tmp/probe imp /dev/peerdirect0 0 0x200000 "dev=0000:02:00.0 mode=dynamic hbm=0000:01:00.0"
rmmod peerdirect_importer
run rmmod rmmod peerdirect
EOF

# The races: for RACE seconds, on the KASAN kernel, at once: the companion named and removed,
# its owner unbound and bound again, dma-bufs exported from it and imported (mapped and
# unmapped by the test importer), its device file opened and asked INFO, and the device list
# read. Each loop counts what it did; every failure is one of the errnos a lost race gives.
cat >"$share/race.sh" <<'EOF'
hbm=0000:03:00.0 nic=0000:04:00.0 dev=/dev/peerdirect0 secs=$1
gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
echo vfio-pci >/sys/bus/pci/devices/$hbm/driver_override
echo $hbm >/sys/bus/pci/drivers_probe
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
insmod /usr/lib/peerdirect/tests/peerdirect_importer.ko
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
EOF

cat >"$share/owned.sh" <<'EOF'
. /mnt/host/lib.sh
gcc -Wall -Werror -o /tmp/probe /mnt/host/probe.c || echo "@probe_build 1 gcc failed"
# hbm1 (0000:05:00.0) is peerdirect's own; hbm0 has no driver at all.
echo peerdirect >/sys/bus/pci/devices/0000:05:00.0/driver_override
insmod /usr/lib/peerdirect/peerdirect.ko companion=1
run owned peerdirect companion add 0000:05:00.0 --bar 2
run owned_xr /tmp/probe xr /dev/peerdirect0 0 0x200000
run unowned peerdirect companion add 0000:03:00.0 --bar 2
run devices peerdirect devices
run rmmod rmmod peerdirect
EOF

record() { sed -n "s/^@$1 //p" "$share/$2.out"; }
rc_of() { record "$1" "$2" | cut -d' ' -f1; }
out_of() { record "$1" "$2" | cut -d' ' -f2-; }
# expect DESCRIPTION FILE NAME RC PATTERN: the record's exit status and output
expect() {
	local desc=$1 file=$2 name=$3 rc=$4 pattern=$5
	if [ "$(rc_of "$name" "$file")" = "$rc" ] && out_of "$name" "$file" | grep -Eq -- "$pattern"; then
		ok "$desc"
	else
		fail "$desc" "$name: exit $(rc_of "$name" "$file"), output: $(out_of "$name" "$file")"
	fi
}

guest --topology switch-iommu --no-bind --userland trixie --kmemleak --share "$share" -- \
	bash /mnt/host/owner.sh >"$share/owner.out" 2>"$share/owner.err"
r=$?
[ $r = 0 ] || fail "the guest run (HBM owned by vfio-pci) ends cleanly" \
	"qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" "$(cat "$share/owner.err")" "$(cat "$share/owner.out")"

expect "the HBM device is bound to vfio-pci, standing in for habanalabs" owner owner 0 'drivers/vfio-pci$'
expect "companion add without companion=1: EOPNOTSUPP, and told to load the module with companion=1" \
	owner mode_off 1 'os error 95\); companion mode is off: load the module with companion=1'
expect "/dev/peerdirect-ctl is root's alone (0600)" owner ctl_mode 0 '^600 root'
expect "root without CAP_SYS_ADMIN: EPERM, and told why" owner no_cap 1 'os error 1\); companion devices are for administrators'
expect "another user cannot open the control device: EACCES, told it is for administrators" \
	owner not_root 1 'os error 13\); the control device is for administrators: run as root'
expect "companion add 0000:03:00.0 --bar 2 serves /dev/peerdirect0 beside vfio-pci" owner add 0 '^/dev/peerdirect0'
expect "the same device again: EEXIST" owner again 1 'os error 17\); that device is a companion already'
expect "a PCI address with no device: ENXIO" owner none 1 'os error 6\); no PCI device has that address'
expect "the NIC's BAR 0, an I/O BAR: EINVAL" owner io_bar 1 'os error 22\); the HBM BAR must be a memory BAR'
expect "a device outside the ID table without --bar (no default BAR): EINVAL" owner no_default 1 'os error 22\)'
expect "a BAR index above 5 (raw request; the CLI refuses it itself): EINVAL" owner bar6 0 'EINVAL'
devices=$(out_of devices owner | tr '|' '\n')
desc="peerdirect devices --json: provider companion, driver vfio-pci, BAR 2, 256 MiB, the device's bus address"
if [ "$(rc_of devices owner)" = 0 ] &&
   [ "$(jq -r '.[0] | [.provider, .driver, .bar_index, .hbm_bytes, .pci_address] | @tsv' <<<"$devices" 2>/dev/null)" = \
     "$(printf 'companion\tvfio-pci\t2\t268435456\t0000:03:00.0')" ]; then
	ok "$desc"
else
	fail "$desc" "$devices"
fi
expect "peerdirect companion list names it" owner list 0 '^/dev/peerdirect0  0000:03:00.0  BAR2  companion of vfio-pci'
topo=$(out_of topo owner | tr '|' '\n')
desc="peerdirect topo on the companion: the NIC reaches it peer-to-peer (the kernel's verdict, 4 hops)"
if [ "$(jq -r '.[0].peers[] | select(.pci_address == "0000:04:00.0") | [.p2p, .distance] | @tsv' <<<"$topo" 2>/dev/null)" = "$(printf 'true\t4')" ]; then
	ok "$desc"
else
	fail "$desc" "$topo"
fi
expect "ALLOC on a companion: EOPNOTSUPP, told that its owner owns the memory" owner alloc 1 'os error 95\); a companion device has no allocator'
desc="the owner's unbind removes the companion: /dev/peerdirect0 is gone"
if [ "$(rc_of after_unbind owner)" = 0 ] && ! out_of after_unbind owner | tr '|' '\n' | grep -qx 'peerdirect0'; then
	ok "$desc"
else
	fail "$desc" "$(out_of after_unbind owner)"
fi
expect "a file opened before the owner's unbind gets ENODEV" owner info_after_unbind 0 'ENODEV'
expect "the owner is bound again" owner rebound 0 'drivers/vfio-pci$'
desc="rebinding the owner brings no companion back"
if [ "$(rc_of list_rebound owner)" = 0 ] && [ -z "$(out_of list_rebound owner)" ]; then ok "$desc"; else fail "$desc" "$(out_of list_rebound owner)"; fi
expect "named again, it is a new /dev/peerdirect0" owner add2 0 '^/dev/peerdirect0'
expect "companion remove stops serving it" owner remove 0 '^$'
expect "remove of a device that is not a companion: ENOENT" owner remove_again 1 'os error 2\); that device is not a companion'
expect "rmmod with a companion in place unloads cleanly" owner rmmod 0 '^$'
expect "the kernel log says each companion's start and end" owner log 0 'companion 0000:03:00.0: its driver unbinds or it is being removed.*companion 0000:03:00.0: removed on request'

# Exports of companion ranges, with the HBM's backing file kept to check the data.
guest --topology switch-iommu --no-bind --userland trixie --kmemleak --share "$share" \
	--hbm-backing "$share/hbm" -- bash /mnt/host/exports.sh >"$share/exports.out" 2>"$share/exports.err"
r=$?
[ $r = 0 ] || fail "the guest run (exports of a companion) ends cleanly" \
	"qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" "$(cat "$share/exports.err")" "$(cat "$share/exports.out")"
expect "EXPORT_RANGE at an unaligned BAR offset: EINVAL" exports unaligned 0 '^EINVAL$'
expect "EXPORT_RANGE of an unaligned length: EINVAL" exports unaligned_len 0 '^EINVAL$'
expect "EXPORT_RANGE of length 0: EINVAL" exports zero 0 '^EINVAL$'
expect "EXPORT_RANGE across the BAR's end: EINVAL" exports past_end 0 '^EINVAL$'
expect "EXPORT_RANGE outside the BAR: EINVAL" exports outside 0 '^EINVAL$'
expect "EXPORT_RANGE whose end overflows 64 bits: EOVERFLOW" exports overflow 0 '^EOVERFLOW$'
expect "EXPORT_RANGE without CAP_SYS_ADMIN: EPERM" exports no_cap 0 '^EPERM$'
expect "companion export --pattern writes 4 MiB through the dma-buf's mapping and reads it back" \
	exports pattern 0 '"bytes_verified": 4194304'
desc="the pattern written through the companion's dma-buf is in the HBM backing file at BAR offset 8 MiB, and the next 4 MiB are untouched"
if "$ROOT/tests/hbm-pattern" check "$share/hbm" $((8 << 20)) $((4 << 20)) 0x5eed0002 >"$share/check" 2>&1 &&
   "$ROOT/tests/hbm-pattern" zero "$share/hbm" $((12 << 20)) $((4 << 20)) >>"$share/check" 2>&1; then
	ok "$desc"
else
	fail "$desc" "$(cat "$share/check")"
fi
# The BAR's bus address (0xd0000000 in this topology) plus the offset: DMA by bus address.
expect "a dynamic importer (the NIC, below the same switch) maps 64 MiB at BAR offset 32 MiB by bus address 0xd2000000, in entries no longer than its max segment" \
	exports dynamic 0 'attach=0 .*map=0 .*sg0=0xd2000000\+.*dma_total=67108864 .*over_max_seg=0 .*id=1'
expect "a revocable pinned importer maps its range" exports revocable 0 'attach=0 .*pin=0 .*map=0 .*sg0=0xd6000000\+.*id=2'
expect "a pinned importer (EFA's way) maps its range" exports pinned 0 'attach=0 .*pin=0 .*map=0 .*sg0=0xd6200000\+.*id=3'
expect "the owner's unbind waits while the pinned importer maps the BAR" exports unbind_waits 0 '^waiting$'
expect "meanwhile the dynamic importer was invalidated and dropped its mapping" exports status1 0 'invalidations=[1-9].*mapped=0 '
expect "and the revocable pinned one was revoked" exports status2 0 'invalidations=[1-9].*mapped=0 .*pinned=0 .*revoked=1'
expect "the pinned one still maps it" exports status3 0 'mapped=1 .*pinned=1'
expect "releasing the pinned import lets the unbind finish, and the companion is gone" exports unbind_done 0 '^gone$'
expect "a CPU mapping of a companion export faults with SIGBUS after the owner's unbind" exports cpu 135 '^mapped a5\|$'
expect "a revoked import cannot map again" exports remap1 0 'map=-19'
expect "rebinding the owner brings no companion back" exports rebound_list 0 '^$'
expect "rmmod afterwards unloads cleanly" exports rmmod 0 '^$'

guest --topology switch --second-hbm --no-bind --userland trixie --share "$share" -- \
	bash /mnt/host/owned.sh >"$share/owned.out" 2>"$share/owned.err"
r=$?
[ $r = 0 ] || fail "the guest run (a second HBM device peerdirect owns) ends cleanly" \
	"qemu/run exited $r" "$(cat "$share/owned.err")" "$(cat "$share/owned.out")"
expect "a device peerdirect is the driver of: EBUSY" owned owned 1 'os error 16\); peerdirect is that device'"'"'s driver already'
expect "EXPORT_RANGE on a device peerdirect owns: EOPNOTSUPP (allocate and export there)" owned owned_xr 0 '^EOPNOTSUPP$'
expect "a device no driver owns can be a companion" owned unowned 0 '^/dev/peerdirect1'
expect "peerdirect devices lists both: owned and companion (no driver)" owned devices 0 'peerdirect0 .* owned.*peerdirect1 .* companion \(no driver\)'
expect "rmmod with an owned device and a companion unloads cleanly" owned rmmod 0 '^$'
guest --topology split --no-bind --userland trixie --share "$share" -- \
	bash /mnt/host/split.sh >"$share/split.out" 2>"$share/split.err"
r=$?
[ $r = 0 ] || fail "the guest run (split topology) ends cleanly" "qemu/run exited $r" "$(cat "$share/split.err")" "$(cat "$share/split.out")"
expect "split topology: the HBM device (no driver) is a companion" split add 0 '^/dev/peerdirect0$'
expect "split topology: the NIC on another root port is refused at attach (EOPNOTSUPP, the kernel's P2P verdict: -1)" \
	split import 0 'p2p_distance=-1 .*attach=-95'
expect "split topology: rmmod afterwards unloads cleanly" split rmmod 0 '^$'

race=${PEERDIRECT_RACE_SECONDS:-10}
guest --kernel kasan --topology switch-iommu --no-bind --userland trixie --kmemleak --share "$share" -- \
	bash /mnt/host/race.sh "$race" >"$share/race.out" 2>"$share/race.err"
r=$?
counts=$(sed -n 's/^@loop_\([a-z_]*\) 0 \([0-9]*\)$/\1=\2/p' "$share/race.out" | tr '\n' ' ')
desc="${race} s of racing on the KASAN kernel (add/remove, owner unbind/bind, imports, opens, listing: $counts) end without a KASAN or other kernel report and no leak, and the module unloads"
if [ $r = 0 ] && [ "$(rc_of rmmod race)" = 0 ] && [ "$(grep -c '^@loop_' "$share/race.out")" = 6 ] &&
   ! grep -q '@loop_[a-z_]* 0 0$' "$share/race.out"; then
	ok "$desc"
else
	fail "$desc" "qemu/run exited $r (99: kernel splat, 98: guest died, 124: timeout)" "$(cat "$share/race.err")" "$(cat "$share/race.out")"
fi

echo "1..$tap_n"
exit $failed

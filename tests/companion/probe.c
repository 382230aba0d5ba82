// SPDX-License-Identifier: GPL-2.0
/* The companion suites' probe (tests/companion/): raw requests the CLI does not make. */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <linux/vfio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include "peerdirect.h"

/*
 * probe driver DEV: INFO's answer size and driver name, as "size=N driver=NAME"
 * probe info FD | probe add-bar BAR DOMAIN BUS SLOT FUNC | probe xr DEV OFFSET LENGTH:
 *	prints OK or the errno's name
 * probe ctl-ro add|remove|reset-prepare|reset-done BDF [BAR]: that control device command for
 *	the device at BDF (DOMAIN:BUS:SLOT.FUNC; ADD's BAR, default 0xff) with its argument in a
 *	read-only page, so that its answer cannot be written back; prints OK or the errno's name
 * probe ctl-failnth add|remove|reset-prepare|reset-done BDF DEV [BAR]: that command with its
 *	N-th copy of user memory failed (the kernel's fault injection, /proc/thread-self/fail-nth),
 *	for N = 1, 2, ... until a run has none failed; prints, for each run, OUTCOME/STATE: OK or
 *	the errno's name, then for ADD and REMOVE how many /dev/peerdirectN exist, for the
 *	resets what EXPORT_RANGE of 2 MiB at 16 MiB of DEV gives (OK, or EBUSY while a reset is
 *	under way)
 * probe imp DEV OFFSET LENGTH "IMPORTER COMMAND": exports the range, then has the test
 *	importer run the command with fd=N prepended; prints its answer on one line
 * probe cmd "IMPORTER COMMAND": the same without an export
 * probe cpu DEV OFFSET LENGTH GOFILE: exports and maps the range, writes it, says "mapped",
 *	waits for GOFILE, then reads the mapping again (SIGBUS once revoked)
 * probe vfio-open BDF [GOFILE [decode-off]]: opens the device bound to vfio-pci as a vfio
 *	user does (its group, a type1 container, the device fd), which has vfio-pci reset it;
 *	with decode-off, turns the device's memory decoding off through vfio's config region,
 *	as a VM's driver does; prints "opened reset_works=N" (or the step that failed), waits
 *	for GOFILE if given, then closes it (vfio-pci resets it again if it can and restores
 *	the config space it saved at open, decoding on)
 * probe bar-move BDF BAR DELTA: moves the memory BAR by DELTA bytes (a signed number) behind
 *	the kernel's back, as root's setpci can: writes the BAR register(s) through the
 *	device's sysfs config file; prints "moved OLD -> NEW" (bus addresses)
 */
static int bar_move(const char *bdf, int bar, long long delta)
{
	char path[96];
	unsigned int lo, hi = 0;
	unsigned long long addr;
	off_t where = 0x10 + 4 * bar;
	int fd, wide;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", bdf);
	fd = open(path, O_RDWR);
	if (fd < 0 || pread(fd, &lo, 4, where) != 4)
		return printf("%s: %s\n", path, strerror(errno)), 1;
	wide = (lo & 6) == 4; /* PCI_BASE_ADDRESS_MEM_TYPE_64 */
	if (wide && pread(fd, &hi, 4, where + 4) != 4)
		return printf("%s: %s\n", path, strerror(errno)), 1;
	addr = ((unsigned long long)hi << 32 | lo) & ~0xfULL;
	lo = (unsigned int)(addr + delta) | (lo & 0xf);
	hi = (unsigned int)((addr + delta) >> 32);
	if (pwrite(fd, &lo, 4, where) != 4 || (wide && pwrite(fd, &hi, 4, where + 4) != 4))
		return printf("write %s: %s\n", path, strerror(errno)), 1;
	printf("moved %#llx -> %#llx\n", addr, addr + delta);
	close(fd);
	return 0;
}

static const char *errname(int e)
{
	switch (e) {
	case ENODEV: return "ENODEV";
	case EINVAL: return "EINVAL";
	case EPERM: return "EPERM";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EOVERFLOW: return "EOVERFLOW";
	case EFAULT: return "EFAULT";
	case EBUSY: return "EBUSY";
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

/* The request for the control device command CMD; 0 for an unknown CMD or address. */
static unsigned long control_request(const char *cmd, const char *bdf, unsigned int bar,
				     struct peerdirect_companion *c)
{
	unsigned int domain, bus, slot, func;

	if (sscanf(bdf, "%x:%x:%x.%x", &domain, &bus, &slot, &func) != 4)
		return printf("not a PCI address: %s\n", bdf), 0;
	*c = (struct peerdirect_companion){
		.size = sizeof(*c), .pci_domain = domain, .pci_bus = bus, .pci_slot = slot,
		.pci_func = func, .bar = bar,
	};
	if (!strcmp(cmd, "add"))
		return PEERDIRECT_IOC_COMPANION_ADD;
	if (!strcmp(cmd, "remove"))
		return PEERDIRECT_IOC_COMPANION_REMOVE;
	if (!strcmp(cmd, "reset-prepare"))
		return PEERDIRECT_IOC_COMPANION_RESET_PREPARE;
	if (!strcmp(cmd, "reset-done"))
		return PEERDIRECT_IOC_COMPANION_RESET_DONE;
	return printf("unknown command %s\n", cmd), 0;
}

static int control_read_only(const char *cmd, const char *bdf, unsigned int bar)
{
	size_t page = sysconf(_SC_PAGESIZE);
	struct peerdirect_companion *c;
	unsigned long req;
	int fd;

	c = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c == MAP_FAILED)
		return printf("mmap: %s\n", strerror(errno)), 1;
	req = control_request(cmd, bdf, bar, c);
	if (!req)
		return 2;
	if (mprotect(c, page, PROT_READ))
		return printf("mprotect: %s\n", strerror(errno)), 1;
	fd = open("/dev/" PEERDIRECT_CONTROL_DEVICE, O_RDWR);
	return report(fd < 0 ? fd : ioctl(fd, req, c));
}

/* How many /dev/peerdirectN exist. */
static int devices(void)
{
	glob_t g;
	int n = glob("/dev/" PEERDIRECT_DEVICE_PREFIX "[0-9]*", 0, NULL, &g) ? 0 : (int)g.gl_pathc;

	globfree(&g);
	return n;
}

/* What EXPORT_RANGE of 2 MiB at 16 MiB of DEV gives: "OK" (the dma-buf closed at once) or the
 * errno's name. */
static const char *exports(const char *dev)
{
	struct peerdirect_export_range x = {
		.size = sizeof(x), .bar_offset = 16 << 20, .length = 2 << 20,
	};
	int fd = open(dev, O_RDWR), rc, err;

	if (fd < 0)
		return errname(errno);
	rc = ioctl(fd, PEERDIRECT_IOC_EXPORT_RANGE, &x);
	err = errno;
	close(fd);
	if (rc)
		return errname(err);
	close(x.fd);
	return "OK";
}

static int control_fail_nth(const char *cmd, const char *bdf, const char *dev, unsigned int bar)
{
	int ctl = open("/dev/" PEERDIRECT_CONTROL_DEVICE, O_RDWR);
	int nth = open("/proc/thread-self/fail-nth", O_RDWR);
	int verbose = open("/sys/kernel/debug/fail_usercopy/verbose", O_WRONLY);
	int resets = !strncmp(cmd, "reset", 5);
	struct peerdirect_companion c;
	unsigned long req;

	if (ctl < 0 || nth < 0)
		return printf("open: %s\n", strerror(errno)), 1;
	/* A line for each failure made, not a stack. */
	if (verbose >= 0 && write(verbose, "1", 1) != 1)
		return printf("fail_usercopy/verbose: %s\n", strerror(errno)), 1;
	for (int n = 1; n <= 16; n++) {
		char arm[16], now[16];
		int rc, err, injected;
		ssize_t len;

		req = control_request(cmd, bdf, bar, &c);
		if (!req)
			return 2;
		len = snprintf(arm, sizeof(arm), "%d", n);
		if (pwrite(nth, arm, len, 0) != len)
			return printf("fail-nth: %s\n", strerror(errno)), 1;
		rc = ioctl(ctl, req, &c);
		err = errno;
		/* 0 once the failure was made. Otherwise this read's own copy may be the armed
		 * one (EFAULT), and so may the write that disarms, which disarms all the same. */
		len = pread(nth, now, sizeof(now) - 1, 0);
		injected = len == 2 && now[0] == '0';
		if (pwrite(nth, "0", 1, 0) != 1 && errno != EFAULT)
			return printf("fail-nth: %s\n", strerror(errno)), 1;
		if (resets)
			printf("%s/%s", rc ? errname(err) : "OK", exports(dev));
		else
			printf("%s/%d", rc ? errname(err) : "OK", devices());
		if (!injected)
			return printf("\n"), 0;
		printf(" ");
	}
	return printf("\nstill failing after 16 copies\n"), 1;
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

static int vfio_open(const char *bdf, const char *go, int decode_off)
{
	struct vfio_region_info config = {
		.argsz = sizeof(config), .index = VFIO_PCI_CONFIG_REGION_INDEX,
	};
	struct vfio_device_info info = { .argsz = sizeof(info) };
	unsigned short cmd;
	char link[256], target[256], path[64];
	int container, group, dev;
	ssize_t n;

	snprintf(link, sizeof(link), "/sys/bus/pci/devices/%s/iommu_group", bdf);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return printf("iommu_group: %s\n", strerror(errno)), 1;
	target[n] = 0;
	snprintf(path, sizeof(path), "/dev/vfio/%s", basename(target));
	container = open("/dev/vfio/vfio", O_RDWR);
	group = open(path, O_RDWR);
	if (container < 0 || group < 0)
		return printf("open %s: %s\n", path, strerror(errno)), 1;
	if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container) ||
	    ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU))
		return printf("container: %s\n", strerror(errno)), 1;
	dev = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf);
	if (dev < 0 || ioctl(dev, VFIO_DEVICE_GET_INFO, &info))
		return printf("device: %s\n", strerror(errno)), 1;
	if (decode_off) {
		/* PCI_COMMAND (offset 4), without PCI_COMMAND_MEMORY (bit 1) */
		if (ioctl(dev, VFIO_DEVICE_GET_REGION_INFO, &config) ||
		    pread(dev, &cmd, 2, config.offset + 4) != 2)
			return printf("config: %s\n", strerror(errno)), 1;
		cmd &= ~2;
		if (pwrite(dev, &cmd, 2, config.offset + 4) != 2)
			return printf("config write: %s\n", strerror(errno)), 1;
	}
	printf("opened reset_works=%d%s\n", !!(info.flags & VFIO_DEVICE_FLAGS_RESET),
	       decode_off ? " decode=off" : "");
	fflush(stdout);
	while (go && access(go, F_OK))
		usleep(10000);
	close(dev);
	close(group);
	close(container);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "driver")) {
		struct peerdirect_info info = { .size = sizeof(info) };
		int fd = open(argv[2], O_RDWR);

		if (fd < 0 || ioctl(fd, PEERDIRECT_IOC_INFO, &info))
			return report(-1);
		printf("size=%u driver=%.*s\n", info.size, (int)sizeof(info.driver), (char *)info.driver);
		return 0;
	}
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
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "ctl-failnth"))
		return control_fail_nth(argv[2], argv[3], argv[4],
					argc == 6 ? strtoul(argv[5], 0, 0) : PEERDIRECT_COMPANION_BAR_DEFAULT);
	if ((argc == 4 || argc == 5) && !strcmp(argv[1], "ctl-ro"))
		return control_read_only(argv[2], argv[3],
					 argc == 5 ? strtoul(argv[4], 0, 0) : PEERDIRECT_COMPANION_BAR_DEFAULT);
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
	if (argc == 5 && !strcmp(argv[1], "bar-move"))
		return bar_move(argv[2], atoi(argv[3]), strtoll(argv[4], 0, 0));
	if (argc >= 3 && argc <= 5 && !strcmp(argv[1], "vfio-open"))
		return vfio_open(argv[2], argc >= 4 ? argv[3] : NULL,
				 argc == 5 && !strcmp(argv[4], "decode-off"));
	return 2;
}

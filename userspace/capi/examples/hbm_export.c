/*
 * hbm_export: the C ABI end to end. Opens /dev/peerdirect0, prints what it is, allocates
 * 4 MiB of HBM, exports it as a dma-buf, maps it, writes a pattern and reads it back, frees
 * everything and prints the module's counters. Exit status 0 iff all of it worked.
 *
 *   cc -o hbm_export hbm_export.c $(pkg-config --cflags --libs peerdirect)
 */
#define _DEFAULT_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <linux/dma-buf.h>
#include <peerdirect.h>

#define LENGTH (4u << 20)

static int fail(const char *what, int err)
{
	fprintf(stderr, "hbm_export: %s: %s (%s)\n", what, pd_strerror(err), pd_last_error());
	return 1;
}

/* Brackets CPU access to the mapping (DMA_BUF_IOCTL_SYNC). */
static int sync_dma_buf(int fd, uint64_t flags)
{
	struct dma_buf_sync sync = { .flags = flags };

	if (ioctl(fd, DMA_BUF_IOCTL_SYNC, &sync) != 0) {
		perror("hbm_export: DMA_BUF_IOCTL_SYNC");
		return -1;
	}
	return 0;
}

/* Word i of the pattern: anything that differs from word to word and from zero. */
static uint64_t pattern(size_t i)
{
	return (i + 1) * UINT64_C(0x9e3779b97f4a7c15);
}

/* Writes the pattern through the mapping and reads it back: 0 iff every word matches. */
static int round_trip(int fd)
{
	volatile uint64_t *words;
	size_t i, n = LENGTH / sizeof(uint64_t), bad = 0;
	void *map = mmap(NULL, LENGTH, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (map == MAP_FAILED) {
		perror("hbm_export: mmap");
		return 1;
	}
	words = map;
	if (sync_dma_buf(fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_WRITE))
		goto out;
	for (i = 0; i < n; i++)
		words[i] = pattern(i);
	if (sync_dma_buf(fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_WRITE) ||
	    sync_dma_buf(fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ))
		goto out;
	for (i = 0; i < n; i++) {
		if (words[i] != pattern(i) && bad++ == 0)
			fprintf(stderr, "hbm_export: word %zu is %#" PRIx64 ", wrote %#" PRIx64 "\n",
				i, words[i], pattern(i));
	}
	if (sync_dma_buf(fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ))
		goto out;
	printf("wrote and read back %u bytes through the mapping: %zu words differ\n", LENGTH, bad);
	munmap(map, LENGTH);
	return bad != 0;
out:
	munmap(map, LENGTH);
	return 1;
}

int main(void)
{
	struct pd_device_info info;
	struct pd_stats stats;
	pd_allocation *alloc;
	pd_device *dev;
	int err, fd, failed;

	printf("libpeerdirect %s\n", pd_version());
	dev = pd_device_open(0, &err);
	if (!dev)
		return fail("pd_device_open(0)", err);
	err = pd_device_info(dev, &info);
	if (err)
		return fail("pd_device_info", err);
	printf("/dev/peerdirect%" PRIu32 ": %04" PRIx32 ":%02x:%02x.%x [%04x:%04x] BAR %" PRIu32
	       ", %" PRIu64 " bytes of HBM at bus address %#" PRIx64 ", provider %s\n",
	       info.index, info.pci_domain, info.pci_bus, info.pci_slot, info.pci_func,
	       info.vendor_id, info.device_id, info.bar_index, info.hbm_bytes, info.hbm_bus_addr,
	       info.provider == PD_PROVIDER_OWNED ? "owned" :
	       info.provider == PD_PROVIDER_COMPANION ? "companion" : "unknown");

	err = pd_alloc(dev, LENGTH, 0, &alloc);
	if (err)
		return fail("pd_alloc(4 MiB)", err);
	printf("allocated %" PRIu64 " bytes at HBM offset %#" PRIx64 " (handle %" PRIu32 ")\n",
	       pd_allocation_length(alloc), pd_allocation_hbm_offset(alloc),
	       pd_allocation_handle(alloc));

	err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd);
	if (err)
		return fail("pd_export", err);
	printf("exported as dma-buf fd %d\n", fd);

	failed = round_trip(fd);
	close(fd);
	err = pd_allocation_free(alloc);
	if (err)
		return fail("pd_allocation_free", err);
	pd_device_close(dev);

	err = pd_stats(0, &stats);
	if (err)
		return fail("pd_stats(0)", err);
	printf("stats: allocations %" PRIu64 ", allocated_bytes %" PRIu64 ", exports %" PRIu64
	       ", hbm_bytes %" PRIu64 "\n",
	       stats.allocations, stats.allocated_bytes, stats.exports, stats.hbm_bytes);
	if (failed || stats.allocations || stats.exports) {
		fprintf(stderr, "hbm_export: %s\n",
			failed ? "the pattern did not read back" : "memory left allocated or exported");
		return 1;
	}
	return 0;
}

/*
 * reset_register: pd_register of an allocation across a reset of its device.
 *
 * The first pd_register of an allocation exports it; a reset of the device (its sysfs
 * "reset", a secondary bus reset) revokes that export, and keeps the device and the
 * allocation. pd_register of the same allocation after the reset must register a new export
 * of it, not the revoked one: on a provider that imports dma-bufs (ibverbs, with the patched
 * rxe) the revoked one is refused with -ENODEV; on tcp, which moves bytes through the
 * library's CPU mapping of the export, the revoked one's mapping faults with SIGBUS.
 *
 * The program allocates 4 MiB on /dev/peerdirect0, registers it (tcp on 127.0.0.1, or the
 * ibverbs device named after "verbs"), holds that registration, resets the device and
 * registers the allocation again; then once more (a cache hit). On tcp it writes and reads
 * bytes at each registration's local address, and checks that the first one's faults after
 * the reset (so that the reset did revoke). It releases everything; the held handle of the
 * revoked registration is released after the new one was made.
 *
 * Beside it, an export of the allocation the program made itself (pd_export) is registered
 * with pd_register_export before the reset; after it, registering that fd again must fail
 * with -ENODEV saying to export again (the library's mapping of it faults), and a new export
 * registers.
 * Prints "ok - ..." or "FAIL - ..."; exit status 0 iff all went well.
 *
 *   cc -o reset_register reset_register.c \
 *      $(pkg-config --cflags --libs peerdirect libfabric libibverbs)
 *   ./reset_register [verbs DEVICE]
 */
#define _POSIX_C_SOURCE 200809L /* strdup, sigsetjmp */
#include <errno.h>
#include <unistd.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "tcp_cache.h"

#define LENGTH (4u << 20)
#define SPACER (16u << 20)
#define ACCESS (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ)

static sigjmp_buf fault_jump;

static void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(fault_jump, 1);
}

/* Writes byte to the first page at addr and reads it back: 0, or 1 if that faulted (SIGBUS). */
static int touch(volatile unsigned char *addr, unsigned char byte)
{
	struct sigaction action, old;
	int faulted = 0;

	memset(&action, 0, sizeof(action));
	action.sa_handler = on_sigbus;
	sigaction(SIGBUS, &action, &old);
	if (sigsetjmp(fault_jump, 1) == 0) {
		for (unsigned i = 0; i < 4096; i++)
			addr[i] = byte;
		for (unsigned i = 0; i < 4096; i++)
			if (addr[i] != byte)
				faulted = 2;
	} else {
		faulted = 1;
	}
	sigaction(SIGBUS, &old, NULL);
	return faulted;
}

/* Resets the device through its sysfs reset: 0, or 1 after printing why not. */
static int reset(const pd_device *dev)
{
	struct pd_device_info info;
	char path[96];
	FILE *file;
	int err = pd_device_info(dev, &info);

	if (err) {
		printf("FAIL - pd_device_info: %s (%s)\n", pd_strerror(err), pd_last_error());
		return 1;
	}
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x/reset",
		 info.pci_domain, info.pci_bus, info.pci_slot, info.pci_func);
	file = fopen(path, "w");
	if (!file || fputs("1", file) == EOF || fclose(file)) {
		printf("FAIL - writing 1 to %s: %s\n", path, strerror(errno));
		return 1;
	}
	printf("ok - the device reset through %s\n", path);
	return 0;
}

/* Opens the ibverbs device name and a protection domain of it: 0, or 1 after printing why not. */
static int verbs_open(const char *name, struct ibv_context **context, struct ibv_pd **pd)
{
	struct ibv_device **list;
	int n, i;

	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			*context = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!*context || !(*pd = ibv_alloc_pd(*context))) {
		printf("FAIL - opening RDMA device %s and a protection domain\n", name);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *verbs = argc > 2 && strcmp(argv[1], "verbs") == 0 ? argv[2] : NULL;
	struct tcp_cache t;
	struct ibv_context *context = NULL;
	struct ibv_pd *pd = NULL;
	struct pd_regcache_stats stats;
	pd_device *dev = NULL;
	pd_allocation *alloc = NULL, *spacer = NULL;
	pd_mr *before = NULL, *after = NULL, *hit = NULL, *own = NULL;
	int own_fd = -1, new_fd = -1;
	void *addr_before = NULL, *addr_after = NULL, *addr;
	uint64_t length;
	int err, status = 1;

	memset(&t, 0, sizeof(t));
	if (verbs) {
		if (verbs_open(verbs, &context, &pd))
			goto out;
		t.cache = pd_regcache_new(&err);
		if (!t.cache || !(t.dom = pd_domain_attach_verbs(t.cache, pd, &err))) {
			printf("FAIL - pd_regcache_new / pd_domain_attach_verbs: %s (%s)\n",
			       pd_strerror(err), pd_last_error());
			goto out;
		}
	} else if (tcp_cache_open(&t)) {
		goto out;
	}
	dev = pd_device_open(0, &err);
	/* The spacer keeps this program's bytes off the first 16 MiB of HBM, where the programs
	 * run before it in tests/system/capi.sh leave theirs for the host to check. */
	if (!dev || (err = pd_alloc(dev, SPACER, 0, &spacer)) ||
	    (err = pd_alloc(dev, LENGTH, 0, &alloc))) {
		printf("FAIL - pd_device_open(0) / pd_alloc: %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		goto out;
	}
	if ((err = pd_register(t.dom, alloc, 0, LENGTH, ACCESS, &before)) ||
	    (err = pd_mr_local(before, &addr_before, &length))) {
		printf("FAIL - pd_register before the reset: %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		goto out;
	}
	if (!verbs && touch(addr_before, 0x5a)) {
		printf("FAIL - the registration's memory at %p did not take a pattern\n",
		       addr_before);
		goto out;
	}
	printf("ok - registered on %s before the reset: path %u, local address %p\n",
	       verbs ? verbs : "tcp", pd_mr_path(before), addr_before);
	if ((err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &own_fd)) ||
	    (err = pd_register_export(t.dom, dev, own_fd, 0, 0, ACCESS, &own))) {
		printf("FAIL - pd_export / pd_register_export before the reset: %s (%s)\n",
		       pd_strerror(err), pd_last_error());
		goto out;
	}
	pd_mr_release(own);
	own = NULL;

	if (reset(dev))
		goto out;
	if (!verbs) {
		if (touch(addr_before, 0xa5) != 1) {
			printf("FAIL - the first registration's memory at %p did not fault after the "
			       "reset\n",
			       addr_before);
			goto out;
		}
		printf("ok - the first registration's memory faults after the reset (SIGBUS)\n");
	}

	/* The registration made before the reset is still held. */
	if ((err = pd_register(t.dom, alloc, 0, LENGTH, ACCESS, &after)) ||
	    (err = pd_mr_local(after, &addr_after, &length))) {
		printf("FAIL - pd_register of the same allocation after the reset: %s (%s)\n",
		       pd_strerror(err), pd_last_error());
		goto out;
	}
	if (after == before || pd_mr_path(after) != PD_PATH_DMABUF) {
		printf("FAIL - pd_register after the reset handed out the revoked registration or "
		       "another path (%u)\n",
		       pd_mr_path(after));
		goto out;
	}
	if (!verbs) {
		if (addr_after == addr_before || touch(addr_after, 0x3c)) {
			printf("FAIL - the registration after the reset has the revoked mapping "
			       "(%p) or its memory at %p faults\n",
			       addr_before, addr_after);
			goto out;
		}
		printf("ok - registered again after the reset: a new export, whose memory at %p "
		       "takes a pattern\n",
		       addr_after);
	} else {
		printf("ok - registered again after the reset on %s: path dmabuf, lkey %#x\n",
		       verbs, pd_mr_lkey(after));
	}
	pd_mr_release(before);
	before = NULL;

	/* The program's own export, revoked by the reset. */
	err = pd_register_export(t.dom, dev, own_fd, 0, 0, ACCESS, &own);
	if (err != -ENODEV || !strstr(pd_last_error(), "before a reset") ||
	    !strstr(pd_last_error(), "export the memory again")) {
		printf("FAIL - pd_register_export of an export made before the reset: %d (%s), "
		       "not -ENODEV saying to export again\n",
		       err, pd_last_error());
		goto out;
	}
	printf("ok - pd_register_export of the program's export made before the reset: ENODEV "
	       "(%s)\n",
	       pd_last_error());
	if ((err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &new_fd)) ||
	    (err = pd_register_export(t.dom, dev, new_fd, 0, 0, ACCESS, &own)) ||
	    (err = pd_mr_local(own, &addr, &length)) || (!verbs && touch(addr, 0x77))) {
		printf("FAIL - a new export registered with pd_register_export after the reset: %s "
		       "(%s)\n",
		       pd_strerror(err), pd_last_error());
		goto out;
	}
	printf("ok - a new export registers with pd_register_export after the reset\n");
	pd_mr_release(own);
	own = NULL;

	if ((err = pd_register(t.dom, alloc, 0, LENGTH, ACCESS, &hit)) ||
	    (err = pd_mr_local(hit, &addr, &length)) ||
	    (err = pd_regcache_stats(t.cache, &stats))) {
		printf("FAIL - pd_register a third time: %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		goto out;
	}
	if (stats.hits != 1 || stats.registrations != 4 || stats.failed_registrations != 0 ||
	    addr != addr_after) {
		printf("FAIL - the third pd_register was no hit on the new registration: hits %" PRIu64
		       ", registrations %" PRIu64 ", failed %" PRIu64 "\n",
		       stats.hits, stats.registrations, stats.failed_registrations);
		goto out;
	}
	printf("ok - the third pd_register is a hit on it: hits 1, misses %" PRIu64
	       ", registrations 4 (2 of them pd_register_export's), failed 0\n",
	       stats.misses);
	status = 0;
out:
	pd_mr_release(own);
	pd_mr_release(hit);
	pd_mr_release(after);
	pd_mr_release(before);
	if (verbs) {
		pd_domain_detach(t.dom);
		pd_regcache_free(t.cache);
	} else if (t.domain) {
		pd_regcache_free(t.cache);
		tcp_cache_close(&t);
	}
	pd_allocation_free(alloc);
	pd_allocation_free(spacer);
	pd_device_close(dev);
	if (own_fd >= 0)
		close(own_fd);
	if (new_fd >= 0)
		close(new_fd);
	if (pd && ibv_dealloc_pd(pd))
		status = 1;
	if (context && ibv_close_device(context))
		status = 1;
	return status;
}

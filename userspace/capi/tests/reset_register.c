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
 *
 * And HCL's pattern on the device (pd_register_export_at): two more exports of the
 * allocation registered by fd alone at device addresses of the program's (AT_A, AT_B),
 * through a device handle closed right after, and found by address (pd_register_addr),
 * watched: the reset drops their registrations at once
 * and tells the invalidation callback (PD_INVALIDATED_DEVICE, at each address); after it,
 * lookups of their bytes fail with -ENODEV saying to export again, so does
 * pd_register_export_at of the first one's fd (after which its bytes still do), and a new
 * export registers at the second one's address, taking its place without
 * pd_regcache_invalidate_dmabuf(), and is found there.
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
#include <time.h>

#include <infiniband/verbs.h>
#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "tcp_cache.h"

#define LENGTH (4u << 20)
#define SPACER (16u << 20)
#define ACCESS (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ)
/* Device addresses of the program's (a runtime's own VA space), 256 MiB apart. */
#define AT_A UINT64_C(0x100040000000)
#define AT_B (AT_A + (UINT64_C(256) << 20))

/* Invalidations of registrations at AT_A or AT_B because their device was reset. */
static unsigned long at_invalidated;

static void on_invalidate(void *ctx, const struct pd_invalidation *inv)
{
	uint64_t addr = (uint64_t)(uintptr_t)inv->addr;

	(void)ctx;
	if (inv->cause == PD_INVALIDATED_DEVICE &&
	    ((addr >= AT_A && addr < AT_A + LENGTH) || (addr >= AT_B && addr < AT_B + LENGTH)))
		__atomic_fetch_add(&at_invalidated, 1, __ATOMIC_RELAXED);
}

/* pd_register_addr of 4 KiB at addr, released: 0, or the error. */
static int look_up(pd_domain *dom, uint64_t addr, uint64_t *offset)
{
	pd_mr *mr = NULL;
	int err = pd_register_addr(dom, (const void *)(uintptr_t)addr, 4096, ACCESS, &mr);

	if (!err && offset)
		*offset = pd_mr_offset(mr);
	pd_mr_release(mr);
	return err;
}

/*
 * Before the reset: two exports of alloc registered with pd_register_export_at at AT_A and
 * AT_B (their fds in fds[]) through a handle of the device of their own, closed right after
 * (the cache keeps the device), and one lookup by address inside each, a hit. 0, or 1.
 */
static int at_before(const struct tcp_cache *t, const pd_allocation *alloc, int fds[2])
{
	const uint64_t base[2] = { AT_A, AT_B };
	struct pd_regcache_stats was, now;
	uint64_t offset = 0;
	pd_device *dev;
	int err = 0;

	dev = pd_device_open(0, &err);
	if (!dev || (err = pd_regcache_stats(t->cache, &was)))
		goto failed;
	for (int i = 0; i < 2; i++) {
		pd_mr *mr = NULL;

		if ((err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fds[i])) ||
		    (err = pd_register_export_at(t->dom, dev, fds[i], 0, 0,
						 (void *)(uintptr_t)base[i], ACCESS, &mr)))
			goto failed;
		pd_mr_release(mr);
	}
	pd_device_close(dev);
	dev = NULL;
	for (int i = 0; i < 2; i++) {
		if ((err = look_up(t->dom, base[i] + (1u << 20), &offset)))
			goto failed;
		if (offset != 1u << 20) {
			printf("FAIL - the lookup at %#" PRIx64 " has offset %#" PRIx64
			       ", not 0x100000\n",
			       base[i] + (1u << 20), offset);
			return 1;
		}
	}
	if ((err = pd_regcache_stats(t->cache, &now)))
		goto failed;
	if (now.registrations - was.registrations != 2 || now.hits - was.hits != 2) {
		printf("FAIL - two exports registered at device addresses and looked up: "
		       "registrations %" PRIu64 ", hits %" PRIu64 ", not 2 and 2\n",
		       now.registrations - was.registrations, now.hits - was.hits);
		return 1;
	}
	printf("ok - two exports registered with pd_register_export_at at %#" PRIx64
	       " and %#" PRIx64 " through a device handle closed right after, each found by "
	       "address (a hit, at its offset)\n",
	       AT_A, AT_B);
	return 0;
failed:
	printf("FAIL - pd_register_export_at before the reset: %s (%s)\n", pd_strerror(err),
	       pd_last_error());
	pd_device_close(dev);
	return 1;
}

/* Whether err is -ENODEV whose message says the memory must be exported again. */
static int revoked_again(int err)
{
	return err == -ENODEV && strstr(pd_last_error(), "reset") &&
	       strstr(pd_last_error(), "export the memory again");
}

/*
 * After the reset: the callback was told of both (within 10 s: the library's watcher thread
 * tells it); their bytes and the first one's fd are refused with -ENODEV; a new export
 * registers at AT_B and is found there. 0, or 1.
 */
static int at_after(const struct tcp_cache *t, const pd_device *dev,
		    const pd_allocation *alloc, const int fds[2], int new_fd[2])
{
	struct pd_regcache_stats was, now;
	uint64_t offset = 0;
	pd_mr *mr = NULL;
	int err;

	for (int i = 0; i < 1000 && __atomic_load_n(&at_invalidated, __ATOMIC_RELAXED) < 2; i++)
		nanosleep(&(struct timespec){ .tv_nsec = 10000000 }, NULL);
	if (__atomic_load_n(&at_invalidated, __ATOMIC_RELAXED) != 2) {
		printf("FAIL - the invalidation callback heard of %lu registrations at the device "
		       "addresses dropped by the reset, not 2\n",
		       __atomic_load_n(&at_invalidated, __ATOMIC_RELAXED));
		return 1;
	}
	printf("ok - the reset dropped both registrations at device addresses at once: the "
	       "callback heard of each (PD_INVALIDATED_DEVICE)\n");
	err = look_up(t->dom, AT_A + 4096, NULL);
	if (!revoked_again(err)) {
		printf("FAIL - pd_register_addr of a revoked export's bytes: %d (%s), not -ENODEV "
		       "saying to export again\n",
		       err, pd_last_error());
		return 1;
	}
	printf("ok - pd_register_addr of a revoked export's bytes: ENODEV (%s)\n",
	       pd_last_error());
	err = pd_register_export_at(t->dom, dev, fds[0], 0, 0, (void *)(uintptr_t)AT_A, ACCESS,
				    &mr);
	if (!revoked_again(err)) {
		pd_mr_release(mr);
		printf("FAIL - pd_register_export_at of an export made before the reset: %d (%s), "
		       "not -ENODEV saying to export again\n",
		       err, pd_last_error());
		return 1;
	}
	printf("ok - pd_register_export_at of an export made before the reset: ENODEV\n");
	/* That refusal bound nothing: its bytes still say it was revoked. */
	err = look_up(t->dom, AT_A + 4096, NULL);
	if (!revoked_again(err)) {
		printf("FAIL - pd_register_addr of the revoked export's bytes after its fd was "
		       "refused: %d (%s), not -ENODEV saying to export again\n",
		       err, pd_last_error());
		return 1;
	}
	printf("ok - and its bytes still: ENODEV\n");
	if ((err = pd_regcache_stats(t->cache, &was)) ||
	    (err = look_up(t->dom, AT_B, NULL)) != -ENODEV ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &new_fd[0])) ||
	    (err = pd_register_export_at(t->dom, dev, new_fd[0], 0, 0, (void *)(uintptr_t)AT_B,
					 ACCESS, &mr))) {
		printf("FAIL - a new export at the revoked one's address (%#" PRIx64 "): %s (%s)\n",
		       AT_B, pd_strerror(err), pd_last_error());
		return 1;
	}
	pd_mr_release(mr);
	if ((err = look_up(t->dom, AT_B + (2u << 20), &offset)) ||
	    (err = pd_regcache_stats(t->cache, &now))) {
		printf("FAIL - a lookup in the new export at %#" PRIx64 ": %s (%s)\n", AT_B,
		       pd_strerror(err), pd_last_error());
		return 1;
	}
	if (offset != 2u << 20 || now.registrations - was.registrations != 1 ||
	    now.hits - was.hits != 1 || now.failed_registrations != 0) {
		printf("FAIL - the new export at %#" PRIx64 ": offset %#" PRIx64
		       ", registrations %" PRIu64 ", hits %" PRIu64 ", failed %" PRIu64
		       ", not 0x200000, 1, 1, 0\n",
		       AT_B, offset, now.registrations - was.registrations, now.hits - was.hits,
		       now.failed_registrations);
		return 1;
	}
	printf("ok - a new export registers at the revoked one's address %#" PRIx64
	       " (no pd_regcache_invalidate_dmabuf) and is found there, a hit\n",
	       AT_B);
	/* Another new export over part of the first one's addresses takes them over too: the
	 * revoked one leaves, and its bytes the new one does not cover are at no address. */
	if ((err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &new_fd[1])) ||
	    (err = pd_register_export_at(t->dom, dev, new_fd[1], 0, 0,
					 (void *)(uintptr_t)(AT_A + (2u << 20)), ACCESS, &mr))) {
		printf("FAIL - a new export over part of the revoked one's addresses: %s (%s)\n",
		       pd_strerror(err), pd_last_error());
		return 1;
	}
	pd_mr_release(mr);
	if ((err = look_up(t->dom, AT_A + (2u << 20) + 4096, NULL)) ||
	    (err = look_up(t->dom, AT_A + 4096, NULL)) != -ENOENT) {
		printf("FAIL - lookups after a new export took over part of the revoked one's "
		       "addresses: %d (%s), not a hit in the new one and -ENOENT before it\n",
		       err, pd_last_error());
		return 1;
	}
	printf("ok - a new export over part of the revoked one's addresses takes them over: a hit "
	       "in it, -ENOENT before it\n");
	return 0;
}

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
	int own_fd = -1, new_fd = -1, at_fds[2] = { -1, -1 }, at_new[2] = { -1, -1 };
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
	if ((err = pd_regcache_set_invalidate_callback(t.cache, on_invalidate, NULL))) {
		printf("FAIL - pd_regcache_set_invalidate_callback: %s\n", pd_strerror(err));
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
	if (at_before(&t, alloc, at_fds))
		goto out;

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
	if (at_after(&t, dev, alloc, at_fds, at_new))
		goto out;

	if ((err = pd_register(t.dom, alloc, 0, LENGTH, ACCESS, &hit)) ||
	    (err = pd_mr_local(hit, &addr, &length)) ||
	    (err = pd_regcache_stats(t.cache, &stats))) {
		printf("FAIL - pd_register a third time: %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		goto out;
	}
	/* Hits: this one and 4 lookups by address; registrations: 2 pd_register, 2
	 * pd_register_export and 4 pd_register_export_at. */
	if (stats.hits != 5 || stats.registrations != 8 || stats.failed_registrations != 0 ||
	    addr != addr_after) {
		printf("FAIL - the third pd_register was no hit on the new registration: hits %" PRIu64
		       ", registrations %" PRIu64 ", failed %" PRIu64 "\n",
		       stats.hits, stats.registrations, stats.failed_registrations);
		goto out;
	}
	printf("ok - the third pd_register is a hit on it: hits 5 (4 by address), misses %" PRIu64
	       ", registrations 8 (2 of them pd_register's), failed 0\n",
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
	for (int i = 0; i < 2; i++)
		if (at_fds[i] >= 0)
			close(at_fds[i]);
	for (int i = 0; i < 2; i++)
		if (at_new[i] >= 0)
			close(at_new[i]);
	if (pd && ibv_dealloc_pd(pd))
		status = 1;
	if (context && ibv_close_device(context))
		status = 1;
	return status;
}

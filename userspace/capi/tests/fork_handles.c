/*
 * fork_handles: the fork rule for registration handles, allocated (pd_register_addr) and in
 * the caller's storage (pd_register_in, pd_register_addr_in), built with -fsanitize=address.
 *
 * libfabric and ibverbs objects do not survive fork (a child's deregistration of an ibverbs
 * registration it inherited would deregister its parent's), so a forked child's calls on
 * its parent's handles fail with -ECHILD and release nothing. Here the parent registers one
 * export of /dev/peerdirect0 at the address of its mapping on libfabric's tcp domain and
 * holds three handles of it; the forked child then:
 *  - asks the parent's domain for a range the cache holds (a hit in the parent) by address
 *    (pd_register_addr, pd_register_addr_in) and by allocation (pd_register_in): -ECHILD,
 *    with pd_last_error naming the call and saying why;
 *  - releases the parent's handles: each left alone, pd_last_error saying so (another
 *    failure between them, so that each message is the release's own);
 * and exits. (What it does to its copy of the parent's memory cannot reach the parent;
 * what a release would do to objects the two share, the registrations of an ibverbs
 * device, could: hence the rule, checked here where it is decided.) The parent then
 * releases its handles and drops the export and the allocation: nothing stays cached or
 * registered.
 * Prints "ok - ..." or "FAIL - ..."; exit status 0 iff all went well.
 *
 *   cc -fsanitize=address -o fork_handles fork_handles.c \
 *      $(pkg-config --cflags --libs peerdirect libfabric)
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "tcp_cache.h"

#define SIZE (2u << 20)
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)

/* Bits of the child's exit status: what went wrong there. */
enum {
	ADDR_IN_ALLOWED = 1,
	ADDR_ALLOWED = 2,
	ALLOC_IN_ALLOWED = 4,
	NO_REASON = 8,
	PLACED_RELEASED = 16,
	BOXED_RELEASED = 32,
	ALLOC_RELEASED = 64,
};

static const char *child_failures[] = {
	"pd_register_addr_in in the parent's domain was not -ECHILD",
	"pd_register_addr in the parent's domain was not -ECHILD",
	"pd_register_in in the parent's domain was not -ECHILD",
	"a refused registration's pd_last_error did not name the call and the fork",
	"pd_mr_release of the parent's handle in place did not leave it alone",
	"pd_mr_release of the parent's allocated handle did not leave it alone",
	"pd_mr_release of the parent's pd_register_in handle did not leave it alone",
};

static int contains(const char *text, const char *part)
{
	return strstr(text, part) != NULL;
}

/* Whether pd_last_error() names `call` refused because its domain is the parent's. */
static int refused_for_fork(const char *call)
{
	char want[128];

	snprintf(want, sizeof(want), "%s: domain was made by the parent of this forked process",
		 call);
	return contains(pd_last_error(), want);
}

/*
 * Whether pd_mr_release(mr) left the parent's handle alone: pd_last_error says so, where
 * another failure had just left its own message.
 */
static int left_alone(pd_mr *mr)
{
	pd_mr *none = NULL;

	pd_register_addr(NULL, NULL, 1, ALL, &none); /* -EINVAL: "domain is NULL" */
	pd_mr_release(mr);
	return contains(pd_last_error(), "pd_mr_release: mr was made by the parent");
}

/* The forked child's part: a bit for each thing that went wrong. */
static int in_child(pd_domain *dom, const pd_allocation *alloc, uint8_t *map, pd_mr *placed,
		    pd_mr *boxed, pd_mr *by_alloc)
{
	pd_mr_storage storage;
	pd_mr *mr = NULL;
	int bad = 0;

	if (pd_register_addr_in(dom, map, 4096, ALL, &storage, &mr) != -ECHILD)
		bad |= ADDR_IN_ALLOWED;
	else if (!refused_for_fork("pd_register_addr_in"))
		bad |= NO_REASON;
	if (pd_register_addr(dom, map, 4096, ALL, &mr) != -ECHILD)
		bad |= ADDR_ALLOWED;
	else if (!refused_for_fork("pd_register_addr"))
		bad |= NO_REASON;
	if (pd_register_in(dom, alloc, 0, 4096, ALL, &storage, &mr) != -ECHILD)
		bad |= ALLOC_IN_ALLOWED;
	else if (!refused_for_fork("pd_register_in"))
		bad |= NO_REASON;
	if (!left_alone(placed))
		bad |= PLACED_RELEASED;
	if (!left_alone(boxed))
		bad |= BOXED_RELEASED;
	if (!left_alone(by_alloc))
		bad |= ALLOC_RELEASED;
	return bad;
}

int main(void)
{
	struct pd_regcache_stats stats;
	pd_mr_storage placed_storage, alloc_storage;
	pd_mr *placed = NULL, *boxed = NULL, *by_alloc = NULL, *whole = NULL;
	struct tcp_cache tcp;
	pd_allocation *alloc = NULL;
	pd_device *dev;
	uint8_t *map;
	int err, fd = -1, wstatus = -1, failed = 0, bit;
	pid_t child;

	setvbuf(stdout, NULL, _IOLBF, 0);
	dev = pd_device_open(0, &err);
	if (!dev || (err = pd_alloc(dev, SIZE, 0, &alloc)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd))) {
		printf("FAIL - an export of /dev/peerdirect0 : %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		return 1;
	}
	map = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		printf("FAIL - mmap of the export : %s\n", strerror(errno));
		return 1;
	}
	if (tcp_cache_open(&tcp))
		return 1;
	if ((err = pd_register_dmabuf_at(tcp.dom, fd, 0, 0, map, ALL, &whole)) ||
	    (err = pd_register_addr_in(tcp.dom, map + 4096, 4096, ALL, &placed_storage, &placed)) ||
	    (err = pd_register_addr(tcp.dom, map + 8192, 4096, ALL, &boxed)) ||
	    (err = pd_register_in(tcp.dom, alloc, 0, 0, ALL, &alloc_storage, &by_alloc))) {
		printf("FAIL - the parent's registrations : %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		return 1;
	}
	fflush(stdout);
	child = fork();
	if (child == 0)
		_exit(in_child(tcp.dom, alloc, map, placed, boxed, by_alloc));
	if (child < 0 || waitpid(child, &wstatus, 0) != child) {
		printf("FAIL - fork or waitpid : %s\n", strerror(errno));
		return 1;
	}
	if (!WIFEXITED(wstatus)) {
		printf("FAIL - the forked child did not exit (wait status %#x)\n", wstatus);
		failed = 1;
	} else {
		for (bit = 0; bit < (int)(sizeof(child_failures) / sizeof(*child_failures)); bit++)
			if (WEXITSTATUS(wstatus) & (1 << bit)) {
				printf("FAIL - in the forked child, %s\n", child_failures[bit]);
				failed = 1;
			}
	}
	pd_mr_release(placed);
	pd_mr_release(boxed);
	pd_mr_release(by_alloc);
	pd_mr_release(whole);
	munmap(map, SIZE);
	if ((err = pd_regcache_invalidate_dmabuf(tcp.cache, fd)) < 0 ||
	    (close(fd), err = pd_allocation_free(alloc)) ||
	    (err = pd_regcache_stats(tcp.cache, &stats))) {
		printf("FAIL - dropping the export and the allocation : %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		return 1;
	}
	if (stats.entries || stats.registrations != stats.deregistrations) {
		printf("FAIL - with the handles released and the export dropped: %" PRIu64
		       " entries cached, %" PRIu64 " registrations and %" PRIu64
		       " deregistrations\n",
		       stats.entries, stats.registrations, stats.deregistrations);
		failed = 1;
	}
	pd_regcache_free(tcp.cache);
	tcp_cache_close(&tcp);
	pd_device_close(dev);
	if (failed)
		return 1;
	printf("ok - a forked child's registrations in its parent's domain (pd_register_addr, "
	       "pd_register_addr_in, pd_register_in: hits in the parent) fail with -ECHILD "
	       "saying why, and its releases of the parent's three handles (allocated, in place, "
	       "in place by allocation) leave them alone saying why; the parent's released, with "
	       "the export and the allocation dropped nothing stays cached or registered (%" PRIu64
	       " registrations, as many deregistrations; AddressSanitizer found nothing)\n",
	       stats.registrations);
	return 0;
}

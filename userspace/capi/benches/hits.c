/*
 * hits: a benchmark, not a test. The C ABI's cache hit, timed as a runtime pays it: a
 * pd_register of a range already registered, then pd_mr_release of the handle it returned,
 * on libfabric's tcp domain over 127.0.0.1, from 1, 2 and 8 threads at once, all asking for
 * the same 2 MiB allocation of /dev/peerdirect0 (so all hit one entry). Per thread count it
 * times the handle allocated by the library (pd_register, lines "hits c"), then made in a
 * pd_mr_storage on the timing thread's stack (pd_register_in, lines "hits c-in"), then, as
 * the floor of any pair of C calls, two calls that return at once (pd_mr_offset(NULL) and
 * pd_mr_release(NULL), lines "hits c-calls"): what a C caller pays to reach the library
 * twice, which a Rust caller, whose hit is inlined, does not.
 *
 * With --foreign, no peerdirect device is needed (scripts/bench-hits --native runs it on the
 * host's CPU): the 2 MiB are a memfd, registered once as a foreign dma-buf at the address of
 * its mapping (pd_register_dmabuf_at), and the timed hit is pd_register_addr (in place:
 * pd_register_addr_in) of those bytes, the C ABI's other hit that makes no system call (pd_register_dmabuf's checks and duplicates
 * the fd at every call). The library refuses a memfd (EINVAL: fstatfs says it is not on the
 * dma-buf file system, and nothing on the host exports dma-bufs to userspace: no udmabuf, no
 * dma-heap, no DRM), so the one registering call runs in a thread of its own under a seccomp
 * filter whose fstatfs of the memfd the main thread answers with the memfd's real statfs
 * and the dma-buf magic (adopt()); no timed call makes a system call, nor runs under the
 * filter. libfabric's tcp provider takes an FI_MR_DMABUF registration by its address and
 * ignores the fd. Its lines end in "foreign".
 *
 * Timed as `peerdirect-guest-tests --bench-hits` times the Rust hit (RegCache::get and the
 * drop of its handle) on the same kind of domain, so that scripts/bench-hits can set the two
 * side by side: each thread times batches of BATCH hit+release pairs with CLOCK_MONOTONIC
 * (the clock Rust's Instant reads) and reports each batch's time per pair; the program prints,
 * per thread count, the median and 99th percentile over every thread's batches and the hits
 * per second per thread, in one line:
 *
 *   hits c threads 2 p50_ns 61.3 p99_ns 88.0 mhits_per_thread 15.2
 *
 *   cc -O2 -I../tests -o hits hits.c $(pkg-config --cflags --libs peerdirect libfabric) -pthread
 *   ./hits [--foreign] [THREADS...]       (default: 1 2 8)
 */
#define _GNU_SOURCE /* strdup, clock_gettime, pthread_barrier, memfd_create */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "tcp_cache.h"

#define LENGTH (2u << 20)
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)
/* Pairs per timed batch, and batches per thread (after WARM untimed ones). */
#define BATCH 64
#define BATCHES 2000
#define WARM 100

/* What a timed pair is, and the name of its lines. */
enum mode {
	ALLOCATED, /* "c": a hit, its handle allocated by the library (pd_register, ...) */
	IN_PLACE,  /* "c-in": the handle in a pd_mr_storage (pd_register_in, ...) */
	CALLS,     /* "c-calls": two calls that do nothing instead of a hit and release */
};

static const char *const mode_names[] = { "c", "c-in", "c-calls" };

struct bench {
	pd_domain *dom;
	const pd_allocation *alloc; /* NULL with --foreign: */
	void *addr;                 /* the memfd's mapping, registered at its address */
	enum mode mode;             /* what a pair is */
	pthread_barrier_t start;
	int failed;
};

struct thread {
	pthread_t id;
	struct bench *bench;
	double per_pair[BATCHES]; /* ns per hit+release pair, one per batch */
	double seconds;           /* all timed batches */
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The call a pair times. */
static const char *hit_name(const struct bench *bench)
{
	if (bench->alloc)
		return bench->mode == IN_PLACE ? "pd_register_in" : "pd_register";
	return bench->mode == IN_PLACE ? "pd_register_addr_in" : "pd_register_addr";
}

/*
 * n hits of `call` (which sets mr), each followed by the release of its handle: returns the
 * first error from pairs() below.
 */
#define PAIRS(n, call)                         \
	for (int i = 0; i < (n); i++) {        \
		int err = (call);              \
		if (err)                       \
			return err;            \
		pd_mr_release(mr);             \
	}

/*
 * n pairs of bench's mode, one after the other: 0, or the first error. Each hit has a loop of
 * its own, its arguments read before it, as a runtime's call site holds them in registers:
 * a pair costs its two calls and nothing of this program's dispatch (the Rust program's loop
 * is its hit, inlined). Reading the mode and the arguments from *bench at every pair cost
 * 1.4 ns a pair natively.
 */
static int pairs(const struct bench *bench, int n)
{
	pd_domain *dom = bench->dom;
	const pd_allocation *alloc = bench->alloc;
	const void *addr = bench->addr;
	pd_mr_storage storage; /* used again once its handle is released */
	pd_mr *mr;

	switch (bench->mode) {
	case CALLS:
		for (int i = 0; i < n; i++) {
			(void)pd_mr_offset(NULL);
			pd_mr_release(NULL);
		}
		break;
	case IN_PLACE:
		if (alloc)
			PAIRS(n, pd_register_in(dom, alloc, 0, 0, ALL, &storage, &mr))
		else
			PAIRS(n, pd_register_addr_in(dom, addr, LENGTH, ALL, &storage, &mr))
		break;
	case ALLOCATED:
		if (alloc)
			PAIRS(n, pd_register(dom, alloc, 0, 0, ALL, &mr))
		else
			PAIRS(n, pd_register_addr(dom, addr, LENGTH, ALL, &mr))
		break;
	}
	return 0;
}

static void *run(void *arg)
{
	struct thread *t = arg;
	struct bench *bench = t->bench;
	int b, err;
	double total = 0;

	pthread_barrier_wait(&bench->start);
	err = pairs(bench, WARM * BATCH);
	for (b = 0; b < BATCHES && !err; b++) {
		double start = now();

		err = pairs(bench, BATCH);
		t->per_pair[b] = (now() - start) / BATCH;
		total += t->per_pair[b] * BATCH;
	}
	t->seconds = total / 1e9;
	if (err) {
		fprintf(stderr, "hits: %s: %s (%s)\n", hit_name(bench), pd_strerror(err),
			pd_last_error());
		bench->failed = 1;
	}
	return NULL;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int measure(struct bench *bench, int threads, enum mode mode)
{
	struct thread *t = calloc((size_t)threads, sizeof(*t));
	double *all = calloc((size_t)threads * BATCHES, sizeof(*all));
	double seconds = 0;
	size_t n = (size_t)threads * BATCHES;
	int i;

	bench->mode = mode;
	if (!t || !all || pthread_barrier_init(&bench->start, NULL, (unsigned)threads)) {
		fprintf(stderr, "hits: out of memory\n");
		return 1;
	}
	for (i = 0; i < threads; i++) {
		t[i].bench = bench;
		if (pthread_create(&t[i].id, NULL, run, &t[i])) {
			fprintf(stderr, "hits: pthread_create failed\n");
			return 1;
		}
	}
	for (i = 0; i < threads; i++) {
		pthread_join(t[i].id, NULL);
		memcpy(all + (size_t)i * BATCHES, t[i].per_pair, sizeof(t[i].per_pair));
		seconds += t[i].seconds;
	}
	pthread_barrier_destroy(&bench->start);
	qsort(all, n, sizeof(*all), by_value);
	if (!bench->failed)
		printf("hits %s threads %d p50_ns %.1f p99_ns %.1f mhits_per_thread %.2f%s\n",
		       mode_names[mode], threads, all[n / 2], all[n * 99 / 100],
		       (double)BATCHES * BATCH * threads / seconds / 1e6,
		       bench->alloc ? "" : " foreign");
	free(all);
	free(t);
	return bench->failed;
}

/* DMA_BUF_MAGIC of <linux/magic.h>: the f_type of the dma-buf pseudo file system. */
#define DMA_BUF_MAGIC 0x444d4142
#if defined(__x86_64__)
#define AUDIT_ARCH_HERE AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define AUDIT_ARCH_HERE AUDIT_ARCH_AARCH64
#endif

/* The registering thread of adopt(): its request, the seccomp listener it made, and its result. */
struct adoption {
	struct bench *bench;
	int memfd;
	pd_mr *mr;
	int listener;
	int err;
	pthread_barrier_t filtered;
};

static void *adopting(void *arg)
{
	struct adoption *a = arg;
#ifdef AUDIT_ARCH_HERE
	/* fstatfs(memfd, ...) goes to the listener; every other call runs as usual. */
	struct sock_filter code[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_HERE, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fstatfs, 0, 3),
		/* The fd's low 32 bits (little endian): all of it. */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)a->memfd, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof(code) / sizeof(code[0]), .filter = code };

	/* This thread's alone (no TSYNC): neither the main thread nor the timed ones get it. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    (a->listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
					SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog)) < 0)
		a->err = -errno;
#else
	a->err = -ENOSYS;
#endif
	pthread_barrier_wait(&a->filtered);
	if (!a->err)
		a->err = pd_register_dmabuf_at(a->bench->dom, a->memfd, 0, 0, a->bench->addr, ALL,
					       &a->mr);
	return NULL;
}

/*
 * Registers the memfd as a foreign dma-buf at its mapping, bench->addr (the first call: a
 * miss), in a thread whose fstatfs of it this thread answers: the memfd's real statfs, with
 * the dma-buf file system's f_type. 0 or a negative errno.
 */
static int adopt(struct bench *bench, int memfd, pd_mr **mr)
{
	struct adoption a = { .bench = bench, .memfd = memfd, .listener = -1 };
	pthread_t thread;
	int err = 0;

	if (pthread_barrier_init(&a.filtered, NULL, 2) ||
	    pthread_create(&thread, NULL, adopting, &a))
		return -ENOMEM;
	pthread_barrier_wait(&a.filtered);
	/* Until the thread is gone (POLLHUP: no task uses the filter any more). */
	while (a.listener >= 0) {
		struct pollfd p = { .fd = a.listener, .events = POLLIN };
		struct seccomp_notif req;
		struct seccomp_notif_resp resp;
		struct statfs st;

		if (poll(&p, 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			err = -errno;
			break;
		}
		if (!(p.revents & POLLIN))
			break;
		memset(&req, 0, sizeof(req));
		if (ioctl(a.listener, SECCOMP_IOCTL_NOTIF_RECV, &req))
			continue; /* EINTR, or ENOENT: the call was interrupted */
		memset(&resp, 0, sizeof(resp));
		resp.id = req.id;
		if (req.data.nr == __NR_fstatfs && req.data.args[0] == (uint64_t)memfd) {
			if (fstatfs(memfd, &st)) {
				resp.error = -errno;
			} else {
				st.f_type = DMA_BUF_MAGIC;
				/* The caller's buffer, in this process: the kernel's struct statfs. */
				memcpy((void *)(uintptr_t)req.data.args[1], &st, sizeof(st));
			}
		} else {
			resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
		}
		ioctl(a.listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
	}
	pthread_join(thread, NULL);
	pthread_barrier_destroy(&a.filtered);
	if (a.listener >= 0)
		close(a.listener);
	*mr = a.mr;
	return err ? err : a.err;
}

int main(int argc, char **argv)
{
	static const int defaults[] = { 1, 2, 8 };
	struct bench bench = { 0 };
	struct tcp_cache tcp;
	pd_allocation *alloc = NULL;
	pd_mr *mr = NULL;
	pd_device *dev = NULL;
	int err = 0, ret, i, failed = 0, foreign = 0, memfd = -1;
	const char *setup = "setting up";

	if (argc > 1 && !strcmp(argv[1], "--foreign")) {
		foreign = 1;
		argv++;
		argc--;
	}
	if (foreign) {
		memfd = memfd_create("hits", MFD_CLOEXEC);
		if (memfd < 0 || ftruncate(memfd, LENGTH) ||
		    (bench.addr = mmap(NULL, LENGTH, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0)) ==
			    MAP_FAILED) {
			perror("hits: a memfd of 2 MiB");
			return 1;
		}
	} else {
		dev = pd_device_open(0, &err);
		if (!dev) {
			fprintf(stderr, "hits: pd_device_open(0): %s (%s)\n", pd_strerror(err),
				pd_last_error());
			return 1;
		}
	}
	if (tcp_cache_open(&tcp))
		return 1;
	bench.dom = tcp.dom;
	if (foreign) {
		setup = "registering a memfd as a dma-buf";
		err = adopt(&bench, memfd, &mr);
	} else if (!(err = pd_alloc(dev, LENGTH, 0, &alloc))) {
		err = pd_register(bench.dom, alloc, 0, 0, ALL, &mr);
	}
	if (err) {
		fprintf(stderr, "hits: %s: %s (%s)\n", setup, pd_strerror(err), pd_last_error());
		return 1;
	}
	/* The first registration (a miss) is held for the whole run: every timed call hits. */
	bench.alloc = alloc;
	/* Per thread count, the handle allocated, then in the caller's storage, then the calls. */
	for (i = 0; i < (argc > 1 ? argc - 1 : (int)(sizeof(defaults) / sizeof(defaults[0]))) &&
		    !failed;
	     i++) {
		int threads = argc > 1 ? atoi(argv[i + 1]) : defaults[i];

		failed = measure(&bench, threads, ALLOCATED) || measure(&bench, threads, IN_PLACE) ||
			 measure(&bench, threads, CALLS);
	}
	if (!failed) {
		struct pd_regcache_stats stats;

		if ((err = pd_regcache_stats(tcp.cache, &stats)) || stats.misses != 1) {
			fprintf(stderr, "hits: %llu misses where only the first call should miss\n",
				err ? 0ULL : (unsigned long long)stats.misses);
			failed = 1;
		} else {
			printf("hits c calls %llu misses 1%s\n", (unsigned long long)stats.hits,
			       foreign ? " foreign" : "");
		}
	}
	pd_mr_release(mr);
	if ((ret = tcp_cache_close(&tcp)) < 0) {
		fprintf(stderr, "hits: pd_domain_detach: %s\n", pd_strerror(ret));
		failed = 1;
	}
	pd_regcache_free(tcp.cache);
	pd_allocation_free(alloc);
	pd_device_close(dev);
	if (foreign) {
		munmap(bench.addr, LENGTH);
		close(memfd);
	}
	return failed;
}

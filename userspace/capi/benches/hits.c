/*
 * hits: a benchmark, not a test. The C ABI's cache hit, timed as a runtime pays it: a
 * pd_register of a range already registered, then pd_mr_release of the handle it returned,
 * on libfabric's tcp domain over 127.0.0.1, from 1, 2 and 8 threads at once, all asking for
 * the same 2 MiB allocation of /dev/peerdirect0 (so all hit one entry).
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
 *   cc -O2 -o hits hits.c $(pkg-config --cflags --libs peerdirect libfabric) -pthread
 *   ./hits [THREADS...]       (default: 1 2 8)
 */
#define _POSIX_C_SOURCE 200809L /* strdup, clock_gettime, pthread_barrier */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#define LENGTH (2u << 20)
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)
/* Pairs per timed batch, and batches per thread (after WARM untimed ones). */
#define BATCH 64
#define BATCHES 2000
#define WARM 100

struct bench {
	pd_domain *dom;
	const pd_allocation *alloc;
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

/* One hit and the release of its handle; 0 or the error. */
static int pair(struct bench *bench)
{
	pd_mr *mr = NULL;
	int err = pd_register(bench->dom, bench->alloc, 0, 0, ALL, &mr);

	if (err)
		return err;
	pd_mr_release(mr);
	return 0;
}

static void *run(void *arg)
{
	struct thread *t = arg;
	struct bench *bench = t->bench;
	int b, i, err = 0;
	double total = 0;

	pthread_barrier_wait(&bench->start);
	for (i = 0; i < WARM * BATCH && !err; i++)
		err = pair(bench);
	for (b = 0; b < BATCHES && !err; b++) {
		double start = now();

		for (i = 0; i < BATCH && !err; i++)
			err = pair(bench);
		t->per_pair[b] = (now() - start) / BATCH;
		total += t->per_pair[b] * BATCH;
	}
	t->seconds = total / 1e9;
	if (err) {
		fprintf(stderr, "hits: pd_register: %s (%s)\n", pd_strerror(err), pd_last_error());
		bench->failed = 1;
	}
	return NULL;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int measure(struct bench *bench, int threads)
{
	struct thread *t = calloc((size_t)threads, sizeof(*t));
	double *all = calloc((size_t)threads * BATCHES, sizeof(*all));
	double seconds = 0;
	size_t n = (size_t)threads * BATCHES;
	int i;

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
		printf("hits c threads %d p50_ns %.1f p99_ns %.1f mhits_per_thread %.2f\n", threads,
		       all[n / 2], all[n * 99 / 100],
		       (double)BATCHES * BATCH * threads / seconds / 1e6);
	free(all);
	free(t);
	return bench->failed;
}

int main(int argc, char **argv)
{
	static const int defaults[] = { 1, 2, 8 };
	struct bench bench = { 0 };
	struct fi_info *hints, *info = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	pd_allocation *alloc = NULL;
	pd_regcache *cache;
	pd_mr *mr = NULL;
	pd_device *dev;
	int err, ret, i, failed = 0;

	dev = pd_device_open(0, &err);
	if (!dev) {
		fprintf(stderr, "hits: pd_device_open(0): %s (%s)\n", pd_strerror(err), pd_last_error());
		return 1;
	}
	hints = fi_allocinfo();
	if (!hints)
		return 1;
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	ret = fi_getinfo(FI_VERSION(1, 20), "127.0.0.1", NULL, FI_SOURCE, hints, &info);
	fi_freeinfo(hints);
	if (ret || (ret = fi_fabric(info->fabric_attr, &fabric, NULL)) ||
	    (ret = fi_domain(fabric, info, &domain, NULL))) {
		fprintf(stderr, "hits: opening tcp: %s (%d)\n", fi_strerror(-ret), ret);
		return 1;
	}
	cache = pd_regcache_new(&err);
	if (!cache || !(bench.dom = pd_domain_attach(cache, domain, &err)) ||
	    (err = pd_alloc(dev, LENGTH, 0, &alloc)) ||
	    (err = pd_register(bench.dom, alloc, 0, 0, ALL, &mr))) {
		fprintf(stderr, "hits: setting up: %s (%s)\n", pd_strerror(err), pd_last_error());
		return 1;
	}
	/* The first registration (a miss) is held for the whole run: every timed call hits. */
	bench.alloc = alloc;
	if (argc > 1) {
		for (i = 1; i < argc && !failed; i++)
			failed = measure(&bench, atoi(argv[i]));
	} else {
		for (i = 0; i < (int)(sizeof(defaults) / sizeof(defaults[0])) && !failed; i++)
			failed = measure(&bench, defaults[i]);
	}
	if (!failed) {
		struct pd_regcache_stats stats;

		if ((err = pd_regcache_stats(cache, &stats)) || stats.misses != 1) {
			fprintf(stderr, "hits: %llu misses where only the first call should miss\n",
				err ? 0ULL : (unsigned long long)stats.misses);
			failed = 1;
		} else {
			printf("hits c calls %llu misses 1\n", (unsigned long long)stats.hits);
		}
	}
	pd_mr_release(mr);
	if ((ret = pd_domain_detach(bench.dom)) < 0) {
		fprintf(stderr, "hits: pd_domain_detach: %s\n", pd_strerror(ret));
		failed = 1;
	}
	pd_regcache_free(cache);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	pd_allocation_free(alloc);
	pd_device_close(dev);
	return failed;
}

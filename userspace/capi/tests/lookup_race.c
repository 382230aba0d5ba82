/*
 * lookup_race: pd_register_addr's lookup by address racing registrations and invalidations of
 * other dma-bufs at the caller's addresses, built with -fsanitize=address.
 *
 * pd_register_addr reads a table of the dma-bufs registered at the caller's addresses, which
 * pd_register_dmabuf_at and pd_regcache_invalidate_dmabuf set anew, without a lock; a miss
 * there, or in the cache, looks again under the lock of the set the table mirrors. Half of
 * the lookups are pd_register_addr_in, the handle in a pd_mr_storage on the hitter's stack,
 * which must be the handle handed out. Every handle must name the bytes looked up
 * (pd_mr_local), so that an entry read torn (one dma-buf's address with another's
 * registration) fails with -EFAULT.
 *
 * A pool (one export of /dev/peerdirect0) is registered once and never dropped; CHURNERS
 * threads each own SOURCES exports more, which they register at their CPU mappings' addresses
 * and drop again, CYCLES times each, all at once; HITTERS threads meanwhile look up buffers in
 * the pool and in every churned export by address. Each churned export has a sequence number, odd
 * while its registration or its drop is under way and a multiple of 4 while it is registered:
 * a lookup that finds the same multiple of 4 before and after its call must hit. So must every
 * lookup in the pool, and, at the end, every lookup of an export left registered. A set
 * changed without its lock (two threads changing it at once, one after the other had read
 * it) loses a registration: such lookups fail with -ENOENT. Any other failure of a lookup is
 * an error too.
 * A third kind of thread meanwhile asks for bytes past a churned export's end at its address,
 * which must be refused (-EINVAL) and bind nothing: no dma-buf left at that address for a
 * lookup, nor one registered forgotten; and, through a second handle on the domain whose
 * registrations tcp refuses (PD_IFACE_SYNAPSEAI), for the pool at its address: the
 * provider's refusal, after which the pool, registered all along, must stay found.
 * Then a dma-buf registered at its addresses ROUNDS times, dropped again after each, while
 * HITTERS threads look up its bytes from before its registration starts until each has hit
 * it: a lookup finds nothing (-ENOENT) until the registration returns, and hits after, so
 * that only the registrations asked for are made, one a round: a lookup that found the
 * dma-buf while its first registration was under way would register a piece of its own.
 * Last, with every dma-buf dropped, nothing may stay cached or registered: a lookup that
 * registered while its dma-buf was being dropped must not have cached that registration.
 * Prints "ok - ..." with the counts, or "FAIL - ..."; exit status 0 iff all went well.
 *
 *   cc -fsanitize=address -o lookup_race lookup_race.c \
 *      $(pkg-config --cflags --libs peerdirect libfabric) -lpthread
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "tcp_cache.h"

#define HITTERS 2
#define CHURNERS 2
#define SOURCES 2
#define CYCLES 1001
#define SIZE (1u << 20)
#define POOL_SIZE (8u << 20)
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)
#define ROUNDS 200

struct export {
	pd_allocation *alloc;
	int fd;
	uint8_t *map;
	uint64_t size;
	unsigned long seq; /* odd: changing; multiple of 4: registered; else dropped */
};

static struct tcp_cache tcp;
static pd_domain *refusing; /* tcp.domain again, its registrations refused by tcp */
static struct export pool, churned[CHURNERS * SOURCES];
static int churners_done, failed;
static long must_hit, hits, misses, refusals, provider_refusals;
/* The round of registrations of `fresh` under way (0 before the first, -1 after the last),
 * the last round each looker hit it in, and the lookups that found nothing. */
static struct export fresh;
static int round_now, looked[HITTERS];
static long not_yet;

static void fail(const char *what, int err)
{
	if (!__atomic_exchange_n(&failed, 1, __ATOMIC_ACQ_REL))
		printf("FAIL - %s : %s (%s)\n", what, pd_strerror(err), pd_last_error());
}

/*
 * Bytes [offset, offset + 4096) of e, looked up by address (in_place: the handle in a
 * pd_mr_storage here): 0 or a negative errno; -EFAULT for a handle of other bytes.
 */
static int lookup(struct export *e, uint64_t offset, int in_place)
{
	pd_mr_storage storage;
	pd_mr *mr = NULL;
	void *addr = NULL;
	uint64_t length = 0;
	int err = in_place ? pd_register_addr_in(tcp.dom, e->map + offset, 4096, ALL, &storage, &mr)
			   : pd_register_addr(tcp.dom, e->map + offset, 4096, ALL, &mr);

	if (!err && in_place && mr != (pd_mr *)&storage)
		err = -EFAULT;
	if (!err && (pd_mr_local(mr, &addr, &length) || addr != e->map + offset || length != 4096))
		err = -EFAULT;
	pd_mr_release(mr);
	return err;
}

static void *hitter(void *arg)
{
	uint64_t state = (uintptr_t)arg * 0x9e3779b97f4a7c15u + 1;
	long mine = 0, found = 0, absent = 0;

	while (!__atomic_load_n(&churners_done, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&failed, __ATOMIC_ACQUIRE)) {
		struct export *e;
		unsigned long before, after;
		int err;

		state = state * 6364136223846793005u + 1442695040888963407u;
		err = lookup(&pool, (state >> 20) % (POOL_SIZE / 4096) * 4096, (state >> 60) & 1);
		if (err) {
			fail("a lookup in the pool, registered all along", err);
			break;
		}
		mine++;
		e = &churned[(state >> 40) % (CHURNERS * SOURCES)];
		before = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
		err = lookup(e, (state >> 8) % (SIZE / 4096) * 4096, (state >> 61) & 1);
		after = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
		if (err && err != -ENOENT) {
			fail("a lookup in a churned export", err);
			break;
		}
		if (err && before == after && before % 4 == 0) {
			printf("FAIL - a lookup in a churned export registered before and after it "
			       "(sequence %lu): -ENOENT, the registration missing from the set\n",
			       before);
			__atomic_store_n(&failed, 1, __ATOMIC_RELEASE);
			break;
		}
		if (!err)
			found++;
		else
			absent++;
	}
	__atomic_add_fetch(&must_hit, mine, __ATOMIC_RELAXED);
	__atomic_add_fetch(&hits, found, __ATOMIC_RELAXED);
	__atomic_add_fetch(&misses, absent, __ATOMIC_RELAXED);
	return NULL;
}

static void *churner(void *arg)
{
	struct export *mine = &churned[(uintptr_t)arg * SOURCES];

	for (int cycle = 0; cycle < CYCLES && !__atomic_load_n(&failed, __ATOMIC_ACQUIRE); cycle++) {
		struct export *e = &mine[cycle % SOURCES];
		pd_mr *mr = NULL;
		int err;

		if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) % 4 == 0) {
			/* Registered: drop it. */
			__atomic_add_fetch(&e->seq, 1, __ATOMIC_ACQ_REL);
			err = pd_regcache_invalidate_dmabuf(tcp.cache, e->fd);
			__atomic_add_fetch(&e->seq, 1, __ATOMIC_ACQ_REL);
			if (err < 0)
				fail("pd_regcache_invalidate_dmabuf", err);
		} else {
			__atomic_add_fetch(&e->seq, 1, __ATOMIC_ACQ_REL);
			err = pd_register_dmabuf_at(tcp.dom, e->fd, 0, 0, e->map, ALL, &mr);
			pd_mr_release(mr);
			__atomic_add_fetch(&e->seq, 1, __ATOMIC_ACQ_REL);
			if (err)
				fail("pd_register_dmabuf_at of a churned export", err);
		}
	}
	return NULL;
}

static int make_export(pd_device *dev, struct export *e, uint64_t size);

/* Looks up bytes of `fresh` once a round until it hits them (-ENOENT before). */
static void *looker(void *arg)
{
	int me = (int)(uintptr_t)arg;
	uint64_t state = (uintptr_t)arg * 0x9e3779b97f4a7c15u + 3;
	long absent = 0;
	int round;

	while ((round = __atomic_load_n(&round_now, __ATOMIC_ACQUIRE)) >= 0 &&
	       !__atomic_load_n(&failed, __ATOMIC_ACQUIRE)) {
		int err;

		if (round == 0 || __atomic_load_n(&looked[me], __ATOMIC_ACQUIRE) == round) {
			sched_yield();
			continue;
		}
		state = state * 6364136223846793005u + 1442695040888963407u;
		err = lookup(&fresh, (state >> 20) % (SIZE / 4096) * 4096, (state >> 60) & 1);
		if (!err)
			__atomic_store_n(&looked[me], round, __ATOMIC_RELEASE);
		else if (err == -ENOENT)
			absent++;
		else
			fail("a lookup of a dma-buf while it is registered", err);
	}
	__atomic_add_fetch(&not_yet, absent, __ATOMIC_RELAXED);
	return NULL;
}

/*
 * `fresh` registered and dropped ROUNDS times while the lookers look it up: 0, or 1 after
 * saying why.
 */
static int register_while_looked_up(pd_device *dev)
{
	struct pd_regcache_stats was, now;
	pthread_t look[HITTERS];
	int err, i;

	if ((err = make_export(dev, &fresh, SIZE)) || (err = pd_regcache_stats(tcp.cache, &was))) {
		fail("an export to register while it is looked up", err);
		return 1;
	}
	for (i = 0; i < HITTERS; i++)
		if (pthread_create(&look[i], NULL, looker, (void *)(uintptr_t)i))
			return 1;
	for (int round = 1; round <= ROUNDS && !failed; round++) {
		pd_mr *mr = NULL;
		int waited = 0;

		__atomic_store_n(&round_now, round, __ATOMIC_RELEASE);
		err = pd_register_dmabuf_at(tcp.dom, fresh.fd, 0, 0, fresh.map, ALL, &mr);
		pd_mr_release(mr);
		if (err) {
			fail("pd_register_dmabuf_at while it is looked up", err);
			break;
		}
		/* Every looker hits it, within 10 s; then none looks it up while it is dropped. */
		for (i = 0; i < HITTERS && !failed; i++)
			while (__atomic_load_n(&looked[i], __ATOMIC_ACQUIRE) != round && !failed) {
				struct timespec ms = { 0, 1000000 };

				if (++waited > 10000) {
					printf("FAIL - a looker found no registration within 10 s of "
					       "round %d's\n", round);
					__atomic_store_n(&failed, 1, __ATOMIC_RELEASE);
					break;
				}
				nanosleep(&ms, NULL);
			}
		if ((err = pd_regcache_invalidate_dmabuf(tcp.cache, fresh.fd)) < 0)
			fail("pd_regcache_invalidate_dmabuf of the looked up dma-buf", err);
	}
	__atomic_store_n(&round_now, -1, __ATOMIC_RELEASE);
	for (i = 0; i < HITTERS; i++)
		pthread_join(look[i], NULL);
	munmap(fresh.map, fresh.size);
	pd_allocation_free(fresh.alloc);
	if (failed)
		return 1;
	if ((err = pd_regcache_stats(tcp.cache, &now))) {
		fail("pd_regcache_stats", err);
		return 1;
	}
	if (now.registrations - was.registrations != ROUNDS || not_yet == 0) {
		printf("FAIL - a dma-buf registered %d times while %d threads looked it up: %" PRIu64
		       " registrations, %ld lookups before it was registered (lookups registered "
		       "pieces of their own, or never raced it)\n",
		       ROUNDS, HITTERS, now.registrations - was.registrations, not_yet);
		return 1;
	}
	printf("ok - a dma-buf registered at its addresses %d times while %d threads looked it "
	       "up: %ld lookups found nothing before each registration returned, then each hit "
	       "it; %d registrations, one a round\n",
	       ROUNDS, HITTERS, not_yet, ROUNDS);
	return 0;
}

/* Asks for bytes past a churned export's end at its address until the churners are done. */
static void *refuser(void *arg)
{
	uint64_t state = (uintptr_t)arg * 0x2545f4914f6cdd1du + 7;
	long mine = 0, by_provider = 0;

	while (!__atomic_load_n(&churners_done, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&failed, __ATOMIC_ACQUIRE)) {
		struct export *e;
		pd_mr *mr = NULL;
		int err;

		state = state * 6364136223846793005u + 1442695040888963407u;
		if ((state >> 62) == 0) {
			/* The pool, registered all along, refused by the provider in the other
			 * handle: the refusal must not forget it (the hitters find it throughout). */
			err = pd_register_dmabuf_at(refusing, pool.fd, 0, 0, pool.map, ALL, &mr);
			if (!err || !strstr(pd_last_error(), "fi_mr_regattr")) {
				pd_mr_release(mr);
				if (!__atomic_exchange_n(&failed, 1, __ATOMIC_ACQ_REL))
					printf("FAIL - the pool in a domain whose registrations tcp "
					       "refuses : %s (%s), expected tcp's refusal\n",
					       err ? pd_strerror(err) : "registered",
					       err ? pd_last_error() : "");
				break;
			}
			by_provider++;
			continue;
		}
		e = &churned[(state >> 40) % (CHURNERS * SOURCES)];
		err = pd_register_dmabuf_at(tcp.dom, e->fd, e->size, 4096, e->map, ALL, &mr);
		if (err != -EINVAL) {
			pd_mr_release(mr);
			if (!__atomic_exchange_n(&failed, 1, __ATOMIC_ACQ_REL))
				printf("FAIL - pd_register_dmabuf_at of bytes past an export's end : %s, "
				       "expected EINVAL\n",
				       err ? pd_strerror(err) : "registered");
			break;
		}
		mine++;
	}
	__atomic_add_fetch(&refusals, mine, __ATOMIC_RELAXED);
	__atomic_add_fetch(&provider_refusals, by_provider, __ATOMIC_RELAXED);
	return NULL;
}

static int make_export(pd_device *dev, struct export *e, uint64_t size)
{
	int err = pd_alloc(dev, size, 0, &e->alloc);

	if (!err)
		err = pd_export(e->alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &e->fd);
	if (err)
		return err;
	e->size = size;
	e->seq = 2; /* not registered */
	e->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, e->fd, 0);
	return e->map == MAP_FAILED ? -errno : 0;
}

int main(void)
{
	pthread_t hit[HITTERS], churn[CHURNERS], refuse;
	struct pd_regcache_stats stats;
	struct timespec t0, t1;
	pd_device *dev;
	pd_mr *mr = NULL;
	int err, i, left = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	dev = pd_device_open(0, &err);
	if (!dev) {
		fail("/dev/peerdirect0", err);
		return 1;
	}
	err = make_export(dev, &pool, POOL_SIZE);
	for (i = 0; i < CHURNERS * SOURCES && !err; i++)
		err = make_export(dev, &churned[i], SIZE);
	if (err) {
		fail("exports of /dev/peerdirect0, mapped", err);
		return 1;
	}
	if (tcp_cache_open(&tcp))
		return 1;
	err = pd_register_dmabuf_at(tcp.dom, pool.fd, 0, 0, pool.map, ALL, &mr);
	pd_mr_release(mr);
	if (err) {
		fail("pd_register_dmabuf_at of the pool", err);
		return 1;
	}
	refusing = pd_domain_attach(tcp.cache, tcp.domain, &err);
	if (!refusing || (err = pd_domain_set_iface(refusing, PD_IFACE_SYNAPSEAI, 0))) {
		fail("a second handle on the domain, PD_IFACE_SYNAPSEAI", err);
		return 1;
	}
	/* In place: no storage, or nowhere to say where it is, is refused before any lookup. */
	{
		pd_mr_storage storage;

		mr = NULL;
		if (pd_register_addr_in(tcp.dom, pool.map, 4096, ALL, NULL, &mr) != -EINVAL ||
		    !strstr(pd_last_error(), "pd_register_addr_in: storage is NULL") || mr ||
		    pd_register_addr_in(tcp.dom, pool.map, 4096, ALL, &storage, NULL) != -EINVAL ||
		    !strstr(pd_last_error(), "pd_register_addr_in: out is NULL")) {
			printf("FAIL - pd_register_addr_in with storage or out NULL: not -EINVAL "
			       "naming it (%s)\n", pd_last_error());
			return 1;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < HITTERS; i++)
		if (pthread_create(&hit[i], NULL, hitter, (void *)(uintptr_t)i))
			return 1;
	for (i = 0; i < CHURNERS; i++)
		if (pthread_create(&churn[i], NULL, churner, (void *)(uintptr_t)i))
			return 1;
	if (pthread_create(&refuse, NULL, refuser, NULL))
		return 1;
	for (i = 0; i < CHURNERS; i++)
		pthread_join(churn[i], NULL);
	__atomic_store_n(&churners_done, 1, __ATOMIC_RELEASE);
	for (i = 0; i < HITTERS; i++)
		pthread_join(hit[i], NULL);
	pthread_join(refuse, NULL);
	if (!failed && (err = pd_domain_detach(refusing)) != 0)
		fail("pd_domain_detach of the refusing handle", err < 0 ? err : -EBUSY);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!failed && register_while_looked_up(dev))
		failed = 1;
	/* What is registered now is found; what is not, not. */
	for (i = 0; i < CHURNERS * SOURCES && !failed; i++) {
		int registered = churned[i].seq % 4 == 0;

		err = lookup(&churned[i], 0, i & 1);
		left += registered;
		if (registered ? err != 0 : err != -ENOENT) {
			printf("FAIL - after the race, export %d (%s) looked up by address : %s\n", i,
			       registered ? "registered" : "dropped", err ? pd_strerror(err) : "found");
			failed = 1;
		}
	}
	/*
	 * Then every one dropped: nothing stays cached or registered (a lookup that registered
	 * while its dma-buf was being dropped must not have cached that registration).
	 */
	for (i = 0; i < CHURNERS * SOURCES && !failed; i++)
		if ((err = pd_regcache_invalidate_dmabuf(tcp.cache, churned[i].fd)) < 0)
			fail("pd_regcache_invalidate_dmabuf after the race", err);
	if (!failed && (err = pd_regcache_invalidate_dmabuf(tcp.cache, pool.fd)) < 0)
		fail("pd_regcache_invalidate_dmabuf of the pool", err);
	if (!failed && (err = pd_regcache_stats(tcp.cache, &stats)))
		fail("pd_regcache_stats", err);
	if (!failed && (stats.entries || stats.registrations != stats.deregistrations)) {
		printf("FAIL - with every dma-buf dropped: %" PRIu64 " entries cached, %" PRIu64
		       " registrations and %" PRIu64 " deregistrations\n",
		       stats.entries, stats.registrations, stats.deregistrations);
		failed = 1;
	}
	pd_regcache_free(tcp.cache);
	tcp_cache_close(&tcp);
	munmap(pool.map, pool.size);
	pd_allocation_free(pool.alloc);
	for (i = 0; i < CHURNERS * SOURCES; i++) {
		munmap(churned[i].map, churned[i].size);
		pd_allocation_free(churned[i].alloc);
	}
	pd_device_close(dev);
	if (failed)
		return 1;
	if (hits == 0 || misses == 0 || refusals == 0 || provider_refusals == 0) {
		if (refusals == 0 || provider_refusals == 0) {
			printf("FAIL - no registration of bytes past an export's end was tried: no "
			       "race\n");
			return 1;
		}
		printf("FAIL - the lookups of churned exports never %s (%ld hits, %ld misses): no "
		       "race\n", hits ? "missed" : "hit", hits, misses);
		return 1;
	}
	printf("ok - %d threads registering and dropping %d exports at their addresses %d times "
	       "each while %d threads looked them up by address, in %.1f s: %ld lookups in the "
	       "pool all hit; of the churned exports %ld hit and %ld missed, none missed while "
	       "registered before and after; %ld registrations of bytes past an export's end "
	       "and %ld of the pool by tcp refused meanwhile; at the end the %d registered were found and the "
	       "others not, and with all dropped nothing stayed cached or registered (%" PRIu64
	       " registrations, as many deregistrations; AddressSanitizer found nothing)\n",
	       CHURNERS, CHURNERS * SOURCES, CYCLES, HITTERS,
	       (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9, must_hit, hits, misses,
	       refusals, provider_refusals, left, stats.registrations);
	return 0;
}

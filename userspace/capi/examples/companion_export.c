/*
 * companion_export: HBM of a companion device (one another driver owns, such as a Gaudi under
 * habanalabs) exported and registered the way a runtime like HCCL would, through the C ABI.
 * Opens /dev/peerdirect<DEVICE_INDEX>, prints what it is, exports bytes
 * [BAR_OFFSET, BAR_OFFSET + LENGTH) of its BAR with pd_export_range (memory the runtime
 * allocated from the owner's driver; the caller vouches for it, so this needs CAP_SYS_ADMIN),
 * maps the dma-buf, writes the test pattern with SEED through the mapping and reads it back,
 * opens libfabric's tcp provider on 127.0.0.1, registers the dma-buf twice with
 * pd_register_export (a miss, then a hit), prints the path and key, then releases everything:
 * the registrations, the cache's entry (pd_regcache_invalidate_dmabuf), the cache, the
 * domain, the mapping and the dma-buf. Each step prints one line, "ok - ..." or
 * "FAIL - ... : <why>"; exit status 0 iff every step was ok (2 for a usage error).
 *
 * The pattern is that of `peerdirect export --pattern SEED` (peerdirect::pattern): byte o is
 * byte o % 8, little endian, of output o / 8 of SplitMix64 seeded with SEED. On the QEMU test
 * host, `tests/hbm-pattern check HBM_FILE BAR_OFFSET LENGTH SEED` finds it in the backing file.
 *
 * With --expect-errno NAME (EPERM, say), the program only tries the export, and succeeds iff
 * pd_export_range returns -NAME: what a caller without CAP_SYS_ADMIN must be told.
 *
 * With --hold GOFILE, the program keeps a registration and its mapping after registering,
 * says "ok - registered, waiting", and waits (up to 120 s) for GOFILE to exist, meanwhile
 * the test removes the companion; then the invalidation callback must have heard of the
 * registration with PD_INVALIDATED_DEVICE, and a child touching the mapping must die of
 * SIGBUS; registering the revoked dma-buf again (pd_register_export, and
 * pd_register_export_at at a device address) must fail with -ENODEV, saying to export again.
 *
 * With --reset, the program keeps a registration and its mapping after registering and
 * announces a reset of the device as the owner's runtime does before it resets it
 * (pd_companion_reset_prepare): the invalidation callback must hear of the registration with
 * PD_INVALIDATED_DEVICE, on the library's own thread, with no further call of the program's;
 * a child touching the mapping must die of SIGBUS; an export is refused with -EBUSY until
 * pd_companion_reset_done, and a second done with -EINVAL; then a new export of the same range
 * maps, takes the pattern with SEED + 1, and registers (a miss).
 *
 * With --lock, the invalidation callback takes an error-checking mutex that the program holds
 * around its own calls, as a runtime's callback takes the lock its registration path holds.
 * Holding it, the program announces a reset (the registration is invalidated: the callback's
 * call waits for the mutex), exports and registers the range again, announces a second reset
 * and registers again, a request that finds its registration revoked. Once the program lets
 * go of the mutex, the callback must hear of both registrations within 5 s, and no call of it
 * may have found the mutex held by its own thread (EDEADLK): the library calls it on its own
 * thread, never inside the program's pd_register_export.
 *
 *   cc -o companion_export companion_export.c $(pkg-config --cflags --libs peerdirect libfabric)
 *   ./companion_export DEVICE_INDEX BAR_OFFSET LENGTH SEED
 *                      [--expect-errno NAME | --hold GOFILE | --reset | --lock]
 *
 * Numbers are decimal, or hexadecimal with 0x.
 */
#define _GNU_SOURCE /* strdup, htole64, gettid, PTHREAD_MUTEX_ERRORCHECK */
#include <ctype.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/dma-buf.h>
#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#define ALL_ACCESS                                                                          \
	(PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ |                   \
	 PD_ACCESS_REMOTE_WRITE)

/* The errnos a step may name: the export's, and those of opening and registering. */
static const struct {
	const char *name;
	int value;
} errnos[] = {
	{ "EPERM", EPERM },   { "ENOENT", ENOENT }, { "EIO", EIO },
	{ "ENXIO", ENXIO },   { "EBADF", EBADF },   { "ENOMEM", ENOMEM },
	{ "EACCES", EACCES }, { "EBUSY", EBUSY },   { "EEXIST", EEXIST },
	{ "ENODEV", ENODEV }, { "EINVAL", EINVAL }, { "EMFILE", EMFILE },
	{ "ENOTTY", ENOTTY }, { "ENOSYS", ENOSYS }, { "EPROTO", EPROTO },
	{ "EOVERFLOW", EOVERFLOW }, { "EOPNOTSUPP", EOPNOTSUPP },
};

/* The name of errno err (either sign), or "errno N" for one without a name here. */
static const char *errno_name(int err)
{
	static char unnamed[32];
	size_t i;

	for (i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++) {
		if (errnos[i].value == err || errnos[i].value == -err)
			return errnos[i].name;
	}
	snprintf(unnamed, sizeof(unnamed), "errno %d", err < 0 ? -err : err);
	return unnamed;
}

/* The errno named name (EPERM, ...), or 0. */
static int errno_value(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++) {
		if (strcmp(errnos[i].name, name) == 0)
			return errnos[i].value;
	}
	return 0;
}

/* A step of a pd_* call that returned the negative errno err. */
static void pd_failed(const char *what, int err)
{
	printf("FAIL - %s: %s : %s\n", what, errno_name(err), pd_last_error());
}

/* A step of a libfabric call that returned ret (a negative FI_E* number). */
static void fi_failed(const char *what, int ret)
{
	printf("FAIL - %s : %s (%d)\n", what, fi_strerror(-ret), ret);
}

/* A decimal number, or a hexadecimal one with 0x (never octal); 0 if text is neither. */
static int parse_u64(const char *text, uint64_t *value)
{
	int hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
	const char *digits = hex ? text + 2 : text;
	char *end;

	/* strtoull would also take blanks and a sign. */
	if (!(hex ? isxdigit((unsigned char)*digits) : isdigit((unsigned char)*digits)))
		return 0;
	errno = 0;
	*value = strtoull(digits, &end, hex ? 16 : 10);
	return errno == 0 && *end == '\0';
}

/*
 * Word i of the test pattern with seed: output i (from 0) of SplitMix64 seeded with seed, as
 * peerdirect::pattern::word and tests/hbm-pattern compute it.
 */
static uint64_t pattern_word(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * UINT64_C(0x9e3779b97f4a7c15);

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* Brackets CPU access to the mapping (DMA_BUF_IOCTL_SYNC); 0 or -errno. */
static int sync_dma_buf(int fd, uint64_t flags)
{
	struct dma_buf_sync sync = { .flags = flags };

	return ioctl(fd, DMA_BUF_IOCTL_SYNC, &sync) == 0 ? 0 : -errno;
}

/*
 * Writes the pattern over the mapping and reads it back; prints the step. 0 iff every word
 * reads back.
 */
static int write_pattern(int fd, void *map, uint64_t length, uint64_t seed)
{
	volatile uint64_t *words = map;
	uint64_t i, n = length / sizeof(uint64_t), bad = 0, first = 0;
	int err;

	if ((err = sync_dma_buf(fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_WRITE)))
		goto sync_failed;
	for (i = 0; i < n; i++)
		words[i] = htole64(pattern_word(seed, i));
	if ((err = sync_dma_buf(fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_WRITE)) ||
	    (err = sync_dma_buf(fd, DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ)))
		goto sync_failed;
	for (i = 0; i < n; i++) {
		if (words[i] != htole64(pattern_word(seed, i)) && bad++ == 0)
			first = i;
	}
	if ((err = sync_dma_buf(fd, DMA_BUF_SYNC_END | DMA_BUF_SYNC_READ)))
		goto sync_failed;
	if (bad) {
		printf("FAIL - pattern %#" PRIx64 " over %" PRIu64 " bytes : %" PRIu64
		       " words differ, the first at byte %#" PRIx64 "\n",
		       seed, length, bad, first * sizeof(uint64_t));
		return 1;
	}
	printf("ok - wrote pattern %#" PRIx64 " over %" PRIu64 " bytes and read it back\n", seed,
	       length);
	return 0;
sync_failed:
	printf("FAIL - DMA_BUF_IOCTL_SYNC : %s\n", strerror(-err));
	return 1;
}

static const char *provider_name(uint32_t provider)
{
	switch (provider) {
	case PD_PROVIDER_OWNED:
		return "owned";
	case PD_PROVIDER_COMPANION:
		return "companion";
	default:
		return "unknown";
	}
}

static const char *path_name(uint32_t path)
{
	switch (path) {
	case PD_PATH_DMABUF:
		return "dma_buf";
	case PD_PATH_HOST_BOUNCE:
		return "host_bounce";
	case PD_PATH_PEERMEM_VA:
		return "peermem_va";
	default:
		return "unknown";
	}
}

/* Whether the cache counted hits and misses so far; prints the step. */
static int cache_counted(const pd_regcache *cache, uint64_t hits, uint64_t misses)
{
	struct pd_regcache_stats stats;
	int err = pd_regcache_stats(cache, &stats);

	if (err) {
		pd_failed("pd_regcache_stats", err);
		return 0;
	}
	if (stats.hits != hits || stats.misses != misses || stats.entries != 1) {
		printf("FAIL - cache counters : hits %" PRIu64 ", misses %" PRIu64 ", entries %" PRIu64
		       "; expected %" PRIu64 ", %" PRIu64 ", 1\n",
		       stats.hits, stats.misses, stats.entries, hits, misses);
		return 0;
	}
	printf("ok - cache counters: hits %" PRIu64 ", misses %" PRIu64 ", entries 1\n", hits,
	       misses);
	return 1;
}

static int usage(void)
{
	fprintf(stderr, "usage: companion_export DEVICE_INDEX BAR_OFFSET LENGTH SEED "
			"[--expect-errno NAME | --hold GOFILE | --reset | --lock]\n");
	return 2;
}

/*
 * What the invalidation callback heard (--hold, --reset), and on which thread; calls is
 * published last (release).
 */
struct heard {
	int calls;
	uint32_t cause;
	uint32_t held;
	uint64_t key;
	pid_t thread;
};

static void on_invalidate(void *ctx, const struct pd_invalidation *invalidation)
{
	struct heard *heard = ctx;

	heard->cause = invalidation->cause;
	heard->held = invalidation->held;
	heard->key = invalidation->key;
	heard->thread = gettid();
	__atomic_store_n(&heard->calls, heard->calls + 1, __ATOMIC_RELEASE);
}

/* Waits up to 5 s for the callback's first call; whether it came. */
static int callback_came(const struct heard *heard)
{
	int tries;

	for (tries = 0; tries < 500 && __atomic_load_n(&heard->calls, __ATOMIC_ACQUIRE) < 1; tries++)
		usleep(10000);
	return __atomic_load_n(&heard->calls, __ATOMIC_ACQUIRE) >= 1;
}

/* Whether touching map kills a child with SIGBUS, now that its memory went (what); prints. */
static int touch_faults(void *map, const char *what)
{
	int wstatus;
	pid_t child;

	fflush(stdout);
	child = fork();
	if (child == 0) {
		(void)*(volatile unsigned char *)map;
		_exit(0);
	}
	if (child < 0 || waitpid(child, &wstatus, 0) != child) {
		printf("FAIL - fork or wait : %s\n", strerror(errno));
		return 0;
	}
	if (!WIFSIGNALED(wstatus) || WTERMSIG(wstatus) != SIGBUS) {
		printf("FAIL - touching the mapping after %s : child status %#x, expected SIGBUS\n",
		       what, wstatus);
		return 0;
	}
	printf("ok - touching the mapping after %s: SIGBUS\n", what);
	return 1;
}

/*
 * --hold: waits for go to exist, then checks that the callback heard of the registration
 * (key) because its device went, that touching the mapping now kills a child with SIGBUS,
 * and that the revoked dma-buf fd is refused (-ENODEV) when registered again, in dom, mapped
 * or at a device address. 0 iff all.
 */
static int hold_until_gone(const char *go, const struct heard *heard, uint64_t key, void *map,
			   const pd_device *dev, pd_domain *dom, int fd)
{
	pd_mr *mr = NULL;
	int err[2];

	int tries;

	printf("ok - registered, waiting\n");
	fflush(stdout);
	for (tries = 0; access(go, F_OK) != 0; tries++) {
		if (tries == 12000) {
			printf("FAIL - waiting for %s : not there after 120 s\n", go);
			return 1;
		}
		usleep(10000);
	}
	/* The cache hears of the removal on a thread of its own: give it 5 s. */
	if (!callback_came(heard) || heard->cause != PD_INVALIDATED_DEVICE || heard->key != key) {
		printf("FAIL - invalidation : %d callback(s), cause %u, key %#" PRIx64
		       "; expected the registration's key %#" PRIx64 " with PD_INVALIDATED_DEVICE\n",
		       heard->calls, heard->cause, heard->key, key);
		return 1;
	}
	printf("ok - invalidated: %d callback(s), cause PD_INVALIDATED_DEVICE, held %u, key %#" PRIx64
	       "\n",
	       heard->calls, heard->held, heard->key);
	if (!touch_faults(map, "the companion went"))
		return 1;
	/* A provider would take the revoked dma-buf (tcp: through a mapping that faults). */
	err[0] = pd_register_export(dom, dev, fd, 0, 0, ALL_ACCESS, &mr);
	pd_mr_release(mr);
	mr = NULL;
	if (err[0] == -ENODEV && strstr(pd_last_error(), "export the memory again"))
		err[1] = pd_register_export_at(dom, dev, fd, 0, 0, (void *)(uintptr_t)0x100040000000u,
					       ALL_ACCESS, &mr);
	else
		err[1] = 0;
	pd_mr_release(mr);
	if (err[0] != -ENODEV || err[1] != -ENODEV ||
	    !strstr(pd_last_error(), "export the memory again")) {
		printf("FAIL - the revoked dma-buf registered again : %d, at an address %d (%s); "
		       "expected -ENODEV saying to export again\n",
		       err[0], err[1], pd_last_error());
		return 1;
	}
	printf("ok - the revoked dma-buf registered again: ENODEV, mapped and at an address (%s)\n",
	       pd_last_error());
	return 0;
}

/*
 * --reset: announces a reset with the registration (key) held in dom and map mapped, checks
 * what the callback heard and that the mapping faults, that exports wait for the reset's end,
 * then exports the range again, writes the pattern with seed + 1 and registers it. 0 iff all.
 */
static int reset_and_export_again(pd_device *dev, pd_domain *dom, const pd_regcache *cache,
				  const struct heard *heard, uint64_t key, void *map,
				  uint64_t bar_offset, uint64_t length, uint64_t seed)
{
	struct pd_regcache_stats stats;
	void *again = MAP_FAILED;
	pd_mr *mr = NULL;
	int fd = -1, err, status = 1;

	if ((err = pd_companion_reset_prepare(dev))) {
		pd_failed("pd_companion_reset_prepare", err);
		return 1;
	}
	printf("ok - pd_companion_reset_prepare\n");
	if (!callback_came(heard) || heard->cause != PD_INVALIDATED_DEVICE || heard->key != key) {
		printf("FAIL - invalidation : %d callback(s), cause %u, key %#" PRIx64
		       "; expected the registration's key %#" PRIx64 " with PD_INVALIDATED_DEVICE\n",
		       heard->calls, heard->cause, heard->key, key);
		return 1;
	}
	if (heard->thread == gettid()) {
		printf("FAIL - invalidation : heard on the program's own thread, expected the "
		       "library's watching thread\n");
		return 1;
	}
	printf("ok - invalidated by the reset: %d callback(s), cause PD_INVALIDATED_DEVICE, held %u, "
	       "key %#" PRIx64 ", on the library's thread\n",
	       heard->calls, heard->held, heard->key);
	if (!touch_faults(map, "the reset began"))
		return 1;
	err = pd_export_range(dev, bar_offset, length, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd);
	if (err != -EBUSY) {
		printf("FAIL - pd_export_range during the reset : %s, expected EBUSY\n",
		       err ? errno_name(err) : "exported");
		goto out;
	}
	printf("ok - pd_export_range during the reset: EBUSY\n");
	if ((err = pd_companion_reset_done(dev))) {
		pd_failed("pd_companion_reset_done", err);
		goto out;
	}
	err = pd_companion_reset_done(dev);
	if (err != -EINVAL) {
		printf("FAIL - a second pd_companion_reset_done : %s, expected EINVAL\n",
		       err ? errno_name(err) : "succeeded");
		goto out;
	}
	printf("ok - pd_companion_reset_done, and a second one: EINVAL\n");
	if ((err = pd_export_range(dev, bar_offset, length, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR,
				   &fd))) {
		pd_failed("pd_export_range after the reset", err);
		goto out;
	}
	again = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (again == MAP_FAILED) {
		printf("FAIL - mmap of the new dma-buf : %s\n", strerror(errno));
		goto out;
	}
	if (write_pattern(fd, again, length, seed + 1))
		goto out;
	if ((err = pd_register_export(dom, dev, fd, 0, 0, ALL_ACCESS, &mr))) {
		pd_failed("pd_register_export after the reset", err);
		goto out;
	}
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_failed("pd_regcache_stats", err);
		goto out;
	}
	if (pd_mr_key(mr) == key || stats.misses != 2 || stats.invalidations != 1) {
		printf("FAIL - registered after the reset : key %#" PRIx64 ", misses %" PRIu64
		       ", invalidations %" PRIu64 "; expected a new key, 2, 1\n",
		       pd_mr_key(mr), stats.misses, stats.invalidations);
		goto out;
	}
	printf("ok - exported again after the reset and registered: key %#" PRIx64
	       ", misses 2, invalidations 1\n",
	       pd_mr_key(mr));
	status = 0;
out:
	pd_mr_release(mr);
	if (again != MAP_FAILED)
		munmap(again, length);
	if (fd >= 0)
		close(fd);
	return status;
}

/* --lock: the program's lock, which the callback takes; counts published with release. */
struct locked {
	pthread_mutex_t mutex; /* PTHREAD_MUTEX_ERRORCHECK */
	int calls;
	int deadlocks; /* calls that found the mutex held by their own thread */
};

static void on_invalidate_locked(void *ctx, const struct pd_invalidation *invalidation)
{
	struct locked *locked = ctx;
	int err = pthread_mutex_lock(&locked->mutex);

	(void)invalidation;
	if (err == 0)
		pthread_mutex_unlock(&locked->mutex);
	else
		__atomic_add_fetch(&locked->deadlocks, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&locked->calls, 1, __ATOMIC_RELEASE);
}

/* A reset announced and ended, as the owner's runtime does around one; 0 iff both. */
static int announce_reset(pd_device *dev)
{
	int err;

	if ((err = pd_companion_reset_prepare(dev))) {
		pd_failed("pd_companion_reset_prepare", err);
		return 1;
	}
	if ((err = pd_companion_reset_done(dev))) {
		pd_failed("pd_companion_reset_done", err);
		return 1;
	}
	return 0;
}

/*
 * --lock: with the mutex held, a reset (the registrations made before are invalidated),
 * a new export registered, a second reset and a request for it again; then, the mutex let
 * go of, both calls of the callback must come, neither with EDEADLK. 0 iff so.
 */
static int lock_around_register(pd_device *dev, pd_domain *dom, struct locked *locked,
				uint64_t bar_offset, uint64_t length)
{
	pd_mr *mr = NULL, *again = NULL;
	int fd = -1, err, tries, calls, status = 1;

	if ((err = pthread_mutex_lock(&locked->mutex))) {
		printf("FAIL - pthread_mutex_lock : %s\n", strerror(err));
		return 1;
	}
	if (announce_reset(dev))
		goto unlock;
	printf("ok - a reset announced with the lock held\n");
	if ((err = pd_export_range(dev, bar_offset, length, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR,
				   &fd))) {
		pd_failed("pd_export_range after the reset", err);
		goto unlock;
	}
	if ((err = pd_register_export(dom, dev, fd, 0, 0, ALL_ACCESS, &mr))) {
		pd_failed("pd_register_export after the reset", err);
		goto unlock;
	}
	printf("ok - exported again and registered with the lock held: key %#" PRIx64 "\n",
	       pd_mr_key(mr));
	if (announce_reset(dev))
		goto unlock;
	/* Its registration was revoked by the second reset: this request finds it so. */
	err = pd_register_export(dom, dev, fd, 0, 0, ALL_ACCESS, &again);
	printf("ok - a second reset, then pd_register_export of the revoked export with the lock "
	       "held: %s\n",
	       err ? errno_name(err) : "registered");
	status = 0;
unlock:
	pthread_mutex_unlock(&locked->mutex);
	for (tries = 0; tries < 500 && __atomic_load_n(&locked->calls, __ATOMIC_ACQUIRE) < 2;
	     tries++)
		usleep(10000);
	calls = __atomic_load_n(&locked->calls, __ATOMIC_ACQUIRE);
	if (status == 0 && (calls < 2 || locked->deadlocks)) {
		printf("FAIL - callback under the program's lock : %d call(s) within 5 s, %d of "
		       "them found the lock held by their own thread (EDEADLK); expected 2, none\n",
		       calls, locked->deadlocks);
		status = 1;
	} else if (status == 0) {
		printf("ok - the callback heard of both registrations once the lock was let go of: "
		       "%d call(s), none with EDEADLK\n",
		       calls);
	}
	pd_mr_release(again);
	pd_mr_release(mr);
	if (fd >= 0)
		close(fd);
	return status;
}

int main(int argc, char **argv)
{
	uint64_t index, bar_offset, length, seed;
	const char *go = NULL;
	int reset = 0, lock = 0;
	struct heard heard = { 0 };
	struct locked locked = { .calls = 0 };
	pthread_mutexattr_t attr;
	int expected = 0;
	char what[128];
	struct pd_device_info info;
	struct fi_info *hints, *fi = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	pd_device *dev = NULL;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_mr *first = NULL, *second = NULL;
	void *map = MAP_FAILED;
	int fd = -1;
	int err, ret, status = 1;

	if (argc == 6 && strcmp(argv[5], "--reset") == 0)
		reset = 1;
	else if (argc == 6 && strcmp(argv[5], "--lock") == 0)
		lock = 1;
	else if (argc != 5 && argc != 7)
		return usage();
	if (!parse_u64(argv[1], &index) || index > UINT_MAX || !parse_u64(argv[2], &bar_offset) ||
	    !parse_u64(argv[3], &length) || !parse_u64(argv[4], &seed))
		return usage();
	if (argc == 7 && strcmp(argv[5], "--hold") == 0)
		go = argv[6];
	else if (argc == 7 && (strcmp(argv[5], "--expect-errno") != 0 ||
			       (expected = errno_value(argv[6])) == 0))
		return usage();

	dev = pd_device_open((unsigned)index, &err);
	if (!dev) {
		snprintf(what, sizeof(what), "pd_device_open(%" PRIu64 ")", index);
		pd_failed(what, err);
		return 1;
	}
	printf("ok - opened /dev/peerdirect%" PRIu64 "\n", index);

	snprintf(what, sizeof(what), "pd_export_range of %" PRIu64 " bytes at BAR offset %#" PRIx64,
		 length, bar_offset);
	if (expected) {
		err = pd_export_range(dev, bar_offset, length, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR,
				      &fd);
		if (err == -expected) {
			printf("ok - refused with %s: %s\n", argv[6], pd_last_error());
			status = 0;
		} else if (err) {
			printf("FAIL - %s: %s, expected %s : %s\n", what, errno_name(err), argv[6],
			       pd_last_error());
		} else {
			printf("FAIL - %s : exported as dma-buf fd %d, expected %s\n", what, fd,
			       argv[6]);
			close(fd);
		}
		pd_device_close(dev);
		return status;
	}

	err = pd_device_info(dev, &info);
	if (err) {
		pd_failed("pd_device_info", err);
		goto out;
	}
	printf("ok - /dev/peerdirect%" PRIu32 ": %04" PRIx32 ":%02x:%02x.%x [%04x:%04x] BAR %" PRIu32
	       ", %" PRIu64 " bytes, provider %s\n",
	       info.index, info.pci_domain, info.pci_bus, info.pci_slot, info.pci_func,
	       info.vendor_id, info.device_id, info.bar_index, info.hbm_bytes,
	       provider_name(info.provider));

	err = pd_export_range(dev, bar_offset, length, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd);
	if (err) {
		pd_failed(what, err);
		goto out;
	}
	printf("ok - exported %" PRIu64 " bytes at BAR offset %#" PRIx64 " as dma-buf fd %d\n",
	       length, bar_offset, fd);

	map = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		printf("FAIL - mmap of the dma-buf : %s\n", strerror(errno));
		goto out;
	}
	printf("ok - mapped the dma-buf\n");
	if (write_pattern(fd, map, length, seed))
		goto out;

	/* libfabric, opened by the program as a runtime does: tcp, thread safe. */
	hints = fi_allocinfo();
	if (!hints) {
		fi_failed("fi_allocinfo", -FI_ENOMEM);
		goto out;
	}
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	ret = fi_getinfo(FI_VERSION(1, 20), "127.0.0.1", NULL, FI_SOURCE, hints, &fi);
	fi_freeinfo(hints);
	if (ret) {
		fi_failed("fi_getinfo(tcp, 127.0.0.1)", ret);
		goto out;
	}
	if ((ret = fi_fabric(fi->fabric_attr, &fabric, NULL))) {
		fi_failed("fi_fabric", ret);
		goto out;
	}
	if ((ret = fi_domain(fabric, fi, &domain, NULL))) {
		fi_failed("fi_domain", ret);
		goto out;
	}
	printf("ok - libfabric %u.%u: provider %s, domain %s\n", FI_MAJOR(fi_version()),
	       FI_MINOR(fi_version()), fi->fabric_attr->prov_name, fi->domain_attr->name);

	cache = pd_regcache_new(&err);
	if (!cache) {
		pd_failed("pd_regcache_new", err);
		goto out;
	}
	printf("ok - created a registration cache\n");
	dom = pd_domain_attach(cache, domain, &err);
	if (!dom) {
		pd_failed("pd_domain_attach", err);
		goto out;
	}
	printf("ok - attached the domain\n");

	if ((go || reset) &&
	    (err = pd_regcache_set_invalidate_callback(cache, on_invalidate, &heard))) {
		pd_failed("pd_regcache_set_invalidate_callback", err);
		goto out;
	}
	if (lock) {
		if (pthread_mutexattr_init(&attr) ||
		    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK) ||
		    pthread_mutex_init(&locked.mutex, &attr)) {
			printf("FAIL - an error-checking mutex\n");
			goto out;
		}
		pthread_mutexattr_destroy(&attr);
		if ((err = pd_regcache_set_invalidate_callback(cache, on_invalidate_locked,
							       &locked))) {
			pd_failed("pd_regcache_set_invalidate_callback", err);
			goto out;
		}
	}
	/* Registered as the device's export: the cache watches the device. */
	err = pd_register_export(dom, dev, fd, 0, 0, ALL_ACCESS, &first);
	if (err) {
		pd_failed("pd_register_export", err);
		goto out;
	}
	printf("ok - registered %" PRIu64 " bytes: path %s, key %#" PRIx64 "\n", length,
	       path_name(pd_mr_path(first)), pd_mr_key(first));
	if (pd_mr_path(first) != PD_PATH_DMABUF) {
		printf("FAIL - registration path : %s, expected dma_buf\n",
		       path_name(pd_mr_path(first)));
		goto out;
	}
	if (!cache_counted(cache, 0, 1))
		goto out;
	err = pd_register_export(dom, dev, fd, 0, 0, ALL_ACCESS, &second);
	if (err) {
		pd_failed("pd_register_export(again)", err);
		goto out;
	}
	if (pd_mr_key(second) != pd_mr_key(first)) {
		printf("FAIL - registered again : key %#" PRIx64 ", expected the first one's %#" PRIx64
		       "\n",
		       pd_mr_key(second), pd_mr_key(first));
		goto out;
	}
	printf("ok - registered again: path %s, key %#" PRIx64 "\n",
	       path_name(pd_mr_path(second)), pd_mr_key(second));
	if (!cache_counted(cache, 1, 1))
		goto out;
	if (go) {
		status = hold_until_gone(go, &heard, pd_mr_key(first), map, dev, dom, fd);
		goto out;
	}
	if (lock) {
		status = lock_around_register(dev, dom, &locked, bar_offset, length);
		goto out;
	}
	if (reset) {
		status = reset_and_export_again(dev, dom, cache, &heard, pd_mr_key(first), map,
						bar_offset, length, seed);
		goto out;
	}

	pd_mr_release(first);
	pd_mr_release(second);
	first = second = NULL;
	printf("ok - released the registrations\n");
	ret = pd_regcache_invalidate_dmabuf(cache, fd);
	if (ret != 1) {
		if (ret < 0)
			pd_failed("pd_regcache_invalidate_dmabuf", ret);
		else
			printf("FAIL - pd_regcache_invalidate_dmabuf : dropped %d entries, expected 1\n",
			       ret);
		goto out;
	}
	printf("ok - pd_regcache_invalidate_dmabuf dropped 1 entry\n");
	ret = pd_domain_detach(dom);
	if (ret < 0) {
		pd_failed("pd_domain_detach", ret);
		goto out;
	}
	dom = NULL;
	pd_regcache_free(cache);
	cache = NULL;
	printf("ok - detached the domain and freed the cache\n");
	status = 0;
out:
	pd_mr_release(first);
	pd_mr_release(second);
	/* Only once nothing of the domain is registered any more: then close it. */
	if ((ret = pd_domain_detach(dom)) < 0) {
		pd_failed("pd_domain_detach", ret);
		status = 1;
	}
	pd_regcache_free(cache);
	if (domain && (ret = fi_close(&domain->fid))) {
		fi_failed("fi_close(domain)", ret);
		status = 1;
	}
	if (fabric && (ret = fi_close(&fabric->fid))) {
		fi_failed("fi_close(fabric)", ret);
		status = 1;
	}
	fi_freeinfo(fi);
	if (map != MAP_FAILED && munmap(map, length) != 0) {
		printf("FAIL - munmap of the dma-buf : %s\n", strerror(errno));
		status = 1;
	}
	if (fd >= 0 && close(fd) != 0) {
		printf("FAIL - close of the dma-buf : %s\n", strerror(errno));
		status = 1;
	}
	pd_device_close(dev);
	if (status == 0)
		printf("ok - closed the domain, the mapping and the dma-buf\n");
	return status;
}

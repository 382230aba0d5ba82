/*
 * hcl_pool: Habana HCL's registration pattern through the C ABI. HCL exports its whole HBM pool
 * as one dma-buf, registers it once per domain at its own address for the pool
 * (fi_mr_dmabuf.base_addr = the device virtual address), then finds the registration of every
 * buffer it sends from by the buffer's address, and keeps a one-word "flush" buffer that a
 * peer reads with RDMA to order its writes.
 *
 * Here the pool is 4 GiB of /dev/peerdirect0 (pd_alloc, pd_export), registered with
 * pd_register_dmabuf_at at the runtime's address for it. On tcp that is the address of a CPU
 * mapping of the pool (tcp copies with the CPU, so the address must be one it can read). On
 * a NIC provider (verbs;ofi_rxm on a dma-buf capable RDMA device) it is a device virtual
 * address, as HCL's, mapped nowhere in the process: the NIC reaches the pool through the
 * dma-buf alone. The program then:
 *  - looks up 1,000 buffers at random addresses of the pool (pd_register_addr_in, each handle
 *    in a pd_mr_storage on the stack, as a runtime's hot path would keep it: no allocation):
 *    each is a cache hit on the one registration, with pd_mr_local() = the address and
 *    pd_mr_offset() = its offset in the pool;
 *  - refuses addresses outside the pool (-ENOENT);
 *  - in a cache of one entry, has the pool's registration evicted (its handle released,
 *    another registration made) and then finds a buffer by address: the whole pool is
 *    registered again, not the buffer alone, so that a second buffer is a hit on it;
 *  - sends 1 MiB from a buffer 3 GiB into the pool to one 1 GiB into it, both found by
 *    address, and checks every byte. On a NIC provider the pool's CPU mapping (which only
 *    fills and checks the buffers) is unmapped first: while the bytes move, no address of
 *    the pool is mapped in the process (checked in /proc/self/maps), so nothing in it can
 *    have copied them; the exporter's debugfs shows the NIC attached to the pool, pinned;
 *  - finds the one-word flush buffer by address with remote-read access and checks what a
 *    peer's fi_read would name it by (pd_mr_remote: the pool's key, at its virtual address
 *    or at its offset). On a NIC provider one endpoint then reads the word with fi_read into
 *    another word of the pool, as HCL's flush does; libfabric 2.1's tcp cannot be the target
 *    of RMA on a dma-buf registration (Documentation/rdma.md, "RMA"), so there the read is
 *    not made.
 * The moved bytes are the pattern of tests/hbm-pattern (SplitMix64 words from SEED); a line
 * "# hbm-dst offset=... length=... seed=..." gives the destination's place in HBM for a check
 * of the HBM backing file on the host.
 * Each step prints "ok - ..." or "FAIL - ... : <why>"; exit status 0 iff all were ok.
 *
 *   cc -o hcl_pool hcl_pool.c $(pkg-config --cflags --libs peerdirect libfabric)
 *   ./hcl_pool [PROVIDER]   (default tcp; peerdirect.ko loaded, /dev/peerdirect0 with at
 *                            least 4 GiB of HBM)
 */
#define _GNU_SOURCE /* strdup */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#define POOL (UINT64_C(4) << 30)
#define LOOKUPS 1000
#define MOVED (1u << 20)
#define SRC_OFFSET ((UINT64_C(3) << 30) + 12345)
#define DST_OFFSET ((UINT64_C(1) << 30) + 777)
#define FLUSH_OFFSET ((UINT64_C(2) << 30) + 64)
#define READBACK_OFFSET ((UINT64_C(2) << 30) + 4096)
#define FLUSH_WORD UINT64_C(0x68736c662d4c4348) /* "HCL-flsh" */
#define SEED UINT64_C(0x4843c1)
/* The pool's device virtual address on a NIC provider: HCL's kind, mapped nowhere here. */
#define DEVICE_VA UINT64_C(0x100000000000)
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ | \
	     PD_ACCESS_REMOTE_WRITE)

static int failed;

static void fail_pd(const char *what, int err)
{
	printf("FAIL - %s : %s (%s)\n", what, pd_strerror(err), pd_last_error());
	failed = 1;
}

static void fail_fi(const char *what, long ret)
{
	printf("FAIL - %s : %s (%ld)\n", what, fi_strerror((int)-ret), ret);
	failed = 1;
}

/* xorshift64: the lookups' addresses, the same every run. */
static uint64_t next(uint64_t *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return *state;
}

/* Byte i of tests/hbm-pattern's pattern: byte i % 8 of SplitMix64's output i / 8 from SEED. */
static uint8_t pattern(uint64_t i)
{
	uint64_t z = SEED + (i / 8 + 1) * UINT64_C(0x9e3779b97f4a7c15);

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	z ^= z >> 31;
	return (uint8_t)(z >> (8 * (i % 8)));
}

/* Whether any mapping of the process overlaps [start, start + len) (/proc/self/maps). */
static int mapped_in_process(uint64_t start, uint64_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi;
	char line[512];
	int found = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo < start + len && hi > start)
			found = 1;
	fclose(f);
	return found;
}

/* Whether a line of /proc/self/maps names a dma-buf (the pool's mapping). */
static int dmabuf_mapped(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int found = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "dmabuf"))
			found = 1;
	fclose(f);
	return found;
}

/*
 * The importer lines peerdirect's debugfs lists under the export of @length bytes: 1 iff one
 * of them is pinned with mapped entries; the line in @importer.
 */
static int pool_importer(uint64_t length, char *importer, size_t size)
{
	FILE *f = fopen("/sys/kernel/debug/peerdirect/peerdirect0/exports", "r");
	char line[512], want[64];
	unsigned long entries;
	int under = 0, found = 0;

	if (!f)
		return -1;
	snprintf(want, sizeof(want), "length=%#" PRIx64 "\n", length);
	while (fgets(line, sizeof(line), f)) {
		if (line[0] != ' ') {
			under = strstr(line, want) != NULL;
			continue;
		}
		if (under && strstr(line, "pinned=1") &&
		    sscanf(strstr(line, "mapped_entries="), "mapped_entries=%lu", &entries) == 1 &&
		    entries > 0 && !found) {
			found = 1;
			snprintf(importer, size, "%s", line + 2);
			importer[strcspn(importer, "\n")] = 0;
		}
	}
	fclose(f);
	return found;
}

/* Two RDM endpoints of one domain, each with its CQ and AV; ep[0] addresses ep[1]. */
struct ends {
	struct fid_cq *cq[2];
	struct fid_av *av[2];
	struct fid_ep *ep[2];
	fi_addr_t peer;
};

static int open_ends(struct fi_info *info, struct fid_domain *domain, struct ends *e)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .size = 64 };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	char name[256];
	size_t name_len = sizeof(name);
	long ret;
	int i;

	for (i = 0; i < 2; i++) {
		if ((ret = fi_cq_open(domain, &cq_attr, &e->cq[i], NULL)) ||
		    (ret = fi_av_open(domain, &av_attr, &e->av[i], NULL)) ||
		    (ret = fi_endpoint(domain, info, &e->ep[i], NULL)) ||
		    (ret = fi_ep_bind(e->ep[i], &e->cq[i]->fid, FI_TRANSMIT | FI_RECV)) ||
		    (ret = fi_ep_bind(e->ep[i], &e->av[i]->fid, 0)) || (ret = fi_enable(e->ep[i]))) {
			fail_fi("opening an endpoint", ret);
			return 0;
		}
	}
	if ((ret = fi_getname(&e->ep[1]->fid, name, &name_len))) {
		fail_fi("fi_getname", ret);
		return 0;
	}
	if (fi_av_insert(e->av[0], name, 1, &e->peer, 0, NULL) != 1) {
		fail_fi("fi_av_insert", -FI_EOTHER);
		return 0;
	}
	return 1;
}

static void close_ends(struct ends *e)
{
	int i;

	for (i = 0; i < 2; i++) {
		if (e->ep[i])
			fi_close(&e->ep[i]->fid);
		if (e->av[i])
			fi_close(&e->av[i]->fid);
		if (e->cq[i])
			fi_close(&e->cq[i]->fid);
	}
}

/* Reads a CQ once (which drives tcp's progress): completions, or -1 on an error entry. */
static long reap(struct fid_cq *cq)
{
	struct fi_cq_tagged_entry entries[4];
	struct fi_cq_err_entry err = { 0 };
	ssize_t n = fi_cq_read(cq, entries, 4);

	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		fi_cq_readerr(cq, &err, 0);
		fail_fi("a completion", -(long)err.err);
		return -1;
	}
	if (n < 0) {
		fail_fi("fi_cq_read", n);
		return -1;
	}
	return n;
}

/* Drives both CQs until `want` completions came on cq[0] and `peer` on cq[1]. 1 iff so. */
static int complete(struct ends *e, long want, long peer)
{
	long n, spins = 0;

	while (want > 0 || peer > 0) {
		if ((n = reap(e->cq[0])) < 0)
			return 0;
		want -= n;
		if ((n = reap(e->cq[1])) < 0)
			return 0;
		peer -= n;
		if (++spins > 50000000) {
			printf("FAIL - waiting for completions : none came\n");
			failed = 1;
			return 0;
		}
	}
	return 1;
}

/*
 * After a post answered -FI_EAGAIN: reads both CQs once (progress for both sides); 0 on an
 * error entry, or when the post has been retried for too long.
 */
static int again(struct ends *e)
{
	static long tries;

	if (reap(e->cq[0]) < 0 || reap(e->cq[1]) < 0)
		return 0;
	if (++tries > 50000000) {
		printf("FAIL - posting : -FI_EAGAIN for ever\n");
		failed = 1;
		return 0;
	}
	return 1;
}

/*
 * pd_register_addr of the pool's bytes at @offset, by the address the pool was registered at
 * (@base), checked against the pool's registration; the handle (in @storage if not NULL:
 * pd_register_addr_in), or NULL.
 */
static pd_mr *lookup(pd_domain *dom, uint64_t base, uint64_t key, uint64_t offset, uint64_t len,
		     uint32_t access, pd_mr_storage *storage)
{
	void *addr = (void *)(uintptr_t)(base + offset), *local;
	uint64_t local_len;
	pd_mr *mr = NULL;
	int err = storage ? pd_register_addr_in(dom, addr, len, access, storage, &mr)
			  : pd_register_addr(dom, addr, len, access, &mr);

	if (err) {
		fail_pd(storage ? "pd_register_addr_in" : "pd_register_addr", err);
		return NULL;
	}
	if ((storage && mr != (pd_mr *)storage) || pd_mr_key(mr) != key || pd_mr_offset(mr) != offset || pd_mr_local(mr, &local, &local_len) ||
	    (uint64_t)(uintptr_t)local != base + offset || local_len != len) {
		printf("FAIL - pd_register_addr(pool + %#" PRIx64 ", %" PRIu64 ") : key %#" PRIx64
		       ", offset %#" PRIx64 ", local %p + %" PRIu64 "; expected the pool's key %#" PRIx64
		       " at that offset and address\n",
		       offset, len, pd_mr_key(mr), pd_mr_offset(mr), local, local_len, key);
		failed = 1;
		pd_mr_release(mr);
		return NULL;
	}
	return mr;
}

/*
 * The pool's registration evicted: in a cache of one entry (PEERDIRECT_MR_CACHE_MAX_COUNT=1)
 * on the same provider domain, the pool is registered at @base and its handle released, then
 * a registration of another export (@alloc's first page, at the address after the pool)
 * evicts it. A buffer found by address then
 * registers the whole pool again (its offset in the registration is its offset in the pool),
 * not the buffer alone, so that another buffer is a hit on it. 1 if all went as said.
 */
static int evicted_pool(struct fid_domain *domain, pd_allocation *alloc, int fd, uint64_t base)
{
	const uint64_t a_offset = (UINT64_C(1) << 30) + 4096, b_offset = (UINT64_C(3) << 30) + 8;
	struct pd_regcache_stats evicted, first, second;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_mr *mr = NULL, *a = NULL, *b = NULL;
	int err, ok = 0, page = -1;

	setenv("PEERDIRECT_MR_CACHE_MAX_COUNT", "1", 1);
	cache = pd_regcache_new(&err);
	unsetenv("PEERDIRECT_MR_CACHE_MAX_COUNT");
	if (!cache || !(dom = pd_domain_attach(cache, domain, &err))) {
		fail_pd("a cache of one entry", err);
		goto out;
	}
	if ((err = pd_register_dmabuf_at(dom, fd, 0, 0, (void *)(uintptr_t)base, ALL, &mr))) {
		fail_pd("pd_register_dmabuf_at of the pool in a cache of one entry", err);
		goto out;
	}
	pd_mr_release(mr);
	mr = NULL;
	if ((err = pd_export(alloc, 0, 4096, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &page)) ||
	    (err = pd_register_dmabuf_at(dom, page, 0, 0, (void *)(uintptr_t)(base + POOL), ALL,
					 &mr))) {
		fail_pd("an export of the allocation's first page registered after the pool", err);
		goto out;
	}
	pd_mr_release(mr);
	mr = NULL;
	if ((err = pd_regcache_stats(cache, &evicted))) {
		fail_pd("pd_regcache_stats", err);
		goto out;
	}
	if ((err = pd_register_addr(dom, (void *)(uintptr_t)(base + a_offset), 4096,
				    PD_ACCESS_LOCAL_READ, &a))) {
		fail_pd("pd_register_addr of a buffer of the evicted pool", err);
		goto out;
	}
	if ((err = pd_regcache_stats(cache, &first))) {
		fail_pd("pd_regcache_stats", err);
		goto out;
	}
	if (evicted.evictions != 1 || evicted.registrations != 2 ||
	    first.registrations != 3 || pd_mr_offset(a) != a_offset) {
		printf("FAIL - a buffer of the evicted pool found by address : %" PRIu64
		       " evictions, %" PRIu64 " then %" PRIu64 " registrations, offset %#" PRIx64
		       " in its registration; expected 1 eviction, 2 then 3 registrations, offset %#"
		       PRIx64 " (the pool registered whole again)\n",
		       evicted.evictions, evicted.registrations, first.registrations,
		       pd_mr_offset(a), a_offset);
		failed = 1;
		goto out;
	}
	b = lookup(dom, base, pd_mr_key(a), b_offset, 8192, PD_ACCESS_LOCAL_READ, NULL);
	if (!b)
		goto out;
	if ((err = pd_regcache_stats(cache, &second))) {
		fail_pd("pd_regcache_stats", err);
		goto out;
	}
	if (second.registrations != first.registrations || second.hits != first.hits + 1) {
		printf("FAIL - a second buffer of the pool registered again : %" PRIu64
		       " registrations, %" PRIu64 " hits; expected %" PRIu64 " and %" PRIu64 "\n",
		       second.registrations, second.hits, first.registrations, first.hits + 1);
		failed = 1;
		goto out;
	}
	printf("ok - the pool's registration evicted (a cache of one entry, its handle released): "
	       "a buffer found by address registers the whole pool again (offset %#" PRIx64
	       " in it), and a buffer 2 GiB away is a hit on that registration\n",
	       a_offset);
	ok = 1;
out:
	pd_mr_release(b);
	pd_mr_release(a);
	if (dom && (err = pd_domain_detach(dom)) < 0) {
		fail_pd("pd_domain_detach of the cache of one entry", err);
		ok = 0;
	}
	pd_regcache_free(cache);
	if (page >= 0)
		close(page);
	return ok;
}

/* The pool's CPU mapping, to fill and check buffers; MAP_FAILED on failure (said). */
static uint8_t *map_pool(int fd)
{
	uint8_t *pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	if (pool == MAP_FAILED) {
		printf("FAIL - mmap of the pool : %s\n", strerror(errno));
		failed = 1;
	}
	return pool;
}

int main(int argc, char **argv)
{
	const char *provider = argc > 1 ? argv[1] : "tcp";
	/* A NIC provider: the pool at a device address; otherwise at its CPU mapping's. */
	int nic = strncmp(provider, "verbs", 5) == 0;
	const char *node = nic ? NULL : "127.0.0.1";
	struct fi_info *hints, *info = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	struct pd_regcache_stats before, after;
	struct ends ends = { 0 };
	pd_device *dev = NULL;
	pd_allocation *alloc = NULL;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_mr *pool_mr = NULL, *src = NULL, *dst = NULL, *flush = NULL, *readback = NULL;
	pd_mr *none = NULL;
	uint8_t *pool = MAP_FAILED;
	uint64_t state = 0x5eed, key, raddr, rkey, roffset, rkey0, base, word;
	char importer[256], past[512];
	int fd = -1, err, i;
	long ret;

	setvbuf(stdout, NULL, _IOLBF, 0);
	dev = pd_device_open(0, &err);
	if (!dev || (err = pd_alloc(dev, POOL, 0, &alloc)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd))) {
		fail_pd("a 4 GiB pool of /dev/peerdirect0", err);
		goto out;
	}
	pool = map_pool(fd);
	if (pool == MAP_FAILED)
		goto out;
	base = nic ? DEVICE_VA : (uint64_t)(uintptr_t)pool;

	hints = fi_allocinfo();
	if (!hints)
		return 1;
	hints->fabric_attr->prov_name = strdup(provider);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED | (nic ? FI_RMA | FI_READ | FI_REMOTE_READ : 0);
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode =
		FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	ret = fi_getinfo(FI_VERSION(1, 20), node, NULL, node ? FI_SOURCE : 0, hints, &info);
	fi_freeinfo(hints);
	if (ret || (ret = fi_fabric(info->fabric_attr, &fabric, NULL)) ||
	    (ret = fi_domain(fabric, info, &domain, NULL))) {
		fail_fi("opening the provider", ret);
		goto out;
	}
	cache = pd_regcache_new(&err);
	if (!cache || !(dom = pd_domain_attach(cache, domain, &err))) {
		fail_pd("pd_regcache_new / pd_domain_attach", err);
		goto out;
	}

	/* One registration for the whole pool, at the runtime's address for it. */
	if ((err = pd_register_dmabuf_at(dom, fd, 0, 0, (void *)(uintptr_t)base, ALL, &pool_mr))) {
		fail_pd("pd_register_dmabuf_at of the pool", err);
		goto out;
	}
	key = pd_mr_key(pool_mr);
	printf("ok - the 4 GiB pool registered once at %#" PRIx64 " (%s) on %s: path %s, key %#" PRIx64
	       "\n",
	       base, nic ? "a device address, mapped nowhere in the process" : "its CPU mapping",
	       provider, pd_mr_path(pool_mr) == PD_PATH_DMABUF ? "dma_buf" : "other", key);
	if (pd_mr_path(pool_mr) != PD_PATH_DMABUF) {
		printf("FAIL - the pool's registration : not on the dma_buf path\n");
		failed = 1;
		goto out;
	}

	/* Buffers found by address, as HCL's sends find theirs. */
	if ((err = pd_regcache_stats(cache, &before))) {
		fail_pd("pd_regcache_stats", err);
		goto out;
	}
	for (i = 0; i < LOOKUPS; i++) {
		uint64_t len = 1 + next(&state) % (256u << 10);
		uint64_t offset = next(&state) % (POOL - len);
		pd_mr_storage storage;
		pd_mr *mr = lookup(dom, base, key, offset, len, PD_ACCESS_LOCAL_READ, &storage);

		if (!mr)
			goto out;
		pd_mr_release(mr);
	}
	if ((err = pd_regcache_stats(cache, &after))) {
		fail_pd("pd_regcache_stats", err);
		goto out;
	}
	if (after.hits - before.hits != LOOKUPS || after.misses != before.misses ||
	    after.registrations != 1) {
		printf("FAIL - %d lookups : %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
		       " registrations; expected %d hits on the one registration\n",
		       LOOKUPS, after.hits - before.hits, after.misses - before.misses,
		       after.registrations, LOOKUPS);
		failed = 1;
		goto out;
	}
	printf("ok - %d buffers looked up by address (1 B to 256 KiB anywhere in the pool): %d "
	       "cache hits on the one registration, each at its address and offset, its handle "
	       "in the caller's pd_mr_storage\n",
	       LOOKUPS, LOOKUPS);
	err = pd_register_addr(dom, (void *)(uintptr_t)(base + POOL - 8), 16, PD_ACCESS_LOCAL_READ,
			       &none);
	snprintf(past, sizeof(past), "%s", pd_last_error());
	ret = pd_register_addr(dom, &state, sizeof(state), PD_ACCESS_LOCAL_READ, &none);
	/* Bytes that start in the pool are too long for it, not in memory never registered. */
	if (err != -ENOENT || ret != -ENOENT || !strstr(past, "runs past the end of the dma-buf")) {
		printf("FAIL - addresses outside the pool : %s (%s) and %s, expected ENOENT, the "
		       "first running past the pool's end\n",
		       pd_strerror(err), past, pd_strerror((int)ret));
		failed = 1;
		goto out;
	}
	printf("ok - bytes past the pool's end, and an address outside it: ENOENT (%s; %s)\n",
	       past, pd_last_error());
	if (!evicted_pool(domain, alloc, fd, base))
		goto out;

	/*
	 * A tagged send between two buffers of the pool, each found by its address; the flush
	 * word set. On a NIC provider the CPU mapping goes before the bytes move.
	 */
	if (!open_ends(info, domain, &ends))
		goto out;
	for (i = 0; i < (int)MOVED; i++) {
		pool[SRC_OFFSET + i] = pattern(i);
		pool[DST_OFFSET + i] = 0;
	}
	memcpy(pool + FLUSH_OFFSET, &(uint64_t){ FLUSH_WORD }, sizeof(uint64_t));
	memset(pool + READBACK_OFFSET, 0, sizeof(uint64_t));
	src = lookup(dom, base, key, SRC_OFFSET, MOVED, PD_ACCESS_LOCAL_READ, NULL);
	dst = lookup(dom, base, key, DST_OFFSET, MOVED, PD_ACCESS_LOCAL_WRITE, NULL);
	if (!src || !dst)
		goto out;
	if (nic) {
		munmap(pool, POOL);
		pool = MAP_FAILED;
		if (mapped_in_process(base, POOL) != 0 || dmabuf_mapped() != 0) {
			printf("FAIL - the pool is still mapped in the process\n");
			failed = 1;
			goto out;
		}
	}
	if ((ret = fi_trecv(ends.ep[1], (void *)(uintptr_t)(base + DST_OFFSET), MOVED,
			    pd_mr_desc(dst), FI_ADDR_UNSPEC, 0x4c43, 0, NULL))) {
		fail_fi("fi_trecv", ret);
		goto out;
	}
	/* Both sides progress while the send waits: the peer accepts the connection (verbs). */
	while ((ret = fi_tsend(ends.ep[0], (void *)(uintptr_t)(base + SRC_OFFSET), MOVED,
			       pd_mr_desc(src), ends.peer, 0x4c43, NULL)) == -FI_EAGAIN)
		if (!again(&ends))
			goto out;
	if (ret) {
		fail_fi("fi_tsend", ret);
		goto out;
	}
	if (!complete(&ends, 1, 1))
		goto out;
	if (nic) {
		/* Still registered and never mapped since: what the exporter sees. */
		if (pool_importer(POOL, importer, sizeof(importer)) != 1) {
			printf("FAIL - peerdirect's debugfs lists no pinned importer of the pool\n");
			failed = 1;
			goto out;
		}
		pool = map_pool(fd);
		if (pool == MAP_FAILED)
			goto out;
	}
	for (i = 0; i < (int)MOVED; i++) {
		if (pool[DST_OFFSET + i] != pattern(i)) {
			printf("FAIL - the receiving buffer : byte %d is %#x, expected %#x\n", i,
			       pool[DST_OFFSET + i], pattern(i));
			failed = 1;
			goto out;
		}
	}
	printf("# hbm-dst offset=%#" PRIx64 " length=%#x seed=%#" PRIx64 "\n",
	       pd_allocation_hbm_offset(alloc) + DST_OFFSET, MOVED, SEED);
	if (nic)
		printf("ok - %s sent %u bytes from pool + 3 GiB + 12345 to pool + 1 GiB + 777, both "
		       "found by device address, with no address of the pool mapped in the process "
		       "(the NIC moved them: peerdirect's debugfs lists the pool's %s); every "
		       "byte checked\n",
		       provider, MOVED, importer);
	else
		printf("ok - %s sent %u bytes from pool + 3 GiB + 12345 to pool + 1 GiB + 777, both "
		       "found by address; every byte checked\n",
		       provider, MOVED);

	/* The flush buffer: one word a peer reads with RDMA, found by address like the rest. */
	flush = lookup(dom, base, key, FLUSH_OFFSET, sizeof(uint64_t), PD_ACCESS_REMOTE_READ, NULL);
	if (!flush)
		goto out;
	if ((err = pd_mr_remote(flush, 1, &raddr, &rkey)) ||
	    (err = pd_mr_remote(flush, 0, &roffset, &rkey0))) {
		fail_pd("pd_mr_remote of the flush word", err);
		goto out;
	}
	if (raddr != base + FLUSH_OFFSET || roffset != FLUSH_OFFSET || rkey != key || rkey0 != key) {
		printf("FAIL - the flush word's remote address : %#" PRIx64 " or offset %#" PRIx64
		       ", keys %#" PRIx64 " %#" PRIx64 "; expected %#" PRIx64 ", %#" PRIx64
		       ", key %#" PRIx64 "\n",
		       raddr, roffset, rkey, rkey0, base + FLUSH_OFFSET, FLUSH_OFFSET, key);
		failed = 1;
		goto out;
	}
	if (!nic) {
		printf("ok - the one-word flush buffer (pool + 2 GiB + 64) found by address for "
		       "remote reads: a peer's fi_read names it %#" PRIx64 " (virtual) or %#" PRIx64
		       " (offset) with the pool's key\n",
		       raddr, roffset);
		goto out;
	}
	/* HCL's flush: one endpoint reads the word with RDMA, into another word of the pool. */
	readback = lookup(dom, base, key, READBACK_OFFSET, sizeof(uint64_t), PD_ACCESS_LOCAL_WRITE,
			  NULL);
	if (!readback)
		goto out;
	while ((ret = fi_read(ends.ep[0], (void *)(uintptr_t)(base + READBACK_OFFSET),
			      sizeof(uint64_t), pd_mr_desc(readback), ends.peer, raddr, rkey,
			      NULL)) == -FI_EAGAIN)
		if (!again(&ends))
			goto out;
	if (ret) {
		fail_fi("fi_read of the flush word", ret);
		goto out;
	}
	if (!complete(&ends, 1, 0))
		goto out;
	memcpy(&word, pool + READBACK_OFFSET, sizeof(word));
	if (word != FLUSH_WORD) {
		printf("FAIL - the flush word read with fi_read : %#" PRIx64 ", expected %#" PRIx64 "\n",
		       word, FLUSH_WORD);
		failed = 1;
		goto out;
	}
	printf("ok - the one-word flush buffer (pool + 2 GiB + 64) found by address for remote "
	       "reads, named %#" PRIx64 " with the pool's key, read with fi_read into "
	       "pool + 2 GiB + 4096: %#" PRIx64 "\n",
	       raddr, word);

out:
	close_ends(&ends);
	pd_mr_release(readback);
	pd_mr_release(flush);
	pd_mr_release(dst);
	pd_mr_release(src);
	pd_mr_release(pool_mr);
	if (dom && (err = pd_domain_detach(dom)) < 0)
		fail_pd("pd_domain_detach", err);
	pd_regcache_free(cache);
	if (domain)
		fi_close(&domain->fid);
	if (fabric)
		fi_close(&fabric->fid);
	if (info)
		fi_freeinfo(info);
	if (pool != MAP_FAILED)
		munmap(pool, POOL);
	if (fd >= 0)
		close(fd);
	if (alloc)
		pd_allocation_free(alloc);
	pd_device_close(dev);
	return failed;
}

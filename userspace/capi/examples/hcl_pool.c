/*
 * hcl_pool: Habana HCL's registration pattern through the C ABI. HCL exports its whole HBM pool
 * as one dma-buf, registers it once per domain at its own address for the pool
 * (fi_mr_dmabuf.base_addr = the device virtual address), then finds the registration of every
 * buffer it sends from by the buffer's address, and keeps a one-word "flush" buffer that a
 * peer reads with RDMA to order its writes.
 *
 * Here the pool is 4 GiB of /dev/peerdirect0 (pd_alloc, pd_export), registered with
 * pd_register_dmabuf_at at the address of a CPU mapping of it (the tcp provider copies with the
 * CPU, so the runtime's address must be one it can read; a NIC provider takes the device
 * address). The program then:
 *  - looks up 1,000 buffers at random addresses of the pool (pd_register_addr): each is a
 *    cache hit on the one registration, with pd_mr_local() = the address and pd_mr_offset() =
 *    its offset in the pool;
 *  - refuses addresses outside the pool (-ENOENT);
 *  - sends 1 MiB over tcp from a buffer 3 GiB into the pool to one 1 GiB into it, both found by
 *    address, and checks every byte;
 *  - finds the one-word flush buffer by address with remote-read access and checks what a
 *    peer's fi_read would name it by (pd_mr_remote: the pool's key, at its virtual address
 *    or at its offset). The read itself needs a provider that can be the target of RMA on a
 *    dma-buf registration: libfabric 2.1's tcp cannot (Documentation/rdma.md, "RMA"), so it
 *    is not made here.
 * Each step prints "ok - ..." or "FAIL - ... : <why>"; exit status 0 iff all were ok.
 *
 *   cc -o hcl_pool hcl_pool.c $(pkg-config --cflags --libs peerdirect libfabric)
 *   ./hcl_pool    (peerdirect.ko loaded, /dev/peerdirect0 with at least 4 GiB of HBM)
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
#include <rdma/fi_tagged.h>

#define POOL (UINT64_C(4) << 30)
#define LOOKUPS 1000
#define MOVED (1u << 20)
#define SRC_OFFSET ((UINT64_C(3) << 30) + 12345)
#define DST_OFFSET ((UINT64_C(1) << 30) + 777)
#define FLUSH_OFFSET ((UINT64_C(2) << 30) + 64)
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

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)((i * 0x9e3779b97f4a7c15ull) >> 56);
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

/* pd_register_addr, checked against the pool's registration; the handle, or NULL. */
static pd_mr *lookup(pd_domain *dom, uint8_t *pool, uint64_t key, uint64_t offset, uint64_t len,
		     uint32_t access)
{
	void *local;
	uint64_t local_len;
	pd_mr *mr = NULL;
	int err = pd_register_addr(dom, pool + offset, len, access, &mr);

	if (err) {
		fail_pd("pd_register_addr", err);
		return NULL;
	}
	if (pd_mr_key(mr) != key || pd_mr_offset(mr) != offset || pd_mr_local(mr, &local, &local_len) ||
	    local != pool + offset || local_len != len) {
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

int main(void)
{
	struct fi_info *hints, *info = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	struct pd_regcache_stats before, after;
	struct ends ends = { 0 };
	pd_device *dev = NULL;
	pd_allocation *alloc = NULL;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_mr *pool_mr = NULL, *src = NULL, *dst = NULL, *flush = NULL, *none = NULL;
	uint8_t *pool = MAP_FAILED;
	uint64_t state = 0x5eed, key, raddr, rkey, roffset, rkey0;
	int fd = -1, err, i;
	long ret;

	dev = pd_device_open(0, &err);
	if (!dev || (err = pd_alloc(dev, POOL, 0, &alloc)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd))) {
		fail_pd("a 4 GiB pool of /dev/peerdirect0", err);
		goto out;
	}
	pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (pool == MAP_FAILED) {
		printf("FAIL - mmap of the pool : %s\n", strerror(errno));
		failed = 1;
		goto out;
	}

	hints = fi_allocinfo();
	if (!hints)
		return 1;
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode =
		FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	ret = fi_getinfo(FI_VERSION(1, 20), "127.0.0.1", NULL, FI_SOURCE, hints, &info);
	fi_freeinfo(hints);
	if (ret || (ret = fi_fabric(info->fabric_attr, &fabric, NULL)) ||
	    (ret = fi_domain(fabric, info, &domain, NULL))) {
		fail_fi("opening tcp", ret);
		goto out;
	}
	cache = pd_regcache_new(&err);
	if (!cache || !(dom = pd_domain_attach(cache, domain, &err))) {
		fail_pd("pd_regcache_new / pd_domain_attach", err);
		goto out;
	}

	/* One registration for the whole pool, at the runtime's address for it. */
	if ((err = pd_register_dmabuf_at(dom, fd, 0, 0, pool, ALL, &pool_mr))) {
		fail_pd("pd_register_dmabuf_at of the pool", err);
		goto out;
	}
	key = pd_mr_key(pool_mr);
	printf("ok - the 4 GiB pool registered once at %p: path %s, key %#" PRIx64 "\n",
	       (void *)pool, pd_mr_path(pool_mr) == PD_PATH_DMABUF ? "dma_buf" : "other", key);

	/* Buffers found by address, as HCL's sends find theirs. */
	if ((err = pd_regcache_stats(cache, &before))) {
		fail_pd("pd_regcache_stats", err);
		goto out;
	}
	for (i = 0; i < LOOKUPS; i++) {
		uint64_t len = 1 + next(&state) % (256u << 10);
		uint64_t offset = next(&state) % (POOL - len);
		pd_mr *mr = lookup(dom, pool, key, offset, len, PD_ACCESS_LOCAL_READ);

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
	       "cache hits on the one registration, each at its address and offset\n",
	       LOOKUPS, LOOKUPS);
	err = pd_register_addr(dom, pool + POOL - 8, 16, PD_ACCESS_LOCAL_READ, &none);
	ret = pd_register_addr(dom, &state, sizeof(state), PD_ACCESS_LOCAL_READ, &none);
	if (err != -ENOENT || ret != -ENOENT) {
		printf("FAIL - addresses outside the pool : %s and %s, expected ENOENT\n",
		       pd_strerror(err), pd_strerror((int)ret));
		failed = 1;
		goto out;
	}
	printf("ok - bytes past the pool's end, and an address outside it: ENOENT (%s)\n",
	       pd_last_error());

	/* A tagged send between two buffers of the pool, each found by its address. */
	if (!open_ends(info, domain, &ends))
		goto out;
	for (i = 0; i < (int)MOVED; i++) {
		pool[SRC_OFFSET + i] = pattern(i);
		pool[DST_OFFSET + i] = 0;
	}
	src = lookup(dom, pool, key, SRC_OFFSET, MOVED, PD_ACCESS_LOCAL_READ);
	dst = lookup(dom, pool, key, DST_OFFSET, MOVED, PD_ACCESS_LOCAL_WRITE);
	if (!src || !dst)
		goto out;
	if ((ret = fi_trecv(ends.ep[1], pool + DST_OFFSET, MOVED, pd_mr_desc(dst), FI_ADDR_UNSPEC,
			    0x4c43, 0, NULL))) {
		fail_fi("fi_trecv", ret);
		goto out;
	}
	while ((ret = fi_tsend(ends.ep[0], pool + SRC_OFFSET, MOVED, pd_mr_desc(src), ends.peer,
			       0x4c43, NULL)) == -FI_EAGAIN)
		if (reap(ends.cq[0]) < 0)
			goto out;
	if (ret) {
		fail_fi("fi_tsend", ret);
		goto out;
	}
	if (!complete(&ends, 1, 1))
		goto out;
	for (i = 0; i < (int)MOVED; i++) {
		if (pool[DST_OFFSET + i] != pattern(i)) {
			printf("FAIL - the receiving buffer : byte %d is %#x, expected %#x\n", i,
			       pool[DST_OFFSET + i], pattern(i));
			failed = 1;
			goto out;
		}
	}
	printf("ok - tcp sent %u bytes from pool + 3 GiB + 12345 to pool + 1 GiB + 777, both found "
	       "by address; every byte checked\n",
	       MOVED);

	/* The flush buffer: one word a peer reads with RDMA, found by address like the rest. */
	flush = lookup(dom, pool, key, FLUSH_OFFSET, sizeof(uint64_t), PD_ACCESS_REMOTE_READ);
	if (!flush)
		goto out;
	if ((err = pd_mr_remote(flush, 1, &raddr, &rkey)) ||
	    (err = pd_mr_remote(flush, 0, &roffset, &rkey0))) {
		fail_pd("pd_mr_remote of the flush word", err);
		goto out;
	}
	if (raddr != (uint64_t)(uintptr_t)(pool + FLUSH_OFFSET) || roffset != FLUSH_OFFSET ||
	    rkey != key || rkey0 != key) {
		printf("FAIL - the flush word's remote address : %#" PRIx64 " or offset %#" PRIx64
		       ", keys %#" PRIx64 " %#" PRIx64 "; expected %p, %#" PRIx64 ", key %#" PRIx64
		       "\n",
		       raddr, roffset, rkey, rkey0, (void *)(pool + FLUSH_OFFSET), FLUSH_OFFSET, key);
		failed = 1;
		goto out;
	}
	printf("ok - the one-word flush buffer (pool + 2 GiB + 64) found by address for remote "
	       "reads: a peer's fi_read names it %#" PRIx64 " (virtual) or %#" PRIx64
	       " (offset) with the pool's key\n",
	       raddr, roffset);

out:
	close_ends(&ends);
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

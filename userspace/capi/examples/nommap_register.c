/*
 * nommap_register: registering a dma-buf by its fd alone, as a runtime registers device memory
 * whose exporter offers no mmap (habanalabs' dma-bufs of HBM, which HCL registers once for its
 * whole pool with base_addr = its own address for the pool), and a read-only export for
 * reading; then moving data with both over libfabric's tcp provider.
 *
 * The exporter without mmap is tests/kmod/peerdirect_nommap.ko: /dev/peerdirect_nommap makes
 * a buffer and a dma-buf of it (PDNM_EXPORT), and maps the buffer through its own mmap, as a
 * runtime reaches its device memory through its driver. The program checks that the dma-buf
 * itself cannot be mapped and that pd_register_dmabuf (which maps it) fails, then registers it
 * with pd_register_dmabuf_at at the address of the driver's mapping: a direct (dma_buf)
 * registration whose local address is that address; a sub-range is a cache hit (one
 * registration for the pool); tcp moves 1 MiB from the pool's first half into its second
 * half, checked byte by byte; and no mapping of the dma-buf appears in /proc/self/maps. A NULL
 * base address, and the same fd at another base address, are refused with -EINVAL.
 *
 * Then a read-only export of /dev/peerdirect0 (pd_export without PD_EXPORT_RDWR): writable
 * registration with pd_register_dmabuf fails (-EACCES: it maps the dma-buf writable);
 * pd_register_dmabuf_at at the address of a read-only mapping of it registers it for
 * PD_ACCESS_LOCAL_READ, and tcp sends its bytes into the pool, checked there.
 *
 * Each step prints "ok - ..." or "FAIL - ... : <why>"; exit status 0 iff all were ok.
 *
 *   cc -o nommap_register nommap_register.c $(pkg-config --cflags --libs peerdirect libfabric)
 *   ./nommap_register    (peerdirect.ko and peerdirect_nommap.ko loaded, /dev/peerdirect0)
 */
#define _GNU_SOURCE /* strdup */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

/* tests/kmod/peerdirect_nommap.c's request. */
struct pdnm_export {
	uint64_t size;
	int32_t fd;
	uint32_t reserved;
};
#define PDNM_EXPORT _IOWR('N', 1, struct pdnm_export)

#define POOL (4u << 20)
#define HALF (POOL / 2)
#define MOVED (1u << 20)
#define RO_LENGTH (2u << 20)
#define ACCESS_RW (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)

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

static uint8_t pattern(uint64_t seed, uint64_t i)
{
	return (uint8_t)(((i + seed) * 0x9e3779b97f4a7c15ull) >> 56);
}

/* Whether err is -expected (named name); prints the step either way, with pd_last_error(). */
static int refused(const char *what, int err, int expected, const char *name)
{
	if (err != -expected) {
		printf("FAIL - %s : %s, expected %s\n", what, err ? pd_strerror(err) : "registered",
		       name);
		failed = 1;
		return 0;
	}
	printf("ok - %s: %s (%s)\n", what, name, pd_last_error());
	return 1;
}

/* Whether /proc/self/maps maps any dma-buf (its lines name "dmabuf"). */
static int maps_a_dma_buf(void)
{
	char line[512];
	FILE *maps = fopen("/proc/self/maps", "r");
	int found = 0;

	if (!maps)
		return -1;
	while (fgets(line, sizeof(line), maps))
		if (strstr(line, "dmabuf"))
			found = 1;
	fclose(maps);
	return found;
}

/* Two tcp endpoints of one domain: a sender and a receiver, each with its CQ and AV. */
struct ends {
	struct fid_cq *cq[2];
	struct fid_av *av[2];
	struct fid_ep *ep[2];
	fi_addr_t receiver;
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
	if (fi_av_insert(e->av[0], name, 1, &e->receiver, 0, NULL) != 1) {
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

/*
 * One tagged message of len bytes from src (registered, descriptor sdesc) to dst (registered,
 * ddesc), addresses as the registrations name them. 1 iff both sides completed.
 */
static int move(struct ends *e, void *src, void *sdesc, void *dst, void *ddesc, size_t len)
{
	long sent = 0, received = 0, n;
	ssize_t ret;
	int spins = 0;

	if ((ret = fi_trecv(e->ep[1], dst, len, ddesc, FI_ADDR_UNSPEC, 0x6e6d, 0, NULL))) {
		fail_fi("fi_trecv", ret);
		return 0;
	}
	while ((ret = fi_tsend(e->ep[0], src, len, sdesc, e->receiver, 0x6e6d, NULL)) ==
	       -FI_EAGAIN) {
		if (reap(e->cq[0]) < 0 || reap(e->cq[1]) < 0)
			return 0;
	}
	if (ret) {
		fail_fi("fi_tsend", ret);
		return 0;
	}
	while (sent < 1 || received < 1) {
		if ((n = reap(e->cq[0])) < 0)
			return 0;
		sent += n;
		if ((n = reap(e->cq[1])) < 0)
			return 0;
		received += n;
		if (++spins > 20000000) {
			printf("FAIL - the transfer : no completion\n");
			failed = 1;
			return 0;
		}
	}
	return 1;
}

/* Whether len bytes at p hold pattern(seed, ...); prints the first difference. */
static int holds(const uint8_t *p, size_t len, uint64_t seed, const char *what)
{
	size_t i;

	for (i = 0; i < len; i++) {
		if (p[i] != pattern(seed, i)) {
			printf("FAIL - %s : byte %zu is %#x, expected %#x\n", what, i, p[i],
			       pattern(seed, i));
			failed = 1;
			return 0;
		}
	}
	return 1;
}

int main(void)
{
	struct pdnm_export req = { .size = POOL };
	struct fi_info *hints, *info = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	struct pd_regcache_stats stats;
	struct ends ends = { 0 };
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_device *dev = NULL;
	pd_allocation *alloc = NULL;
	pd_mr *pool_mr = NULL, *sub = NULL, *other = NULL, *ro_mr = NULL;
	uint8_t *pool = MAP_FAILED, *ro = MAP_FAILED, *rw = MAP_FAILED;
	void *addr;
	uint64_t length;
	int nm = -1, ro_fd = -1, rw_fd = -1, err;
	long ret;
	size_t i;

	/* The exporter without mmap: its buffer through its own device, the dma-buf apart. */
	nm = open("/dev/peerdirect_nommap", O_RDWR | O_CLOEXEC);
	if (nm < 0 || ioctl(nm, PDNM_EXPORT, &req)) {
		printf("FAIL - /dev/peerdirect_nommap PDNM_EXPORT : %s\n", strerror(errno));
		return 1;
	}
	pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, nm, 0);
	if (pool == MAP_FAILED) {
		printf("FAIL - mmap of /dev/peerdirect_nommap : %s\n", strerror(errno));
		return 1;
	}
	if (mmap(NULL, POOL, PROT_READ, MAP_SHARED, req.fd, 0) != MAP_FAILED || errno != EINVAL) {
		printf("FAIL - mmap of the dma-buf : expected EINVAL (no mmap), got %s\n",
		       strerror(errno));
		return 1;
	}
	printf("ok - a %u-byte dma-buf (fd %d) whose exporter refuses mmap (EINVAL); the pool "
	       "mapped through its own device at %p\n",
	       POOL, req.fd, (void *)pool);

	/* libfabric's tcp domain, opened by the program as a runtime does. */
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

	/* What a mapping library does with it: map the dma-buf, which fails. */
	if (!refused("pd_register_dmabuf, which maps the dma-buf, fails",
		     pd_register_dmabuf(dom, req.fd, 0, 0, ACCESS_RW, &other), EINVAL, "EINVAL"))
		goto out;
	pd_regcache_invalidate_dmabuf(cache, req.fd);
	if (!refused("pd_register_dmabuf_at with base address NULL",
		     pd_register_dmabuf_at(dom, req.fd, 0, 0, NULL, ACCESS_RW, &other), EINVAL,
		     "EINVAL"))
		goto out;
	/* A refusal binds nothing: bytes past the dma-buf's end refused at the pool's address
	 * leave no dma-buf there for a lookup to find. */
	if (!refused("pd_register_dmabuf_at of bytes past the dma-buf's end",
		     pd_register_dmabuf_at(dom, req.fd, POOL, 4096, pool, ACCESS_RW, &other), EINVAL,
		     "EINVAL") ||
	    !refused("then a lookup at that address",
		     pd_register_addr(dom, pool, 4096, ACCESS_RW, &other), ENOENT, "ENOENT"))
		goto out;

	/* HCL's pattern: one registration for the whole pool at the runtime's address. */
	if ((err = pd_register_dmabuf_at(dom, req.fd, 0, 0, pool, ACCESS_RW, &pool_mr))) {
		fail_pd("pd_register_dmabuf_at of the pool", err);
		goto out;
	}
	if (pd_mr_path(pool_mr) != PD_PATH_DMABUF || pd_mr_local(pool_mr, &addr, &length) ||
	    addr != pool || length != POOL) {
		printf("FAIL - the pool's registration : path %u, local %p + %" PRIu64
		       ", expected dma_buf at %p + %u\n",
		       pd_mr_path(pool_mr), addr, length, (void *)pool, POOL);
		failed = 1;
		goto out;
	}
	printf("ok - pd_register_dmabuf_at registered the pool by its fd at %p: path dma_buf, "
	       "key %#" PRIx64 "\n",
	       addr, pd_mr_key(pool_mr));
	if ((err = pd_register_dmabuf_at(dom, req.fd, HALF, MOVED, pool, PD_ACCESS_LOCAL_READ,
					 &sub)) ||
	    (err = pd_regcache_stats(cache, &stats))) {
		fail_pd("pd_register_dmabuf_at of a sub-range", err);
		goto out;
	}
	if (stats.hits != 1 || pd_mr_key(sub) != pd_mr_key(pool_mr)) {
		printf("FAIL - a sub-range : hits %" PRIu64 ", key %#" PRIx64
		       ", expected a hit on key %#" PRIx64 "\n",
		       stats.hits, pd_mr_key(sub), pd_mr_key(pool_mr));
		failed = 1;
		goto out;
	}
	printf("ok - a sub-range of the pool is a cache hit on the same registration\n");
	if (!refused("the same dma-buf at another base address",
		     pd_register_dmabuf_at(dom, req.fd, 0, 0, pool + 4096, ACCESS_RW, &other),
		     EINVAL, "EINVAL"))
		goto out;

	/* tcp moves bytes at the registration's addresses: the pool's first half to its second. */
	if (!open_ends(info, domain, &ends))
		goto out;
	for (i = 0; i < MOVED; i++) {
		pool[i] = pattern(1, i);
		pool[HALF + i] = 0;
	}
	if (!move(&ends, pool, pd_mr_desc(pool_mr), pool + HALF, pd_mr_desc(pool_mr), MOVED) ||
	    !holds(pool + HALF, MOVED, 1, "the pool's second half"))
		goto out;
	printf("ok - tcp moved %u bytes from the pool's first half to its second through the "
	       "registration, every byte checked\n",
	       MOVED);
	if (maps_a_dma_buf() != 0) {
		printf("FAIL - /proc/self/maps : a dma-buf is mapped\n");
		failed = 1;
		goto out;
	}
	printf("ok - /proc/self/maps maps no dma-buf: the library never mapped it\n");

	/* A read-only export of peerdirect's HBM, registered for reading. */
	dev = pd_device_open(0, &err);
	if (!dev || (err = pd_alloc(dev, RO_LENGTH, 0, &alloc)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &rw_fd)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC, &ro_fd))) {
		fail_pd("an HBM allocation and its exports", err);
		goto out;
	}
	rw = mmap(NULL, RO_LENGTH, PROT_READ | PROT_WRITE, MAP_SHARED, rw_fd, 0);
	ro = mmap(NULL, RO_LENGTH, PROT_READ, MAP_SHARED, ro_fd, 0);
	if (rw == MAP_FAILED || ro == MAP_FAILED) {
		printf("FAIL - mapping the exports : %s\n", strerror(errno));
		failed = 1;
		goto out;
	}
	for (i = 0; i < MOVED; i++)
		rw[i] = pattern(2, i);
	if (!refused("pd_register_dmabuf of a read-only export (it maps writable)",
		     pd_register_dmabuf(dom, ro_fd, 0, 0, PD_ACCESS_LOCAL_READ, &other), EACCES,
		     "EACCES"))
		goto out;
	pd_regcache_invalidate_dmabuf(cache, ro_fd);
	if ((err = pd_register_dmabuf_at(dom, ro_fd, 0, 0, ro, PD_ACCESS_LOCAL_READ, &ro_mr))) {
		fail_pd("pd_register_dmabuf_at of a read-only export", err);
		goto out;
	}
	memset(pool + HALF, 0, MOVED);
	if (!move(&ends, ro, pd_mr_desc(ro_mr), pool + HALF, pd_mr_desc(pool_mr), MOVED) ||
	    !holds(pool + HALF, MOVED, 2, "the bytes sent from the read-only export"))
		goto out;
	printf("ok - a read-only export registered for reading at its read-only mapping; tcp sent "
	       "%u bytes of HBM from it into the pool, every byte checked\n",
	       MOVED);

out:
	close_ends(&ends);
	pd_mr_release(ro_mr);
	pd_mr_release(sub);
	pd_mr_release(pool_mr);
	pd_mr_release(other);
	if (dom && (err = pd_domain_detach(dom)) < 0)
		fail_pd("pd_domain_detach", err);
	pd_regcache_free(cache);
	if (domain)
		fi_close(&domain->fid);
	if (fabric)
		fi_close(&fabric->fid);
	if (info)
		fi_freeinfo(info);
	if (ro != MAP_FAILED)
		munmap(ro, RO_LENGTH);
	if (rw != MAP_FAILED)
		munmap(rw, RO_LENGTH);
	if (ro_fd >= 0)
		close(ro_fd);
	if (rw_fd >= 0)
		close(rw_fd);
	if (alloc)
		pd_allocation_free(alloc);
	pd_device_close(dev);
	munmap(pool, POOL);
	close(req.fd);
	close(nm);
	return failed;
}

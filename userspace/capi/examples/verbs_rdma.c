/*
 * verbs_rdma: HCL's ibverbs path through the C ABI. A runtime that owns its protection
 * domain and its RC queue pairs registers HBM once, at its own device virtual address
 * (pd_register_dmabuf_at on a pd_domain_attach_verbs domain), finds buffers in it by that
 * address (pd_register_addr), and moves bytes with its own work requests naming HBM by device
 * VA: remote_addr = the device VA of the target byte, as a peer computes it; ibv_sge.addr =
 * the device VA of the local byte. So the registration's IOVA must be that address
 * (base_addr + offset in the dma-buf); an MR at any other IOVA does not cover it and the NIC
 * answers a remote access error (or a local protection error for the local side).
 *
 * On an RDMA device whose driver imports dma-bufs (here rxe0 with the test kernel's patched
 * rxe and the patched provider: qemu/run --rxe-dmabuf; a NIC with EFA, mlx5 or irdma): two
 * RC queue pairs of the device connected to each other (one device, looped back inside it),
 * 8 MiB of HBM allocated (after 2 MiB of another allocation, so that its offset in HBM is not
 * its offset in the pool) and exported twice: one dma-buf registered at device VA DEVICE_VA,
 * the other mapped by the program to watch HBM (zeroed first). Then
 *   - pd_mr_remote and pd_mr_local of a 1 MiB buffer at pool + OFF_A must give DEVICE_VA +
 *     OFF_A, and the pool's rkey;
 *   - an RDMA WRITE of host memory holding the pattern into HBM at DEVICE_VA + OFF_A,
 *   - an RDMA READ of HBM at DEVICE_VA + OFF_A into zeroed host memory,
 *   - an RDMA WRITE from HBM at DEVICE_VA + OFF_A (the local side: pd_mr_lkey and the device
 *     VA) into HBM at DEVICE_VA + OFF_B,
 * each completing, with the bytes checked through the mapping: the pattern at both buffers,
 * zeros everywhere else in the 8 MiB. The program prints where the buffers are in HBM
 * (hbm_offset) for the host to find the pattern in the HBM backing file (tests/hbm-pattern).
 * Last, everything is released and ibv_dealloc_pd of the program's domain must succeed.
 *
 * The pattern is that of peerdirect::pattern (tests/hbm-pattern): byte o is byte o % 8, little
 * endian, of output o / 8 of SplitMix64 seeded with SEED.
 *
 * Each step prints "ok - ..." or "FAIL - ... : <why>"; exit status 0 iff all were ok.
 *
 *   cc -o verbs_rdma verbs_rdma.c $(pkg-config --cflags --libs peerdirect libibverbs)
 *   ./verbs_rdma [DEVICE [GID_INDEX]]    (default rxe0 1: rxe0's IPv4 GID)
 */
#define _GNU_SOURCE /* posix_memalign, usleep, clock_gettime */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <peerdirect.h>

#define POOL (8u << 20)
#define LEN (1u << 20)
/* Two buffers of the pool, at offsets that are page aligned but not 2 MiB aligned. */
#define OFF_A ((1u << 20) + 5 * 4096u)
#define OFF_B ((5u << 20) + 3 * 4096u)
/* A device virtual address of the runtime's, 1 GiB aligned as its allocator hands them out. */
#define DEVICE_VA UINT64_C(0x100040000000)
#define SEED UINT64_C(0x5eed0007)
#define ACCESS (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ | \
		PD_ACCESS_REMOTE_WRITE)
#define IBV_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

static int failed;

static void fail_pd(const char *what, int err)
{
	printf("FAIL - %s : %s (%s)\n", what, pd_strerror(err), pd_last_error());
	failed = 1;
}

/* Byte o of the pattern with SEED. */
static uint8_t pattern_byte(uint64_t o)
{
	uint64_t z = SEED + (o / 8 + 1) * UINT64_C(0x9e3779b97f4a7c15);

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	z ^= z >> 31;
	return (uint8_t)(z >> (8 * (o % 8)));
}

/* The first byte of buf[0..len) that is not the pattern's, or -1. */
static long not_pattern(const volatile uint8_t *buf, uint64_t len)
{
	for (uint64_t o = 0; o < len; o++)
		if (buf[o] != pattern_byte(o))
			return (long)o;
	return -1;
}

/* The first byte of buf[from..to) that is not zero, or -1. */
static long not_zero(const volatile uint8_t *buf, uint64_t from, uint64_t to)
{
	for (uint64_t o = from; o < to; o++)
		if (buf[o])
			return (long)o;
	return -1;
}

struct pair {
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
};

/* Two RC queue pairs of ctx connected to each other through the device's own GID gid_index. */
static int connect_pair(struct ibv_context *ctx, struct ibv_pd *pd, int gid_index, struct pair *p)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	union ibv_gid gid;
	int i;

	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		return -errno;
	p->cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!p->cq)
		return -errno;
	init.send_cq = init.recv_cq = p->cq;
	for (i = 0; i < 2; i++) {
		p->qp[i] = ibv_create_qp(pd, &init);
		if (!p->qp[i])
			return -errno;
	}
	for (i = 0; i < 2; i++) {
		struct ibv_qp_attr a;

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS;
		if (ibv_modify_qp(p->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
			return -errno;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = p->qp[!i]->qp_num;
		a.max_dest_rd_atomic = 4;
		a.min_rnr_timer = 12;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
		a.ah_attr.grh.hop_limit = 1;
		a.ah_attr.port_num = 1;
		if (ibv_modify_qp(p->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
			return -errno;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 4;
		if (ibv_modify_qp(p->qp[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
			return -errno;
	}
	return 0;
}

static void destroy_pair(struct pair *p)
{
	int i;

	for (i = 0; i < 2; i++)
		if (p->qp[i])
			ibv_destroy_qp(p->qp[i]);
	if (p->cq)
		ibv_destroy_cq(p->cq);
}

/*
 * Posts one RDMA opcode on the pair's first queue pair: len bytes between laddr (lkey) and
 * raddr (rkey); waits up to 60 s for its completion. The work completion's status, or a
 * negative errno; *secs the time it took.
 */
static int rdma(struct pair *p, enum ibv_wr_opcode opcode, uint64_t laddr, uint32_t lkey,
		uint64_t raddr, uint32_t rkey, uint32_t len, double *secs)
{
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;
	struct timespec t0, t1;
	struct ibv_wc wc;
	int n;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = opcode;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ibv_post_send(p->qp[0], &wr, &bad))
		return -errno;
	for (;;) {
		n = ibv_poll_cq(p->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		*secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
		if (n)
			return (int)wc.status;
		if (*secs > 60)
			return -ETIMEDOUT;
		usleep(1000);
	}
}

static const char *status_str(int s)
{
	return s < 0 ? strerror(-s) : ibv_wc_status_str((enum ibv_wc_status)s);
}

/*
 * Checks one transfer's completion: ok iff IBV_WC_SUCCESS; prints the step and its time. An
 * error completion moves the queue pairs to the error state, so they are made anew for the
 * next transfer, which then fails or succeeds on its own.
 */
static int completed(const char *what, int s, double secs, struct ibv_context *ctx,
		     struct ibv_pd *pd, int gid_index, struct pair *p)
{
	int err;

	if (s != IBV_WC_SUCCESS) {
		printf("FAIL - %s : %s\n", what, status_str(s));
		failed = 1;
		destroy_pair(p);
		memset(p, 0, sizeof(*p));
		err = connect_pair(ctx, pd, gid_index, p);
		if (err)
			printf("FAIL - queue pairs made anew : %s\n", strerror(-err));
		return 0;
	}
	printf("ok - %s completes (%.3f s)\n", what, secs);
	return 1;
}

/* Checks that hbm[off..off + LEN) holds the pattern: prints the step. */
static void holds_pattern(const char *what, const volatile uint8_t *hbm, uint64_t off)
{
	long bad = not_pattern(hbm + off, LEN);

	if (bad >= 0) {
		printf("FAIL - %s : byte %ld is %#x, the pattern's is %#x\n", what, bad,
		       hbm[off + (uint64_t)bad], pattern_byte((uint64_t)bad));
		failed = 1;
		return;
	}
	printf("ok - %s\n", what);
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "rxe0";
	int gid_index = argc > 2 ? atoi(argv[2]) : 1;
	struct ibv_device **list;
	struct ibv_context *context = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_mr *host_mr = NULL;
	struct pair p;
	struct pd_regcache_stats stats;
	pd_device *dev = NULL;
	pd_allocation *filler = NULL, *alloc = NULL;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_mr *pool = NULL, *buf_a = NULL, *buf_b = NULL;
	volatile uint8_t *hbm = MAP_FAILED;
	uint8_t *host = NULL;
	void *local;
	uint64_t hbm_offset, remote_a, rkey_a, remote_b, rkey_b, length;
	uint64_t va_a = DEVICE_VA + OFF_A, va_b = DEVICE_VA + OFF_B;
	double secs;
	long bad;
	int fd_reg = -1, fd_map = -1, n, i, err, s;

	memset(&p, 0, sizeof(p));
	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			context = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!context) {
		printf("FAIL - open RDMA device %s\n", name);
		return 1;
	}
	pd = ibv_alloc_pd(context);
	err = pd ? connect_pair(context, pd, gid_index, &p) : -errno;
	if (err) {
		printf("FAIL - %s: a protection domain and two RC queue pairs connected to each other (GID %d) : %s\n",
		       name, gid_index, strerror(-err));
		failed = 1;
		goto out;
	}
	printf("ok - %s: the program's protection domain and two RC queue pairs connected to each other\n",
	       name);

	dev = pd_device_open(0, &err);
	if (!dev || (err = pd_alloc(dev, 2u << 20, 0, &filler)) ||
	    (err = pd_alloc(dev, POOL, 0, &alloc)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd_reg)) ||
	    (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd_map))) {
		fail_pd("2 MiB of HBM allocated, then 8 MiB allocated and exported twice", err);
		goto out;
	}
	hbm = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, fd_map, 0);
	if (hbm == MAP_FAILED) {
		printf("FAIL - mmap of the second export : %s\n", strerror(errno));
		failed = 1;
		goto out;
	}
	memset((void *)hbm, 0, POOL);
	hbm_offset = pd_allocation_hbm_offset(alloc);
	printf("ok - 8 MiB of HBM at hbm_offset %#" PRIx64
	       " exported twice, the second mapped and zeroed\n", hbm_offset);

	cache = pd_regcache_new(&err);
	dom = cache ? pd_domain_attach_verbs(cache, pd, &err) : NULL;
	if (!dom) {
		fail_pd("pd_domain_attach_verbs of the program's protection domain", err);
		goto out;
	}
	err = pd_register_dmabuf_at(dom, fd_reg, 0, 0, (void *)(uintptr_t)DEVICE_VA, ACCESS, &pool);
	if (err) {
		fail_pd("pd_register_dmabuf_at of the pool at its device VA", err);
		goto out;
	}
	printf("ok - the pool registered once with pd_register_dmabuf_at at device VA %#" PRIx64
	       ": rkey %#" PRIx64 ", path %s\n", DEVICE_VA, pd_mr_key(pool),
	       pd_mr_path(pool) == PD_PATH_DMABUF ? "dma_buf" : "not dma_buf");

	if ((err = pd_register_addr(dom, (void *)(uintptr_t)va_a, LEN, ACCESS, &buf_a)) ||
	    (err = pd_register_addr(dom, (void *)(uintptr_t)va_b, LEN, ACCESS, &buf_b)) ||
	    (err = pd_regcache_stats(cache, &stats))) {
		fail_pd("pd_register_addr of two buffers in the pool by device VA", err);
		goto out;
	}
	if (stats.registrations != 1 || stats.hits != 2 || pd_mr_offset(buf_a) != OFF_A ||
	    pd_mr_offset(buf_b) != OFF_B) {
		printf("FAIL - two buffers found by device VA : registrations %" PRIu64 ", hits %" PRIu64
		       ", offsets %#" PRIx64 " and %#" PRIx64 "\n", stats.registrations, stats.hits,
		       pd_mr_offset(buf_a), pd_mr_offset(buf_b));
		failed = 1;
	} else {
		printf("ok - buffers at pool + %#x and + %#x found by device VA (pd_register_addr): cache hits on the pool's one registration\n",
		       OFF_A, OFF_B);
	}

	/* The addresses a runtime and its peers use: the device VA of each byte. */
	if ((err = pd_mr_remote(buf_a, 1, &remote_a, &rkey_a)) ||
	    (err = pd_mr_remote(buf_b, 1, &remote_b, &rkey_b)) ||
	    (err = pd_mr_local(buf_a, &local, &length))) {
		fail_pd("pd_mr_remote and pd_mr_local of the buffers", err);
		goto out;
	}
	if (remote_a != va_a || remote_b != va_b || (uintptr_t)local != va_a || length != LEN ||
	    rkey_a != pd_mr_key(pool) || rkey_b != pd_mr_key(pool)) {
		printf("FAIL - pd_mr_remote and pd_mr_local name the buffers by their device VAs %#" PRIx64
		       " and %#" PRIx64 " : remote_addr %#" PRIx64 " and %#" PRIx64 ", local %p (%" PRIu64
		       " bytes), rkeys %#" PRIx64 " and %#" PRIx64 " (the pool's %#" PRIx64 ")\n",
		       va_a, va_b, remote_a, remote_b, local, length, rkey_a, rkey_b, pd_mr_key(pool));
		failed = 1;
	} else {
		printf("ok - pd_mr_remote and pd_mr_local give the buffers' device VAs %#" PRIx64
		       " and %#" PRIx64 " (the pool's + %#x, + %#x) and the pool's rkey\n", va_a, va_b,
		       OFF_A, OFF_B);
	}

	if (posix_memalign((void **)&host, 4096, 2 * LEN) ||
	    !(host_mr = ibv_reg_mr(pd, host, 2 * LEN, IBV_ACCESS))) {
		printf("FAIL - 2 MiB of host memory registered with ibv_reg_mr : %s\n", strerror(errno));
		failed = 1;
		goto out;
	}
	for (i = 0; i < (int)LEN; i++)
		host[i] = pattern_byte((uint64_t)i);
	memset(host + LEN, 0, LEN);

	/*
	 * Host memory into HBM at the device VA the runtime computes (checked above to be what
	 * pd_mr_remote says), with pd_mr_remote's rkey.
	 */
	s = rdma(&p, IBV_WR_RDMA_WRITE, (uintptr_t)host, host_mr->lkey, va_a, (uint32_t)rkey_a, LEN,
		 &secs);
	if (completed("RDMA WRITE of 1 MiB of host memory into HBM at device VA pool + OFF_A", s, secs,
		      context, pd, gid_index, &p))
		holds_pattern("HBM at pool + OFF_A holds the pattern (read through the second export's mapping)",
			      hbm, OFF_A);

	s = rdma(&p, IBV_WR_RDMA_READ, (uintptr_t)host + LEN, host_mr->lkey, va_a, (uint32_t)rkey_a,
		 LEN, &secs);
	if (completed("RDMA READ of 1 MiB of HBM at device VA pool + OFF_A into host memory", s, secs,
		      context, pd, gid_index, &p)) {
		bad = not_pattern(host + LEN, LEN);
		if (bad >= 0) {
			printf("FAIL - the host memory read into holds the pattern : byte %ld is %#x\n",
			       bad, host[LEN + (uint64_t)bad]);
			failed = 1;
		} else {
			printf("ok - the host memory read into holds the pattern\n");
		}
	}

	/* HBM as the local side too: ibv_sge.addr is the device VA, with pd_mr_lkey. */
	s = rdma(&p, IBV_WR_RDMA_WRITE, va_a, pd_mr_lkey(buf_a), va_b, (uint32_t)rkey_b, LEN, &secs);
	if (completed("RDMA WRITE of 1 MiB from HBM at device VA pool + OFF_A (pd_mr_lkey) into HBM at pool + OFF_B",
		      s, secs, context, pd, gid_index, &p))
		holds_pattern("HBM at pool + OFF_B holds the pattern", hbm, OFF_B);

	bad = not_zero(hbm, 0, OFF_A);
	if (bad < 0)
		bad = not_zero(hbm, OFF_A + LEN, OFF_B);
	if (bad < 0)
		bad = not_zero(hbm, OFF_B + LEN, POOL);
	if (bad >= 0) {
		printf("FAIL - the rest of the pool is still zero : byte %ld is %#x\n", bad, hbm[bad]);
		failed = 1;
	} else {
		printf("ok - the rest of the pool is still zero\n");
	}
	printf("hbm: pattern %#" PRIx64 " of %u bytes at hbm_offset %#" PRIx64 " and %#" PRIx64 "\n",
	       SEED, LEN, hbm_offset + OFF_A, hbm_offset + OFF_B);

out:
	pd_mr_release(buf_a);
	pd_mr_release(buf_b);
	pd_mr_release(pool);
	err = pd_domain_detach(dom);
	pd_regcache_free(cache);
	if (err < 0)
		fail_pd("pd_domain_detach", err);
	if (host_mr)
		ibv_dereg_mr(host_mr);
	free(host);
	destroy_pair(&p);
	if (hbm != MAP_FAILED)
		munmap((void *)hbm, POOL);
	if (fd_map >= 0)
		close(fd_map);
	if (fd_reg >= 0)
		close(fd_reg);
	pd_allocation_free(alloc);
	pd_allocation_free(filler);
	pd_device_close(dev);
	if (pd && (err = ibv_dealloc_pd(pd))) {
		printf("FAIL - ibv_dealloc_pd of the program's domain : %s\n", strerror(err));
		failed = 1;
	} else if (pd) {
		printf("ok - released: ibv_dealloc_pd of the program's domain succeeds\n");
	}
	ibv_close_device(context);
	return failed;
}

// SPDX-License-Identifier: GPL-2.0
/*
 * HBM through ibv_reg_dmabuf_mr and rxe's data path, for tests/system/rxe-dmabuf.sh; built in
 * the guests' trixie userland (gcc, libibverbs) and run in the guest, printing TAP.
 *
 *   rxe_dmabuf refused DIR WHO ibv_reg_dmabuf_mr of a peerdirect dma-buf on rxe0 fails with
 *                              EOPNOTSUPP (Debian's provider, which has no reg_dmabuf_mr;
 *                              Debian's stock kernel, whose rxe has no reg_user_mr_dmabuf);
 *                              WHO names the refuser in the test's description
 *   rxe_dmabuf transfer DIR PCI [dynamic]
 *                              on the test kernel's patched rxe: three 4 MiB ranges of HBM
 *                              (A, B, C) exported and registered, rxe's import of A listed
 *                              in peerdirect's debugfs as pinned (with dynamic, after
 *                              rdma_rxe.dmabuf_dynamic=1: as dynamic, not pinned, its ranges
 *                              past the first run's); an RDMA WRITE of A into B
 *                              and an RDMA READ of A into C between two RC queue pairs of
 *                              rxe0 (one rxe device, looped back inside it); B registered
 *                              again with remote atomic access, and an atomic into it ends
 *                              in a remote access error (one into host memory completes);
 *                              then the HBM
 *                              device (PCI address PCI) unbound while they are registered:
 *                              it returns, and copies into and out of the revoked HBM fail
 *                              with error completions
 *   rxe_dmabuf race PCI ROUNDS [dynamic]
 *                              revocation during transfers: per round, the HBM device (PCI
 *                              address PCI) bound, two 4 MiB ranges exported and registered,
 *                              a thread streaming 64 KiB RDMA WRITEs (odd rounds: READs)
 *                              between them, and the device unbound a few milliseconds in:
 *                              the unbind returns, the stream ends in an error completion,
 *                              every posted request completes, the MRs deregister (with
 *                              dynamic, rxe importing dynamically)
 *   rxe_dmabuf peer PCI NODE PEER-IP [lose-nak]
 *                              two hosts: this guest (node NODE, 0 or 1) and the peer guest
 *                              at PEER-IP, their NICs linked, rxe0 on each; node 0 listens
 *                              on TCP port 18515 for node 1, and they exchange their QP
 *                              numbers, GIDs and where their ranges are. Each exports three
 *                              4 MiB ranges of its HBM (A: its pattern, seed 0x5eed0000 +
 *                              NODE; B, C zeroed), registers them with ibv_reg_dmabuf_mr,
 *                              RDMA WRITEs its A into the peer's B and RDMA READs the peer's
 *                              A into its C; each checks B and C hold the peer's pattern,
 *                              and prints "# hbm-a|b|c offset=O length=L seed=S" lines for
 *                              the host to check its HBM backing file (tests/hbm-pattern).
 *                              Then node 1 streams RDMA READs out of node 0's A and node 0
 *                              unbinds its HBM device (PCI address PCI) in the middle: the
 *                              unbind returns, the stream ends in an error completion
 *                              (with lose-nak, node 1 creates /mnt/host/lose-naks for the
 *                              stream's length, which has tests/lossy-link drop node 0's
 *                              NAKs on the link: the stream must end in retries exceeded,
 *                              not a stall)
 *
 * DIR (the shared folder) receives `offsets` (`offsets-dynamic`): the HBM offsets of A, B and C
 * and the pattern's seed, for the host to check in the HBM backing file.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "peerdirect.h"

#define LEN (4u << 20)
#define SEED 0x5eed1234u

static int tap_n;
/* Before every description: "dynamic import: " in the runs that import dynamically. */
static const char *kind = "";

static void ok(int good, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ok(int good, const char *fmt, ...)
{
	va_list ap;

	printf("%sok %d - %s", good ? "" : "not ", ++tap_n, kind);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static void diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void diag(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* The pattern, word by word: what the host recomputes (tests/system/rxe-dmabuf.sh). */
static uint32_t pattern(uint32_t seed, uint32_t i)
{
	uint32_t x = seed ^ (i * 0x9e3779b1u);

	x ^= x >> 16;
	x *= 0x85ebca6bu;
	x ^= x >> 13;
	return x;
}

struct range {
	uint32_t handle;
	uint64_t hbm_offset;
	int fd;
	uint32_t *map;
};

static int export_range(int dev, struct range *r)
{
	struct peerdirect_alloc a = { .size = sizeof(a), .length = LEN };
	struct peerdirect_export e = { .size = sizeof(e), .flags = PEERDIRECT_EXPORT_RDWR };

	if (ioctl(dev, PEERDIRECT_IOC_ALLOC, &a))
		return -errno;
	e.handle = a.handle;
	if (ioctl(dev, PEERDIRECT_IOC_EXPORT, &e))
		return -errno;
	r->handle = a.handle;
	r->hbm_offset = a.hbm_offset;
	r->fd = e.fd;
	r->map = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, e.fd, 0);
	return r->map == MAP_FAILED ? -errno : 0;
}

static struct ibv_context *open_rxe0(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "rxe0"))
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	return ctx;
}

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
/* An arbitrary I/O virtual address for each registration, as HCL picks its own. */
#define IOVA(i) (0x7f0000000000ull + (uint64_t)(i) * 0x10000000ull)

static int refused(const char *who)
{
	struct ibv_context *ctx = open_rxe0();
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct range r;
	struct ibv_mr *mr;
	int dev, err = 0;

	printf("1..1\n");
	dev = open("/dev/peerdirect0", O_RDWR);
	if (dev < 0 || !pd || (err = export_range(dev, &r))) {
		ok(0, "a peerdirect export and rxe0's PD for ibv_reg_dmabuf_mr");
		return 1;
	}
	errno = 0;
	mr = ibv_reg_dmabuf_mr(pd, 0, LEN, IOVA(0), r.fd, ACCESS);
	err = mr ? 0 : errno;
	ok(!mr && err == EOPNOTSUPP,
	   "%s: ibv_reg_dmabuf_mr of a peerdirect dma-buf on rxe0 fails with EOPNOTSUPP", who);
	diag("ibv_reg_dmabuf_mr: %s", mr ? "success" : strerror(err));
	return mr || err != EOPNOTSUPP;
}

struct pair {
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
};

static int to_state(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	return ibv_modify_qp(qp, attr, mask);
}

/* @qp from RESET to INIT on port 1, allowing remote @access. */
static int to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = access,
	};

	return to_state(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			IBV_QP_ACCESS_FLAGS);
}

/*
 * @qp from INIT to RTS, connected to queue pair @dest_qpn at @dgid through this port's GID
 * @gid_index (both packet sequences from 0).
 */
static int to_rts(struct ibv_qp *qp, uint32_t dest_qpn, const uint8_t dgid[16], int gid_index)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest_qpn,
		.max_dest_rd_atomic = 4,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .sgid_index = gid_index, .hop_limit = 64 } },
	};

	memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	if (to_state(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -errno;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	/*
	 * rxe retries forever at a retry count of 7 (rxe_comp.c), where the spec's transport
	 * retry count is a count: a responder that NAKed and moved to the error state, its NAK
	 * lost on the link (the two hosts' link drops packets under load), would leave the
	 * requester retrying into silence. 6 ends that in an error completion (retries
	 * exceeded) after 7 timeouts without progress. Each timeout is 268 ms (16), so that a
	 * transfer which must succeed gives up only after about 2 s without a response, not
	 * 0.5 s (14): under TCG, and KASAN, a responder can be that slow.
	 */
	a.timeout = 16;
	a.retry_cnt = 6;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (to_state(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		return -errno;
	return 0;
}

/*
 * Two RC queue pairs of @ctx connected to each other through rxe0's own GID @gid_index,
 * allowing remote @access.
 */
static int connect_pair(struct ibv_context *ctx, struct ibv_pd *pd, struct pair *p, int gid_index,
			int access)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	union ibv_gid gid;
	int err;

	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		return -errno;
	p->cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	if (!p->cq)
		return -errno;
	init.send_cq = init.recv_cq = p->cq;
	for (int i = 0; i < 2; i++) {
		p->qp[i] = ibv_create_qp(pd, &init);
		if (!p->qp[i] || to_init(p->qp[i], access))
			return -errno;
	}
	for (int i = 0; i < 2; i++) {
		err = to_rts(p->qp[i], p->qp[!i]->qp_num, gid.raw, gid_index);
		if (err)
			return err;
	}
	return 0;
}

/* Posts one RDMA @opcode on @qp and waits (up to 60 s) for its completion; its status. */
static int rdma(struct pair *p, enum ibv_wr_opcode opcode, struct ibv_mr *local, uint64_t laddr,
		uint32_t rkey, uint64_t raddr, uint32_t len, double *secs)
{
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = local->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;
	struct timespec t0, t1;
	struct ibv_wc wc;
	int n;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (ibv_post_send(p->qp[0], &wr, &bad))
		return -errno;
	for (;;) {
		n = ibv_poll_cq(p->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		*secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
		if (n)
			return wc.status;
		if (*secs > 60)
			return -ETIMEDOUT;
		usleep(1000);
	}
}

/*
 * Posts an 8-byte atomic fetch-and-add of @add at @raddr of @remote on @qp, the old value
 * landing at @laddr of @local, and waits (up to 60 s) for its completion; its status.
 */
static int atomic_add(struct pair *p, struct ibv_mr *local, uint64_t laddr, struct ibv_mr *remote,
		      uint64_t raddr, uint64_t add)
{
	struct ibv_sge sge = { .addr = laddr, .length = 8, .lkey = local->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = raddr, .compare_add = add, .rkey = remote->rkey },
	}, *bad;
	struct ibv_wc wc;
	int n;

	if (ibv_post_send(p->qp[0], &wr, &bad))
		return -errno;
	for (int ms = 0; ms < 60000; ms++) {
		n = ibv_poll_cq(p->cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n)
			return wc.status;
		usleep(1000);
	}
	return -ETIMEDOUT;
}

static const char *status_str(int s)
{
	return s < 0 ? strerror(-s) : ibv_wc_status_str(s);
}

/* The first word of @got that differs from the pattern, or -1. */
static long mismatch(const uint32_t *got)
{
	for (uint32_t i = 0; i < LEN / 4; i++)
		if (got[i] != pattern(SEED, i))
			return i;
	return -1;
}

static int open_bound(const char *pci);
static int sysfs_write(const char *path, const char *what);

/*
 * Tells the patched rxe how to import the dma-bufs registered from now on (qemu/patches/0006):
 * dynamically, or pinned and revocable; 0 or -errno.
 */
static int import_dynamically(int dynamic)
{
	kind = dynamic ? "dynamic import: " : "";
	return sysfs_write("/sys/module/rdma_rxe/parameters/dmabuf_dynamic", dynamic ? "1" : "0");
}

/*
 * The importer line peerdirect's debugfs lists under the export of @r (its allocation's HBM
 * offset and LEN), into @line; 0, or -ENOENT if the export or its importer is not listed.
 */
static int importer_of(const struct range *r, char *line, size_t size)
{
	char want[96], buf[512];
	int found = 0, err = -ENOENT;
	FILE *f = fopen("/sys/kernel/debug/peerdirect/peerdirect0/exports", "r");

	if (!f)
		return -errno;
	snprintf(want, sizeof(want), " offset=0x%llx length=0x%x\n", (unsigned long long)r->hbm_offset, LEN);
	while (fgets(buf, sizeof(buf), f)) {
		size_t n = strlen(buf), w = strlen(want);

		if (found) {
			if (!strncmp(buf, "  importer=", 11)) {
				buf[strcspn(buf, "\n")] = 0;
				snprintf(line, size, "%s", buf + 2);
				err = 0;
			}
			break;
		}
		found = !strncmp(buf, "handle=", 7) && n >= w && !strcmp(buf + n - w, want);
	}
	fclose(f);
	return err;
}

static int transfer(const char *dir, const char *pci, int dynamic)
{
	struct ibv_context *ctx = open_rxe0();
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct range r[3];
	struct ibv_mr *mr[3] = { 0 }, *host_mr, *atomic, *words_mr;
	struct pair p, q, a;
	uint64_t *words;
	char path[512];
	uint32_t *host;
	double secs;
	long bad;
	int dev, err, s, failed = 0;
	FILE *f;

	/*
	 * Plan: set-up (1), registration (2), the import's kind (1), write (2), read (2),
	 * atomics (1), revocation (4).
	 */
	printf("1..13\n");
	err = import_dynamically(dynamic);
	dev = err ? -1 : open_bound(pci);
	if (!err && dev < 0)
		err = dev;
	/*
	 * Dynamic: past the three ranges the first (pinned) transfer left for the host to check
	 * (the allocator starts again at the bottom after a rebind).
	 */
	if (!err && dynamic) {
		struct peerdirect_alloc pad = { .size = sizeof(pad), .length = 3 * LEN };

		err = ioctl(dev, PEERDIRECT_IOC_ALLOC, &pad) ? -errno : 0;
	}
	for (int i = 0; i < 3 && !err; i++)
		err = export_range(dev, &r[i]);
	if (!err && !pd)
		err = -ENODEV;
	if (!err) {
		/* A: the pattern; B and C: zeros, all written through the dma-bufs' mappings. */
		for (uint32_t i = 0; i < LEN / 4; i++)
			r[0].map[i] = pattern(SEED, i);
		memset(r[1].map, 0, LEN);
		memset(r[2].map, 0, LEN);
		snprintf(path, sizeof(path), "%s/offsets%s", dir, dynamic ? "-dynamic" : "");
		f = fopen(path, "w");
		if (!f)
			err = -errno;
		else {
			fprintf(f, "%llu %llu %llu %u %u\n", (unsigned long long)r[0].hbm_offset,
				(unsigned long long)r[1].hbm_offset,
				(unsigned long long)r[2].hbm_offset, SEED, LEN);
			fclose(f);
		}
	}
	ok(!err, "three 4 MiB ranges of HBM exported (A with the pattern, B and C zeroed through their mappings) and rxe0 opened");
	if (err) {
		diag("%s", strerror(-err));
		return 1;
	}

	err = 0;
	for (int i = 0; i < 3 && !err; i++) {
		mr[i] = ibv_reg_dmabuf_mr(pd, 0, LEN, IOVA(i), r[i].fd, ACCESS);
		if (!mr[i])
			err = errno;
	}
	ok(!err, "ibv_reg_dmabuf_mr of A, B and C on rxe0 (local write, remote read and write)");
	if (err) {
		diag("ibv_reg_dmabuf_mr: %s", strerror(err));
		return 1;
	}
	/*
	 * How rxe imported A, as the exporter sees it: pinned and revocable (irdma's way), or
	 * with rdma_rxe.dmabuf_dynamic=1 dynamic (mlx5's: revocable, not pinned); mapped either way.
	 */
	{
		char line[512] = "";
		unsigned int entries = 0;
		int pinned = -1, listed = importer_of(&r[0], line, sizeof(line)) == 0;
		const char *p = strstr(line, " revocable pinned=");

		if (p && sscanf(p, " revocable pinned=%d mapped_entries=%u", &pinned, &entries) != 2)
			pinned = -1;
		ok(listed && pinned == !dynamic && entries > 0,
		   "peerdirect's debugfs lists rxe's import of A as %s, revocable and mapped",
		   dynamic ? "dynamic (not pinned)" : "pinned");
		diag("A's importer: %s", listed ? line : "(not listed)");
		failed |= !(listed && pinned == !dynamic && entries > 0);
	}
	/*
	 * Remote atomic access is granted (verbs users such as libfabric's verbs provider ask it
	 * with every remote write), on B's dma-buf again.
	 */
	errno = 0;
	atomic = ibv_reg_dmabuf_mr(pd, 0, LEN, IOVA(3), r[1].fd, ACCESS | IBV_ACCESS_REMOTE_ATOMIC);
	err = atomic ? 0 : errno;
	ok(atomic != NULL, "ibv_reg_dmabuf_mr of B again with remote atomic access succeeds (as libfabric's verbs provider asks it)");
	if (!atomic)
		diag("ibv_reg_dmabuf_mr with IBV_ACCESS_REMOTE_ATOMIC: %s", strerror(err));
	failed |= !atomic;

	err = connect_pair(ctx, pd, &p, 1, ACCESS);
	if (err) {
		ok(0, "two RC queue pairs of rxe0 connected to each other");
		diag("%s", strerror(-err));
		return 1;
	}
	s = rdma(&p, IBV_WR_RDMA_WRITE, mr[0], IOVA(0), mr[1]->rkey, IOVA(1), LEN, &secs);
	ok(s == IBV_WC_SUCCESS, "RDMA WRITE of 4 MiB from A into B completes");
	diag("RDMA WRITE A -> B: %s", status_str(s));
	diag("timing: RDMA WRITE 4 MiB HBM to HBM on rxe: %.3f s", secs);
	bad = mismatch(r[1].map);
	ok(bad < 0, "B holds A's pattern, read back through B's mapping%s", bad < 0 ? "" : " (it does not)");
	if (bad >= 0)
		diag("word %ld: 0x%08x, expected 0x%08x", bad, r[1].map[bad], pattern(SEED, bad));
	failed |= s != IBV_WC_SUCCESS || bad >= 0;

	s = rdma(&p, IBV_WR_RDMA_READ, mr[2], IOVA(2), mr[0]->rkey, IOVA(0), LEN, &secs);
	ok(s == IBV_WC_SUCCESS, "RDMA READ of 4 MiB of A into C completes");
	diag("RDMA READ A -> C: %s", status_str(s));
	diag("timing: RDMA READ 4 MiB HBM to HBM on rxe: %.3f s", secs);
	bad = mismatch(r[2].map);
	ok(bad < 0, "C holds A's pattern, read back through C's mapping%s", bad < 0 ? "" : " (it does not)");
	if (bad >= 0)
		diag("word %ld: 0x%08x, expected 0x%08x", bad, r[2].map[bad], pattern(SEED, bad));
	failed |= s != IBV_WC_SUCCESS || bad >= 0;

	/*
	 * Atomics: rxe's work on pages, which HBM has not. On a pair allowing remote atomics, a
	 * fetch-and-add into host memory registered for it completes (the control); the same
	 * into the dma-buf MR registered for it ends in a remote access error, and B is unchanged.
	 */
	if (atomic) {
		int host_s = -EINVAL, hbm_s = -EINVAL;

		words = aligned_alloc(4096, 4096);
		words_mr = words ? ibv_reg_mr(pd, words, 4096, ACCESS | IBV_ACCESS_REMOTE_ATOMIC) : NULL;
		if (words_mr && !connect_pair(ctx, pd, &a, 1, ACCESS | IBV_ACCESS_REMOTE_ATOMIC)) {
			words[0] = 0;
			words[1] = 40;
			host_s = atomic_add(&a, words_mr, (uintptr_t)&words[0], words_mr,
					    (uintptr_t)&words[1], 2);
			if (host_s == IBV_WC_SUCCESS && (words[0] != 40 || words[1] != 42))
				host_s = -EBADMSG;
			if (host_s == IBV_WC_SUCCESS)
				hbm_s = atomic_add(&a, words_mr, (uintptr_t)&words[0], atomic, IOVA(3), 1);
		}
		bad = mismatch(r[1].map);
		ok(host_s == IBV_WC_SUCCESS && hbm_s == IBV_WC_REM_ACCESS_ERR && bad < 0,
		   "an atomic fetch-and-add into host memory completes; into the dma-buf MR it ends in a remote access error, and B is unchanged");
		diag("fetch-and-add into host memory: %s; into the dma-buf MR: %s; B %s", status_str(host_s),
		     status_str(hbm_s), bad < 0 ? "unchanged" : "changed");
		failed |= host_s != IBV_WC_SUCCESS || hbm_s != IBV_WC_REM_ACCESS_ERR || bad >= 0;
	} else {
		ok(0, "an atomic into the dma-buf MR (not registered)");
	}

	/*
	 * Revocation: the HBM device is unbound while A, B and C are registered. rxe imports
	 * them revocable (as irdma does) or dynamically (as mlx5 does), so the unbind revokes
	 * them (a dynamic import: unmaps them, and the exporter refuses to map them again) and
	 * returns without waiting for the registrations; rxe's copies out of A and into B must
	 * then fail with error completions, each on a pair of its own (an error moves a pair to
	 * the error state).
	 */
	{
		struct pollfd pfd = { .fd = dev, .events = POLLPRI };
		int fd, unbound, polled;

		host = aligned_alloc(4096, LEN);
		host_mr = host ? ibv_reg_mr(pd, host, LEN, ACCESS) : NULL;
		err = connect_pair(ctx, pd, &q, 1, ACCESS);
		fd = open("/sys/bus/pci/drivers/peerdirect/unbind", O_WRONLY);
		unbound = fd >= 0 && write(fd, pci, strlen(pci)) == (ssize_t)strlen(pci);
		polled = poll(&pfd, 1, 10000);
		ok(host_mr && !err && unbound && polled == 1 && (pfd.revents & POLLHUP),
		   "unbinding the HBM device while A, B and C are registered returns, and its file polls POLLHUP (revoked)");
		diag("unbind %s: %s; poll: %d, revents %#x", pci, unbound ? "done" : "failed", polled,
		     pfd.revents);
		s = rdma(&p, IBV_WR_RDMA_WRITE, mr[0], IOVA(0), host_mr ? host_mr->rkey : 0, (uintptr_t)host, LEN, &secs);
		ok(s > 0, "then an RDMA WRITE out of revoked A ends in an error completion");
		diag("RDMA WRITE A -> host memory: %s", status_str(s));
		failed |= s <= 0;
		s = rdma(&q, IBV_WR_RDMA_WRITE, host_mr, (uintptr_t)host, mr[1]->rkey, IOVA(1), LEN, &secs);
		ok(s > 0, "and an RDMA WRITE into revoked B ends in an error completion");
		diag("RDMA WRITE host memory -> B: %s", status_str(s));
		failed |= s <= 0;
		err = 0;
		for (int i = 0; i < 3; i++)
			err |= ibv_dereg_mr(mr[i]);
		if (atomic)
			err |= ibv_dereg_mr(atomic);
		ok(!err, "the revoked registrations deregister");
		failed |= !!err;
	}
	return failed;
}

/*
 * rxe0's port counters named in @names (NULL-terminated), as "name value, ..." in @buf: what
 * its requester and responder saw (retries, NAKs, errors), for diagnostics.
 */
static const char *rxe_counters(char *buf, size_t size, const char *const *names)
{
	size_t used = 0;

	buf[0] = 0;
	for (; *names && used < size; names++) {
		char path[160], value[32] = "?";
		FILE *f;

		snprintf(path, sizeof(path), "/sys/class/infiniband/rxe0/ports/1/hw_counters/%s", *names);
		f = fopen(path, "r");
		if (f) {
			if (!fgets(value, sizeof(value), f))
				strcpy(value, "?");
			value[strcspn(value, "\n")] = 0;
			fclose(f);
		}
		used += snprintf(buf + used, size - used, "%s%s %s", used ? ", " : "", *names, value);
	}
	return buf;
}

static const char *const link_counters[] = {
	"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_seq_err",
	"completer_retry_err", "retry_exceeded_err", "send_err", NULL
};

static double since(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (t1.tv_sec - t0->tv_sec) + (t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Writes @what to the sysfs file @path; 0 or -errno. */
static int sysfs_write(const char *path, const char *what)
{
	int fd = open(path, O_WRONLY), err = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, what, strlen(what)) != (ssize_t)strlen(what))
		err = -errno;
	close(fd);
	return err;
}

/* Binds the HBM device @pci to peerdirect if it is not, and opens /dev/peerdirect0 (10 s). */
static int open_bound(const char *pci)
{
	char path[256];
	int dev, err;

	snprintf(path, sizeof(path), "/sys/bus/pci/drivers/peerdirect/%s", pci);
	if (access(path, F_OK)) {
		err = sysfs_write("/sys/bus/pci/drivers/peerdirect/bind", pci);
		if (err)
			return err;
	}
	for (int i = 0; i < 1000; i++) {
		dev = open("/dev/peerdirect0", O_RDWR);
		if (dev >= 0 || errno != ENOENT)
			return dev >= 0 ? dev : -errno;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

#define RACE_CHUNK (64u << 10)
#define RACE_DEPTH 8

/* The stream of one round: what it posted and how that ended. */
struct stream {
	struct pair *p;
	struct ibv_mr *local; /* what RDMA READs land in, or RDMA WRITEs come from */
	uint64_t laddr, raddr; /* the IOVAs of the local and the remote range */
	uint32_t rkey;
	int read; /* RDMA READs of the remote range into the local one; else WRITEs */
	long posted, done, good, errors, post_failed;
	int first_error; /* the first error completion's status */
	atomic_int running;
};

/*
 * Keeps RACE_DEPTH requests in flight until one completes in error (or 60 s pass), then
 * reads completions until every posted one came (or 10 s more pass).
 */
static void *stream_run(void *arg)
{
	struct stream *st = arg;
	struct ibv_wc wc[16];
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	atomic_store(&st->running, 1);
	while (!st->errors && !st->post_failed && since(&t0) < 60) {
		while (st->posted - st->done < RACE_DEPTH) {
			uint64_t off = (uint64_t)(st->posted % (LEN / RACE_CHUNK)) * RACE_CHUNK;
			struct ibv_sge sge = { .addr = st->laddr + off, .length = RACE_CHUNK,
					       .lkey = st->local->lkey };
			struct ibv_send_wr wr = {
				.wr_id = (uint64_t)st->posted, .sg_list = &sge, .num_sge = 1,
				.opcode = st->read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED,
				.wr.rdma = { .remote_addr = st->raddr + off, .rkey = st->rkey },
			}, *bad;

			if (ibv_post_send(st->p->qp[0], &wr, &bad)) {
				st->post_failed = errno;
				break;
			}
			st->posted++;
		}
		int n = ibv_poll_cq(st->p->cq, 16, wc);

		for (int i = 0; i < n; i++) {
			st->done++;
			if (wc[i].status == IBV_WC_SUCCESS) {
				st->good++;
			} else if (!st->errors++) {
				st->first_error = wc[i].status;
			}
		}
		if (n == 0)
			usleep(200);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (st->done < st->posted && since(&t0) < 10) {
		int n = ibv_poll_cq(st->p->cq, 16, wc);

		for (int i = 0; i < n; i++) {
			st->done++;
			if (wc[i].status != IBV_WC_SUCCESS && !st->errors++)
				st->first_error = wc[i].status;
		}
		if (!n)
			usleep(1000);
	}
	return NULL;
}

/*
 * One round of revocation during transfers; 0 iff it went as it must. The ranges, MRs and
 * queue pairs of a round are released before the next.
 */
static int race_round(const char *pci, int round)
{
	struct ibv_context *ctx = open_rxe0();
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct stream st = { .read = round % 2 };
	struct ibv_mr *a = NULL, *b = NULL;
	struct range r[2] = { { .fd = -1, .map = MAP_FAILED }, { .fd = -1, .map = MAP_FAILED } };
	struct timespec t0;
	struct pair p;
	pthread_t thread;
	int dev, err = 0, unbind_err, dereg = 0, delay_ms = 5 + (round * 37) % 120;
	double unbind_secs;

	dev = open_bound(pci);
	if (dev < 0 || !pd) {
		ok(0, "round %d: the HBM device bound and opened, rxe0 opened", round);
		diag("%s", dev < 0 ? strerror(-dev) : "no rxe0");
		return 1;
	}
	/*
	 * Past the first three ranges, which hold what `transfer` left for the host to check
	 * (the allocator starts again at the bottom after a rebind).
	 */
	{
		struct peerdirect_alloc pad = { .size = sizeof(pad), .length = 3 * LEN };

		err = ioctl(dev, PEERDIRECT_IOC_ALLOC, &pad) ? -errno : 0;
	}
	for (int i = 0; i < 2 && !err; i++)
		err = export_range(dev, &r[i]);
	a = err ? NULL : ibv_reg_dmabuf_mr(pd, 0, LEN, IOVA(0), r[0].fd, ACCESS);
	b = a ? ibv_reg_dmabuf_mr(pd, 0, LEN, IOVA(1), r[1].fd, ACCESS) : NULL;
	if (err || !a || !b || connect_pair(ctx, pd, &p, 1, ACCESS)) {
		ok(0, "round %d: two ranges of HBM exported and registered, a pair connected", round);
		diag("%s", strerror(err ? -err : errno));
		return 1;
	}
	st.p = &p;
	/* READs of A into B, or WRITEs of A into B. */
	st.local = st.read ? b : a;
	st.laddr = IOVA(st.read ? 1 : 0);
	st.raddr = IOVA(st.read ? 0 : 1);
	st.rkey = st.read ? a->rkey : b->rkey;
	if (pthread_create(&thread, NULL, stream_run, &st)) {
		ok(0, "round %d: the stream's thread starts", round);
		return 1;
	}
	while (!atomic_load(&st.running))
		usleep(100);
	usleep(delay_ms * 1000);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	unbind_err = sysfs_write("/sys/bus/pci/drivers/peerdirect/unbind", pci);
	unbind_secs = since(&t0);
	pthread_join(thread, NULL);
	dereg |= ibv_dereg_mr(a);
	dereg |= ibv_dereg_mr(b);
	for (int i = 0; i < 2; i++)
		dereg |= ibv_destroy_qp(p.qp[i]);
	dereg |= ibv_destroy_cq(p.cq);
	dereg |= ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	for (int i = 0; i < 2; i++) {
		munmap(r[i].map, LEN);
		close(r[i].fd);
	}
	close(dev);
	err = unbind_err || unbind_secs > 20 || !st.errors || st.done != st.posted || dereg;
	ok(!err,
	   "round %d: unbinding the HBM device %d ms into a stream of 64 KiB RDMA %ss between two of its dma-buf MRs returns; the stream ends in an error completion; every posted request completes; the MRs, queue pairs and domain are released",
	   round, delay_ms, st.read ? "READ" : "WRITE");
	diag("round %d: unbind %s in %.3f s; %ld of %ld posted completed, %ld good before the first error (%s)%s%s",
	     round, unbind_err ? strerror(-unbind_err) : "done", unbind_secs, st.done, st.posted,
	     st.good, st.errors ? ibv_wc_status_str(st.first_error) : "none",
	     st.post_failed ? "; a post failed: " : "", st.post_failed ? strerror(st.post_failed) : "");
	return err;
}

static int race(const char *pci, int rounds, int dynamic)
{
	int failed = 0, err;

	printf("1..%d\n", rounds + 1);
	err = import_dynamically(dynamic);
	ok(!err, "rdma_rxe.dmabuf_dynamic set to %d: rxe imports %s", dynamic,
	   dynamic ? "dynamically (as mlx5 does)" : "pinned and revocable (as irdma does)");
	if (err) {
		diag("%s", strerror(-err));
		return 1;
	}
	for (int i = 0; i < rounds; i++)
		failed |= race_round(pci, i);
	return failed;
}

/*
 * Two hosts: this guest's rxe0 and the peer guest's, on their linked NICs. What each side
 * tells the other over TCP (both sides are x86-64 builds of this program: the struct goes as
 * it is).
 */
struct peer_info {
	uint32_t qpn;
	uint32_t a_rkey, b_rkey;
	uint32_t pad;
	uint64_t a_addr, b_addr;
	uint8_t gid[16];
};

#define PEER_PORT 18515
#define PEER_SECS 120

/* Word i of tests/hbm-pattern's pattern: SplitMix64's output i from @seed. */
static uint64_t splitmix(uint64_t seed, uint64_t i)
{
	uint64_t z = seed + (i + 1) * UINT64_C(0x9e3779b97f4a7c15);

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* The first word of @got that differs from tests/hbm-pattern's pattern of @seed, or -1. */
static long splitmix_mismatch(const uint32_t *got, uint64_t seed)
{
	const uint64_t *w = (const uint64_t *)got;

	for (uint64_t i = 0; i < LEN / 8; i++)
		if (w[i] != splitmix(seed, i))
			return (long)i;
	return -1;
}

/* The index of rxe0's GID that is this host's IPv4 address (RoCE v2), or -1. */
static int ipv4_gid(struct ibv_context *ctx, union ibv_gid *gid)
{
	static const uint8_t mapped[12] = { [10] = 0xff, [11] = 0xff };
	struct ibv_port_attr port;

	if (ibv_query_port(ctx, 1, &port))
		return -1;
	for (int i = 0; i < port.gid_tbl_len; i++)
		if (!ibv_query_gid(ctx, 1, i, gid) && !memcmp(gid->raw, mapped, sizeof(mapped)))
			return i;
	return -1;
}

/*
 * The TCP connection to the peer: node 0 listens, node 1 connects to @peer_ip, trying until
 * node 0 listens (the guests boot side by side, not in step); both give up after PEER_SECS.
 */
static int peer_connect(int node, const char *peer_ip)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(PEER_PORT) };
	struct timeval tv = { .tv_sec = PEER_SECS };
	int one = 1, s, c = -1;
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (node == 0) {
		struct pollfd pfd;

		s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
		    bind(s, (struct sockaddr *)&sa, sizeof(sa)) || listen(s, 1))
			return -errno;
		pfd = (struct pollfd){ .fd = s, .events = POLLIN };
		if (poll(&pfd, 1, PEER_SECS * 1000) == 1)
			c = accept(s, NULL, NULL);
		else
			errno = ETIMEDOUT;
		close(s);
	} else {
		if (inet_pton(AF_INET, peer_ip, &sa.sin_addr) != 1)
			return -EINVAL;
		while (c < 0 && since(&t0) < PEER_SECS) {
			c = socket(AF_INET, SOCK_STREAM, 0);
			if (c < 0)
				return -errno;
			if (connect(c, (struct sockaddr *)&sa, sizeof(sa))) {
				close(c);
				c = -1;
				sleep(1);
			}
		}
		if (c < 0)
			errno = ETIMEDOUT;
	}
	if (c < 0)
		return -errno;
	/* No exchange below waits longer than the peer may take. */
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return c;
}

/* Sends @len bytes of @buf and receives as many of the peer's into @got; 0 or -errno. */
static int swap(int c, const void *buf, void *got, size_t len)
{
	size_t n = 0;

	if (send(c, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
		return -errno;
	while (n < len) {
		ssize_t r = recv(c, (char *)got + n, len - n, 0);

		if (r <= 0)
			return r ? -errno : -ECONNRESET;
		n += r;
	}
	return 0;
}

/* Both sides reached the same step @what (one byte each way, checked). */
static int barrier(int c, char what)
{
	char got = 0;
	int err = swap(c, &what, &got, 1);

	return err ? err : got == what ? 0 : -EPROTO;
}

/* This host's RC queue pair of @ctx (in @p->qp[0], with its CQ), in INIT. */
static int create_remote_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct pair *p)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};

	p->qp[0] = p->qp[1] = NULL;
	p->cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	if (!p->cq)
		return -errno;
	init.send_cq = init.recv_cq = p->cq;
	p->qp[0] = ibv_create_qp(pd, &init);
	if (!p->qp[0] || to_init(p->qp[0], ACCESS))
		return -errno;
	return 0;
}

/*
 * `peer`: see the top of the file. A: this host's pattern (seed 0x5eed0000 + node); B: the
 * peer's RDMA WRITE lands there; C: this host's RDMA READ of the peer's A lands there.
 */
static int peer(const char *pci, int node, const char *peer_ip, int lose_nak)
{
	struct ibv_context *ctx = open_rxe0();
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	uint64_t seed = 0x5eed0000u + node, peer_seed = 0x5eed0000u + !node;
	struct peer_info me = { 0 }, them = { 0 };
	struct ibv_mr *mr[3] = { 0 };
	union ibv_gid gid;
	struct range r[3];
	struct pair p;
	char counters[512];
	double secs;
	long bad;
	int dev, err, s, c, gid_index, failed = 0;

	/*
	 * Plan: set-up and registration (1), connection (1), write (1), read (1), the peer's
	 * write (1), revocation across the link (1), release (1).
	 */
	printf("1..7\n");
	dev = open("/dev/peerdirect0", O_RDWR);
	err = dev < 0 ? -errno : pd ? 0 : -ENODEV;
	for (int i = 0; i < 3 && !err; i++)
		err = export_range(dev, &r[i]);
	if (!err) {
		uint64_t *a = (uint64_t *)r[0].map;

		for (uint64_t i = 0; i < LEN / 8; i++)
			a[i] = splitmix(seed, i);
		memset(r[1].map, 0, LEN);
		memset(r[2].map, 0, LEN);
	}
	for (int i = 0; i < 3 && !err; i++) {
		mr[i] = ibv_reg_dmabuf_mr(pd, 0, LEN, IOVA(i), r[i].fd, ACCESS);
		if (!mr[i])
			err = -errno;
	}
	gid_index = err ? -1 : ipv4_gid(ctx, &gid);
	ok(!err && gid_index >= 0,
	   "three 4 MiB ranges of this host's HBM exported (A with this host's pattern, B and C zeroed) and registered with ibv_reg_dmabuf_mr on rxe0, which has a GID for this host's IPv4 address");
	if (err || gid_index < 0) {
		diag("%s", err ? strerror(-err) : "no IPv4 GID on rxe0");
		return 1;
	}
	/* The host's checks: what each range must hold once both sides are done. */
	for (int i = 0; i < 3; i++)
		diag("hbm-%c offset=0x%llx length=0x%x seed=0x%llx", 'a' + i,
		     (unsigned long long)r[i].hbm_offset, LEN,
		     (unsigned long long)(i ? peer_seed : seed));

	/*
	 * The connection: this host's QP number, GID and where A and B are (IOVA and rkey) for
	 * the peer's; then both queue pairs connected before either side posts anything.
	 */
	c = peer_connect(node, peer_ip);
	err = c < 0 ? c : create_remote_qp(ctx, pd, &p);
	if (!err) {
		me.qpn = p.qp[0]->qp_num;
		memcpy(me.gid, gid.raw, 16);
		me.a_addr = IOVA(0);
		me.a_rkey = mr[0]->rkey;
		me.b_addr = IOVA(1);
		me.b_rkey = mr[1]->rkey;
		err = swap(c, &me, &them, sizeof(me));
	}
	if (!err)
		err = to_rts(p.qp[0], them.qpn, them.gid, gid_index);
	if (!err)
		err = barrier(c, 'c');
	ok(!err, "an RC queue pair of rxe0 connected to the peer's across the link (QP number, GID and the IOVAs and rkeys of A and B exchanged over TCP)");
	if (err) {
		diag("connection to node %d (%s): %s", !node, peer_ip, strerror(-err));
		return 1;
	}
	diag("this host: QP %u, GID index %d; the peer's QP %u", me.qpn, gid_index, them.qpn);

	s = rdma(&p, IBV_WR_RDMA_WRITE, mr[0], IOVA(0), them.b_rkey, them.b_addr, LEN, &secs);
	ok(s == IBV_WC_SUCCESS, "RDMA WRITE of 4 MiB from this host's A into the peer's B completes");
	diag("RDMA WRITE A -> the peer's B: %s; timing: %.3f s for 4 MiB HBM to HBM across the link",
	     status_str(s), secs);
	failed |= s != IBV_WC_SUCCESS;

	s = rdma(&p, IBV_WR_RDMA_READ, mr[2], IOVA(2), them.a_rkey, them.a_addr, LEN, &secs);
	bad = s == IBV_WC_SUCCESS ? splitmix_mismatch(r[2].map, peer_seed) : 0;
	ok(s == IBV_WC_SUCCESS && bad < 0,
	   "RDMA READ of 4 MiB of the peer's A into this host's C completes, and C holds the peer's pattern");
	diag("RDMA READ the peer's A -> C: %s; timing: %.3f s for 4 MiB HBM to HBM across the link",
	     status_str(s), secs);
	if (bad > 0)
		diag("C, word %ld: %#llx, expected %#llx", bad,
		     (unsigned long long)((uint64_t *)r[2].map)[bad],
		     (unsigned long long)splitmix(peer_seed, bad));
	failed |= s != IBV_WC_SUCCESS || bad >= 0;

	/* Both sides' transfers completed: the peer's WRITE is in B. */
	err = barrier(c, 't');
	bad = err ? 0 : splitmix_mismatch(r[1].map, peer_seed);
	ok(!err && bad < 0, "once the peer's RDMA WRITE completed, this host's B holds the peer's pattern");
	if (err)
		diag("waiting for the peer: %s", strerror(-err));
	else if (bad >= 0)
		diag("B, word %ld: %#llx, expected %#llx", bad,
		     (unsigned long long)((uint64_t *)r[1].map)[bad],
		     (unsigned long long)splitmix(peer_seed, bad));
	failed |= err || bad >= 0;

	/*
	 * Revocation across the link: node 1 streams 64 KiB RDMA READs out of node 0's A; node 0
	 * unbinds its HBM device in the middle of the stream. Node 0's unbind must return; node
	 * 1's stream must end in an error completion (node 0's rxe refuses to read revoked HBM;
	 * or, where the link lost that NAK, node 1's retries run out)
	 * with every posted request completed.
	 */
	if (!err && node == 1) {
		struct stream st = { .p = &p, .local = mr[2], .laddr = IOVA(2), .raddr = them.a_addr,
				     .rkey = them.a_rkey, .read = 1 };
		pthread_t thread;

		int good;

		/* The relay drops NAKs while the file exists (tests/lossy-link). */
		if (lose_nak) {
			int fd = open("/mnt/host/lose-naks", O_WRONLY | O_CREAT, 0644);

			err = fd < 0 ? -errno : close(fd);
		}
		if (!err)
			err = pthread_create(&thread, NULL, stream_run, &st) ? -EAGAIN : 0;
		while (!err && !atomic_load(&st.running))
			usleep(100);
		if (!err) {
			err = barrier(c, 's');
			pthread_join(thread, NULL);
		}
		if (lose_nak)
			unlink("/mnt/host/lose-naks");
		if (!err)
			err = barrier(c, 'u');
		good = !err && st.errors && st.done == st.posted &&
		       (!lose_nak || st.first_error == IBV_WC_RETRY_EXC_ERR);
		if (lose_nak)
			ok(good, "node 0 unbinding its HBM device while this host streams 64 KiB RDMA READs out of it, node 0's NAK lost on the link: the stream ends in retries exceeded (not a stall), every posted request completes");
		else
			ok(good, "node 0 unbinding its HBM device while this host streams 64 KiB RDMA READs out of it: the stream ends in an error completion, every posted request completes");
		diag("stream: %ld of %ld posted completed, %ld good before the first error (%s)%s%s",
		     st.done, st.posted, st.good, st.errors ? ibv_wc_status_str(st.first_error) : "none",
		     err ? "; " : "", err ? strerror(-err) : "");
		diag("rxe0's counters: %s", rxe_counters(counters, sizeof(counters), link_counters));
		failed |= !good;
	} else if (!err) {
		struct timespec t0;
		double unbind_secs = 0;
		int unbind_err = 0;

		err = barrier(c, 's');
		if (!err) {
			usleep(50000);
			clock_gettime(CLOCK_MONOTONIC, &t0);
			unbind_err = sysfs_write("/sys/bus/pci/drivers/peerdirect/unbind", pci);
			unbind_secs = since(&t0);
			err = barrier(c, 'u');
		}
		ok(!err && !unbind_err && unbind_secs < 20,
		   "unbinding this host's HBM device while node 1 streams RDMA READs out of A returns");
		diag("unbind %s: %s in %.3f s%s%s", pci, unbind_err ? strerror(-unbind_err) : "done",
		     unbind_secs, err ? "; " : "", err ? strerror(-err) : "");
		diag("rxe0's counters once the peer's stream ended: %s",
		     rxe_counters(counters, sizeof(counters), link_counters));
		failed |= err || unbind_err || unbind_secs >= 20;
	} else {
		ok(0, "revocation across the link (the peer is gone)");
	}

	err = ibv_destroy_qp(p.qp[0]) | ibv_destroy_cq(p.cq);
	for (int i = 0; i < 3; i++)
		err |= ibv_dereg_mr(mr[i]);
	err |= ibv_dealloc_pd(pd) | ibv_close_device(ctx);
	ok(!err, "the queue pair and the MRs of A, B and C are released");
	failed |= !!err;
	for (int i = 0; i < 3; i++) {
		munmap(r[i].map, LEN);
		close(r[i].fd);
	}
	close(c);
	close(dev);
	return failed;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "refused"))
		return refused(argv[3]);
	if (argc == 4 && !strcmp(argv[1], "transfer"))
		return transfer(argv[2], argv[3], 0);
	if (argc == 5 && !strcmp(argv[1], "transfer") && !strcmp(argv[4], "dynamic"))
		return transfer(argv[2], argv[3], 1);
	if (argc == 4 && !strcmp(argv[1], "race") && atoi(argv[3]) > 0)
		return race(argv[2], atoi(argv[3]), 0);
	if (argc == 5 && !strcmp(argv[1], "race") && atoi(argv[3]) > 0 && !strcmp(argv[4], "dynamic"))
		return race(argv[2], atoi(argv[3]), 1);
	if ((argc == 5 || (argc == 6 && !strcmp(argv[5], "lose-nak"))) && !strcmp(argv[1], "peer") &&
	    (!strcmp(argv[3], "0") || !strcmp(argv[3], "1")))
		return peer(argv[2], atoi(argv[3]), argv[4], argc == 6);
	fprintf(stderr, "usage: rxe_dmabuf refused DIR WHO | transfer DIR PCI-ADDRESS [dynamic] | race PCI-ADDRESS ROUNDS [dynamic] | peer PCI-ADDRESS NODE PEER-IP [lose-nak]\n");
	return 2;
}

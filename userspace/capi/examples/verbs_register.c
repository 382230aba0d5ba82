/*
 * verbs_register: registering HBM in an ibverbs protection domain the program allocated
 * itself, through the registration cache (pd_domain_attach_verbs). Opens the RDMA device
 * named on the command line (default rxe0), allocates a protection domain, allocates 4 MiB
 * of HBM on /dev/peerdirect0 and asks pd_register for it: ibv_reg_dmabuf_mr in that domain.
 *
 * On a device whose kernel driver imports dma-bufs (mlx5, EFA, irdma; in the test guests rxe0
 * with the patched rxe and provider, qemu/run --rxe-dmabuf) the registration succeeds: the
 * program prints its keys and the IOVA a work request would use (pd_register's: the offset in
 * the allocation, 1 MiB), and checks them. On soft-RoCE (rxe) as Debian ships it, which has no
 * dma-buf memory regions, it must fail with -EOPNOTSUPP and a message naming the device, its
 * driver and what to use instead; the program checks that (a second argument "refused" says
 * which outcome to expect). verbs_rdma.c registers at the runtime's device VA and moves bytes.
 *
 * Either way it then detaches the domain handle and deallocates the protection domain itself:
 * ibv_dealloc_pd must succeed (the library left no memory region in it and never freed it).
 * Exit status 0 iff the expected outcome came and everything was released.
 *
 *   cc -o verbs_register verbs_register.c $(pkg-config --cflags --libs peerdirect libibverbs)
 *   ./verbs_register [DEVICE [refused|direct]]
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <peerdirect.h>

#define LENGTH (4u << 20)

static int pd_fail(const char *what, int err)
{
	fprintf(stderr, "verbs_register: %s: %s (%s)\n", what, pd_strerror(err), pd_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "rxe0";
	int expect_refusal = argc > 2 && strcmp(argv[2], "refused") == 0;
	struct ibv_device **list;
	struct ibv_context *context = NULL;
	struct ibv_pd *pd = NULL;
	struct pd_regcache_stats stats;
	pd_device *dev = NULL;
	pd_allocation *alloc = NULL;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_mr *mr = NULL;
	void *iova;
	uint64_t length, remote_addr, rkey;
	int n, i, err, ret, status = 1;

	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			context = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!context) {
		fprintf(stderr, "verbs_register: cannot open RDMA device %s\n", name);
		return 1;
	}
	pd = ibv_alloc_pd(context);
	if (!pd) {
		perror("verbs_register: ibv_alloc_pd");
		goto out;
	}
	dev = pd_device_open(0, &err);
	if (!dev) {
		pd_fail("pd_device_open(0)", err);
		goto out;
	}
	err = pd_alloc(dev, LENGTH, 0, &alloc);
	if (err) {
		pd_fail("pd_alloc", err);
		goto out;
	}
	cache = pd_regcache_new(&err);
	if (!cache) {
		pd_fail("pd_regcache_new", err);
		goto out;
	}
	dom = pd_domain_attach_verbs(cache, pd, &err);
	if (!dom) {
		pd_fail("pd_domain_attach_verbs", err);
		goto out;
	}
	printf("attached protection domain of %s\n", name);
	err = pd_register(dom, alloc, 1u << 20, 4096,
			  PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ | PD_ACCESS_REMOTE_WRITE, &mr);
	if (expect_refusal) {
		if (err != -EOPNOTSUPP) {
			fprintf(stderr, "verbs_register: expected -EOPNOTSUPP, got %d (%s)\n", err,
				pd_last_error());
			goto out;
		}
		printf("refused: %s\n", pd_last_error());
	} else {
		if (err) {
			pd_fail("pd_register", err);
			goto out;
		}
		if ((err = pd_mr_local(mr, &iova, &length)) ||
		    (err = pd_mr_remote(mr, 1, &remote_addr, &rkey))) {
			pd_fail("pd_mr_local/remote", err);
			goto out;
		}
		printf("registered 4096 bytes at 1 MiB: lkey %#x, rkey %#" PRIx64 ", iova %p\n",
		       pd_mr_lkey(mr), pd_mr_key(mr), iova);
		if (pd_mr_path(mr) != PD_PATH_DMABUF || rkey != pd_mr_key(mr) || length != 4096 ||
		    remote_addr != (uint64_t)(uintptr_t)iova) {
			fprintf(stderr, "verbs_register: the registration reads wrong\n");
			goto out;
		}
		pd_mr_release(mr);
		mr = NULL;
	}
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_fail("pd_regcache_stats", err);
		goto out;
	}
	printf("cache: misses %" PRIu64 ", registrations %" PRIu64 ", failed %" PRIu64
	       ", entries %" PRIu64 "\n",
	       stats.misses, stats.registrations, stats.failed_registrations, stats.entries);
	ret = pd_domain_detach(dom);
	if (ret < 0) {
		pd_fail("pd_domain_detach", ret);
		goto out;
	}
	dom = NULL;
	printf("detached: %d cached registration(s) dropped\n", ret);
	status = 0;
out:
	pd_mr_release(mr);
	pd_domain_detach(dom);
	pd_regcache_free(cache);
	pd_allocation_free(alloc);
	pd_device_close(dev);
	if (pd && (ret = ibv_dealloc_pd(pd))) {
		fprintf(stderr, "verbs_register: ibv_dealloc_pd: %s\n", strerror(ret));
		status = 1;
	}
	if (ibv_close_device(context)) {
		perror("verbs_register: ibv_close_device");
		status = 1;
	}
	if (status == 0)
		printf("released: the protection domain is the program's to deallocate, and was\n");
	return status;
}

/*
 * key_pool: a runtime that hands out memory keys itself, as aws-ofi-nccl does from its key
 * pool, and names where its memory lives, as HCL does (FI_HMEM_SYNAPSEAI). Opens libfabric's
 * tcp provider on 127.0.0.1 without FI_MR_PROV_KEY (so tcp takes the keys it is asked for,
 * which must be unique in the domain), attaches the domain to a registration cache and gives
 * it the program's key pool (pd_domain_set_keys, with the domain's mr_key_size), then:
 * - registers two HBM allocations of /dev/peerdirect0: their keys are the pool's first two;
 * - frees the first allocation: its registration closes and its key goes back to the pool;
 * - an allocator whose key does not fit the key size given: the registration fails, -ERANGE;
 *   one with no key left: -ENOSPC;
 * - PD_IFACE_SYNAPSEAI: tcp (no SynapseAI support here) refuses the registration; an unknown
 *   iface is -EINVAL; back to PD_IFACE_SYSTEM, the registration takes the pool's free key;
 * - detaching the domain closes every registration: every key is back in the pool;
 * - the allocator calls into the library each time (pd_domain_set_iface): it runs under no
 *   lock of the library's; the first time, it also tries to detach the domain it registers
 *   in, which must fail with -EBUSY (the registration under way uses the handle).
 * Each step prints one line, "ok - ..." or "FAIL - ... : <why>"; exit status 0 iff all ok.
 *
 *   cc -o key_pool key_pool.c $(pkg-config --cflags --libs peerdirect libfabric)
 *   ./key_pool
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#define LENGTH (2u << 20)
#define ALL (PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE)
#define FIRST_KEY 0x7000u
#define KEYS 8

/*
 * The runtime's keys. The library calls release on whichever thread closes a registration;
 * the calls this program checks happen before the call that closes it returns.
 */
struct pool {
	int used[KEYS];
	int released;
	uint64_t last_released;
	/* The allocator calls back into the library (it must not run under its locks). */
	pd_domain *dom;
	uint32_t iface;
	int reentries, reentry_failures;
	/* pd_domain_detach of dom from inside the allocator, tried once: its result. */
	int detach_tried, detach_err;
	char detach_why[512];
};

static int alloc_key(void *ctx, uint64_t *key)
{
	struct pool *pool = ctx;
	int i;

	/* Setting the iface it has again: a call into the library from inside the allocator. */
	if (pool->dom) {
		pool->reentries++;
		if (pd_domain_set_iface(pool->dom, pool->iface, 0))
			pool->reentry_failures++;
		if (!pool->detach_tried) {
			pool->detach_tried = 1;
			pool->detach_err = pd_domain_detach(pool->dom);
			snprintf(pool->detach_why, sizeof(pool->detach_why), "%s", pd_last_error());
		}
	}
	for (i = 0; i < KEYS; i++) {
		if (!pool->used[i]) {
			pool->used[i] = 1;
			*key = FIRST_KEY + (uint64_t)i;
			return 0;
		}
	}
	return -ENOSPC;
}

static void release_key(void *ctx, uint64_t key)
{
	struct pool *pool = ctx;

	if (key >= FIRST_KEY && key < FIRST_KEY + KEYS)
		pool->used[key - FIRST_KEY] = 0;
	pool->released++;
	pool->last_released = key;
}

/* A key too large for a one-byte key size. */
static int large_key(void *ctx, uint64_t *key)
{
	(void)ctx;
	*key = 0x1234;
	return 0;
}

static int no_key(void *ctx, uint64_t *key)
{
	(void)ctx;
	(void)key;
	return -ENOSPC;
}

static int in_use(const struct pool *pool)
{
	int i, n = 0;

	for (i = 0; i < KEYS; i++)
		n += pool->used[i];
	return n;
}

static int failed;

static void fail_pd(const char *what, int err)
{
	printf("FAIL - %s : %s (%s)\n", what, pd_strerror(err), pd_last_error());
	failed = 1;
}

/* A new allocation of LENGTH bytes, or NULL. */
static pd_allocation *allocate(pd_device *dev)
{
	pd_allocation *alloc = NULL;
	int err = pd_alloc(dev, LENGTH, 0, &alloc);

	if (err) {
		fail_pd("pd_alloc", err);
		return NULL;
	}
	return alloc;
}

/* Registers all of alloc and expects errno `expected` (0: success); what the step was. */
static pd_mr *expect(pd_domain *dom, const pd_allocation *alloc, int expected, const char *what)
{
	pd_mr *mr = NULL;
	int err = pd_register(dom, alloc, 0, 0, ALL, &mr);

	if (err != expected) {
		printf("FAIL - %s : %s (%s), expected %s\n", what, err ? pd_strerror(err) : "registered",
		       pd_last_error(), expected ? pd_strerror(expected) : "success");
		failed = 1;
		pd_mr_release(mr);
		return NULL;
	}
	return mr;
}

int main(void)
{
	struct pool pool = { { 0 }, 0, 0, NULL, PD_IFACE_SYSTEM, 0, 0, 0, 0, { 0 } };
	struct fi_info *hints, *info = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	pd_allocation *a = NULL, *b = NULL, *c = NULL;
	pd_mr *mr_a = NULL, *mr_b = NULL, *mr_c = NULL;
	pd_regcache *cache = NULL;
	pd_domain *dom = NULL;
	pd_device *dev;
	size_t key_size;
	int err, ret;

	dev = pd_device_open(0, &err);
	if (!dev) {
		fail_pd("pd_device_open(0)", err);
		return 1;
	}
	hints = fi_allocinfo();
	if (!hints)
		return 1;
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	/* No FI_MR_PROV_KEY: the provider takes the keys it is asked for. */
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED;
	ret = fi_getinfo(FI_VERSION(1, 20), "127.0.0.1", NULL, FI_SOURCE, hints, &info);
	fi_freeinfo(hints);
	if (ret || (ret = fi_fabric(info->fabric_attr, &fabric, NULL)) ||
	    (ret = fi_domain(fabric, info, &domain, NULL))) {
		printf("FAIL - opening tcp : %s (%d)\n", fi_strerror(-ret), ret);
		return 1;
	}
	if (info->domain_attr->mr_mode & FI_MR_PROV_KEY) {
		printf("FAIL - tcp's domain : FI_MR_PROV_KEY set, so requested keys are ignored\n");
		return 1;
	}
	key_size = info->domain_attr->mr_key_size;
	cache = pd_regcache_new(&err);
	if (!cache || !(dom = pd_domain_attach(cache, domain, &err))) {
		fail_pd("pd_regcache_new / pd_domain_attach", err);
		return 1;
	}
	pool.dom = dom;
	if ((err = pd_domain_set_keys(dom, alloc_key, release_key, &pool, key_size))) {
		fail_pd("pd_domain_set_keys", err);
		return 1;
	}

	/* Two registrations: the pool's first two keys. */
	if (!(a = allocate(dev)) || !(b = allocate(dev)) || !(c = allocate(dev)))
		goto out;
	mr_a = expect(dom, a, 0, "pd_register of the first allocation");
	mr_b = expect(dom, b, 0, "pd_register of the second allocation");
	if (!mr_a || !mr_b)
		goto out;
	if (pd_mr_key(mr_a) != FIRST_KEY || pd_mr_key(mr_b) != FIRST_KEY + 1 || in_use(&pool) != 2) {
		printf("FAIL - keys : %#" PRIx64 " and %#" PRIx64 ", %d in use; expected %#x and "
		       "%#x from the pool\n",
		       pd_mr_key(mr_a), pd_mr_key(mr_b), in_use(&pool), FIRST_KEY, FIRST_KEY + 1);
		failed = 1;
		goto out;
	}
	printf("ok - two registrations took keys %#" PRIx64 " and %#" PRIx64
	       " from the program's pool (tcp without FI_MR_PROV_KEY, key size %zu bytes)\n",
	       pd_mr_key(mr_a), pd_mr_key(mr_b), key_size);

	/* Freeing the first allocation closes its registration: its key goes back. */
	pd_mr_release(mr_a);
	mr_a = NULL;
	if ((err = pd_allocation_free(a))) {
		fail_pd("pd_allocation_free", err);
		goto out;
	}
	a = NULL;
	if (pool.released != 1 || pool.last_released != FIRST_KEY || in_use(&pool) != 1) {
		printf("FAIL - after freeing the first allocation : %d key(s) released, the last "
		       "%#" PRIx64 ", %d in use; expected %#x back\n",
		       pool.released, pool.last_released, in_use(&pool), FIRST_KEY);
		failed = 1;
		goto out;
	}
	printf("ok - freeing the first allocation closed its registration and gave key %#x back\n",
	       FIRST_KEY);

	/* Keys the domain cannot hold, and none left. */
	if ((err = pd_domain_set_keys(dom, large_key, NULL, NULL, 1))) {
		fail_pd("pd_domain_set_keys(one byte)", err);
		goto out;
	}
	expect(dom, c, -ERANGE, "a key of 0x1234 for a one-byte key size");
	if (!failed && !strstr(pd_last_error(), "key size")) {
		printf("FAIL - the -ERANGE message : %s\n", pd_last_error());
		failed = 1;
	}
	if ((err = pd_domain_set_keys(dom, no_key, NULL, NULL, key_size))) {
		fail_pd("pd_domain_set_keys(none left)", err);
		goto out;
	}
	expect(dom, c, -ENOSPC, "an allocator with no key left");
	if (failed)
		goto out;
	printf("ok - a key the key size cannot hold: -ERANGE; an allocator with none left: "
	       "-ENOSPC\n");

	/* Where the memory lives. */
	if ((err = pd_domain_set_keys(dom, alloc_key, release_key, &pool, key_size)) ||
	    (err = pd_domain_set_iface(dom, PD_IFACE_SYNAPSEAI, 0))) {
		fail_pd("pd_domain_set_keys / pd_domain_set_iface(SYNAPSEAI)", err);
		goto out;
	}
	pool.iface = PD_IFACE_SYNAPSEAI;
	err = pd_register(dom, c, 0, 0, ALL, &mr_c);
	if (err == 0 || !strstr(pd_last_error(), "fi_mr_regattr")) {
		printf("FAIL - PD_IFACE_SYNAPSEAI on tcp : %s (%s), expected tcp's refusal\n",
		       err ? pd_strerror(err) : "registered", pd_last_error());
		failed = 1;
		goto out;
	}
	printf("ok - PD_IFACE_SYNAPSEAI (device 0) on tcp, which has no SynapseAI support: %s (%s)\n",
	       pd_strerror(err), pd_last_error());
	if ((err = pd_domain_set_iface(dom, 7, 0)) != -EINVAL) {
		printf("FAIL - pd_domain_set_iface(7) : %d, expected -EINVAL\n", err);
		failed = 1;
		goto out;
	}
	if ((err = pd_domain_set_iface(dom, PD_IFACE_SYSTEM, 0))) {
		fail_pd("pd_domain_set_iface(SYSTEM)", err);
		goto out;
	}
	pool.iface = PD_IFACE_SYSTEM;
	if (!(mr_c = expect(dom, c, 0, "pd_register with PD_IFACE_SYSTEM again")))
		goto out;
	if (pd_mr_key(mr_c) != FIRST_KEY || in_use(&pool) != 2) {
		printf("FAIL - key after the refusals : %#" PRIx64 ", %d in use; expected %#x\n",
		       pd_mr_key(mr_c), in_use(&pool), FIRST_KEY);
		failed = 1;
		goto out;
	}
	printf("ok - an unknown iface: -EINVAL; PD_IFACE_SYSTEM again registers, with the pool's "
	       "free key %#" PRIx64 " (the refused registrations gave theirs back)\n",
	       pd_mr_key(mr_c));

out:
	pd_mr_release(mr_a);
	pd_mr_release(mr_b);
	pd_mr_release(mr_c);
	if (dom && (ret = pd_domain_detach(dom)) < 0) {
		fail_pd("pd_domain_detach", ret);
	} else if (!failed && in_use(&pool) != 0) {
		printf("FAIL - after pd_domain_detach : %d key(s) still in use\n", in_use(&pool));
		failed = 1;
	} else if (!failed) {
		printf("ok - pd_domain_detach closed every registration: every key is back in the "
		       "pool\n");
	}
	if (!failed && (pool.reentries == 0 || pool.reentry_failures)) {
		printf("FAIL - the allocator's calls into the library : %d, %d failed\n",
		       pool.reentries, pool.reentry_failures);
		failed = 1;
	} else if (!failed) {
		printf("ok - the allocator called into the library %d times (pd_domain_set_iface), "
		       "as it may: it runs under no lock of the library's\n",
		       pool.reentries);
	}
	if (!failed && (!pool.detach_tried || pool.detach_err != -EBUSY ||
			!strstr(pool.detach_why, "key allocator"))) {
		printf("FAIL - pd_domain_detach of the domain from inside its key allocator : %d "
		       "(%s), expected -EBUSY\n",
		       pool.detach_err, pool.detach_why);
		failed = 1;
	} else if (!failed) {
		printf("ok - pd_domain_detach of the domain from inside its key allocator: -EBUSY "
		       "(%s)\n",
		       pool.detach_why);
	}
	pd_regcache_free(cache);
	if (domain)
		fi_close(&domain->fid);
	if (fabric)
		fi_close(&fabric->fid);
	fi_freeinfo(info);
	pd_allocation_free(a);
	pd_allocation_free(b);
	pd_allocation_free(c);
	pd_device_close(dev);
	return failed;
}

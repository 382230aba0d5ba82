/*
 * What the C race tests and benches/hits.c share: libfabric's tcp provider on 127.0.0.1
 * (FI_THREAD_SAFE, the memory registration modes the library asks for), a registration cache
 * and its handle on the domain. Include after <peerdirect.h>, <rdma/fabric.h> and
 * <rdma/fi_domain.h>.
 */
#ifndef PEERDIRECT_TESTS_TCP_CACHE_H
#define PEERDIRECT_TESTS_TCP_CACHE_H

#include <stdio.h>
#include <string.h>

struct tcp_cache {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	pd_regcache *cache;
	pd_domain *dom;
};

/* Opens the domain and attaches a new cache to it: 0, or 1 after printing "FAIL - ...". */
static int tcp_cache_open(struct tcp_cache *t)
{
	struct fi_info *hints = fi_allocinfo();
	int err = 0;

	memset(t, 0, sizeof(*t));
	if (!hints) {
		printf("FAIL - fi_allocinfo\n");
		return 1;
	}
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	if (fi_getinfo(FI_VERSION(1, 20), "127.0.0.1", NULL, FI_SOURCE, hints, &t->info) ||
	    fi_fabric(t->info->fabric_attr, &t->fabric, NULL) ||
	    fi_domain(t->fabric, t->info, &t->domain, NULL)) {
		fi_freeinfo(hints);
		printf("FAIL - opening tcp\n");
		return 1;
	}
	fi_freeinfo(hints);
	t->cache = pd_regcache_new(&err);
	if (!t->cache || !(t->dom = pd_domain_attach(t->cache, t->domain, &err))) {
		printf("FAIL - pd_regcache_new / pd_domain_attach : %s (%s)\n", pd_strerror(err),
		       pd_last_error());
		return 1;
	}
	return 0;
}

/*
 * Detaches the domain's handle (the cache freed first, or not) and closes the domain; what
 * pd_domain_detach() returned.
 */
static int tcp_cache_close(struct tcp_cache *t)
{
	int detached = pd_domain_detach(t->dom);

	fi_close(&t->domain->fid);
	fi_close(&t->fabric->fid);
	fi_freeinfo(t->info);
	return detached;
}

#endif

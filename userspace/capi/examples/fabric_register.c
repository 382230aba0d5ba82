/*
 * fabric_register: registering HBM in a libfabric domain the program opened itself, through
 * the registration cache. Opens a provider's fabric and domain (fi_getinfo, fi_fabric,
 * fi_domain; tcp on 127.0.0.1 unless a provider, and optionally a node, are given),
 * allocates 4 MiB of HBM on /dev/peerdirect0, registers it twice with pd_register (the second
 * request, a part of the first, is a cache hit, its handle made in the program's
 * pd_mr_storage with pd_register_in: no allocation), prints the path and key and what a peer's
 * fi_read would use (pd_mr_remote), frees the allocation (which drops the cache entry first:
 * the cache's invalidations count it), releases everything and closes the domain. Exit
 * status 0 iff all of it worked.
 *
 * A provider that refuses dma-bufs (verbs on soft-RoCE) makes the first pd_register fail with
 * -EOPNOTSUPP: host bounce is off by default. The program then turns it on
 * (pd_regcache_set_host_bounce), as a caller that copies through the staging buffer would,
 * and checks that the registration says so: path host_bounce, a reason, a staging buffer,
 * and no RMA address.
 *
 * A second cache registers the same memory in the same domain while the first registration is
 * held: its key must differ (providers without FI_MR_PROV_KEY, like tcp, take the keys the
 * library requests, which must be unique in the domain).
 *
 * Last, a dma-buf exported by something else (a udmabuf of this program's memory, standing
 * in for habanalabs' own export) goes through pd_register_dmabuf: a miss, then a hit inside
 * it, and pd_regcache_invalidate_dmabuf drops it.
 *
 * Along the way: the domain is named by a pd_domain handle (pd_domain_attach); a second
 * handle on the same domain pointer registers anew (handles, not addresses, name domains), and
 * cannot be detached, nor name an endpoint, while one of its registrations is held (-EBUSY,
 * which drops nothing: no invalidation heard, the entry still cached; released, the detach
 * drops it). pd_mr_local gives the
 * local address of a registration, checked against a mapping of the same HBM by content. An
 * invalidation callback records every registration whose memory or domain goes: the program
 * checks each event (key, cause, held, domain handle, local address and length).
 *
 *   cc -o fabric_register fabric_register.c $(pkg-config --cflags --libs peerdirect libfabric)
 *   ./fabric_register ['verbs;ofi_rxm' [node]]
 */
#define _GNU_SOURCE /* strdup, memfd_create, F_ADD_SEALS */
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
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#define LENGTH (4u << 20)

static int pd_fail(const char *what, int err)
{
	fprintf(stderr, "fabric_register: %s: %s (%s)\n", what, pd_strerror(err), pd_last_error());
	return 1;
}

static int fi_fail(const char *what, int ret)
{
	fprintf(stderr, "fabric_register: %s: %s (%d)\n", what, fi_strerror(-ret), ret);
	return 1;
}

/* <linux/udmabuf.h> */
struct udmabuf_create {
	uint32_t memfd;
	uint32_t flags;
	uint64_t offset;
	uint64_t size;
};
#define UDMABUF_FLAGS_CLOEXEC 0x01
#define UDMABUF_CREATE _IOW('u', 0x42, struct udmabuf_create)

/* A dma-buf of `size` bytes of a new sealed memfd, from /dev/udmabuf; -1 with errno. */
static int udmabuf(uint64_t size)
{
	struct udmabuf_create create = { .flags = UDMABUF_FLAGS_CLOEXEC, .size = size };
	int dev, memfd, fd = -1;

	memfd = memfd_create("fabric_register", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (memfd < 0)
		return -1;
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev >= 0 && ftruncate(memfd, (off_t)size) == 0 &&
	    fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) {
		create.memfd = (uint32_t)memfd;
		fd = ioctl(dev, UDMABUF_CREATE, &create);
	}
	if (dev >= 0)
		close(dev);
	close(memfd);
	return fd;
}

/* What the invalidation callback heard. */
struct heard {
	unsigned count;
	struct pd_invalidation events[16];
};

static void on_invalidate(void *ctx, const struct pd_invalidation *invalidation)
{
	struct heard *heard = ctx;

	if (heard->count < 16)
		heard->events[heard->count] = *invalidation;
	heard->count++;
}

static const char *cause_name(uint32_t cause)
{
	switch (cause) {
	case PD_INVALIDATED_MEMORY:
		return "memory";
	case PD_INVALIDATED_DEVICE:
		return "device";
	case PD_INVALIDATED_DOMAIN:
		return "domain";
	default:
		return "unknown";
	}
}

/*
 * Whether the callback heard exactly one event since `*seen` events, with this cause, key,
 * held flag and domain handle, and (when addr is not NULL) local address and length; prints it.
 */
static int heard_one(struct heard *heard, unsigned *seen, uint32_t cause, uint64_t key,
		     uint32_t held, const pd_domain *domain, const void *addr, uint64_t length)
{
	const struct pd_invalidation *e = &heard->events[*seen < 16 ? *seen : 15];
	int good = heard->count == *seen + 1 && e->cause == cause && e->key == key &&
		   e->held == held && e->domain == domain && (!addr || (e->addr == addr && e->length == length));

	if (heard->count > *seen && *seen < 16)
		printf("invalidated: cause %s, key %#" PRIx64 ", held %u, %s domain, %" PRIu64
		       " bytes%s\n",
		       cause_name(e->cause), e->key, e->held, e->domain == domain ? "its" : "another",
		       e->length, e->addr ? " at its local address" : "");
	if (!good)
		fprintf(stderr, "fabric_register: heard %u invalidation(s) after %u, expected one: cause %s, key %#" PRIx64 ", held %u\n",
			heard->count, *seen, cause_name(cause), key, held);
	*seen = heard->count;
	return good;
}

static const char *path_name(uint32_t path)
{
	switch (path) {
	case PD_PATH_DMABUF:
		return "dmabuf";
	case PD_PATH_HOST_BOUNCE:
		return "host_bounce";
	case PD_PATH_PEERMEM_VA:
		return "peermem_va";
	default:
		return "unknown";
	}
}

static void print_mr(const char *name, const pd_mr *mr)
{
	const char *reason = pd_mr_reason(mr);

	printf("%s: path %s, key %#" PRIx64 ", desc %p, offset in mr %" PRIu64 "%s%s\n", name,
	       path_name(pd_mr_path(mr)), pd_mr_key(mr), pd_mr_desc(mr), pd_mr_offset(mr),
	       reason ? ", reason: " : "", reason ? reason : "");
}

static void print_stats(const char *when, const struct pd_regcache_stats *s)
{
	printf("cache %s: hits %" PRIu64 ", misses %" PRIu64 ", registrations %" PRIu64
	       ", deregistrations %" PRIu64 ", invalidations %" PRIu64 ", entries %" PRIu64 "\n",
	       when, s->hits, s->misses, s->registrations, s->deregistrations, s->invalidations,
	       s->entries);
}

int main(int argc, char **argv)
{
	const char *provider = argc > 1 ? argv[1] : "tcp";
	const char *node = argc > 1 ? (argc > 2 ? argv[2] : NULL) : "127.0.0.1";
	void *staging;
	uint64_t staging_len;
	int bounce = 0;
	struct fi_info *hints, *info = NULL;
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	struct pd_regcache_stats stats;
	uint64_t whole_addr, whole_key, part_addr, part_key, foreign_key;
	int virt_addr;
	pd_device *dev = NULL;
	pd_allocation *alloc = NULL;
	pd_regcache *cache = NULL, *cache2 = NULL;
	pd_domain *dom = NULL, *dom2 = NULL, *again = NULL;
	pd_mr *whole = NULL, *part = NULL, *other = NULL, *foreign = NULL, *inside = NULL;
	pd_mr_storage part_storage;
	pd_mr *anew = NULL;
	uint64_t key_anew = 0;
	struct heard heard = { 0 };
	unsigned seen = 0;
	void *whole_local = NULL, *part_local = NULL;
	uint64_t whole_len = 0, part_len = 0;
	int export_fd = -1;
	unsigned char *view = MAP_FAILED;
	unsigned char saved[4096];
	int same;
	int foreign_fd = -1;
	int err, ret, status = 1;

	/* libfabric, opened by the program: tcp, thread safe, the MR modes it asks for. */
	hints = fi_allocinfo();
	if (!hints)
		return fi_fail("fi_allocinfo", -FI_ENOMEM);
	hints->fabric_attr->prov_name = strdup(provider);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	ret = fi_getinfo(FI_VERSION(1, 20), node, NULL, node ? FI_SOURCE : 0, hints, &info);
	fi_freeinfo(hints);
	if (ret)
		return fi_fail("fi_getinfo", ret);
	ret = fi_fabric(info->fabric_attr, &fabric, NULL);
	if (ret) {
		fi_fail("fi_fabric", ret);
		goto out;
	}
	ret = fi_domain(fabric, info, &domain, NULL);
	if (ret) {
		fi_fail("fi_domain", ret);
		goto out;
	}
	printf("libfabric %u.%u: provider %s, domain %s\n", FI_MAJOR(fi_version()),
	       FI_MINOR(fi_version()), info->fabric_attr->prov_name, info->domain_attr->name);

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
	printf("allocated %u bytes at HBM offset %#" PRIx64 "\n", LENGTH,
	       pd_allocation_hbm_offset(alloc));

	cache = pd_regcache_new(&err);
	if (!cache) {
		pd_fail("pd_regcache_new", err);
		goto out;
	}
	err = pd_regcache_set_invalidate_callback(cache, on_invalidate, &heard);
	if (err) {
		pd_fail("pd_regcache_set_invalidate_callback", err);
		goto out;
	}
	dom = pd_domain_attach(cache, domain, &err);
	if (!dom) {
		pd_fail("pd_domain_attach", err);
		goto out;
	}
#define ALL_ACCESS                                                                          \
	(PD_ACCESS_LOCAL_READ | PD_ACCESS_LOCAL_WRITE | PD_ACCESS_REMOTE_READ |                   \
	 PD_ACCESS_REMOTE_WRITE)
	err = pd_register(dom, alloc, 0, 0, ALL_ACCESS, &whole);
	if (err == -EOPNOTSUPP) {
		/* The provider refuses dma-bufs: host bounce only when asked for. */
		printf("refused without host bounce: %s\n", pd_last_error());
		/* Refused by its fd alone at an address of the runtime's, it binds nothing: no
		 * dma-buf left at that address, and asking again is refused the same way (in a
		 * cache of its own, so that the counts checked below stay this one's). */
		{
			void *at = (void *)(uintptr_t)0x600000000000u;
			int fd = -1, first, lookup, again, bounced;
			char why[1024];
			pd_regcache *own = pd_regcache_new(&err);
			pd_domain *in_own = own ? pd_domain_attach(own, domain, &err) : NULL;
			pd_mr *none = NULL;

			if (!in_own || (err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR,
							&fd))) {
				pd_fail("a cache of its own, and pd_export", err);
				pd_regcache_free(own);
				goto out;
			}
			first = pd_register_dmabuf_at(in_own, fd, 0, 0, at, ALL_ACCESS, &none);
			lookup = pd_register_addr(in_own, at, 4096, ALL_ACCESS, &none);
			again = pd_register_dmabuf_at(in_own, fd, 0, 0, at, ALL_ACCESS, &none);
			/* Host bounce copies through a mapping, which a dma-buf at an address has not:
			 * on, it is refused all the same, saying so (not to turn host bounce on). */
			pd_regcache_set_host_bounce(own, 1);
			bounced = pd_register_dmabuf_at(in_own, fd, 0, 0, at, ALL_ACCESS, &none);
			snprintf(why, sizeof(why), "%s", pd_last_error());
			close(fd);
			pd_domain_detach(in_own);
			pd_regcache_free(own);
			if (first != -EOPNOTSUPP || lookup != -ENOENT || again != -EOPNOTSUPP) {
				fprintf(stderr, "fabric_register: by fd alone: %d, then a lookup %d and "
						"again %d; expected EOPNOTSUPP, ENOENT, EOPNOTSUPP (%s)\n",
					first, lookup, again, pd_last_error());
				goto out;
			}
			if (bounced != -EOPNOTSUPP || !strstr(why, "host bounce is on") ||
			    strstr(why, "pd_regcache_set_host_bounce(cache, 1)")) {
				fprintf(stderr, "fabric_register: by fd alone with host bounce on: %d (%s); "
						"expected EOPNOTSUPP saying host bounce cannot serve it\n",
					bounced, why);
				goto out;
			}
			printf("refused by fd alone too, binding nothing: a lookup there ENOENT, "
			       "asked again EOPNOTSUPP\n");
			printf("refused by fd alone with host bounce on: %s\n", why);
		}
		bounce = 1;
		err = pd_regcache_set_host_bounce(cache, 1);
		if (err) {
			pd_fail("pd_regcache_set_host_bounce", err);
			goto out;
		}
		err = pd_register(dom, alloc, 0, 0, ALL_ACCESS, &whole);
	}
	if (err) {
		pd_fail("pd_register(all of it)", err);
		goto out;
	}
	print_mr("registered 4194304 bytes", whole);
	staging = pd_mr_staging(whole, &staging_len);
	if (bounce != (pd_mr_path(whole) == PD_PATH_HOST_BOUNCE) || bounce != (staging != NULL) ||
	    bounce != (staging_len > 0) || bounce != (pd_mr_reason(whole) != NULL)) {
		fprintf(stderr, "fabric_register: a host-bounce registration %s\n",
			bounce ? "does not say so" : "was handed out without being asked for");
		goto out;
	}
	if (bounce) {
		/* The caller's side of host bounce: copies through the staging buffer. */
		memset(staging, 0x5a, staging_len);
		printf("staging: %" PRIu64 " bytes, written by the program\n", staging_len);
	}
	err = pd_register_in(dom, alloc, 1u << 20, 4096, PD_ACCESS_REMOTE_WRITE, &part_storage,
			     &part);
	if (err) {
		pd_fail("pd_register_in(4096 bytes at 1 MiB)", err);
		goto out;
	}
	print_mr("registered 4096 bytes at 1 MiB", part);
	if (part != (pd_mr *)&part_storage) {
		fprintf(stderr, "fabric_register: pd_register_in's handle is not in its storage\n");
		goto out;
	}
	if (pd_mr_key(part) != pd_mr_key(whole) || pd_mr_offset(part) != 1u << 20) {
		fprintf(stderr, "fabric_register: the second registration is not the first one\n");
		goto out;
	}
	/* The local address of each: what fi_tsend/fi_trecv take with pd_mr_desc(). */
	if (bounce) {
		err = pd_mr_local(whole, &whole_local, &whole_len);
		if (err != -EOPNOTSUPP) {
			fprintf(stderr, "fabric_register: pd_mr_local of a host bounce gave %d\n", err);
			goto out;
		}
		printf("local: refused for host bounce (%s)\n", pd_last_error());
	} else {
		if ((err = pd_mr_local(whole, &whole_local, &whole_len)) ||
		    (err = pd_mr_local(part, &part_local, &part_len))) {
			pd_fail("pd_mr_local", err);
			goto out;
		}
		/* The same HBM through an export of the program's own: a pattern written there is
		 * what the registration's local address reads. */
		err = pd_export(alloc, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &export_fd);
		if (err) {
			pd_fail("pd_export", err);
			goto out;
		}
		view = mmap(NULL, LENGTH, PROT_READ | PROT_WRITE, MAP_SHARED, export_fd, 0);
		if (view == MAP_FAILED) {
			perror("fabric_register: mmap of an export");
			goto out;
		}
		/* Put back afterwards: what was in HBM before is someone else's to check. */
		memcpy(saved, view + (1u << 20), sizeof(saved));
		for (unsigned i = 0; i < 4096; i++)
			view[(1u << 20) + i] = (unsigned char)(i * 7 + 3);
		same = memcmp(part_local, view + (1u << 20), 4096) == 0;
		memcpy(view + (1u << 20), saved, sizeof(saved));
		if (whole_len != LENGTH || part_len != 4096 ||
		    (char *)part_local - (char *)whole_local != 1u << 20 || !same) {
			fprintf(stderr, "fabric_register: pd_mr_local gave the wrong address or length\n");
			goto out;
		}
		printf("local: %" PRIu64 " bytes at the whole's address, %" PRIu64
		       " at +1048576 of it, which reads what an export of the same HBM wrote\n",
		       whole_len, part_len);
	}
	if (pd_mr_local(part, NULL, &part_len) != -EINVAL) {
		fprintf(stderr, "fabric_register: pd_mr_local with a NULL addr did not fail\n");
		goto out;
	}
	/* A second handle on the same domain pointer is a domain of its own: it registers anew,
	 * and cannot go while one of its registrations is held. */
	again = pd_domain_attach(cache, domain, &err);
	if (!again) {
		pd_fail("pd_domain_attach(again)", err);
		goto out;
	}
	err = pd_register(again, alloc, 0, 0, ALL_ACCESS, &anew);
	if (err) {
		pd_fail("pd_register(second handle)", err);
		goto out;
	}
	printf("second handle, same domain pointer: key %#" PRIx64 " (first %#" PRIx64 ")\n",
	       pd_mr_key(anew), pd_mr_key(whole));
	if (pd_mr_key(anew) == pd_mr_key(whole)) {
		fprintf(stderr, "fabric_register: a second handle got the first one's registration\n");
		goto out;
	}
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_fail("pd_regcache_stats", err);
		goto out;
	}
	ret = pd_domain_detach(again);
	if (ret != -EBUSY) {
		fprintf(stderr, "fabric_register: detaching with a held registration gave %d\n", ret);
		goto out;
	}
	printf("detach while held: %s\n", pd_last_error());
	/* Refused, it dropped nothing: the callback heard nothing, the entry is still cached. */
	{
		struct pd_regcache_stats after;

		if ((err = pd_regcache_stats(cache, &after))) {
			pd_fail("pd_regcache_stats", err);
			goto out;
		}
		if (heard.count != seen || after.entries != stats.entries ||
		    after.invalidations != stats.invalidations) {
			fprintf(stderr, "fabric_register: the refused detach dropped something: %u "
					"invalidation(s) heard, entries %" PRIu64 " -> %" PRIu64 "\n",
				heard.count - seen, stats.entries, after.entries);
			goto out;
		}
		printf("refused detach dropped nothing: no invalidation heard, %" PRIu64
		       " entries cached as before\n",
		       after.entries);
		/* Naming an endpoint is refused the same way: the registration held is bound to
		 * none. (Only a pointer is stored until a registration binds to it: none does.) */
		ret = pd_domain_set_endpoint(again, (struct fid_ep *)&after);
		if (ret != -EBUSY || pd_regcache_stats(cache, &after) || heard.count != seen ||
		    after.entries != stats.entries || after.invalidations != stats.invalidations) {
			fprintf(stderr, "fabric_register: pd_domain_set_endpoint with a registration "
					"held gave %d, %u invalidation(s) heard, entries %" PRIu64
					" -> %" PRIu64 "\n",
				ret, heard.count - seen, stats.entries, after.entries);
			goto out;
		}
		printf("refused endpoint dropped nothing: %s\n", pd_last_error());
	}
	key_anew = pd_mr_key(anew);
	pd_mr_release(anew);
	anew = NULL;
	ret = pd_domain_detach(again);
	if (ret != 1) {
		fprintf(stderr, "fabric_register: detaching the second handle gave %d (%s)\n", ret,
			ret < 0 ? pd_last_error() : "expected 1 entry");
		goto out;
	}
	if (!heard_one(&heard, &seen, PD_INVALIDATED_DOMAIN, key_anew, 0, again, NULL, 0))
		goto out;
	again = NULL;
	/* Another cache, the same domain and memory, while the first registration is held. */
	cache2 = pd_regcache_new(&err);
	if (!cache2) {
		pd_fail("pd_regcache_new(second)", err);
		goto out;
	}
	if (bounce && (err = pd_regcache_set_host_bounce(cache2, 1))) {
		pd_fail("pd_regcache_set_host_bounce(second)", err);
		goto out;
	}
	dom2 = pd_domain_attach(cache2, domain, &err);
	if (!dom2) {
		pd_fail("pd_domain_attach(second cache)", err);
		goto out;
	}
	err = pd_register(dom2, alloc, 0, 0, ALL_ACCESS, &other);
	if (err) {
		pd_fail("pd_register(second cache, same domain)", err);
		goto out;
	}
	printf("second cache, same domain: key %#" PRIx64 " (first %#" PRIx64 ")\n",
	       pd_mr_key(other), pd_mr_key(whole));
	if (pd_mr_key(other) == pd_mr_key(whole)) {
		fprintf(stderr, "fabric_register: two registrations in one domain share a key\n");
		goto out;
	}
	/* The second cache freed first, its registration held: its domain handle stays, and
	 * is detached once the handle is released. */
	pd_regcache_free(cache2);
	cache2 = NULL;
	if ((ret = pd_domain_detach(dom2)) != -EBUSY ||
	    !strstr(pd_last_error(), "still held by pd_mr handles")) {
		fprintf(stderr, "fabric_register: detaching a freed cache's domain with a handle "
				"held gave %d (%s), not -EBUSY saying it is held\n",
			ret, pd_last_error());
		goto out;
	}
	pd_mr_release(other);
	other = NULL;
	if ((ret = pd_domain_detach(dom2)) != 0) {
		fprintf(stderr, "fabric_register: detaching the second cache's domain gave %d\n", ret);
		goto out;
	}
	dom2 = NULL;
	printf("second cache freed with its registration held: detach EBUSY until the handle is "
	       "released, then 0\n");
	/* What a peer puts in fi_read/fi_write: addresses are virtual under FI_MR_VIRT_ADDR. */
	virt_addr = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
	if (bounce) {
		err = pd_mr_remote(whole, virt_addr, &whole_addr, &whole_key);
		if (err != -EOPNOTSUPP) {
			fprintf(stderr, "fabric_register: pd_mr_remote of a host bounce gave %d\n", err);
			goto out;
		}
		printf("rma: refused for host bounce (%s)\n", pd_last_error());
	} else if ((err = pd_mr_remote(whole, virt_addr, &whole_addr, &whole_key)) ||
	    (err = pd_mr_remote(part, virt_addr, &part_addr, &part_key))) {
		pd_fail("pd_mr_remote", err);
		goto out;
	} else {
		printf("rma: FI_MR_VIRT_ADDR %d, whole at %#" PRIx64 ", the part at %#" PRIx64
		       " (+%" PRIu64 "), key %#" PRIx64 "\n",
		       virt_addr, whole_addr, part_addr, part_addr - whole_addr, part_key);
		if (part_key != pd_mr_key(part) || whole_key != part_key ||
		    part_addr - whole_addr != 1u << 20 || (!virt_addr && whole_addr != 0)) {
			fprintf(stderr, "fabric_register: pd_mr_remote gave the wrong address or key\n");
			goto out;
		}
	}
	if (pd_mr_remote(part, virt_addr, NULL, &part_key) != -EINVAL) {
		fprintf(stderr, "fabric_register: pd_mr_remote with a NULL addr did not fail\n");
		goto out;
	}
	whole_key = pd_mr_key(whole);
	pd_mr_release(whole);
	pd_mr_release(part);
	whole = part = NULL;
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_fail("pd_regcache_stats", err);
		goto out;
	}
	print_stats("after registering", &stats);
	/* The second handle's registration was a miss, and the refused one too. */
	if (stats.hits != 1 || stats.misses != 2u + bounce || stats.entries != 1) {
		fprintf(stderr, "fabric_register: expected 1 hit, %d misses, 1 entry\n", 2 + bounce);
		goto out;
	}

	/* Freeing the allocation drops its registration from the cache first. */
	err = pd_allocation_free(alloc);
	alloc = NULL;
	if (err) {
		pd_fail("pd_allocation_free", err);
		goto out;
	}
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_fail("pd_regcache_stats", err);
		goto out;
	}
	print_stats("after freeing", &stats);
	if (stats.invalidations != 2 || stats.entries != 0 ||
	    stats.deregistrations != stats.registrations) {
		fprintf(stderr, "fabric_register: freeing did not invalidate the cached registration\n");
		goto out;
	}
	/* The callback heard of it, with what a runtime needs to take the key back. */
	if (!heard_one(&heard, &seen, PD_INVALIDATED_MEMORY, whole_key, 0, dom, whole_local,
		       whole_len))
		goto out;
	/* A dma-buf exported by something else: a miss, a hit inside it, invalidated on request. */
	foreign_fd = udmabuf(LENGTH);
	if (foreign_fd < 0) {
		perror("fabric_register: a udmabuf");
		goto out;
	}
	err = pd_register_dmabuf(dom, foreign_fd, 0, 0, ALL_ACCESS, &foreign);
	if (err) {
		pd_fail("pd_register_dmabuf(udmabuf)", err);
		goto out;
	}
	print_mr("foreign dma-buf, 4194304 bytes", foreign);
	err = pd_register_dmabuf(dom, foreign_fd, 1u << 20, 4096, PD_ACCESS_REMOTE_WRITE,
				 &inside);
	if (err) {
		pd_fail("pd_register_dmabuf(4096 bytes at 1 MiB of it)", err);
		goto out;
	}
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_fail("pd_regcache_stats", err);
		goto out;
	}
	print_stats("after the foreign dma-buf", &stats);
	if (pd_mr_key(inside) != pd_mr_key(foreign) || pd_mr_offset(inside) != 1u << 20 ||
	    stats.hits != 2 || stats.entries != 1) {
		fprintf(stderr, "fabric_register: the second foreign request was not a hit\n");
		goto out;
	}
	foreign_key = pd_mr_key(foreign);
	pd_mr_release(foreign);
	pd_mr_release(inside);
	foreign = inside = NULL;
	ret = pd_regcache_invalidate_dmabuf(cache, foreign_fd);
	if (ret != 1) {
		fprintf(stderr, "fabric_register: pd_regcache_invalidate_dmabuf dropped %d entries (%s)\n",
			ret, ret < 0 ? pd_last_error() : "expected 1");
		goto out;
	}
	if ((err = pd_regcache_stats(cache, &stats))) {
		pd_fail("pd_regcache_stats", err);
		goto out;
	}
	print_stats("after invalidating it", &stats);
	if (stats.entries != 0 || stats.deregistrations != stats.registrations) {
		fprintf(stderr, "fabric_register: invalidating the foreign dma-buf left a registration\n");
		goto out;
	}
	if (!heard_one(&heard, &seen, PD_INVALIDATED_MEMORY, foreign_key, 0, dom, NULL, 0))
		goto out;
	ret = pd_domain_detach(dom);
	if (ret != 0) {
		fprintf(stderr, "fabric_register: detaching the domain gave %d\n", ret);
		goto out;
	}
	dom = NULL;
	printf("detached: %u invalidations heard in all\n", heard.count);
	status = 0;
out:
	pd_mr_release(foreign);
	pd_mr_release(inside);
	if (foreign_fd >= 0)
		close(foreign_fd);
	if (view != MAP_FAILED)
		munmap(view, LENGTH);
	if (export_fd >= 0)
		close(export_fd);
	pd_mr_release(other);
	pd_mr_release(anew);
	pd_domain_detach(again);
	pd_domain_detach(dom2);
	pd_regcache_free(cache2);
	pd_mr_release(whole);
	pd_mr_release(part);
	pd_allocation_free(alloc);
	/* Only once nothing of the domain is registered any more: then close it. */
	pd_domain_detach(dom);
	pd_regcache_free(cache);
	pd_device_close(dev);
	if (domain && (ret = fi_close(&domain->fid)))
		status = fi_fail("fi_close(domain)", ret);
	if (fabric && (ret = fi_close(&fabric->fid)))
		status = fi_fail("fi_close(fabric)", ret);
	fi_freeinfo(info);
	if (status == 0)
		printf("closed: the domain after every registration in it\n");
	return status;
}

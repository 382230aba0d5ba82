/*
 * Calls every function of peerdirect.h through the real libpeerdirect.so on a host without
 * peerdirect devices: the failure paths, their errnos and messages. Prints one line per
 * failed check; exit status 0 iff all passed.
 *   c_program REGULAR_FILE
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <peerdirect.h>

static int failed;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		if (!(cond)) {                                                       \
			printf("FAILED line %d: %s (last error: %s)\n", __LINE__, #cond, \
			       pd_last_error());                                      \
			failed = 1;                                                  \
		}                                                                    \
	} while (0)

static int contains(const char *haystack, const char *needle)
{
	return haystack && strstr(haystack, needle) != NULL;
}

int main(int argc, char **argv)
{
	int err = 12345;
	uint64_t u64 = 0;
	pd_device *dev;
	pd_allocation *alloc = (pd_allocation *)&err; /* must be left alone on failure */
	struct pd_device_info info;
	struct pd_stats stats;
	int fd = -7;

	if (argc != 2)
		return 2;

	CHECK(strcmp(pd_last_error(), "") == 0);
	CHECK(strcmp(pd_version(), "0.1.0") == 0);
	CHECK(strcmp(pd_strerror(-ENOENT), "No such file or directory") == 0);
	CHECK(strcmp(pd_strerror(ENOMEM), "Cannot allocate memory") == 0);

	/* No /dev/peerdirect4095 on the host. */
	CHECK(pd_device_open(4095, &err) == NULL);
	CHECK(err == -ENOENT);
	CHECK(contains(pd_last_error(), "open /dev/peerdirect4095: "));
	CHECK(contains(pd_last_error(), "is peerdirect.ko loaded and the HBM device bound?"));
	CHECK(pd_device_open(4095, NULL) == NULL);

	CHECK(pd_device_open_path(NULL, &err) == NULL);
	CHECK(err == -EINVAL);
	CHECK(strcmp(pd_last_error(), "pd_device_open_path: path is NULL; pass a valid pointer") == 0);

	/* A regular file opens, but is no peerdirect device: its ioctls fail with ENOTTY. */
	dev = pd_device_open_path(argv[1], &err);
	CHECK(dev != NULL);
	CHECK(err == 0);
	CHECK(pd_device_info(dev, &info) == -ENOTTY);
	CHECK(contains(pd_last_error(), "PEERDIRECT_IOC_INFO on "));
	CHECK(contains(pd_last_error(), "not a peerdirect device"));
	CHECK(pd_device_info(dev, NULL) == -EINVAL);
	CHECK(pd_device_info(NULL, &info) == -EINVAL);
	CHECK(strcmp(pd_last_error(), "pd_device_info: dev is NULL; pass a valid pointer") == 0);

	CHECK(pd_alloc(dev, 4096, 0, &alloc) == -ENOTTY);
	CHECK(alloc == (pd_allocation *)&err);
	CHECK(contains(pd_last_error(), "PEERDIRECT_IOC_ALLOC on "));
	CHECK(pd_alloc(dev, 4096, 0, NULL) == -EINVAL);
	CHECK(pd_alloc(NULL, 4096, 0, &alloc) == -EINVAL);

	/* Ranges of a companion's BAR: arguments are checked before the ioctl, which the
	 * regular file then refuses. fd_out is left alone on failure. */
	CHECK(pd_export_range(dev, 0, 4096, PD_EXPORT_RDWR, &fd) == -ENOTTY);
	CHECK(fd == -7);
	CHECK(contains(pd_last_error(), "PEERDIRECT_IOC_EXPORT_RANGE on "));
	CHECK(pd_export_range(NULL, 0, 4096, PD_EXPORT_RDWR, &fd) == -EINVAL);
	CHECK(strcmp(pd_last_error(), "pd_export_range: dev is NULL; pass a valid pointer") == 0);
	CHECK(pd_export_range(dev, 0, 4096, PD_EXPORT_RDWR, NULL) == -EINVAL);
	CHECK(strcmp(pd_last_error(), "pd_export_range: fd_out is NULL; pass a valid pointer") == 0);
	CHECK(pd_export_range(dev, 0, 4096, PD_EXPORT_RDWR | 0x4u, &fd) == -EINVAL);
	CHECK(strcmp(pd_last_error(), "pd_export_range: unknown flags 0x4; only PD_EXPORT_CLOEXEC "
				      "and PD_EXPORT_RDWR exist") == 0);
	CHECK(fd == -7);
	pd_device_close(dev);
	pd_device_close(NULL);

	CHECK(pd_export(NULL, 0, 0, PD_EXPORT_RDWR, &fd) == -EINVAL);
	CHECK(fd == -7);
	CHECK(contains(pd_last_error(), "pd_export: alloc is NULL"));
	CHECK(pd_allocation_free(NULL) == 0);
	CHECK(pd_allocation_length(NULL) == 0);
	CHECK(pd_allocation_hbm_offset(NULL) == 0);
	CHECK(pd_allocation_handle(NULL) == 0);

	CHECK(pd_stats(4095, NULL) == -EINVAL);
	CHECK(pd_stats(4095, &stats) < 0);
	CHECK(contains(pd_last_error(), "/sys/kernel/debug"));

	/* The registration cache: limits from the environment, NULL checks, empty stats. */
	{
		struct pd_regcache_stats cstats;
		pd_regcache *cache;
		pd_mr *mr = (pd_mr *)&err;
		pd_domain *dom;
		void *ptr;
		struct fid_domain *domain = (struct fid_domain *)&cstats; /* never dereferenced */

		CHECK(setenv("PEERDIRECT_MR_CACHE_MAX_COUNT", "many", 1) == 0);
		CHECK(pd_regcache_new(&err) == NULL);
		CHECK(err == -EINVAL);
		CHECK(contains(pd_last_error(), "PEERDIRECT_MR_CACHE_MAX_COUNT"));
		CHECK(setenv("PEERDIRECT_MR_CACHE_MAX_COUNT", "16", 1) == 0);
		cache = pd_regcache_new(&err);
		CHECK(cache != NULL);
		CHECK(err == 0);
		CHECK(pd_regcache_stats(cache, &cstats) == 0);
		CHECK(cstats.max_count == 16 && cstats.entries == 0 && cstats.invalidations == 0);
		CHECK(pd_regcache_stats(cache, NULL) == -EINVAL);
		CHECK(pd_regcache_stats(NULL, &cstats) == -EINVAL);
		/* Domains: NULL arguments; without libfabric on this host, attaching says so. */
		CHECK(pd_domain_attach(NULL, domain, &err) == NULL && err == -EINVAL);
		CHECK(pd_domain_attach(cache, NULL, &err) == NULL && err == -EINVAL);
		CHECK(strcmp(pd_last_error(), "pd_domain_attach: domain is NULL; pass a valid pointer") == 0);
		dom = pd_domain_attach(cache, domain, &err);
		if (dom) {
			CHECK(err == 0);
			/* No registration yet: the endpoint is only noted, never called. */
			CHECK(pd_domain_set_endpoint(dom, (struct fid_ep *)&cstats) == 0);
			CHECK(pd_domain_set_endpoint(dom, NULL) == 0);
			CHECK(pd_domain_detach(dom) == 0);
		} else {
			CHECK(err == -ENOSYS);
			CHECK(contains(pd_last_error(), "libfabric"));
		}
		CHECK(pd_domain_detach(NULL) == 0);
		CHECK(pd_domain_attach_verbs(NULL, (struct ibv_pd *)domain, &err) == NULL &&
		      err == -EINVAL);
		CHECK(pd_domain_attach_verbs(cache, NULL, &err) == NULL && err == -EINVAL);
		CHECK(strcmp(pd_last_error(), "pd_domain_attach_verbs: pd is NULL; pass a valid pointer") == 0);
		CHECK(pd_mr_lkey(NULL) == 0);
		CHECK(pd_register(NULL, NULL, 0, 0, PD_ACCESS_LOCAL_READ, &mr) == -EINVAL);
		CHECK(strcmp(pd_last_error(), "pd_register: domain is NULL; pass a valid pointer") == 0);
		CHECK(mr == (pd_mr *)&err);
		{
			pd_mr_storage storage;

			CHECK(pd_register_in(NULL, NULL, 0, 0, PD_ACCESS_LOCAL_READ, &storage, &mr) ==
			      -EINVAL);
			CHECK(strcmp(pd_last_error(),
				     "pd_register_in: domain is NULL; pass a valid pointer") == 0);
			CHECK(pd_register_addr_in(NULL, &err, 4096, PD_ACCESS_LOCAL_READ, &storage,
						  &mr) == -EINVAL);
			CHECK(strcmp(pd_last_error(),
				     "pd_register_addr_in: domain is NULL; pass a valid pointer") == 0);
			CHECK(mr == (pd_mr *)&err);
		}
		/* A dma-buf exported elsewhere: not a dma-buf, NULL arguments. */
		{
			int file = open(argv[1], O_RDONLY);

			CHECK(file >= 0);
			CHECK(pd_regcache_invalidate_dmabuf(cache, file) == -EINVAL);
			CHECK(contains(pd_last_error(), "not a dma-buf"));
			close(file);
		}
		CHECK(pd_regcache_invalidate_dmabuf(cache, -1) == -EBADF);
		CHECK(pd_register_dmabuf(NULL, 0, 0, 0, PD_ACCESS_LOCAL_READ, &mr) == -EINVAL);
		CHECK(pd_register_export(NULL, NULL, 0, 0, 0, PD_ACCESS_LOCAL_READ, &mr) == -EINVAL);
		CHECK(contains(pd_last_error(), "pd_register_export"));
		CHECK(pd_regcache_invalidate_dmabuf(NULL, 0) == -EINVAL);
		CHECK(mr == (pd_mr *)&err);
		CHECK(pd_regcache_set_host_bounce(cache, 1) == 0);
		CHECK(pd_regcache_set_host_bounce(NULL, 1) == -EINVAL);
		CHECK(pd_regcache_set_invalidate_callback(NULL, NULL, NULL) == -EINVAL);
		CHECK(pd_domain_set_keys(NULL, NULL, NULL, NULL, 8) == -EINVAL);
		CHECK(contains(pd_last_error(), "pd_domain_set_keys: domain is NULL"));
		CHECK(pd_domain_set_iface(NULL, PD_IFACE_SYSTEM, 0) == -EINVAL);
		CHECK(pd_domain_set_endpoint(NULL, (struct fid_ep *)domain) == -EINVAL);
		CHECK(strcmp(pd_last_error(),
			     "pd_domain_set_endpoint: domain is NULL; pass a valid pointer") == 0);
		CHECK(pd_domain_set_endpoint(NULL, NULL) == -EINVAL);
		CHECK(pd_regcache_set_invalidate_callback(cache, NULL, NULL) == 0);
		CHECK(pd_mr_staging(NULL, &u64) == NULL && u64 == 0);
		CHECK(pd_mr_local(NULL, &ptr, &u64) == -EINVAL);
		CHECK(pd_mr_key(NULL) == 0);
		CHECK(pd_mr_desc(NULL) == NULL);
		CHECK(pd_mr_offset(NULL) == 0);
		CHECK(pd_mr_path(NULL) == 0);
		CHECK(pd_mr_reason(NULL) == NULL);
		CHECK(pd_mr_remote(NULL, 1, &u64, &u64) == -EINVAL);
		pd_mr_release(NULL);
		pd_regcache_free(cache);
		pd_regcache_free(NULL);
	}

	/*
	 * fork: the child's calls on its parent's handles fail with -ECHILD and release nothing
	 * of the parent's; handles the child makes itself work; the parent's are untouched.
	 */
	{
		struct pd_regcache_stats stats;
		pd_regcache *cache = pd_regcache_new(&err);
		int wstatus = -1;
		pid_t child;

		CHECK(cache != NULL);
		fflush(stdout);
		child = fork();
		if (child == 0) {
			pd_regcache *mine;
			int bad = 0;

			if (pd_regcache_stats(cache, &stats) != -ECHILD)
				bad |= 1;
			if (!contains(pd_last_error(),
				      "pd_regcache_stats: cache was made by the parent of this forked process"))
				bad |= 2;
			if (pd_regcache_set_invalidate_callback(cache, NULL, NULL) != -ECHILD)
				bad |= 4;
			pd_regcache_free(cache); /* left alone: the parent's */
			if (!contains(pd_last_error(), "pd_regcache_free: cache was made by the parent"))
				bad |= 8;
			mine = pd_regcache_new(&err);
			if (!mine || pd_regcache_stats(mine, &stats) != 0 || stats.entries != 0)
				bad |= 16;
			pd_regcache_free(mine);
			_exit(bad);
		}
		CHECK(child > 0);
		CHECK(waitpid(child, &wstatus, 0) == child);
		CHECK(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
		if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
			printf("FAILED: the forked child's checks %#x\n", WEXITSTATUS(wstatus));
		CHECK(pd_regcache_stats(cache, &stats) == 0);
		pd_regcache_free(cache);
	}

	return failed;
}

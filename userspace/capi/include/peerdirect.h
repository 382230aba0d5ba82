/*
 * peerdirect.h - C ABI of libpeerdirect: accelerator HBM exported as DMA-BUF for
 * peer-to-peer RDMA. Link with `pkg-config --cflags --libs peerdirect`.
 *
 * Conventions:
 * - Handles (pd_device, pd_allocation, pd_regcache, pd_domain, pd_mr) are opaque; the caller
 *   owns them and releases them with pd_device_close(), pd_allocation_free(),
 *   pd_regcache_free(), pd_domain_detach() and pd_mr_release().
 * - Functions returning int return 0 on success or a negative errno (-ENOENT, -ENOMEM, ...).
 *   On failure, pd_last_error() returns a message saying what was being done, on which
 *   device node, and what to do about it. The message is per thread.
 * - A NULL handle or a NULL output pointer is refused with -EINVAL. Every non-NULL pointer
 *   must be valid as described at each function; handles must not be used after they are
 *   released.
 * - A pd_device may be used from several threads at once; a pd_allocation too, except that
 *   freeing it must not race with other calls on it. So may a pd_regcache, a pd_domain (the
 *   libfabric domain attached must then be FI_THREAD_SAFE, as libfabric requires for calls
 *   from several threads; an ibverbs protection domain always is) and a pd_mr, except that
 *   pd_regcache_free(), pd_domain_detach() and pd_mr_release() must not race with other calls
 *   on the handle they release.
 * - fork: a handle belongs to the process that made it. In a forked child, calls on its
 *   parent's handles fail with -ECHILD (pd_last_error() says why) and the release functions
 *   leave them alone (closing them would close the parent's libfabric, ibverbs and peerdirect
 *   objects, and the library's threads did not survive the fork); the accessors that return what
 *   a handle holds (pd_mr_key(), pd_mr_desc(), pd_mr_offset(), pd_mr_path(), pd_allocation_*())
 *   still read it, while those that return an int (pd_mr_local(), pd_mr_remote(),
 *   pd_regcache_stats()) fail with -ECHILD too. Handles the child makes itself work. The
 *   library counts forks with pthread_atfork(): a child made without those handlers (glibc's
 *   _Fork(), a raw clone or fork system call), which POSIX allows only async-signal-safe
 *   calls anyway, is not told apart from its parent and must make no call of this library
 *   (one on the parent's handles would act on the parent's objects) before it execs.
 * - The library never aborts or unwinds into the caller: an internal error is -EIO with a
 *   message.
 */
#ifndef PEERDIRECT_H
#define PEERDIRECT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An open /dev/peerdirectN. */
typedef struct pd_device pd_device;
/* HBM allocated through a pd_device. */
typedef struct pd_allocation pd_allocation;

/* A registration cache (pd_regcache_new()). */
typedef struct pd_regcache pd_regcache;
/* A libfabric domain attached to a registration cache (pd_domain_attach()). */
typedef struct pd_domain pd_domain;
/* A registration handed out by pd_register(). */
typedef struct pd_mr pd_mr;
/* libfabric's domain (<rdma/fabric.h>); only ever passed by pointer. */
struct fid_domain;
/* libfabric's endpoint (<rdma/fabric.h>); only ever passed by pointer. */
struct fid_ep;
/* libibverbs' protection domain (<infiniband/verbs.h>); only ever passed by pointer. */
struct ibv_pd;

/* pd_export() flags. */
#define PD_EXPORT_CLOEXEC 0x1u /* the dma-buf fd is close-on-exec */
#define PD_EXPORT_RDWR 0x2u    /* the dma-buf may be mapped writable (else read-only) */

/* struct pd_device_info.provider: how peerdirect reaches the HBM. */
#define PD_PROVIDER_OWNED 1u /* peerdirect is the device's PCI driver and owns the BAR */
#define PD_PROVIDER_COMPANION 2u /* another driver owns the device; peerdirect serves its BAR */

/* What the module tells about one HBM device (pd_device_info()). */
struct pd_device_info {
	uint64_t hbm_bytes;     /* size of the HBM BAR */
	uint64_t hbm_bus_addr;  /* PCI bus address of the BAR: what a peer device DMAs to */
	uint64_t hbm_phys_addr; /* CPU physical address of the BAR */
	uint32_t index;         /* N of /dev/peerdirectN */
	uint32_t bar_index;     /* which BAR holds the HBM */
	int32_t numa_node;      /* -1: none */
	uint32_t pci_domain;    /* PCI address DDDD:BB:SS.F */
	uint8_t pci_bus;
	uint8_t pci_slot;
	uint8_t pci_func;
	uint8_t reserved0;      /* 0 */
	uint16_t vendor_id;
	uint16_t device_id;
	uint32_t provider;      /* PD_PROVIDER_* */
	uint32_t reserved1;     /* 0 */
};

/* pd_register() access: what the NIC may do with the memory. */
#define PD_ACCESS_LOCAL_READ 0x1u   /* local sends, RDMA write sources */
#define PD_ACCESS_LOCAL_WRITE 0x2u  /* local receives, RDMA read targets */
#define PD_ACCESS_REMOTE_READ 0x4u  /* peers' RDMA reads */
#define PD_ACCESS_REMOTE_WRITE 0x8u /* peers' RDMA writes */

/* pd_mr_path(): how a registration reaches HBM. */
#define PD_PATH_DMABUF 1u      /* the NIC was given the dma-buf (FI_MR_DMABUF): direct */
#define PD_PATH_HOST_BOUNCE 2u /* a host staging buffer; pd_mr_reason() says why */
#define PD_PATH_PEERMEM_VA 3u  /* a virtual address resolved by a peer-memory client */

/* struct pd_invalidation.cause: why a registration is invalidated. */
#define PD_INVALIDATED_MEMORY 1u /* its allocation is being freed, or its dma-buf invalidated */
#define PD_INVALIDATED_DEVICE 2u /* its device is gone: unbound, removed or reset (revoked) */
#define PD_INVALIDATED_DOMAIN 3u /* its domain is being detached */

/* A registration whose memory, device or domain goes (pd_regcache_set_invalidate_callback()). */
struct pd_invalidation {
	pd_domain *domain; /* the domain it is registered in */
	uint64_t key;      /* its fi_mr_key(): take it back from the peers that were given it */
	void *addr;        /* its local address, as pd_mr_local() gives it (ibverbs: the IOVA,
			      which may be 0); NULL for host bounce, whose length is 0 */
	uint64_t length;   /* its length in bytes (0 for host bounce) */
	uint32_t cause;    /* PD_INVALIDATED_* */
	uint32_t held;     /* 1: a pd_mr still holds it, registered until released; 0: it is
			      deregistered once the callback returns */
};

/*
 * Called once for each registration of a cache whose memory, device or domain goes, cached or
 * only held by pd_mr handles, before the cache lets go of it. Always on the cache's own
 * thread ("peerdirect-tell"), one call at a time, never on a thread that calls the library,
 * and outside the library's locks, so a lock the caller holds around pd_register() (or any
 * other call) may be taken by the callback:
 * - what a call discovers (pd_register() or a command finding the device removed or reset,
 *   the library's watcher seeing it) is told without that call waiting for the callback;
 * - pd_allocation_free(), pd_domain_detach(), pd_regcache_invalidate_dmabuf() and pd_regcache_free()
 *   return only once the callback has been told and the registrations no pd_mr holds are
 *   closed: do not call them holding a lock the callback takes.
 * It may call pd_mr_release(), pd_device_close(), pd_regcache_invalidate_dmabuf() and
 * pd_regcache_set_invalidate_callback(), but must not free the cache or detach a domain.
 */
typedef void (*pd_invalidate_fn)(void *ctx, const struct pd_invalidation *invalidation);

/* What a pd_regcache did so far, and holds now (pd_regcache_stats()). */
struct pd_regcache_stats {
	uint64_t hits;                 /* requests served by a cached registration */
	uint64_t misses;               /* requests that had to register */
	uint64_t registrations;        /* successful registrations */
	uint64_t failed_registrations; /* registrations the provider refused */
	uint64_t deregistrations;      /* registrations - deregistrations are alive */
	uint64_t evictions;            /* entries dropped as least recently used */
	uint64_t superseded;           /* entries dropped for a new one that contains them */
	uint64_t invalidations;        /* entries dropped because their allocation was freed,
					  their device revoked or their domain invalidated */
	uint64_t uncached;             /* registrations handed out without caching them */
	uint64_t entries;              /* entries cached now */
	uint64_t bytes;                /* bytes they cover */
	uint64_t max_count;            /* limit on entries (PEERDIRECT_MR_CACHE_MAX_COUNT) */
	uint64_t max_bytes;            /* limit on bytes (PEERDIRECT_MR_CACHE_MAX_SIZE) */
};

/* The module's counters for one device (pd_stats()). */
struct pd_stats {
	uint64_t allocations;     /* live ranges, freed ones that dma-bufs still hold included */
	uint64_t allocated_bytes; /* their bytes */
	uint64_t exports;         /* live dma-bufs */
	uint64_t hbm_bytes;       /* size of the HBM BAR */
};

/*
 * Opens /dev/peerdirect<index>. Returns the handle, or NULL with the negative errno in *err
 * (-ENOENT: no such device; is peerdirect.ko loaded and the device bound?). On success *err
 * is 0. err may be NULL.
 */
pd_device *pd_device_open(unsigned index, int *err);

/* Like pd_device_open(), for the device node at path (a NUL-terminated string). */
pd_device *pd_device_open_path(const char *path, int *err);

/*
 * Releases the handle; NULL is ignored. Allocations made through it stay valid: the device
 * file is closed once the handle is closed and all of them are freed.
 */
void pd_device_close(pd_device *dev);

/* Fills *info (PEERDIRECT_IOC_INFO). */
int pd_device_info(const pd_device *dev, struct pd_device_info *info);

/*
 * Allocates length bytes of HBM, rounded up to the page size, aligned to align in the BAR
 * (0: the module's default, 2 MiB; else a power of two of at least the page size). Stores
 * the new handle in *out. -ENOMEM: HBM full or too fragmented.
 */
int pd_alloc(pd_device *dev, uint64_t length, uint64_t align, pd_allocation **out);

/*
 * Frees the allocation and releases the handle, even when it returns an error; NULL returns
 * 0. Dma-bufs exported from it keep the memory until they are closed. Before the memory is
 * freed, every pd_regcache that registered it drops its entries of it (counted in
 * invalidations); pd_mr handles still held stay registered until released.
 */
int pd_allocation_free(pd_allocation *alloc);

/* The allocation's length in bytes (what was asked for, rounded up to the page size). */
uint64_t pd_allocation_length(const pd_allocation *alloc);
/* Where the allocation starts in the HBM BAR. */
uint64_t pd_allocation_hbm_offset(const pd_allocation *alloc);
/* Its handle on the device file (never 0; 0 for NULL). */
uint32_t pd_allocation_handle(const pd_allocation *alloc);

/*
 * Exports bytes [offset, offset + length) of the allocation as a dma-buf; both page aligned,
 * length 0 meaning up to the end. flags: PD_EXPORT_*. Stores the dma-buf's fd in *fd_out:
 * the caller owns it (close() it; mmap() it, bracketing CPU access with DMA_BUF_IOCTL_SYNC;
 * hand it to an RDMA stack). The dma-buf keeps the memory after pd_allocation_free().
 * A reset of the device revokes it: its mapping faults (SIGBUS), RDMA stacks refuse it
 * (-ENODEV), and registering it again fails with -ENODEV; export again after the reset.
 * -EBUSY: the device is being reset; call again once it is done.
 */
int pd_export(const pd_allocation *alloc, uint64_t offset, uint64_t length, uint32_t flags,
	      int *fd_out);

/*
 * Companion devices only (struct pd_device_info.provider == PD_PROVIDER_COMPANION: another
 * driver, such as habanalabs, owns the device and its runtime allocates the HBM): exports
 * bytes [bar_offset, bar_offset + length) of the device's HBM BAR as a dma-buf
 * (PEERDIRECT_IOC_EXPORT_RANGE). No allocator records that range, so the caller vouches that
 * its runtime owns it and keeps it allocated while the dma-buf and any registration of it
 * live; this needs CAP_SYS_ADMIN. bar_offset and length are multiples of the page size,
 * length above 0, the range inside the BAR. flags: PD_EXPORT_*. Stores the dma-buf's fd in
 * *fd_out, owned by the caller as for pd_export(); register it with pd_register_export().
 * -EPERM: no CAP_SYS_ADMIN; -EINVAL: unaligned, empty or outside the BAR, or unknown flags;
 * -EOVERFLOW: bar_offset + length overflows; -EOPNOTSUPP: a device peerdirect owns (use
 * pd_alloc() and pd_export() there); -ENODEV: the device is gone.
 * The dma-buf is revoked when the companion goes (its owner driver unbinds, the device is
 * removed, or an administrator removes the companion): importers are invalidated, CPU
 * mappings of it then fault with SIGBUS, this device's calls fail with -ENODEV, and the
 * registration cache drops the registrations made with pd_register_export(), telling the
 * invalidation callback (PD_INVALIDATED_DEVICE). Before the runtime frees the range, call
 * pd_regcache_invalidate_dmabuf() (PD_INVALIDATED_MEMORY), then close the fd.
 */
int pd_export_range(const pd_device *dev, uint64_t bar_offset, uint64_t length, uint32_t flags,
		    int *fd_out);

/*
 * Companion devices only: the owner's runtime calls pd_companion_reset_prepare() before it
 * resets the device (habanalabs' hard reset, a vfio user's reset) and pd_companion_reset_done()
 * after (PEERDIRECT_IOC_COMPANION_RESET_PREPARE and _DONE through /dev/peerdirect; needs
 * CAP_SYS_ADMIN). Prepare revokes every dma-buf exported from the device (as removal does:
 * importers invalidated, CPU mappings fault with SIGBUS), counts the reset on the status page,
 * and refuses exports (-EBUSY) until done; registration caches of every process that watches
 * the device drop their registrations of those dma-bufs at once (PD_INVALIDATED_DEVICE), from
 * the library's watching thread, so that no NIC reaches the device while it resets. The device
 * stays: exports made after done work. -EPERM: no CAP_SYS_ADMIN; -ENOENT: not a companion
 * (peerdirect's own devices see their resets from the PCI core); -EINVAL (done): no reset
 * was announced; -ENODEV: the device is gone. Prepares nest (two resets announced at once):
 * each needs its done, and exports are refused until the last done.
 */
int pd_companion_reset_prepare(const pd_device *dev);
int pd_companion_reset_done(const pd_device *dev);

/*
 * Fills *out with the counters of /dev/peerdirect<index> from debugfs
 * (/sys/kernel/debug/peerdirect/peerdirect<index>/stats). Needs root and debugfs mounted.
 */
int pd_stats(unsigned index, struct pd_stats *out);

/*
 * Registration cache: registrations of HBM in a libfabric domain that the caller opened,
 * kept and handed out again to any request inside one (same domain and allocation, a
 * containing range, at least the access). Limits from the environment; the least recently
 * used entry no pd_mr holds is evicted, entries in use never are (a registration that fits only
 * if one went is made but not cached): PEERDIRECT_MR_CACHE_MAX_COUNT (default 4096; 0 disables caching) and
 * PEERDIRECT_MR_CACHE_MAX_SIZE (default 256G; K, M, G, T suffixes). A registration larger than
 * the byte limit is not cached: a pool registered once with pd_register_dmabuf_at() must fit
 * in it, or each buffer pd_register_addr() finds in it gets a registration of its own. Returns NULL with the
 * negative errno in *err (-EINVAL: a bad limit, named in pd_last_error()); err may be NULL.
 * A pd_regcache may be used from several threads at once.
 */
pd_regcache *pd_regcache_new(int *err);

/*
 * Releases the cache (NULL is ignored). No invalidation callback starts once it has started,
 * and it returns only once no call of the callback runs on another thread (so the callback's
 * ctx may be freed then; do not call it holding a lock the callback takes); cached
 * registrations are closed now, those held by pd_mr handles when the handles are released.
 * Its pd_domain handles stay valid until detached.
 */
void pd_regcache_free(pd_regcache *cache);

/*
 * Attaches a libfabric domain that the caller opened to the cache: the handle names it in
 * pd_register() and pd_register_dmabuf(). Each call makes a new handle with registrations of
 * its own, even for a domain pointer seen before: a domain closed and another opened at the
 * same address never share registrations. Returns NULL with the negative errno in *err
 * (-EINVAL: NULL argument; -ENOSYS: libfabric.so.1 >= 1.20 cannot be loaded); err may be NULL.
 *
 * The domain is borrowed, never closed by this library. Keep it open until the handle is
 * detached. Open it with FI_THREAD_SAFE, or never use it concurrently with calls of this
 * library that register or close registrations (pd_register, pd_mr_release, pd_allocation_free
 * of a registered allocation, pd_domain_detach, pd_regcache_free). Without FI_MR_PROV_KEY,
 * keys 1, 2, ... are requested, from one counter for the whole process (so several caches may
 * share a domain): do not request keys of your own from that range in the same domain.
 */
pd_domain *pd_domain_attach(pd_regcache *cache, struct fid_domain *domain, int *err);

/*
 * As pd_domain_attach(), for an ibverbs protection domain the caller allocated (ibv_alloc_pd),
 * whose queue pairs will use the registrations: pd_register() makes them with
 * ibv_reg_dmabuf_mr (rdma-core >= 34); they are always direct (no host bounce). The IOVA
 * (ibv_reg_dmabuf_mr's iova: the address work requests name the bytes by) of bytes
 * [offset, ...) of a dma-buf is base_addr + offset for a dma-buf registered at the caller's
 * base_addr (pd_register_dmabuf_at(), pd_register_export_at(), pd_register_addr(): a runtime's device virtual
 * addresses, which its peers' remote_addr then use), else the offset in the dma-buf
 * (pd_register(), pd_register_dmabuf(), pd_register_export()). Read them with pd_mr_key()
 * (the rkey), pd_mr_lkey(), pd_mr_local() (the IOVA for ibv_sge.addr) and pd_mr_remote() (a
 * peer's remote_addr and rkey), both in that IOVA space. -ENOSYS: libibverbs.so.1 cannot be loaded or has no
 * ibv_reg_dmabuf_mr. A device whose driver cannot import dma-bufs (rxe, siw) makes
 * pd_register() fail with -EOPNOTSUPP, naming the device, its driver and what to use instead.
 * Keep the protection domain allocated until the handle is detached and every pd_mr of it
 * released; the library never deallocates it.
 */
pd_domain *pd_domain_attach_verbs(pd_regcache *cache, struct ibv_pd *pd, int *err);

/*
 * Before fi_close() of the domain: drops the cache's registrations in it (the invalidation
 * callback is told of each, PD_INVALIDATED_DOMAIN) and releases the handle; returns how many
 * cached entries were dropped. -EBUSY while pd_mr handles of the domain are held: nothing is
 * dropped or told, and the handle stays attached with its registrations cached: release the
 * handles and call again. -EBUSY too while a call on the handle is registering in the domain
 * (from inside it: its key allocator). NULL returns 0.
 */
int pd_domain_detach(pd_domain *domain);

/*
 * Registers bytes [offset, offset + length) of alloc (length 0: up to the end) in the domain
 * with access (PD_ACCESS_*), or hands out a cached registration that contains them. Stores
 * an owning handle in *out: read it with pd_mr_key(), pd_mr_desc(), pd_mr_local(),
 * pd_mr_offset(), pd_mr_path(), pd_mr_reason(), pd_mr_remote(); release it with
 * pd_mr_release(). The first call on an allocation exports all of it read-write and maps it;
 * that dma-buf is closed when the allocation is freed. A reset of the device revokes it (its
 * registrations are invalidated, PD_INVALIDATED_DEVICE): the first call after the reset exports
 * and maps the allocation again (-EBUSY while the device is being reset: call again once it
 * is done). -EOPNOTSUPP: the provider refuses to
 * register dma-bufs and host bounce is off (the default; see pd_regcache_set_host_bounce()),
 * pd_last_error() gives the provider's reason; other errors are the provider's
 * (pd_last_error() names the call).
 */
int pd_register(pd_domain *domain, const pd_allocation *alloc, uint64_t offset, uint64_t length,
		uint32_t access, pd_mr **out);

/*
 * Room for a pd_mr in the caller's memory, as struct fi_context is for a libfabric operation:
 * pd_register_in() and pd_register_addr_in() make their handle there instead of allocating
 * one, so that a hit allocates nothing. *out then equals (pd_mr *)storage, a handle like any
 * other until pd_mr_release(), after which the storage may be used again. While it holds a
 * handle, the storage must stay where it is and not be copied, freed or used for another
 * handle.
 */
typedef struct pd_mr_storage {
	uint64_t internal[12];
} pd_mr_storage;

/* As pd_register(), the handle made in *storage (-EINVAL: storage NULL). */
int pd_register_in(pd_domain *domain, const pd_allocation *alloc, uint64_t offset,
		   uint64_t length, uint32_t access, pd_mr_storage *storage, pd_mr **out);

/*
 * As pd_register, for a dma-buf that something else exported (habanalabs'
 * HL_MEM_OP_EXPORT_DMABUF_FD, a GPU driver, udmabuf, another process): bytes
 * [offset, offset + length) of the dma-buf fd (length 0: up to its end). The cache keeps its
 * own duplicate of fd, mapped, so the caller may close fd at any time; requests for the same
 * dma-buf (by any fd of it) share cached registrations. No device tells the cache when that
 * memory goes: call pd_regcache_invalidate_dmabuf() before its exporter frees it.
 * -EINVAL: fd is not a dma-buf; -EBADF: fd is negative; -EACCES: it cannot be mapped writable.
 */
int pd_register_dmabuf(pd_domain *domain, int fd, uint64_t offset, uint64_t length,
		       uint32_t access, pd_mr **out);

/*
 * As pd_register_dmabuf, by the fd alone: the dma-buf is never mapped, so one whose exporter
 * has no mmap (habanalabs' device memory) registers too, and so does a read-only export on a
 * provider that moves bytes with the CPU (tcp, shm), which gets the access asked for (ask
 * only PD_ACCESS_LOCAL_READ / PD_ACCESS_REMOTE_READ for memory nothing may write). A NIC
 * (ibverbs, verbs;ofi_rxm, efa) imports every dma-buf for reading and writing, which a
 * read-only export of /dev/peerdirectN refuses (-EACCES): export it read-write for a NIC. Its first byte is named
 * base_addr in the registration (fi_mr_dmabuf.base_addr; on an ibverbs domain, bytes
 * [offset, ...) get IOVA base_addr + offset): the address the caller names it by, which local
 * operations use (pd_mr_local() gives base_addr + offset) and peers' RMA with FI_MR_VIRT_ADDR
 * (ibverbs: always). A runtime passes its device virtual address, as HCL does; a provider that
 * moves bytes with the CPU (tcp, shm) reads and writes there, so it must then be a CPU address
 * of the same bytes (a mapping the runtime made through its own driver). The library never
 * touches base_addr. Host bounce is not possible (it copies through a mapping): a provider
 * that refuses dma-bufs fails with -EOPNOTSUPP. A dma-buf is registered at one address only:
 * another base_addr, or pd_register_dmabuf() of it, is -EINVAL until
 * pd_regcache_invalidate_dmabuf(). A refused call binds nothing: until one succeeds, the
 * dma-buf is at no address (pd_register_addr() does not find it) and may be asked for anew.
 * No device is watched for it: when its exporter revokes it (a reset of the device, a
 * habanalabs hard reset), its registrations stay cached and found by address until the
 * runtime, told by its own driver, drops it with pd_regcache_invalidate_dmabuf() and
 * registers its new export (at the same base_addr, once the old one is dropped). For an
 * export of /dev/peerdirectN, pd_register_export_at() watches its device instead.
 * -EINVAL also: base_addr NULL, or so high that base_addr + the dma-buf's size (its end, one
 * past its last byte) passes 2^64 - 1; otherwise as for
 * pd_register_dmabuf.
 */
int pd_register_dmabuf_at(pd_domain *domain, int fd, uint64_t offset, uint64_t length,
			  void *base_addr, uint32_t access, pd_mr **out);

/*
 * Bytes [addr, addr + length) (length above 0) of a dma-buf registered with
 * pd_register_dmabuf_at() in this cache, found by the caller's own addresses, as a runtime
 * finds the registration covering a buffer (HCL registers its whole pool once, then sends
 * from buffers inside it): as pd_register_dmabuf_at() of that range, so a cached registration
 * that covers it is handed out (a hit: no write lock, no provider call). pd_mr_local() gives
 * addr, pd_mr_offset() its offset in the registration. A miss (the registration that covered
 * the bytes evicted, say) registers the largest range registered of that dma-buf so far if it
 * covers them and fits in the cache's limits (the runtime's whole pool: its other buffers then
 * hit again), else the bytes alone, which is also what it does if the provider refuses the
 * larger range. The dma-bufs registered at the
 * caller's addresses may not overlap there (pd_register_dmabuf_at() refuses it with -EINVAL).
 * Also those of pd_register_export_at(). -ENOENT: no such dma-buf covers the bytes; -ENODEV:
 * the one that does (pd_register_export_at()) was revoked by a reset or the removal of its
 * device; -EINVAL: length 0, or as for pd_register().
 */
int pd_register_addr(pd_domain *domain, const void *addr, uint64_t length, uint32_t access,
		     pd_mr **out);

/* As pd_register_addr(), the handle made in *storage (see pd_register_in()). */
int pd_register_addr_in(pd_domain *domain, const void *addr, uint64_t length, uint32_t access,
			pd_mr_storage *storage, pd_mr **out);

/*
 * As pd_register_dmabuf, for a dma-buf that dev exported (pd_export_range() on a companion
 * device, or pd_export()): it is registered under its identity on that device, and the cache
 * watches dev, so that the device's removal drops the registration and tells the invalidation
 * callback (PD_INVALIDATED_DEVICE), as for pd_register(). -ENODEV: a reset or the removal
 * of the device revoked the dma-buf: export the memory again and register the new fd.
 * -EINVAL: fd is not a dma-buf dev exported (or is registered with pd_register_dmabuf
 * already), or as for pd_register_dmabuf.
 */
int pd_register_export(pd_domain *domain, const pd_device *dev, int fd, uint64_t offset,
		       uint64_t length, uint32_t access, pd_mr **out);

/*
 * pd_register_dmabuf_at() for a dma-buf that dev exported (pd_export(), pd_export_range()):
 * registered by its fd alone, its first byte named base_addr, found by address with
 * pd_register_addr(), and watched as pd_register_export() watches its dma-bufs: a reset or
 * the removal of the device drops its registrations at once and tells the invalidation
 * callback (PD_INVALIDATED_DEVICE). HCL's pattern on a peerdirect device: the pool exported
 * once, registered once at the runtime's device address. After a reset (or the device's
 * removal), lookups of its bytes (pd_register_addr()) and this call with its fd fail with
 * -ENODEV, saying to export again, until a new dma-buf registers at any of its addresses
 * (the new export at the same base_addr, typically), which takes them over: the revoked one
 * leaves, and its bytes the new one does not cover are then at no address (-ENOENT); or
 * until pd_regcache_invalidate_dmabuf() drops it. No pd_regcache_invalidate_dmabuf() is
 * needed to register the new export. The cache keeps dev's file open while it knows the
 * dma-buf: the caller may close dev at once, and the device is still watched. Errors as for
 * pd_register_dmabuf_at() and pd_register_export().
 */
int pd_register_export_at(pd_domain *domain, const pd_device *dev, int fd, uint64_t offset,
			  uint64_t length, void *base_addr, uint32_t access, pd_mr **out);

/*
 * Drops every cached registration of the dma-buf fd (registered with pd_register_dmabuf,
 * pd_register_dmabuf_at, pd_register_export or pd_register_export_at) and the cache's duplicate of it, telling the
 * invalidation callback of each registration of it (PD_INVALIDATED_MEMORY); registrations
 * still held by pd_mr handles go when those are released. fd is any open fd of the dma-buf: a
 * caller that closes the fd it registered by keeps another (a dup) to name the dma-buf here.
 * Returns how many cached entries were dropped, or a negative errno (-EBADF: fd not open).
 */
int pd_regcache_invalidate_dmabuf(pd_regcache *cache, int fd);

/*
 * A key allocator for a domain's registrations (pd_domain_set_keys()): alloc returns 0 and a
 * key no registration of the domain uses in *key, or a negative errno when none is left;
 * release gives back the key of a registration once it is closed. alloc runs inside a
 * registration, while other registrations of the same dma-buf wait for it (so that a storm
 * of them registers once): it may call the library, and register memory, itself, but must
 * not wait for another thread that registers the same dma-buf; pd_domain_detach() of the
 * domain it registers in fails there with -EBUSY.
 */
typedef int (*pd_key_alloc_fn)(void *ctx, uint64_t *key);
typedef void (*pd_key_release_fn)(void *ctx, uint64_t key);

/*
 * From now on, new registrations in the libfabric domain request their keys
 * (fi_mr_attr.requested_key) from alloc(ctx, &key) instead of the library's process-wide
 * counter from 1, which may collide with keys the runtime requests itself; each key must be
 * below 2^(8 * key_size) (the domain's fi_domain_attr.mr_key_size; 8 or more: any key).
 * Providers with FI_MR_PROV_KEY pick their own keys and ignore the requested one. Each key is
 * given back with release(ctx, key) (release may be NULL) once its registration is closed,
 * from whichever thread closes it; alloc and release must be callable with ctx from any
 * thread until the domain's last registration made with them is closed. A registration
 * fails with -ENOSPC when alloc fails and -ERANGE when its key does not fit. alloc NULL:
 * the library's counter again. Registrations made before keep their keys. Returns 0,
 * -EINVAL (domain NULL) or -EOPNOTSUPP (an ibverbs domain: ibverbs picks its keys).
 */
int pd_domain_set_keys(pd_domain *domain, pd_key_alloc_fn alloc, pd_key_release_fn release,
		       void *ctx, size_t key_size);

/* pd_domain_set_iface(): where a domain's registered memory lives (fi_mr_attr.iface). */
#define PD_IFACE_SYSTEM 0u    /* FI_HMEM_SYSTEM: the default */
#define PD_IFACE_SYNAPSEAI 1u /* FI_HMEM_SYNAPSEAI, on SynapseAI device `device` */

/*
 * From now on, new registrations in the libfabric domain name their memory's iface (and
 * fi_mr_attr.device.synapseai = device for PD_IFACE_SYNAPSEAI, as HCL registers Gaudi HBM).
 * Only providers built with libfabric's SynapseAI support take PD_IFACE_SYNAPSEAI; others
 * refuse the registration as they refuse dma-bufs. Returns 0, -EINVAL (domain NULL, an
 * unknown iface) or -EOPNOTSUPP (an ibverbs domain).
 */
int pd_domain_set_iface(pd_domain *domain, uint32_t iface, int device);

/*
 * From now on, new registrations in the libfabric domain are bound to the endpoint ep
 * (fi_mr_bind(mr, &ep->fid, 0)) and then enabled (fi_mr_enable(mr)) before pd_register() and
 * its siblings hand them out: what a domain whose fi_info has FI_MR_ENDPOINT in
 * domain_attr->mr_mode needs, since its memory regions are created disabled, with no usable
 * key, until bound and enabled. The library cannot read an attached domain's mr_mode, so it
 * binds exactly when an endpoint is named: call this for a domain with FI_MR_ENDPOINT, before
 * its first registration, and only for such a domain (other providers refuse to bind memory
 * regions to endpoints). A registration that cannot be bound or enabled is closed, and the
 * call fails with libfabric's error as a negative errno, pd_last_error() naming fi_mr_bind or
 * fi_mr_enable. ep NULL: no endpoint, registrations are not bound.
 *
 * ep must be an open, enabled endpoint of the attached domain, and stay open until every
 * registration bound to it is closed (libfabric requires memory regions bound to an endpoint
 * to be closed before it): release their pd_mr handles and drop the cache's registrations
 * (name another endpoint or NULL, or pd_domain_detach()) before fi_close(ep).
 *
 * A registration stays bound to its endpoint for life. So naming another endpoint (or NULL)
 * drops the cache's registrations in the domain, telling the invalidation callback
 * (PD_INVALIDATED_DOMAIN), and fails with -EBUSY, the endpoint unchanged, while pd_mr handles
 * still hold registrations made with the endpoint named before (then nothing is dropped), or
 * one is being made: release them and call again. Naming the endpoint named already changes nothing. A runtime
 * with several endpoints in one domain attaches the domain once per endpoint (each pd_domain
 * has registrations of its own, so none is handed out for another endpoint).
 *
 * May be called while other threads use the handle (registrations under way count as held);
 * ep is only given to fi_mr_bind on the registering threads, under the domain's rule
 * (FI_THREAD_SAFE, or the caller serializes). Returns 0, -EINVAL (domain NULL), -EOPNOTSUPP
 * (an ibverbs domain) or -EBUSY.
 */
int pd_domain_set_endpoint(pd_domain *domain, struct fid_ep *ep);

/*
 * From now on, calls fn(ctx, invalidation) for each registration of the cache whose memory,
 * device or domain goes (see pd_invalidate_fn); fn NULL: no callback. fn must be callable
 * with ctx from any thread until it is replaced or the cache freed. Returns 0 or -EINVAL, and
 * only once no call of the callback it replaces runs on another thread: after setting NULL
 * the old ctx may be freed (do not call it holding a lock the callback takes; from inside the
 * callback it does not wait for that call itself).
 */
int pd_regcache_set_invalidate_callback(pd_regcache *cache, pd_invalidate_fn fn, void *ctx);

/*
 * Host bounce: where the provider refuses to register a dma-buf, register a host staging buffer
 * instead (allow != 0) or fail with -EOPNOTSUPP (allow == 0, the default). The key and
 * descriptor of a host-bounce pd_mr (pd_mr_path() == PD_PATH_HOST_BOUNCE) name the staging
 * buffer (pd_mr_staging()), not HBM: peers' data lands there, and the caller must copy HBM into
 * it before each send and out of it after each receive. Only turn it on to do exactly that.
 * Applies to later registrations: those made already keep their path, and a cached
 * host-bounce registration is still handed out to requests it covers (a hit) after host bounce
 * is turned off; to stop that, drop them (pd_domain_detach() and attach again, or
 * pd_regcache_invalidate_dmabuf() of a dma-buf). Returns 0 or -EINVAL (cache NULL).
 */
int pd_regcache_set_host_bounce(pd_regcache *cache, int allow);

/* Fills *out with the cache's counters. */
int pd_regcache_stats(const pd_regcache *cache, struct pd_regcache_stats *out);

/* Releases the handle (NULL is ignored); one in a pd_mr_storage is dropped in place. */
void pd_mr_release(pd_mr *mr);
/* fi_mr_key() of the registration (the rkey for ibverbs): what peers name it with (0 for
 * NULL). */
uint64_t pd_mr_key(const pd_mr *mr);
/* The ibverbs local key of the registration, for ibv_sge.lkey (0 for libfabric, and NULL). */
uint32_t pd_mr_lkey(const pd_mr *mr);
/* fi_mr_desc() of the registration, for local buffers (NULL for NULL and for ibverbs). */
void *pd_mr_desc(const pd_mr *mr);
/* Where the requested range starts in the registration, which may be larger. */
uint64_t pd_mr_offset(const pd_mr *mr);
/*
 * The local address of the requested range's first byte in *addr, and its length in *length:
 * the buf to pass with pd_mr_desc() to the caller's own operations (fi_tsend, fi_trecv,
 * fi_read's destination); for ibverbs the IOVA, for ibv_sge.addr with pd_mr_lkey() (base_addr
 * + offset for pd_register_dmabuf_at(), see pd_domain_attach_verbs()).
 * -EOPNOTSUPP for a PD_PATH_HOST_BOUNCE registration: its descriptor names the staging buffer
 * (pd_mr_staging()).
 */
int pd_mr_local(const pd_mr *mr, void **addr, uint64_t *length);
/* PD_PATH_* (0 for NULL). */
uint32_t pd_mr_path(const pd_mr *mr);
/*
 * What a peer needs to reach the requested range with RMA (fi_read, fi_write): *addr is the
 * address of its first byte, a virtual address when the caller's domain uses FI_MR_VIRT_ADDR
 * (virt_addr != 0; see fi_info->domain_attr->mr_mode) else the offset from the registration's
 * start (ibverbs: always the IOVA, as pd_mr_local() gives it; virt_addr is ignored), and *key
 * its key. -EOPNOTSUPP for a PD_PATH_HOST_BOUNCE registration: RMA would reach the staging
 * buffer, not HBM.
 */
int pd_mr_remote(const pd_mr *mr, int virt_addr, uint64_t *addr, uint64_t *key);
/* Why the registration is PD_PATH_HOST_BOUNCE (the provider's refusal); NULL when direct.
 * Valid until the handle is released. */
const char *pd_mr_reason(const pd_mr *mr);
/*
 * The host staging buffer of a PD_PATH_HOST_BOUNCE registration, which its key and descriptor
 * name, with its length in *length (if length is not NULL); NULL and 0 when the registration
 * is direct. Valid until the handle is released.
 */
void *pd_mr_staging(const pd_mr *mr, uint64_t *length);

/*
 * The message of the last failure on the calling thread ("" before the first), with a hint
 * of what to do. Valid until the next failing call on this thread.
 */
const char *pd_last_error(void);

/* A static description of errno err, either sign: pd_strerror(-ENOENT). */
const char *pd_strerror(int err);

/* The library's version, e.g. "0.1.0". */
const char *pd_version(void);

#ifdef __cplusplus
}
#endif

#endif /* PEERDIRECT_H */

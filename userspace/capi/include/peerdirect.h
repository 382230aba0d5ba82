/*
 * peerdirect.h - C ABI of libpeerdirect: accelerator HBM exported as DMA-BUF for
 * peer-to-peer RDMA. Link with `pkg-config --cflags --libs peerdirect`.
 *
 * Conventions:
 * - Handles (pd_device, pd_allocation) are opaque; the caller owns them and releases them
 *   with pd_device_close() and pd_allocation_free().
 * - Functions returning int return 0 on success or a negative errno (-ENOENT, -ENOMEM, ...).
 *   On failure, pd_last_error() returns a message saying what was being done, on which
 *   device node, and what to do about it. The message is per thread.
 * - A NULL handle or a NULL output pointer is refused with -EINVAL. Every non-NULL pointer
 *   must be valid as described at each function; handles must not be used after they are
 *   released.
 * - A pd_device may be used from several threads at once; a pd_allocation too, except that
 *   freeing it must not race with other calls on it.
 * - The library never aborts or unwinds into the caller: an internal error is -EIO with a
 *   message.
 */
#ifndef PEERDIRECT_H
#define PEERDIRECT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An open /dev/peerdirectN. */
typedef struct pd_device pd_device;
/* HBM allocated through a pd_device. */
typedef struct pd_allocation pd_allocation;

/* pd_export() flags. */
#define PD_EXPORT_CLOEXEC 0x1u /* the dma-buf fd is close-on-exec */
#define PD_EXPORT_RDWR 0x2u    /* the dma-buf may be mapped writable (else read-only) */

/* struct pd_device_info.provider: how peerdirect reaches the HBM. */
#define PD_PROVIDER_OWNED 1u /* peerdirect is the device's PCI driver and owns the BAR */

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
 * 0. Dma-bufs exported from it keep the memory until they are closed.
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
 */
int pd_export(const pd_allocation *alloc, uint64_t offset, uint64_t length, uint32_t flags,
	      int *fd_out);

/*
 * Fills *out with the counters of /dev/peerdirect<index> from debugfs
 * (/sys/kernel/debug/peerdirect/peerdirect<index>/stats). Needs root and debugfs mounted.
 */
int pd_stats(unsigned index, struct pd_stats *out);

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

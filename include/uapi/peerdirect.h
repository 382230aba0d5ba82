/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * peerdirect: accelerator HBM exported as DMA-BUF for peer-to-peer RDMA.
 *
 * This header is the ABI. The kernel module and the userspace crate both derive their
 * definitions from it (scripts/gen-uapi); nothing else defines these structs.
 *
 * Conventions (the same as iommufd's):
 *  - Every command takes one struct whose first field is `size`: the caller sets it to the
 *    sizeof() it was compiled with. The kernel refuses sizes below the first version of the
 *    struct (EINVAL), accepts larger ones only when the bytes it does not know are zero (E2BIG
 *    otherwise), and writes back at most `size` bytes. Structs only grow at the end.
 *  - `flags` rejects bits the kernel does not know (EOPNOTSUPP).
 *  - Fields named __reserved* are explicit padding and must be zero (EINVAL).
 *  - Sizes, offsets and addresses are 64-bit.
 */
#ifndef _UAPI_PEERDIRECT_H
#define _UAPI_PEERDIRECT_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* Character device: /dev/peerdirectN, one per HBM device. */
#define PEERDIRECT_DEVICE_PREFIX "peerdirect"

/* ioctl type code (Documentation/userspace-api/ioctl/ioctl-number.rst has 0xBD free). */
#define PEERDIRECT_IOCTL_TYPE 0xBD

/* Command numbers; the ioctl request is _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_x). */
#define PEERDIRECT_CMD_INFO 0x00
#define PEERDIRECT_CMD_ALLOC 0x01
#define PEERDIRECT_CMD_FREE 0x02
#define PEERDIRECT_CMD_EXPORT 0x03

/* How peerdirect reaches the device's HBM (struct peerdirect_info.provider). */
#define PEERDIRECT_PROVIDER_OWNED 1 /* peerdirect is the PCI driver and owns the BAR */

/**
 * struct peerdirect_info - PEERDIRECT_IOC_INFO: describe the HBM device behind this fd
 * @size: in: sizeof(struct peerdirect_info) as the caller knows it; out: bytes the kernel wrote
 * @flags: in: must be 0
 * @hbm_bytes: out: size of the HBM BAR in bytes
 * @hbm_bus_addr: out: PCI bus address of the HBM BAR (what a peer device DMAs to)
 * @hbm_phys_addr: out: CPU physical address of the HBM BAR
 * @bar_index: out: index of the HBM BAR
 * @numa_node: out: NUMA node of the device, -1 if none
 * @pci_domain: out: PCI domain (segment) of the device
 * @pci_bus: out: PCI bus number
 * @pci_slot: out: PCI slot (device) number
 * @pci_func: out: PCI function number
 * @__reserved0: padding, must be 0
 * @vendor_id: out: PCI vendor ID
 * @device_id: out: PCI device ID
 * @index: out: N of /dev/peerdirectN
 * @provider: out: PEERDIRECT_PROVIDER_*
 * @__reserved1: padding, must be 0
 */
struct peerdirect_info {
	__u32 size;
	__u32 flags;
	__u64 hbm_bytes;
	__u64 hbm_bus_addr;
	__u64 hbm_phys_addr;
	__u32 bar_index;
	__s32 numa_node;
	__u32 pci_domain;
	__u8 pci_bus;
	__u8 pci_slot;
	__u8 pci_func;
	__u8 __reserved0;
	__u16 vendor_id;
	__u16 device_id;
	__u32 index;
	__u32 provider;
	__u32 __reserved1;
};
/* Size of the first version of struct peerdirect_info. */
#define PEERDIRECT_INFO_SIZE_VER0 64

#define PEERDIRECT_IOC_INFO _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_INFO)

/* Alignment of an allocation when the caller asks for none: importers can use 2 MiB pages. */
#define PEERDIRECT_ALLOC_ALIGN_DEFAULT 0x200000

/**
 * struct peerdirect_alloc - PEERDIRECT_IOC_ALLOC: allocate a range of HBM
 * @size: in: sizeof(struct peerdirect_alloc) as the caller knows it; out: bytes the kernel wrote
 * @flags: in: must be 0
 * @length: in: bytes wanted, > 0; out: bytes allocated (rounded up to the page size)
 * @align: in: alignment of the range in the BAR, a power of two >= the page size;
 *         0 means PEERDIRECT_ALLOC_ALIGN_DEFAULT
 * @handle: out: names the allocation in later commands on the same open file
 * @__reserved0: padding, must be 0
 * @hbm_offset: out: offset of the range from the start of the HBM BAR
 *
 * The allocation belongs to the open file that made it: other files cannot name it. Closing
 * the file frees it; the memory is reused only once every dma-buf exported from it is gone.
 */
struct peerdirect_alloc {
	__u32 size;
	__u32 flags;
	__u64 length;
	__u64 align;
	__u32 handle;
	__u32 __reserved0;
	__u64 hbm_offset;
};
#define PEERDIRECT_ALLOC_SIZE_VER0 40

#define PEERDIRECT_IOC_ALLOC _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_ALLOC)

/**
 * struct peerdirect_free - PEERDIRECT_IOC_FREE: free an allocation of this open file
 * @size: in: sizeof(struct peerdirect_free) as the caller knows it; out: bytes the kernel wrote
 * @flags: in: must be 0
 * @handle: in: from PEERDIRECT_IOC_ALLOC
 * @__reserved0: padding, must be 0
 *
 * The handle is gone at once; the memory is reused once every dma-buf exported from the
 * allocation is released.
 */
struct peerdirect_free {
	__u32 size;
	__u32 flags;
	__u32 handle;
	__u32 __reserved0;
};
#define PEERDIRECT_FREE_SIZE_VER0 16

#define PEERDIRECT_IOC_FREE _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_FREE)

/* struct peerdirect_export.flags */
#define PEERDIRECT_EXPORT_CLOEXEC (1U << 0) /* the new fd is close-on-exec */
#define PEERDIRECT_EXPORT_RDWR (1U << 1)    /* the dma-buf may be mapped writable (mmap) */

/**
 * struct peerdirect_export - PEERDIRECT_IOC_EXPORT: export (part of) an allocation as DMA-BUF
 * @size: in: sizeof(struct peerdirect_export) as the caller knows it; out: bytes the kernel wrote
 * @flags: in: PEERDIRECT_EXPORT_*
 * @handle: in: from PEERDIRECT_IOC_ALLOC on this open file
 * @fd: out: the dma-buf file descriptor
 * @offset: in: start of the exported range inside the allocation, page aligned
 * @length: in: bytes to export, page aligned; 0 means up to the end of the allocation
 *
 * The dma-buf holds the allocation: freeing the handle or closing this file does not take
 * the memory from its importers.
 */
struct peerdirect_export {
	__u32 size;
	__u32 flags;
	__u32 handle;
	__s32 fd;
	__u64 offset;
	__u64 length;
};
#define PEERDIRECT_EXPORT_SIZE_VER0 32

#define PEERDIRECT_IOC_EXPORT _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_EXPORT)

#endif /* _UAPI_PEERDIRECT_H */

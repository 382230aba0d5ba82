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
 *  - A command whose answer cannot be written back (the struct is in memory the caller cannot
 *    write) fails with EFAULT and leaves nothing done: no allocation, fd or companion is left
 *    that the caller cannot name, and FREE, COMPANION_REMOVE and the resets do not act.
 */
#ifndef _UAPI_PEERDIRECT_H
#define _UAPI_PEERDIRECT_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* Character device: /dev/peerdirectN, one per HBM device. */
#define PEERDIRECT_DEVICE_PREFIX "peerdirect"
/* The control device, for administrators (CAP_SYS_ADMIN): /dev/peerdirect-ctl. */
#define PEERDIRECT_CONTROL_DEVICE "peerdirect-ctl"

/* ioctl type code (Documentation/userspace-api/ioctl/ioctl-number.rst has 0xBD free). */
#define PEERDIRECT_IOCTL_TYPE 0xBD

/* Command numbers; the ioctl request is _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_x). */
#define PEERDIRECT_CMD_INFO 0x00
#define PEERDIRECT_CMD_ALLOC 0x01
#define PEERDIRECT_CMD_FREE 0x02
#define PEERDIRECT_CMD_EXPORT 0x03
#define PEERDIRECT_CMD_P2P 0x04
#define PEERDIRECT_CMD_EXPORT_RANGE 0x05
/* On the control device. */
#define PEERDIRECT_CMD_COMPANION_ADD 0x10
#define PEERDIRECT_CMD_COMPANION_REMOVE 0x11
#define PEERDIRECT_CMD_COMPANION_RESET_PREPARE 0x12
#define PEERDIRECT_CMD_COMPANION_RESET_DONE 0x13

/* How peerdirect reaches the device's HBM (struct peerdirect_info.provider). */
#define PEERDIRECT_PROVIDER_OWNED 1 /* peerdirect is the PCI driver and owns the BAR */
/* Another driver (or none) owns the device; peerdirect serves its BAR beside it, claims
 * nothing, and has no allocator for it (PEERDIRECT_IOC_COMPANION_ADD). */
#define PEERDIRECT_PROVIDER_COMPANION 2
/* Bytes of struct peerdirect_info.driver, its NUL padding included. */
#define PEERDIRECT_DRIVER_NAME_LEN 32

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
 * @driver: out (since PEERDIRECT_INFO_SIZE_VER1): name of the PCI driver bound to the device,
 *          NUL-padded: "peerdirect" for a device peerdirect owns; for a companion its owner
 *          driver's (habanalabs, vfio-pci), empty if none is bound
 *
 * A caller that passes PEERDIRECT_INFO_SIZE_VER0 gets no @driver; a kernel older than
 * @driver answers @size = PEERDIRECT_INFO_SIZE_VER0 to a caller that passes more.
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
	__u8 driver[PEERDIRECT_DRIVER_NAME_LEN];
};
/* Size of the first version of struct peerdirect_info, and of the one with @driver. */
#define PEERDIRECT_INFO_SIZE_VER0 64
#define PEERDIRECT_INFO_SIZE_VER1 96

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

/*
 * struct peerdirect_p2p.path: facts about the PCI path between the two devices.
 *  COMMON_BRIDGE: the paths meet at a bridge below the host bridge (@common_bridge)
 *  ACS_REDIRECT: a bridge on that path redirects P2P requests upstream (@acs_bridge)
 *  SAME_HOST_BRIDGE: both devices are below the same host bridge
 *  PEER_IOMMU: the peer's DMA is translated by an IOMMU
 */
#define PEERDIRECT_P2P_COMMON_BRIDGE (1U << 0)
#define PEERDIRECT_P2P_ACS_REDIRECT (1U << 1)
#define PEERDIRECT_P2P_SAME_HOST_BRIDGE (1U << 2)
#define PEERDIRECT_P2P_PEER_IOMMU (1U << 3)

/**
 * struct peerdirect_p2p - PEERDIRECT_IOC_P2P: can a PCI device reach this HBM peer-to-peer?
 * @size: in: sizeof(struct peerdirect_p2p) as the caller knows it; out: bytes the kernel wrote
 * @flags: in: must be 0
 * @pci_domain: in: PCI domain (segment) of the peer device, e.g. a NIC
 * @pci_bus: in: its bus number
 * @pci_slot: in: its slot (device) number, < 32
 * @pci_func: in: its function number, < 8
 * @__reserved0: padding, must be 0
 * @distance: out: the kernel's verdict, pci_p2pdma_distance_many(): the number of PCI hops
 *            between the two devices, or -1 when the kernel's P2P rules give no path (the
 *            exporter then refuses the peer's attach with EOPNOTSUPP)
 * @path: out: PEERDIRECT_P2P_* facts that explain the verdict
 * @common_bridge: out: with PEERDIRECT_P2P_COMMON_BRIDGE, bus << 8 | devfn of the bridge where
 *                 the paths meet (in @pci_domain); else 0
 * @acs_bridge: out: with PEERDIRECT_P2P_ACS_REDIRECT, bus << 8 | devfn of the first bridge on
 *              the path that redirects (in @pci_domain); else 0
 * @acs_bridges: out: how many bridges on the path redirect
 * @__reserved1: padding, must be 0
 * @host_bridge_vendor: out: PCI vendor ID of this HBM device's host bridge (function 00.0 of
 *                      its root bus), 0 if it has none; the kernel's P2P allowlist is by this ID
 * @host_bridge_device: out: its PCI device ID
 * @__reserved2: padding, must be 0
 *
 * Read-only: it changes nothing and needs nothing but the open device. ENXIO when no PCI
 * device has that address; ENODEV once this HBM device is gone.
 */
struct peerdirect_p2p {
	__u32 size;
	__u32 flags;
	__u32 pci_domain;
	__u8 pci_bus;
	__u8 pci_slot;
	__u8 pci_func;
	__u8 __reserved0;
	__s32 distance;
	__u32 path;
	__u16 common_bridge;
	__u16 acs_bridge;
	__u16 acs_bridges;
	__u16 __reserved1;
	__u16 host_bridge_vendor;
	__u16 host_bridge_device;
	__u32 __reserved2;
};
#define PEERDIRECT_P2P_SIZE_VER0 40

#define PEERDIRECT_IOC_P2P _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_P2P)

/**
 * struct peerdirect_export_range - PEERDIRECT_IOC_EXPORT_RANGE: export a range of a companion
 * device's BAR, memory its owner's runtime allocated, as a DMA-BUF
 * @size: in: sizeof(struct peerdirect_export_range) as the caller knows it; out: bytes written
 * @flags: in: PEERDIRECT_EXPORT_* (CLOEXEC, RDWR)
 * @bar_offset: in: start of the range from the start of the HBM BAR, a multiple of the page size
 * @length: in: bytes, > 0, a multiple of the page size
 * @fd: out: the dma-buf's file descriptor
 * @__reserved0: padding, must be 0
 *
 * Only on a companion device (PEERDIRECT_PROVIDER_COMPANION; EOPNOTSUPP on a device peerdirect
 * owns: use ALLOC and EXPORT there), and only for CAP_SYS_ADMIN (EPERM): there is no allocator
 * to say who owns the range, so the caller vouches for it, as the owner's runtime does. EINVAL
 * for a length of 0, an unaligned offset or length, or a range past the BAR's end; EOVERFLOW
 * when bar_offset + length does not fit in 64 bits. The dma-buf is served like any other
 * (P2P rules, pinned, dynamic and revocable importers, mmap) and revoked with the companion.
 */
struct peerdirect_export_range {
	__u32 size;
	__u32 flags;
	__u64 bar_offset;
	__u64 length;
	__s32 fd;
	__u32 __reserved0;
};
/* Size of the first version of struct peerdirect_export_range. */
#define PEERDIRECT_EXPORT_RANGE_SIZE_VER0 32

#define PEERDIRECT_IOC_EXPORT_RANGE _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_EXPORT_RANGE)

/* struct peerdirect_companion.bar: the device's own HBM BAR, from peerdirect's ID table. */
#define PEERDIRECT_COMPANION_BAR_DEFAULT 0xff

/**
 * struct peerdirect_companion - PEERDIRECT_IOC_COMPANION_ADD, _REMOVE, _RESET_PREPARE and
 * _RESET_DONE, on the control device: serve (or stop serving) the HBM BAR of a PCI device
 * that another driver owns, or bracket a reset of that device
 * @size: in: sizeof(struct peerdirect_companion) as the caller knows it; out: bytes written
 * @flags: in: must be 0
 * @pci_domain: in: PCI domain (segment) of the device
 * @pci_bus: in: PCI bus number
 * @pci_slot: in: PCI slot (device) number, below 32
 * @pci_func: in: PCI function number, below 8
 * @bar: in (ADD): index of the BAR that holds HBM, 0-5, or PEERDIRECT_COMPANION_BAR_DEFAULT
 *       for a device in peerdirect's ID table (Gaudi: BAR 4); ignored by the others
 * @index: out (ADD): N of the new /dev/peerdirectN
 * @__reserved0: padding, must be 0
 *
 * Needs CAP_SYS_ADMIN (EPERM) and the module loaded with companion=1 (EOPNOTSUPP otherwise).
 * ADD fails with ENXIO when no PCI device has that address, EBUSY when peerdirect is the
 * device's driver, ENODEV when no driver is bound to it (or its driver is unbinding), EEXIST
 * when it is a companion already, EINVAL for a BAR index above 5, an I/O or empty BAR, or
 * PEERDIRECT_COMPANION_BAR_DEFAULT on a device outside the ID table. peerdirect then holds a
 * reference on the device, claims none of its resources, and serves /dev/peerdirectN for it
 * (PEERDIRECT_PROVIDER_COMPANION) until REMOVE, until the owner driver unbinds or the device
 * is removed, or until unload: each of those first revokes what was exported from it, and
 * returns once no importer maps the BAR. A fatal signal ends REMOVE's wait (EINTR), leaving
 * the companion in place, its exports revoked.
 *
 * RESET_PREPARE, before the owner resets the device (habanalabs' hard reset, vfio-pci's
 * reset at open): revokes every export, counts the reset in the status page's resets, and
 * refuses new exports (EBUSY) until RESET_DONE, after the reset. RESET_DONE without a
 * RESET_PREPARE under way fails with EINVAL. REMOVE, RESET_PREPARE and RESET_DONE fail with
 * ENOENT when the device is not a companion.
 */
struct peerdirect_companion {
	__u32 size;
	__u32 flags;
	__u32 pci_domain;
	__u8 pci_bus;
	__u8 pci_slot;
	__u8 pci_func;
	__u8 bar;
	__u32 index;
	__u32 __reserved0;
};
/* Size of the first version of struct peerdirect_companion. */
#define PEERDIRECT_COMPANION_SIZE_VER0 24

#define PEERDIRECT_IOC_COMPANION_ADD _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_COMPANION_ADD)
#define PEERDIRECT_IOC_COMPANION_REMOVE _IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_COMPANION_REMOVE)
#define PEERDIRECT_IOC_COMPANION_RESET_PREPARE \
	_IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_COMPANION_RESET_PREPARE)
#define PEERDIRECT_IOC_COMPANION_RESET_DONE \
	_IO(PEERDIRECT_IOCTL_TYPE, PEERDIRECT_CMD_COMPANION_RESET_DONE)

/*
 * The status page: mmap(NULL, page size, PROT_READ, MAP_SHARED, fd, PEERDIRECT_STATUS_OFFSET)
 * of /dev/peerdirectN maps one read-only page that starts with struct peerdirect_status, so
 * that a process learns without a system call that the device is going away (a registration
 * cache checks it before handing out a cached registration). Writable or larger mappings, or
 * other offsets, are refused (EPERM, EINVAL). The kernel only ever sets bits in @state and
 * counts @resets up, with release semantics; read them with acquire semantics.
 *
 * read() of /dev/peerdirectN copies the same struct peerdirect_status into a buffer of at
 * least PEERDIRECT_STATUS_SIZE_VER0 bytes (EINVAL if smaller; a larger one gets the struct
 * this module has) and returns how many bytes it copied; it never waits and ignores the file
 * offset. poll() of the file reports POLLPRI | POLLHUP once the device starts going away
 * (REVOKED), and, while it stays, POLLPRI alone once @resets counts a reset that no read() of
 * that file has returned yet, until one does: a process that polls for POLLPRI learns of each
 * reset without a system call per check, reads the status, then drops what it registered of
 * the exports made before the reset.
 */
#define PEERDIRECT_STATUS_OFFSET 0
#define PEERDIRECT_STATUS_VERSION 1

/*
 * struct peerdirect_status.state:
 *  REVOKED: the device is being or has been unbound, removed or unloaded: its exports are
 *  revoked or about to be, and every command fails with ENODEV. Set before the first export
 *  is revoked; never cleared (a rebound device is a new device file).
 */
#define PEERDIRECT_STATUS_REVOKED (1U << 0)

/**
 * struct peerdirect_status - the start of the status page
 * @version: PEERDIRECT_STATUS_VERSION
 * @state: PEERDIRECT_STATUS_* bits
 * @resets: resets of the device begun since it was bound (a function level or bus reset, or
 *	recovery from a PCIe error), each counted before the exports made until then are
 *	revoked: a registration of an export made while @resets read N is stale once it reads
 *	more. The device stays; exports made after the reset work (an EXPORT while it is reset
 *	fails with EBUSY). A companion's resets are those its owner's runtime announces
 *	(PEERDIRECT_IOC_COMPANION_RESET_PREPARE); its owner driver resets the device without
 *	telling peerdirect. Written with release semantics, like @state.
 */
struct peerdirect_status {
	__u32 version;
	__u32 state;
	__u32 resets;
};
/* Size of the first version of struct peerdirect_status (the smallest read() buffer). */
#define PEERDIRECT_STATUS_SIZE_VER0 12

#endif /* _UAPI_PEERDIRECT_H */

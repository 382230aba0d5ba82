/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The PeerDirect peer-memory client contract, as MLNX_OFED-style ib_core stacks (5.x) define
 * it in their <rdma/peer_mem.h>: written here from that contract's description, so that
 * peerdirect can register a client where such an ib_core runs. Upstream Linux has no such
 * API; only peerdirect_peermem.ko links against it, built where that core is installed.
 *
 * The flow, as the core drives it for one memory registration:
 *   acquire(addr, size)		is this user range the client's? 1 yes, 0 no, < 0 error
 *   get_pages(addr, size, ...)		fill sg_head (one entry per get_page_size() chunk);
 *					remember core_context for invalidate
 *   dma_map(sg_head, dma_device)	DMA addresses for dma_device, *nmap entries used
 *   ...
 *   dma_unmap, put_pages, release	in that order, when the registration ends
 * When the memory goes away, the client calls invalidate(reg_handle, core_context); the core
 * then stops using it and calls dma_unmap and put_pages (and release later).
 */
#ifndef PEERDIRECT_PEER_MEM_H
#define PEERDIRECT_PEER_MEM_H

#include <linux/types.h>

struct device;
struct sg_table;

#define IB_PEER_MEMORY_NAME_MAX 64
#define IB_PEER_MEMORY_VER_MAX 16

struct peer_memory_client {
	char name[IB_PEER_MEMORY_NAME_MAX];
	char version[IB_PEER_MEMORY_VER_MAX];
	/* 1: the range is the client's (*client_context set), 0: not the client's, < 0: error */
	int (*acquire)(unsigned long addr, size_t size, void *peer_mem_private_data,
		       char *peer_mem_name, void **client_context);
	int (*get_pages)(unsigned long addr, size_t size, int write, int force,
			 struct sg_table *sg_head, void *client_context, u64 core_context);
	int (*dma_map)(struct sg_table *sg_head, void *client_context, struct device *dma_device,
		       int dmasync, int *nmap);
	int (*dma_unmap)(struct sg_table *sg_head, void *client_context,
			 struct device *dma_device);
	void (*put_pages)(struct sg_table *sg_head, void *client_context);
	unsigned long (*get_page_size)(void *client_context);
	void (*release)(void *client_context);
	void *(*get_context_private_data)(u64 peer_id);
	void (*put_context_private_data)(void *context);
};

typedef int (*invalidate_peer_memory)(void *reg_handle, u64 core_context);

/*
 * Provided by the core (never by peerdirect). Registration writes the core's invalidate
 * function into *invalidate_callback and returns a handle (NULL on failure).
 */
void *ib_register_peer_memory_client(const struct peer_memory_client *peer_client,
				     invalidate_peer_memory *invalidate_callback);
void ib_unregister_peer_memory_client(void *reg_handle);

#endif /* PEERDIRECT_PEER_MEM_H */

// SPDX-License-Identifier: GPL-2.0
/*
 * peerdirect_peermem.ko, the PeerDirect peer-memory client: lets an MLNX_OFED-style ib_core
 * (one that exports ib_register_peer_memory_client, see peer_mem.h) register user memory that
 * maps peerdirect's HBM, so that ibv_reg_mr() on an mmapped peerdirect dma-buf works
 * unmodified there.
 *
 * A module of its own, linked against the core's API: MLNX_OFED exports it with plain
 * EXPORT_SYMBOL, which symbol_get() no longer resolves since Linux 6.6 (only _GPL symbols),
 * so peerdirect.ko cannot look it up at run time. Built with the core's Module.symvers
 * (KBUILD_EXTRA_SYMBOLS; `make peermem OFED=/usr/src/ofa_kernel/default`) and peerdirect.ko's,
 * it loads only where that core runs (modprobe then loads ib_core and peerdirect first), as
 * nvidia-peermem does; on an upstream host it is simply not built or loaded, and peerdirect.ko
 * is the same either way.
 *
 * The client is a dma-buf importer on ib_core's behalf, so the exporter's rules apply
 * unchanged: attach checks peer-to-peer reachability from the HBM to the DMA device (refusal:
 * -EOPNOTSUPP from dma_map), the mapping is the exporter's, and revocation reaches the core
 * as the peer-memory invalidate callback.
 *
 * Only user mappings of peerdirect's dma-bufs are recognised (the misc device has no mmap):
 * they carry peerdirect_dmabuf_vm_ops, exported by peerdirect.ko.
 */
#define pr_fmt(fmt) "peerdirect_peermem: " fmt

#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/limits.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/printk.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "peer_mem.h"

/* peerdirect.ko's (kmod/sys/helpers/dma_buf.c). */
extern const struct vm_operations_struct peerdirect_dmabuf_vm_ops;

/* One registration the core asked for: a range of one of our dma-bufs. */
struct pdpm_ctx {
	struct dma_buf *dmabuf; /* reference, from acquire to release */
	u64 offset; /* of the (page-aligned) range inside the dma-buf */
	u64 len; /* page-aligned */
	unsigned long page_size;
	bool writable; /* the user mapping was writable */
	u64 core_context; /* from get_pages, handed back to invalidate */

	/* Set by dma_map, cleared by dma_unmap; the core serialises its calls per context. */
	struct dma_buf_attachment *attach;
	/* The exporter's mapping; under the reservation lock. */
	struct sg_table *sgt;
	/* Under the reservation lock: the core has been (or is being) told. */
	bool invalidated;
	struct work_struct invalidate_work;
};

/* Written once at registration (before the core can call the client), read afterwards. */
static void *pdpm_reg_handle;
static invalidate_peer_memory pdpm_invalidate;
static struct workqueue_struct *pdpm_wq;

/* The largest of 2 MiB, 64 KiB and 4 KiB dividing the range's address, offset and length. */
static unsigned long pdpm_page_size(unsigned long start, u64 offset, u64 len)
{
	static const unsigned long sizes[] = { SZ_2M, SZ_64K, SZ_4K };
	size_t i;

	for (i = 0; i < ARRAY_SIZE(sizes); i++)
		if (sizes[i] >= PAGE_SIZE && IS_ALIGNED(start | offset | len, sizes[i]))
			return sizes[i];
	return PAGE_SIZE;
}

/* Runs without locks held: the core's invalidate unmaps (dma_unmap takes the resv lock). */
static void pdpm_invalidate_work(struct work_struct *work)
{
	struct pdpm_ctx *ctx = container_of(work, struct pdpm_ctx, invalidate_work);
	u64 core_context = ctx->core_context;

	/* The core may end the registration from here on, release included: ctx is not ours. */
	pdpm_invalidate(pdpm_reg_handle, core_context);
}

static int pdpm_acquire(unsigned long addr, size_t size, void *peer_mem_private_data,
			char *peer_mem_name, void **client_context)
{
	struct mm_struct *mm = current->mm;
	unsigned long start, end;
	struct vm_area_struct *vma;
	struct pdpm_ctx *ctx;

	if (!mm || !size || addr + size < addr)
		return 0;
	start = ALIGN_DOWN(addr, PAGE_SIZE);
	end = ALIGN(addr + size, PAGE_SIZE);
	if (end < start || !end)
		return 0;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);
	if (!ctx)
		return -ENOMEM;

	mmap_read_lock(mm);
	vma = vma_lookup(mm, addr);
	/* Only our dma-bufs' mappings, and the whole range inside that one VMA. */
	if (!vma || vma->vm_ops != &peerdirect_dmabuf_vm_ops || !vma->vm_file ||
	    end > vma->vm_end) {
		mmap_read_unlock(mm);
		kfree(ctx);
		return 0;
	}
	ctx->dmabuf = vma->vm_file->private_data;
	ctx->offset = ((u64)vma->vm_pgoff << PAGE_SHIFT) + (start - vma->vm_start);
	ctx->len = end - start;
	ctx->writable = vma->vm_flags & VM_WRITE;
	if (ctx->offset + ctx->len > ctx->dmabuf->size) {
		mmap_read_unlock(mm);
		kfree(ctx);
		return 0;
	}
	get_dma_buf(ctx->dmabuf);
	mmap_read_unlock(mm);

	ctx->page_size = pdpm_page_size(start, ctx->offset, ctx->len);
	INIT_WORK(&ctx->invalidate_work, pdpm_invalidate_work);
	*client_context = ctx;
	return 1;
}

static int pdpm_get_pages(unsigned long addr, size_t size, int write, int force,
			  struct sg_table *sg_head, void *client_context, u64 core_context)
{
	struct pdpm_ctx *ctx = client_context;
	struct scatterlist *sg;
	unsigned int i, nents;
	int ret;

	if (ctx->len / ctx->page_size > UINT_MAX)
		return -E2BIG;
	if (write && !ctx->writable)
		return -EACCES;
	nents = ctx->len / ctx->page_size;
	ret = sg_alloc_table(sg_head, nents, GFP_KERNEL);
	if (ret)
		return ret;
	/* BAR memory has no struct pages: the CPU side of each entry is only its length. */
	for_each_sg(sg_head->sgl, sg, nents, i) {
		sg->offset = 0;
		sg->length = ctx->page_size;
	}
	ctx->core_context = core_context;
	return 0;
}

/* The exporter revokes the buffer (reservation lock held): tell the core, later. */
static void pdpm_invalidate_mappings(struct dma_buf_attachment *attach)
{
	struct pdpm_ctx *ctx = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (ctx->sgt && !ctx->invalidated) {
		ctx->invalidated = true;
		queue_work(pdpm_wq, &ctx->invalidate_work);
	}
}

static const struct dma_buf_attach_ops pdpm_attach_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = pdpm_invalidate_mappings,
};

/* Writes one DMA run [addr, addr + len) at range offset @off into the next entries. */
static int pdpm_emit(struct pdpm_ctx *ctx, struct sg_table *sg_head, struct scatterlist **next,
		     unsigned int *n, dma_addr_t addr, u64 off, u64 len)
{
	u64 max_entry = round_down((u64)UINT_MAX, ctx->page_size);

	/* A discontinuity inside a page of the promised size: the page size would be a lie. */
	if (!IS_ALIGNED(off, ctx->page_size) || !IS_ALIGNED(addr, ctx->page_size))
		return -EINVAL;
	while (len) {
		u64 piece = min(len, max_entry);

		if (*n >= sg_head->orig_nents || !*next)
			return -EINVAL;
		sg_dma_address(*next) = addr;
		sg_dma_len(*next) = piece;
		*next = sg_next(*next);
		(*n)++;
		addr += piece;
		len -= piece;
	}
	return 0;
}

/* Fills sg_head's DMA side with the range's part of the exporter's mapping, merged. */
static int pdpm_fill(struct pdpm_ctx *ctx, struct sg_table *mapped, struct sg_table *sg_head,
		     int *nmap)
{
	u64 start = ctx->offset, end = ctx->offset + ctx->len, cur = 0;
	u64 run_off = 0, run_len = 0, covered = 0;
	struct scatterlist *next = sg_head->sgl, *sg;
	dma_addr_t run_addr = 0;
	unsigned int n = 0;
	int i, ret;

	for_each_sgtable_dma_sg(mapped, sg, i) {
		u64 len = sg_dma_len(sg);
		u64 s = max(cur, start), e = min(cur + len, end);

		if (s < e) {
			dma_addr_t addr = sg_dma_address(sg) + (s - cur);

			if (run_len && addr == run_addr + run_len) {
				run_len += e - s;
			} else {
				if (run_len) {
					ret = pdpm_emit(ctx, sg_head, &next, &n, run_addr, run_off,
							run_len);
					if (ret)
						return ret;
				}
				run_addr = addr;
				run_off = s - start;
				run_len = e - s;
			}
			covered += e - s;
		}
		cur += len;
		if (cur >= end)
			break;
	}
	if (covered != ctx->len)
		return -EINVAL;
	ret = pdpm_emit(ctx, sg_head, &next, &n, run_addr, run_off, run_len);
	if (ret)
		return ret;
	*nmap = n;
	return 0;
}

/*
 * The peer-memory API says nothing of access, so the direction follows the dma-buf: a
 * read-only one (exported without PEERDIRECT_EXPORT_RDWR) is mapped for the NIC to read only,
 * which peerdirect's exporter requires.
 */
static enum dma_data_direction pdpm_dir(struct pdpm_ctx *ctx)
{
	return ctx->dmabuf->file->f_mode & FMODE_WRITE ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
}

static int pdpm_dma_map(struct sg_table *sg_head, void *client_context,
			struct device *dma_device, int dmasync, int *nmap)
{
	struct pdpm_ctx *ctx = client_context;
	struct dma_resv *resv = ctx->dmabuf->resv;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;
	long wait;
	int ret;

	if (ctx->attach)
		return -EBUSY;
	/* The exporter refuses devices it has no P2P path to (-EOPNOTSUPP), or -ENODEV. */
	attach = dma_buf_dynamic_attach(ctx->dmabuf, dma_device, &pdpm_attach_ops, ctx);
	if (IS_ERR(attach))
		return PTR_ERR(attach);

	dma_resv_lock(resv, NULL);
	sgt = dma_buf_map_attachment(attach, pdpm_dir(ctx));
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto out_unlock;
	}
	/* As ib_umem_dmabuf_map_pages(): the contents are valid once the kernel fences signal. */
	wait = dma_resv_wait_timeout(resv, DMA_RESV_USAGE_KERNEL, false, MAX_SCHEDULE_TIMEOUT);
	ret = wait < 0 ? wait : pdpm_fill(ctx, sgt, sg_head, nmap);
	if (ret) {
		dma_buf_unmap_attachment(attach, sgt, pdpm_dir(ctx));
		goto out_unlock;
	}
	ctx->sgt = sgt;
	ctx->attach = attach;
	dma_resv_unlock(resv);
	return 0;

out_unlock:
	dma_resv_unlock(resv);
	dma_buf_detach(ctx->dmabuf, attach);
	return ret;
}

static void pdpm_unmap(struct pdpm_ctx *ctx)
{
	struct dma_resv *resv = ctx->dmabuf->resv;

	if (!ctx->attach)
		return;
	dma_resv_lock(resv, NULL);
	dma_buf_unmap_attachment(ctx->attach, ctx->sgt, pdpm_dir(ctx));
	ctx->sgt = NULL;
	dma_resv_unlock(resv);
	dma_buf_detach(ctx->dmabuf, ctx->attach);
	ctx->attach = NULL;
}

static int pdpm_dma_unmap(struct sg_table *sg_head, void *client_context,
			  struct device *dma_device)
{
	struct pdpm_ctx *ctx = client_context;
	struct scatterlist *sg;
	unsigned int i;

	pdpm_unmap(ctx);
	for_each_sg(sg_head->sgl, sg, sg_head->orig_nents, i) {
		sg_dma_address(sg) = 0;
		sg_dma_len(sg) = 0;
	}
	return 0;
}

static void pdpm_put_pages(struct sg_table *sg_head, void *client_context)
{
	sg_free_table(sg_head);
}

static unsigned long pdpm_get_page_size(void *client_context)
{
	struct pdpm_ctx *ctx = client_context;

	return ctx->page_size;
}

static void pdpm_release(void *client_context)
{
	struct pdpm_ctx *ctx = client_context;

	/* Released from the core's invalidate (our work item): the work touches ctx no more. */
	if (current_work() != &ctx->invalidate_work)
		cancel_work_sync(&ctx->invalidate_work);
	/* The core always unmaps first; if it did not, the mapping must not outlive us. */
	pdpm_unmap(ctx);
	dma_buf_put(ctx->dmabuf);
	kfree(ctx);
}

static const struct peer_memory_client pdpm_client = {
	.name = "peerdirect",
	.version = "1",
	.acquire = pdpm_acquire,
	.get_pages = pdpm_get_pages,
	.dma_map = pdpm_dma_map,
	.dma_unmap = pdpm_dma_unmap,
	.put_pages = pdpm_put_pages,
	.get_page_size = pdpm_get_page_size,
	.release = pdpm_release,
};

static int __init pdpm_init(void)
{
	pdpm_wq = alloc_workqueue("peerdirect_peer_mem", WQ_UNBOUND, 0);
	if (!pdpm_wq)
		return -ENOMEM;
	pdpm_reg_handle = ib_register_peer_memory_client(&pdpm_client, &pdpm_invalidate);
	if (!pdpm_reg_handle || !pdpm_invalidate) {
		pr_err("ib_register_peer_memory_client refused the peer-memory client\n");
		if (pdpm_reg_handle)
			ib_unregister_peer_memory_client(pdpm_reg_handle);
		destroy_workqueue(pdpm_wq);
		return -EINVAL;
	}
	pr_info("PeerDirect peer-memory client \"%s\" registered with ib_core\n", pdpm_client.name);
	return 0;
}

static void __exit pdpm_exit(void)
{
	ib_unregister_peer_memory_client(pdpm_reg_handle);
	/* Flushes invalidations still queued; none is left once the core released everything. */
	destroy_workqueue(pdpm_wq);
	pr_info("PeerDirect peer-memory client unregistered\n");
}

module_init(pdpm_init);
module_exit(pdpm_exit);

MODULE_DESCRIPTION("PeerDirect peer-memory client for peerdirect's HBM dma-bufs (MLNX_OFED-style ib_core)");
MODULE_AUTHOR("The peerdirect developers");
MODULE_LICENSE("GPL");
MODULE_IMPORT_NS("DMA_BUF");

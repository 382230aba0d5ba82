// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/dma_buf.rs: the sg tables of our dma-bufs' mappings, their CPU
 * mappings, naming, revocation and the listing of their attachments.
 */
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/export.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/huge_mm.h>
#include <linux/io.h>
#include <linux/iosys-map.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "helpers.h"

/*
 * The sg table of every map, filled here rather than by dma_buf_phys_vec_to_sgt(), which
 * needs a p2pdma provider (a companion device's BAR has none of ours: its owner driver holds
 * the device and its device-managed state), asks the P2P map type again on every map, and
 * takes one range per segment. The caller has the kernel's P2P verdict and the path (p2p.rs)
 * and says how the importer reaches the BAR: @bus_addr, behind a shared switch without ACS
 * redirect, by bus address (the CPU physical address plus @bus_offset, what
 * pci_p2pdma_bus_addr_map() computes); otherwise through the host bridge, mapped for the
 * importer whole, as the core maps one range: where an IOMMU translates the importer's DMA,
 * in one IOVA range (dma_iova_try_alloc(), dma_iova_link(), dma_iova_sync()), whose unmap
 * (dma_iova_destroy()) invalidates the IOTLB before it returns, where dma_unmap_phys() may
 * leave that to a flush queue; where none does, with one dma_map_phys(DMA_ATTR_MMIO) (as
 * habanalabs maps its BARs with dma_map_resource()).
 *
 * Entries are at most @seg bytes (at most 4 GiB less a page: sg_dma_len is 32 bits), the
 * importer's max segment, but in an IOVA range: that range is one, which entries as long as
 * sg_dma_len holds describe (as the core's IOVA path does), whatever the max segment
 * (Documentation/exporter.md).
 *
 * Up to PEERDIRECT_TABLE_INLINE entries (any range up to 16 GiB with mlx5's 2 GiB segment or
 * EFA's) live in the table's own allocation, sized to them: a map and its unmap make one
 * allocation and one free, where sg_alloc_table() would add a second of each. (A fixed inline
 * array of 8 made every map's allocation 512 bytes, which Debian's kernel zeroes on
 * allocation: the map of one entry took longer than with two small allocations.)
 */
#define PEERDIRECT_TABLE_INLINE 8

/* The longest entry: what sg_dma_len holds, page aligned (the core's MAX_SG_ENT_SZ). */
#define PEERDIRECT_MAX_ENTRY ALIGN_DOWN((u64)UINT_MAX, PAGE_SIZE)

struct peerdirect_table {
	struct sg_table sgt;
	/* The IOVA range, if the range was mapped in one. */
	struct dma_iova_state iova;
	/*
	 * What dma_map_phys() returned, and the bytes it mapped from there (0 by bus address):
	 * unmap undoes that, never what the table says now, which the importer can rewrite.
	 */
	dma_addr_t addr;
	u64 mapped;
	struct scatterlist inline_sg[];
};

/* Undoes the DMA mapping of @len bytes at @addr (in @iova if it is one) for @dev. */
static void peerdirect_table_unmap_dma(struct device *dev, struct dma_iova_state *iova,
				       dma_addr_t addr, u64 len, enum dma_data_direction dir)
{
	if (dma_use_iova(iova))
		dma_iova_destroy(dev, iova, len, dir, DMA_ATTR_MMIO);
	else if (len)
		dma_unmap_phys(dev, addr, len, dir, DMA_ATTR_MMIO);
}

struct sg_table *peerdirect_map_table(struct dma_buf_attachment *attach, phys_addr_t paddr,
				      u64 bus_offset, u64 len, u64 seg, enum dma_data_direction dir,
				      bool bus_addr)
{
	struct dma_iova_state iova = {};
	struct device *dev = attach->dev;
	struct peerdirect_table *m;
	struct scatterlist *sg;
	unsigned int i, nr;
	dma_addr_t addr;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (bus_addr) {
		addr = paddr + bus_offset;
	} else if (dma_iova_try_alloc(dev, &iova, paddr, len)) {
		ret = dma_iova_link(dev, &iova, paddr, 0, len, dir, DMA_ATTR_MMIO);
		if (ret) {
			dma_iova_free(dev, &iova);
			return ERR_PTR(ret);
		}
		ret = dma_iova_sync(dev, &iova, 0, len);
		if (ret) {
			dma_iova_destroy(dev, &iova, len, dir, DMA_ATTR_MMIO);
			return ERR_PTR(ret);
		}
		addr = iova.addr;
		seg = PEERDIRECT_MAX_ENTRY;
	} else {
		addr = dma_map_phys(dev, paddr, len, dir, DMA_ATTR_MMIO);
		if (dma_mapping_error(dev, addr))
			return ERR_PTR(-EIO);
	}
	/* A real NIC's max segment holds the whole range: no division. */
	nr = len <= seg ? 1 : DIV_ROUND_UP(len, seg);
	m = kmalloc(struct_size(m, inline_sg, nr <= PEERDIRECT_TABLE_INLINE ? nr : 0), GFP_KERNEL);
	if (!m) {
		ret = -ENOMEM;
		goto err_unmap;
	}
	if (nr <= PEERDIRECT_TABLE_INLINE) {
		sg_init_table(m->inline_sg, nr);
		m->sgt.sgl = m->inline_sg;
		m->sgt.nents = nr;
		m->sgt.orig_nents = nr;
	} else {
		ret = sg_alloc_table(&m->sgt, nr, GFP_KERNEL | __GFP_ZERO);
		if (ret) {
			kfree(m);
			goto err_unmap;
		}
	}
	m->iova = iova;
	m->addr = addr;
	m->mapped = bus_addr ? 0 : len;
	for_each_sgtable_dma_sg(&m->sgt, sg, i) {
		u64 off = (u64)i * seg;

		sg_dma_address(sg) = addr + off;
		sg_dma_len(sg) = min(seg, len - off);
	}
	return &m->sgt;

err_unmap:
	peerdirect_table_unmap_dma(dev, &iova, addr, bus_addr ? 0 : len, dir);
	return ERR_PTR(ret);
}

void peerdirect_unmap_table(struct dma_buf_attachment *attach, struct sg_table *sgt,
			    enum dma_data_direction dir)
{
	struct peerdirect_table *m = container_of(sgt, struct peerdirect_table, sgt);

	peerdirect_table_unmap_dma(attach->dev, &m->iova, m->addr, m->mapped, dir);
	if (sgt->sgl != m->inline_sg)
		sg_free_table(sgt);
	kfree(m);
}

/*
 * CPU mappings of our dma-bufs are filled at fault time, never in ->mmap: a fault runs only
 * on a VMA already linked into the dma-buf file's mapping, and checks the buffer's CPU window
 * under the reservation lock that revocation takes. So either the fault comes first and
 * revocation's unmap_mapping_range() zaps what it inserted, or revocation comes first and the
 * fault raises SIGBUS (vfio-pci's model, with its memory_lock). Where the range and the VMA
 * are aligned, PMD and PUD entries map 2 MiB and 1 GiB at a time.
 */
/* The layout sys/dma_buf.rs's CpuWindow has (it asserts the same numbers). */
static_assert(offsetof(struct peerdirect_cpu_window, place) == 24);
static_assert(offsetof(struct peerdirect_cpu_window, revoked) == 56);
static_assert(offsetof(struct peerdirect_cpu_window, kmap) == 64);

static struct peerdirect_cpu_window *peerdirect_vma_window(struct vm_area_struct *vma)
{
	struct dma_buf *dmabuf = vma->vm_private_data;

	return dmabuf->priv;
}

static vm_fault_t peerdirect_dmabuf_huge_fault(struct vm_fault *vmf, unsigned int order)
{
	struct vm_area_struct *vma = vmf->vma;
	struct dma_buf *dmabuf = vma->vm_private_data;
	struct peerdirect_cpu_window *window = peerdirect_vma_window(vma);
	unsigned long addr = vmf->address & ~((PAGE_SIZE << order) - 1);
	unsigned long pfn = (window->phys >> PAGE_SHIFT) + vma->vm_pgoff +
			    ((addr - vma->vm_start) >> PAGE_SHIFT);
	/*
	 * A write fault asks for a writable entry: where the mapping needs write notification
	 * (soft-dirty tracking), the entry a read fault inserted is read-only, and a write to it
	 * comes back here for the present entry, which only a write insert makes writable: else
	 * the fault repeats forever. panthor's and drm_gem_shmem's huge faults do the same.
	 */
	bool write = vmf->flags & FAULT_FLAG_WRITE;
	vm_fault_t ret = VM_FAULT_FALLBACK;

	if (order && (addr < vma->vm_start || addr + (PAGE_SIZE << order) > vma->vm_end ||
		      !IS_ALIGNED(pfn, 1UL << order)))
		return VM_FAULT_FALLBACK;

	dma_resv_lock(dmabuf->resv, NULL);
	/*
	 * Nothing to map while the BAR does not decode (a reset, an owner that turned it off) or
	 * is no longer where the export found it (resized, reassigned, moved).
	 */
	if (window->revoked || !peerdirect_pci_bar_in_place(window->pdev, &window->place))
		ret = VM_FAULT_SIGBUS;
	else if (!order)
		ret = vmf_insert_pfn(vma, vmf->address, pfn);
#ifdef CONFIG_ARCH_SUPPORTS_PMD_PFNMAP
	else if (order == PMD_ORDER)
		ret = vmf_insert_pfn_pmd(vmf, pfn, write);
#endif
#ifdef CONFIG_ARCH_SUPPORTS_PUD_PFNMAP
	else if (order == PUD_ORDER)
		ret = vmf_insert_pfn_pud(vmf, pfn, write);
#endif
	dma_resv_unlock(dmabuf->resv);
	return ret;
}

static vm_fault_t peerdirect_dmabuf_fault(struct vm_fault *vmf)
{
	return peerdirect_dmabuf_huge_fault(vmf, 0);
}

/*
 * Also how the PeerDirect peer-memory client (peerdirect_peermem.ko, kmod/peermem/) recognises
 * user mappings of our dma-bufs: vma->vm_ops == &peerdirect_dmabuf_vm_ops.
 */
const struct vm_operations_struct peerdirect_dmabuf_vm_ops = {
	.fault = peerdirect_dmabuf_fault,
#ifdef CONFIG_ARCH_SUPPORTS_HUGE_PFNMAP
	.huge_fault = peerdirect_dmabuf_huge_fault,
#endif
};
EXPORT_SYMBOL_GPL(peerdirect_dmabuf_vm_ops);

/*
 * Whether @dmabuf is revoked (removal, reset): read under the reservation lock, which
 * revocation takes to mark it. Not under any lock the caller holds: mmap and
 * begin_cpu_access ask it.
 */
bool peerdirect_dmabuf_revoked(struct dma_buf *dmabuf)
{
	struct peerdirect_cpu_window *window = dmabuf->priv;
	bool revoked;

	dma_resv_lock(dmabuf->resv, NULL);
	revoked = window->revoked;
	dma_resv_unlock(dmabuf->resv);
	return revoked;
}

/*
 * Sets up a user mapping of @dmabuf's CPU window (offset from vm_pgoff), write-combined, to
 * be filled at fault time. Only shared mappings (a private copy of device memory means
 * nothing), never executable ones.
 */
int peerdirect_dmabuf_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct peerdirect_cpu_window *window = dmabuf->priv;
	u64 size = vma->vm_end - vma->vm_start;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;

	/* VM_MAYSHARE: a shared mapping of a read-only file has no VM_SHARED. */
	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	if (vma->vm_flags & VM_EXEC)
		return -EPERM;
	if (off > window->len || size > window->len - off)
		return -EINVAL;
	/* Faults would raise SIGBUS: say so now. */
	if (peerdirect_dmabuf_revoked(dmabuf))
		return -ENODEV;
	vma->vm_ops = &peerdirect_dmabuf_vm_ops;
	vma->vm_private_data = dmabuf;
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	vm_flags_clear(vma, VM_MAYEXEC);
	return 0;
}

/*
 * The kernel's mapping of @dmabuf's CPU window (dma_buf_ops.vmap, under the reservation lock,
 * the buffer not revoked: the caller checked): write-combined I/O memory, as the user
 * mappings are, made at the first vmap and kept until revocation or release, so that an
 * importer that vmaps around every copy (the test bed's rxe, per packet) does not map and
 * unmap the range each time. BAR memory has no struct pages: @map is I/O memory, to be read
 * and written with memcpy_fromio()/memcpy_toio() (iosys_map_memcpy_from/_to).
 */
int peerdirect_dmabuf_vmap(struct dma_buf *dmabuf, struct iosys_map *map)
{
	struct peerdirect_cpu_window *window = dmabuf->priv;

	dma_resv_assert_held(dmabuf->resv);
	if (!window->kmap) {
		window->kmap = ioremap_wc(window->phys, window->len);
		if (!window->kmap)
			return -ENOMEM;
	}
	iosys_map_set_vaddr_iomem(map, window->kmap);
	return 0;
}

/* Undoes the kernel mapping at @dmabuf's release, when nothing can use it any more. */
void peerdirect_dmabuf_kmap_release(struct dma_buf *dmabuf)
{
	struct peerdirect_cpu_window *window = dmabuf->priv;

	if (window->kmap)
		iounmap(window->kmap);
	window->kmap = NULL;
}

/* Names the dma-buf after its device, handle and range (shown in fdinfo and debugfs). */
int peerdirect_dmabuf_set_name(struct dma_buf *dmabuf, u32 index, u32 handle, u64 offset,
			       u64 len)
{
	char *name = kasprintf(GFP_KERNEL, "peerdirect%u:h%u:0x%llx+0x%llx", index, handle,
			       offset, len);

	if (!name)
		return -ENOMEM;
	spin_lock(&dmabuf->name_lock);
	kfree(dmabuf->name);
	dmabuf->name = name;
	spin_unlock(&dmabuf->name_lock);
	return 0;
}

/*
 * Revokes @dmabuf after its memory is gone (the caller made later maps fail first): its CPU
 * window is closed, importers are told to drop their mappings and the kernel's mapping (vmap)
 * is undone, under the reservation lock, then CPU mappings are zapped so that later accesses
 * fault (SIGBUS) instead of reaching the vanished BAR. A buffer whose last reference is already gone is skipped: its release is under
 * way, and with no file reference left no importer or VMA holds it (its inode may already be
 * freed, so its mapping must not be touched). Returns false for such a buffer.
 */
bool peerdirect_dmabuf_revoke(struct dma_buf *dmabuf)
{
	struct peerdirect_cpu_window *window = dmabuf->priv;
	struct file *file = get_file_active(&dmabuf->file);

	if (!file)
		return false;
	dma_resv_lock(dmabuf->resv, NULL);
	window->revoked = true;
	dma_buf_invalidate_mappings(dmabuf);
	dma_resv_wait_timeout(dmabuf->resv, DMA_RESV_USAGE_BOOKKEEP, false, MAX_SCHEDULE_TIMEOUT);
	/*
	 * No kernel mapping outlives the BAR: an importer copies under the reservation lock
	 * (vmap, copy, vunmap), so none is copying now, and its next vmap fails with ENODEV.
	 */
	if (window->kmap)
		iounmap(window->kmap);
	window->kmap = NULL;
	dma_resv_unlock(dmabuf->resv);
	unmap_mapping_range(file->f_mapping, 0, 0, 1);
	fput(file);
	return true;
}

#ifdef CONFIG_LOCKDEP
void peerdirect_assert_resv_held(struct dma_buf_attachment *attach)
{
	dma_resv_assert_held(attach->dmabuf->resv);
}
#endif

/*
 * Describes up to @max of @dmabuf's attachments in @out (in attach order) and returns how many
 * it has. The dma-buf core keeps the list under the reservation lock; the caller keeps
 * @dmabuf's memory valid (its release has not completed) and does not hold that lock.
 */
size_t peerdirect_dmabuf_attachments(struct dma_buf *dmabuf, struct peerdirect_attach_info *out,
				     size_t max)
{
	struct dma_buf_attachment *attach;
	size_t n = 0;

	dma_resv_lock(dmabuf->resv, NULL);
	list_for_each_entry(attach, &dmabuf->attachments, node) {
		uintptr_t word = (uintptr_t)attach->priv;

		if (n < max) {
			strscpy_pad(out[n].importer, dev_name(attach->dev));
			out[n].entries = word >> PEERDIRECT_ATTACH_ENTRIES_SHIFT;
			out[n].revocable = dma_buf_attach_revocable(attach);
			out[n].pinned = word & PEERDIRECT_ATTACH_PINNED;
		}
		n++;
	}
	dma_resv_unlock(dmabuf->resv);
	return n;
}

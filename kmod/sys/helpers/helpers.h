/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C helpers for what kernel::bindings cannot reach (static inlines and macros), defined
 * beside this header, one file per file of the floor that wraps them (pci.c for sys/pci.rs,
 * and so on). The Rust side declares them all in sys/raw.rs; keep the two in step.
 */
#ifndef PEERDIRECT_HELPERS_H
#define PEERDIRECT_HELPERS_H

#include <linux/dma-direction.h>
#include <linux/pci.h>

u64 peerdirect_pci_bus_address(struct pci_dev *pdev, int bar);
int peerdirect_pci_domain(struct pci_dev *pdev);
int peerdirect_pci_numa_node(struct pci_dev *pdev);
bool peerdirect_pci_bar_is_mem(struct pci_dev *pdev, int bar);
bool peerdirect_pci_decodes_memory(struct pci_dev *pdev);

/* Where a BAR was found (sys::pci::BarPlace). */
struct peerdirect_bar_place {
	u64 phys;
	u64 bus;
	u64 len;
	int bar;
};
bool peerdirect_pci_bar_in_place(struct pci_dev *pdev, const struct peerdirect_bar_place *place);
int peerdirect_pci_reserve_wc(struct pci_dev *pdev, int bar);
u16 peerdirect_pci_dev_id(struct pci_dev *pdev);
struct pci_dev *peerdirect_pci_upstream_bridge(struct pci_dev *pdev);
bool peerdirect_pci_acs_redirects(struct pci_dev *bridge);
bool peerdirect_pci_same_host_bridge(struct pci_dev *a, struct pci_dev *b);
u32 peerdirect_pci_host_bridge_ids(struct pci_dev *pdev);
bool peerdirect_pci_iommu_mapped(struct pci_dev *pdev);
bool peerdirect_pci_bound_to(struct pci_dev *pdev, const char *driver);
void peerdirect_pci_driver_name(struct pci_dev *pdev, u8 *name, size_t len);
void peerdirect_pci_device_lock(struct pci_dev *pdev);
void peerdirect_pci_device_unlock(struct pci_dev *pdev);
bool peerdirect_capable_sys_admin(void);
bool peerdirect_fatal_signal_pending(void);
void peerdirect_global_init_lock(void);
void peerdirect_global_init_unlock(void);

/*
 * What the PCI bus notifier calls (sys/pci_notifier.rs's PciBusEvents), given at registration
 * and valid until unregistration.
 */
struct peerdirect_pci_events {
	void (*device_changed)(struct device *dev);
};

/*
 * What the error handlers of peerdirect's PCI driver call (sys/pci_driver.rs's ResetAware),
 * with the device lock held: @prepare before the device is reset or while an error is
 * recovered from, @done once it is reset or recovered (each @prepare has at most one @done:
 * none when the device is removed instead).
 */
struct peerdirect_pci_reset_events {
	void (*prepare)(struct pci_dev *pdev);
	void (*done)(struct pci_dev *pdev);
};

struct pci_driver;
void peerdirect_pci_driver_set_reset_events(struct pci_driver *drv,
					    const struct peerdirect_pci_reset_events *events);

/* A device link to a PCI device another driver owns (sys/owner_link.rs, owner_link.c). */
struct peerdirect_owner_link;
int peerdirect_owner_links_init(void);
void peerdirect_owner_links_exit(void);
struct peerdirect_owner_link *peerdirect_owner_link_create(struct pci_dev *owner,
							   unsigned long key,
							   void (*unlinked)(unsigned long key));
void peerdirect_owner_link_destroy(struct peerdirect_owner_link *link);

struct dma_buf;
struct dma_buf_attachment;
struct iosys_map;
struct sg_table;
struct vm_area_struct;

struct page;

struct file;
struct file_operations;

void peerdirect_file_replace_fops(struct file *file, const struct file_operations *fops);
pid_t peerdirect_current_tgid(void);
void peerdirect_page_set_bits(struct page *page, size_t offset, u32 bits);
void peerdirect_page_count(struct page *page, size_t offset);
u32 peerdirect_page_load(struct page *page, size_t offset);
unsigned long peerdirect_vma_pgoff(struct vm_area_struct *vma);
int peerdirect_pci_generation_register(const struct peerdirect_pci_events *events);
void peerdirect_pci_generation_unregister(void);
struct sg_table *peerdirect_map_table(struct dma_buf_attachment *attach, phys_addr_t paddr,
				      u64 bus_offset, u64 len, u64 seg, enum dma_data_direction dir,
				      bool bus_addr);
void peerdirect_unmap_table(struct dma_buf_attachment *attach, struct sg_table *sgt,
			    enum dma_data_direction dir);
struct pci_dev *peerdirect_to_pci_dev(struct device *dev);

/*
 * The head of every dma-buf's private data (dmabuf->priv), mirrored by sys/dma_buf.rs's
 * `CpuWindow`: the CPU physical range a user mapping reaches, closed for good by revocation.
 * @revoked is written and read only under the buffer's reservation lock, and so is @kmap, the
 * kernel's write-combined mapping of the range (vmap), made at the first vmap and kept until
 * revocation or release.
 */
struct peerdirect_cpu_window {
	u64 phys;
	u64 len;
	struct pci_dev *pdev;
	struct peerdirect_bar_place place;
	bool revoked;
	void __iomem *kmap;
};

extern const struct vm_operations_struct peerdirect_dmabuf_vm_ops;
int peerdirect_dmabuf_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma);
int peerdirect_dmabuf_set_name(struct dma_buf *dmabuf, u32 index, u32 handle, u64 offset,
			       u64 len);
bool peerdirect_dmabuf_revoke(struct dma_buf *dmabuf);
bool peerdirect_dmabuf_revoked(struct dma_buf *dmabuf);
int peerdirect_dmabuf_vmap(struct dma_buf *dmabuf, struct iosys_map *map);
void peerdirect_dmabuf_kmap_release(struct dma_buf *dmabuf);

/*
 * What the exporter keeps of an attachment lives in its exporter-private word
 * (attach->priv), so that attach allocates nothing and detach has nothing to undo: whether the
 * importer pinned it, whether the importer reaches the BAR by bus address, and how many DMA
 * segments its current mappings have (an importer may map one attachment more than once).
 * sys/dma_buf.rs writes it (its ATTACH_* constants mirror these): at attach, before the core
 * publishes the attachment, then under the buffer's reservation lock only (pin, unpin, map
 * and unmap run under it), under which it is read.
 */
#define PEERDIRECT_ATTACH_PINNED 1UL
#define PEERDIRECT_ATTACH_BUS_ADDR 2UL
#define PEERDIRECT_ATTACH_ENTRIES_SHIFT 2

#ifdef CONFIG_LOCKDEP
void peerdirect_assert_resv_held(struct dma_buf_attachment *attach);
#endif

/* One attachment as debugfs and removal's log describe it. */
struct peerdirect_attach_info {
	char importer[32];
	u32 entries;
	bool revocable;
	bool pinned;
};

size_t peerdirect_dmabuf_attachments(struct dma_buf *dmabuf, struct peerdirect_attach_info *out,
				     size_t max);
void peerdirect_log_refused_attach(struct pci_dev *hbm, struct device *importer,
				   const char *reason);

#endif /* PEERDIRECT_HELPERS_H */

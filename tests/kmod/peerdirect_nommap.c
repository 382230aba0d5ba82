// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only: an exporter of dma-bufs that have no mmap, standing in for habanalabs, whose
 * dma-bufs of device memory a runtime (HCL) registers with a NIC but never maps through the
 * dma-buf: the runtime reaches the memory through the driver's own device file, here
 * /dev/peerdirect_nommap. PDNM_EXPORT on an open file makes that file's buffer (zeroed kernel
 * memory, vmalloc_user) of the given size and returns a dma-buf of it; mmap of the same file
 * maps the buffer (the runtime's own address for it); mmap of the dma-buf fails with EINVAL,
 * as dma-buf's core answers for an exporter without mmap. Importers map it page by page
 * (map_dma_buf). One buffer per open file. Never installed, never loaded outside the test
 * guest (userspace/capi/examples/nommap_register.c uses it in tests/system/capi.sh).
 */

#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>

/* The request, as nommap_register.c spells it: size in, the dma-buf's fd out. */
struct pdnm_export {
	__u64 size;
	__s32 fd;
	__u32 reserved;
};
#define PDNM_EXPORT _IOWR('N', 1, struct pdnm_export)

struct pdnm_buf {
	struct kref ref; /* the file's, and each dma-buf's */
	void *vaddr;
	size_t size;
};

static void pdnm_buf_free(struct kref *ref)
{
	struct pdnm_buf *buf = container_of(ref, struct pdnm_buf, ref);

	vfree(buf->vaddr);
	kfree(buf);
}

static struct sg_table *pdnm_map(struct dma_buf_attachment *attach, enum dma_data_direction dir)
{
	struct pdnm_buf *buf = attach->dmabuf->priv;
	struct scatterlist *sg;
	struct sg_table *sgt;
	unsigned int i;
	int ret;

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(sgt, buf->size >> PAGE_SHIFT, GFP_KERNEL);
	if (ret)
		goto free;
	for_each_sgtable_sg(sgt, sg, i)
		sg_set_page(sg, vmalloc_to_page(buf->vaddr + (size_t)i * PAGE_SIZE), PAGE_SIZE, 0);
	ret = dma_map_sgtable(attach->dev, sgt, dir, 0);
	if (ret)
		goto table;
	return sgt;
table:
	sg_free_table(sgt);
free:
	kfree(sgt);
	return ERR_PTR(ret);
}

static void pdnm_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
		       enum dma_data_direction dir)
{
	dma_unmap_sgtable(attach->dev, sgt, dir, 0);
	sg_free_table(sgt);
	kfree(sgt);
}

static void pdnm_dmabuf_release(struct dma_buf *dmabuf)
{
	struct pdnm_buf *buf = dmabuf->priv;

	kref_put(&buf->ref, pdnm_buf_free);
}

/* No .mmap: dma_buf_mmap() and mmap of the fd fail with EINVAL. */
static const struct dma_buf_ops pdnm_ops = {
	.map_dma_buf = pdnm_map,
	.unmap_dma_buf = pdnm_unmap,
	.release = pdnm_dmabuf_release,
};

static int pdnm_open(struct inode *inode, struct file *file)
{
	/* The misc core set it to the miscdevice; this file has no buffer yet. */
	file->private_data = NULL;
	return 0;
}

static long pdnm_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct pdnm_export req;
	struct dma_buf *dmabuf;
	struct pdnm_buf *buf;
	int fd;

	if (cmd != PDNM_EXPORT)
		return -ENOTTY;
	if (copy_from_user(&req, (void __user *)arg, sizeof(req)))
		return -EFAULT;
	if (!req.size || !PAGE_ALIGNED(req.size) || req.size > SZ_256M || req.reserved)
		return -EINVAL;
	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	buf->vaddr = vmalloc_user(req.size);
	if (!buf->vaddr) {
		kfree(buf);
		return -ENOMEM;
	}
	buf->size = req.size;
	kref_init(&buf->ref);
	if (cmpxchg(&file->private_data, NULL, buf)) {
		kref_put(&buf->ref, pdnm_buf_free);
		return -EBUSY;
	}
	info.ops = &pdnm_ops;
	info.size = req.size;
	info.flags = O_RDWR | O_CLOEXEC;
	info.priv = buf;
	kref_get(&buf->ref);
	dmabuf = dma_buf_export(&info);
	if (IS_ERR(dmabuf)) {
		kref_put(&buf->ref, pdnm_buf_free);
		return PTR_ERR(dmabuf);
	}
	fd = dma_buf_fd(dmabuf, O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	req.fd = fd;
	/* The fd is the caller's now, even if it cannot be told its number. */
	return copy_to_user((void __user *)arg, &req, sizeof(req)) ? -EFAULT : 0;
}

static int pdnm_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct pdnm_buf *buf = READ_ONCE(file->private_data);

	if (!buf)
		return -ENODEV;
	return remap_vmalloc_range(vma, buf->vaddr, vma->vm_pgoff);
}

static int pdnm_release(struct inode *inode, struct file *file)
{
	struct pdnm_buf *buf = file->private_data;

	if (buf)
		kref_put(&buf->ref, pdnm_buf_free);
	return 0;
}

static const struct file_operations pdnm_fops = {
	.owner = THIS_MODULE,
	.open = pdnm_open,
	.release = pdnm_release,
	.unlocked_ioctl = pdnm_ioctl,
	.mmap = pdnm_mmap,
};

static struct miscdevice pdnm_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "peerdirect_nommap",
	.fops = &pdnm_fops,
};

module_misc_device(pdnm_misc);

MODULE_DESCRIPTION("Test-only: dma-bufs without mmap, reached through the exporter's own device");
MODULE_IMPORT_NS("DMA_BUF");
MODULE_LICENSE("GPL");

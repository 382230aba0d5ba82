// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only: imports a dma-buf with ib_core's own umem functions, as RDMA drivers do:
 *
 *   pinned     ib_umem_dmabuf_get_pinned_with_dma_device(ibdev, &nic->dev, ...): the pinned
 *              path of EFA (efa_reg_user_mr_dmabuf: ib_umem_dmabuf_get_pinned, which is this
 *              with ibdev->dma_device) and of mlx5's data-direct MRs;
 *   revocable  ib_umem_dmabuf_get_pinned_revocable_and_lock + ib_umem_dmabuf_set_revoke_locked:
 *              irdma's revocable pinned path;
 *   dynamic    ib_umem_dmabuf_get with move-notify ops + ib_umem_dmabuf_map_pages under the
 *              reservation lock: mlx5's dynamic (ODP-style) path.
 *
 * Then, as a driver building its page list, ib_umem_find_best_pgsz with an EFA-like page-size
 * bitmap (4 KiB .. 2 GiB) and rdma_umem_for_each_dma_block over the umem.
 *
 * Which ib_device: rdma_rxe registers its ib_device with no DMA device (ibdev->dma_device is
 * NULL), so with rxe's ib_device only the _with_dma_device variant can attach (the others
 * would hand dma_buf_dynamic_attach a NULL device). rxe's device is found with an ib_client.
 * The variants that take ibdev->dma_device get a test-owned ib_device instead: allocated with
 * ib_alloc_device, never registered, its dma_device set to the NIC's PCI device (what
 * ib_register_device would have set for a PCI RDMA driver), deallocated after the umem is
 * released. ib_core's dma-buf umem code uses the ib_device only as a label (umem->ibdev) and
 * for dma_device, so this is the same code path a registered device takes. mode=pinned uses
 * rxe's ib_device when one exists (ibdev=rxe), or the test-owned one (ibdev=own).
 *
 * Interface: /sys/kernel/debug/peerdirect_ibimport/run. Write one command (one write, from
 * the process that owns the dma-buf fd), read the result back as key=value lines.
 *
 *   info
 *	rxe=NAME|none, rxe_dma_device=null|DEV
 *   run fd=N nic=DDDD:BB:SS.F mode=pinned|revocable|dynamic [ibdev=rxe|own]
 *       [offset=O] [size=S] [iova=V] [hold=0|1]
 *	import (size defaults to the dma-buf's size less offset; iova to 0), choose the page
 *	size, walk the DMA blocks, report; then release unless hold=1 ("id=I").
 *   status id=I	revoke_calls, revoke_saw_mapped, invalidations, revoked, mapped, pinned
 *   release id=I | release all
 *   bench fd=N nic=DDDD:BB:SS.F mode=pinned|revocable [offset=O] [size=S] [iova=V] [reps=R]
 *         [max_seg=BYTES]
 *	a memory registration as a driver performs it, R times (default 5): get the umem
 *	(pinned: EFA's ib_umem_dmabuf_get_pinned path; revocable: irdma's, unlocked after the
 *	revoke callback is set), choose the page size, walk every DMA block as a driver fills
 *	its page list; then ib_umem_release. Reports the best of each in ns (reg_ns,
 *	dereg_ns), with pgsz and blocks. Uses a test-owned ib_device whose DMA device is the NIC.
 *	max_seg=BYTES sets the NIC's DMA max segment size for the command and puts the old one
 *	back after: EFA's (UINT_MAX) where the stand-in has the PCI default (64 KiB).
 *
 * Failures of ib_core calls are results ("get=-95"), not write errors; the write fails only
 * when the command is malformed or names no such fd, device or id. Nothing here WARNs; every
 * path frees what it took.
 */

#include <linux/debugfs.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/seq_buf.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "cmdfile.h"
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/iter.h>

MODULE_IMPORT_NS("DMA_BUF");

/* EFA-like: every power of two from 4 KiB to 2 GiB. */
#define PIB_PGSZ_BITMAP GENMASK(31, 12)
/* Most repetitions one bench command makes. */
#define PIB_MAX_REPS 1000

enum pib_mode { PIB_PINNED, PIB_REVOCABLE, PIB_DYNAMIC };

static const char *const pib_mode_names[] = {
	[PIB_PINNED] = "pinned",
	[PIB_REVOCABLE] = "revocable",
	[PIB_DYNAMIC] = "dynamic",
};

struct pib_import {
	struct list_head node; /* in pib_held, when held */
	u32 id;
	enum pib_mode mode;
	struct pci_dev *nic; /* reference */
	struct ib_device *own; /* the test-owned ib_device, if used */
	struct ib_umem_dmabuf *umem;
	/* Under the dma-buf's reservation lock: */
	unsigned int revoke_calls;
	bool revoke_saw_mapped;
	unsigned int invalidations;
};

static LIST_HEAD(pib_held);
static DEFINE_MUTEX(pib_held_lock); /* taken before any reservation lock */
static u32 pib_next_id = 1;
static struct dentry *pib_dir;

/* rxe's ib_device, kept by the ib_client below. */
static DEFINE_MUTEX(pib_rxe_lock);
static struct ib_device *pib_rxe;

static int pib_client_add(struct ib_device *ibdev)
{
	if (ibdev->ops.driver_id != RDMA_DRIVER_RXE)
		return -EOPNOTSUPP;
	mutex_lock(&pib_rxe_lock);
	if (!pib_rxe)
		pib_rxe = ibdev;
	mutex_unlock(&pib_rxe_lock);
	return 0;
}

static void pib_client_remove(struct ib_device *ibdev, void *client_data)
{
	mutex_lock(&pib_rxe_lock);
	if (pib_rxe == ibdev)
		pib_rxe = NULL;
	mutex_unlock(&pib_rxe_lock);
}

static struct ib_client pib_client = {
	.name = "peerdirect_ibimport",
	.add = pib_client_add,
	.remove = pib_client_remove,
	.no_kverbs_req = true,
};

/* irdma-style revoke callback: called under the reservation lock, before ib_core unmaps. */
static void pib_revoke(void *priv)
{
	struct pib_import *p = priv;

	dma_resv_assert_held(p->umem->attach->dmabuf->resv);
	p->revoke_calls++;
	p->revoke_saw_mapped = p->umem->sgt != NULL;
}

/* mlx5-style move notify: drop the mapping; it is rebuilt on the next use. */
static void pib_invalidate_dynamic(struct dma_buf_attachment *attach)
{
	struct ib_umem_dmabuf *umem = attach->importer_priv;
	struct pib_import *p = umem->private;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (p)
		p->invalidations++;
	ib_umem_dmabuf_unmap_pages(umem);
}

static const struct dma_buf_attach_ops pib_dynamic_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = pib_invalidate_dynamic,
};

struct pib_cmd {
	const char *verb;
	int fd;
	bool has_fd, has_nic, has_mode, has_id, all, has_size, hold;
	bool want_rxe, want_own;
	unsigned int nic[4];
	unsigned int reps, max_seg;
	enum pib_mode mode;
	u64 offset, size, iova;
	u32 id;
};

static int pib_parse(char *line, struct pib_cmd *cmd, struct seq_buf *out)
{
	static const char *const verbs[] = { "run", "info", "status", "release", "bench" };
	bool first = true;
	char *tok, *val;
	int ret = 0;

	memset(cmd, 0, sizeof(*cmd));
	cmd->verb = "run";

	while ((tok = strsep(&line, " \t\n")) != NULL) {
		if (!*tok)
			continue;
		val = strchr(tok, '=');
		if (!val) {
			int v = match_string(verbs, ARRAY_SIZE(verbs), tok);

			if (first && v >= 0) {
				cmd->verb = verbs[v];
				first = false;
				continue;
			}
			if (!strcmp(tok, "all") && !strcmp(cmd->verb, "release")) {
				cmd->all = true;
				continue;
			}
			seq_buf_printf(out, "error=unknown word '%s'\n", tok);
			return -EINVAL;
		}
		first = false;
		*val++ = '\0';
		if (!strcmp(tok, "fd")) {
			ret = kstrtoint(val, 10, &cmd->fd);
			cmd->has_fd = true;
		} else if (!strcmp(tok, "nic")) {
			ret = cmdfile_parse_bdf(val, cmd->nic);
			cmd->has_nic = true;
		} else if (!strcmp(tok, "mode")) {
			ret = match_string(pib_mode_names, ARRAY_SIZE(pib_mode_names), val);
			if (ret >= 0) {
				cmd->mode = ret;
				cmd->has_mode = true;
				ret = 0;
			}
		} else if (!strcmp(tok, "ibdev")) {
			if (!strcmp(val, "rxe"))
				cmd->want_rxe = true;
			else if (!strcmp(val, "own"))
				cmd->want_own = true;
			else
				ret = -EINVAL;
		} else if (!strcmp(tok, "offset")) {
			ret = kstrtou64(val, 0, &cmd->offset);
		} else if (!strcmp(tok, "size")) {
			ret = kstrtou64(val, 0, &cmd->size);
			cmd->has_size = true;
		} else if (!strcmp(tok, "iova")) {
			ret = kstrtou64(val, 0, &cmd->iova);
		} else if (!strcmp(tok, "hold")) {
			ret = kstrtobool(val, &cmd->hold);
		} else if (!strcmp(tok, "max_seg")) {
			ret = kstrtouint(val, 0, &cmd->max_seg);
			if (!ret && cmd->max_seg < PAGE_SIZE)
				ret = -ERANGE;
		} else if (!strcmp(tok, "reps")) {
			ret = kstrtouint(val, 10, &cmd->reps);
			if (!ret && (cmd->reps < 1 || cmd->reps > PIB_MAX_REPS))
				ret = -ERANGE;
		} else if (!strcmp(tok, "id")) {
			ret = kstrtou32(val, 10, &cmd->id);
			cmd->has_id = true;
		} else {
			seq_buf_printf(out, "error=unknown key '%s'\n", tok);
			return -EINVAL;
		}
		if (ret) {
			seq_buf_printf(out, "error=bad value for %s: '%s'\n", tok, val);
			return -EINVAL;
		}
	}

	if (!strcmp(cmd->verb, "run") || !strcmp(cmd->verb, "bench")) {
		if (!cmd->has_fd || !cmd->has_nic || !cmd->has_mode) {
			seq_buf_printf(out, "error=%s needs fd=, nic= and mode=\n", cmd->verb);
			return -EINVAL;
		}
		if (cmd->max_seg && strcmp(cmd->verb, "bench")) {
			seq_buf_puts(out, "error=max_seg= only with bench\n");
			return -EINVAL;
		}
		if (!strcmp(cmd->verb, "bench") &&
		    (cmd->mode == PIB_DYNAMIC || cmd->want_rxe || cmd->hold)) {
			seq_buf_puts(out,
				     "error=bench takes mode=pinned or mode=revocable, no ibdev= or hold=\n");
			return -EINVAL;
		}
		if (cmd->want_rxe && cmd->mode != PIB_PINNED) {
			seq_buf_puts(out,
				     "error=ibdev=rxe only with mode=pinned: rxe's ib_device has no dma_device, and the other variants attach ibdev->dma_device\n");
			return -EINVAL;
		}
	} else if (!strcmp(cmd->verb, "status") && !cmd->has_id) {
		seq_buf_puts(out, "error=status needs id=\n");
		return -EINVAL;
	} else if (!strcmp(cmd->verb, "release") && !cmd->has_id && !cmd->all) {
		seq_buf_puts(out, "error=release needs id= or all\n");
		return -EINVAL;
	}
	return 0;
}

/* A never-registered ib_device whose DMA device is @dev, as a PCI RDMA driver's would be. */
static struct ib_device *pib_alloc_own(struct device *dev)
{
	struct ib_device *ibdev = _ib_alloc_device(sizeof(*ibdev), &init_net);

	if (ibdev)
		ibdev->dma_device = dev;
	return ibdev;
}

/* Page size and DMA blocks, as a driver building its page list. Under the reservation lock. */
static void pib_report_blocks(struct pib_import *p, u64 iova, struct seq_buf *out)
{
	struct ib_umem *umem = &p->umem->umem;
	u64 first = 0, last = 0, prev = 0;
	struct ib_block_iter biter;
	unsigned long pgsz;
	bool contiguous = true;
	size_t blocks = 0;

	dma_resv_assert_held(p->umem->attach->dmabuf->resv);
	seq_buf_printf(out, "umem_nents=%u\n", umem->sgt_append.sgt.nents);
	seq_buf_printf(out, "dma_start=0x%llx\n", (u64)ib_umem_start_dma_addr(umem));
	seq_buf_printf(out, "pgsz_bitmap=0x%lx\n", (unsigned long)PIB_PGSZ_BITMAP);
	pgsz = ib_umem_find_best_pgsz(umem, PIB_PGSZ_BITMAP, iova);
	seq_buf_printf(out, "pgsz=%lu\n", pgsz);
	if (!pgsz)
		return;
	seq_buf_printf(out, "num_dma_blocks=%zu\n", ib_umem_num_dma_blocks(umem, pgsz));
	rdma_umem_for_each_dma_block(umem, &biter, pgsz) {
		u64 addr = rdma_block_iter_dma_address(&biter);

		if (!blocks)
			first = addr;
		else if (addr != prev + pgsz)
			contiguous = false;
		prev = last = addr;
		blocks++;
	}
	seq_buf_printf(out, "blocks=%zu\n", blocks);
	seq_buf_printf(out, "block_first=0x%llx\n", first);
	seq_buf_printf(out, "block_last=0x%llx\n", last);
	seq_buf_printf(out, "blocks_contiguous=%d\n", blocks ? contiguous : 0);
}

static void pib_report_state_locked(struct pib_import *p, struct seq_buf *out)
{
	dma_resv_assert_held(p->umem->attach->dmabuf->resv);
	seq_buf_printf(out, "id=%u\n", p->id);
	seq_buf_printf(out, "mode=%s\n", pib_mode_names[p->mode]);
	seq_buf_printf(out, "revoke_calls=%u\n", p->revoke_calls);
	seq_buf_printf(out, "revoke_saw_mapped=%d\n", p->revoke_saw_mapped);
	seq_buf_printf(out, "invalidations=%u\n", p->invalidations);
	seq_buf_printf(out, "revoked=%d\n", p->umem->revoked);
	seq_buf_printf(out, "pinned=%d\n", p->umem->pinned);
	seq_buf_printf(out, "mapped=%d\n", !!p->umem->sgt);
	if (p->umem->sgt)
		seq_buf_printf(out, "dma_start=0x%llx\n",
			       (u64)ib_umem_start_dma_addr(&p->umem->umem));
}

/* ib_umem_release() revokes what is not revoked yet, unmaps, unpins, detaches, frees. */
static void pib_free(struct pib_import *p)
{
	if (p->umem)
		ib_umem_release(&p->umem->umem);
	if (p->own)
		ib_dealloc_device(p->own);
	pci_dev_put(p->nic);
	kfree(p);
}

static int pib_run(const struct pib_cmd *cmd, struct seq_buf *out)
{
	int access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;
	struct ib_umem_dmabuf *umem;
	struct ib_device *ibdev = NULL;
	struct dma_buf *dmabuf;
	struct pib_import *p;
	struct dma_resv *resv;
	size_t dmabuf_size;
	u64 size;
	int ret;

	dmabuf = dma_buf_get(cmd->fd);
	if (IS_ERR(dmabuf)) {
		seq_buf_printf(out, "error=fd %d is not a dma-buf (%ld)\n", cmd->fd,
			       PTR_ERR(dmabuf));
		return PTR_ERR(dmabuf);
	}
	dmabuf_size = dmabuf->size;
	seq_buf_printf(out, "exporter=%s\n", dmabuf->exp_name ?: "");
	dma_buf_put(dmabuf);
	seq_buf_printf(out, "dmabuf_size=%zu\n", dmabuf_size);
	if (cmd->has_size)
		size = cmd->size;
	else
		size = cmd->offset < dmabuf_size ? dmabuf_size - cmd->offset : 0;

	p = kzalloc_obj(*p);
	if (!p)
		return -ENOMEM;
	p->mode = cmd->mode;
	p->nic = pci_get_domain_bus_and_slot(cmd->nic[0], cmd->nic[1],
					     PCI_DEVFN(cmd->nic[2], cmd->nic[3]));
	if (!p->nic) {
		seq_buf_printf(out, "error=no PCI device %04x:%02x:%02x.%x\n", cmd->nic[0],
			       cmd->nic[1], cmd->nic[2], cmd->nic[3]);
		kfree(p);
		return -ENODEV;
	}
	seq_buf_printf(out, "mode=%s\n", pib_mode_names[cmd->mode]);
	seq_buf_printf(out, "dma_device=%s\n", pci_name(p->nic));
	seq_buf_printf(out, "offset=%llu\n", cmd->offset);
	seq_buf_printf(out, "size=%llu\n", size);
	seq_buf_printf(out, "iova=0x%llx\n", cmd->iova);

	mutex_lock(&pib_rxe_lock);
	if (cmd->mode == PIB_PINNED && !cmd->want_own && pib_rxe) {
		ibdev = pib_rxe;
		seq_buf_printf(out, "ibdev=%s\n", dev_name(&ibdev->dev));
		seq_buf_puts(out, "ibdev_kind=rxe\n");
	} else if (cmd->want_rxe) {
		mutex_unlock(&pib_rxe_lock);
		seq_buf_puts(out, "error=ibdev=rxe: no rxe ib_device is registered\n");
		pib_free(p);
		return -ENODEV;
	} else {
		mutex_unlock(&pib_rxe_lock);
		p->own = pib_alloc_own(&p->nic->dev);
		if (!p->own) {
			pib_free(p);
			return -ENOMEM;
		}
		ibdev = p->own;
		seq_buf_puts(out, "ibdev=test-owned\n");
		seq_buf_puts(out, "ibdev_kind=own\n");
	}

	switch (cmd->mode) {
	case PIB_PINNED:
		umem = ib_umem_dmabuf_get_pinned_with_dma_device(ibdev, &p->nic->dev,
								 cmd->offset, size, cmd->fd,
								 access);
		break;
	case PIB_REVOCABLE:
		umem = ib_umem_dmabuf_get_pinned_revocable_and_lock(ibdev, cmd->offset, size,
								    cmd->fd, access);
		break;
	case PIB_DYNAMIC:
	default:
		umem = ib_umem_dmabuf_get(ibdev, cmd->offset, size, cmd->fd, access,
					  &pib_dynamic_ops);
		break;
	}
	if (!p->own)
		mutex_unlock(&pib_rxe_lock); /* ib_core keeps no use of rxe's device */
	ret = PTR_ERR_OR_ZERO(umem);
	seq_buf_printf(out, "get=%d\n", ret);
	if (ret) {
		pib_free(p);
		return 0;
	}
	p->umem = umem;
	resv = umem->attach->dmabuf->resv;

	switch (cmd->mode) {
	case PIB_REVOCABLE:
		/* Returned locked: set the callback before anyone can revoke. */
		ib_umem_dmabuf_set_revoke_locked(umem, pib_revoke, p);
		break;
	case PIB_DYNAMIC:
		dma_resv_lock(resv, NULL);
		umem->private = p;
		ret = ib_umem_dmabuf_map_pages(umem);
		seq_buf_printf(out, "map=%d\n", ret);
		if (ret) {
			dma_resv_unlock(resv);
			pib_free(p);
			return 0;
		}
		break;
	case PIB_PINNED:
	default:
		dma_resv_lock(resv, NULL);
		break;
	}
	seq_buf_printf(out, "peer2peer=%d\n", umem->attach->peer2peer);
	seq_buf_printf(out, "revocable=%d\n", dma_buf_attach_revocable(umem->attach));
	seq_buf_printf(out, "pinned=%d\n", umem->pinned);
	pib_report_blocks(p, cmd->iova, out);
	dma_resv_unlock(resv);

	if (cmd->hold) {
		mutex_lock(&pib_held_lock);
		p->id = pib_next_id++;
		list_add_tail(&p->node, &pib_held);
		mutex_unlock(&pib_held_lock);
		seq_buf_printf(out, "id=%u\n", p->id);
		return 0;
	}
	pib_free(p);
	return 0;
}

/* No revocation is expected while a bench runs: the exporter's device stays. */
static void pib_bench_revoke(void *priv)
{
}

/* The size "run" would import: the dma-buf's less @offset unless size= was given. */
static int pib_size(const struct pib_cmd *cmd, u64 *size, struct seq_buf *out)
{
	struct dma_buf *dmabuf = dma_buf_get(cmd->fd);

	if (IS_ERR(dmabuf)) {
		seq_buf_printf(out, "error=fd %d is not a dma-buf (%ld)\n", cmd->fd,
			       PTR_ERR(dmabuf));
		return PTR_ERR(dmabuf);
	}
	seq_buf_printf(out, "exporter=%s\n", dmabuf->exp_name ?: "");
	if (cmd->has_size)
		*size = cmd->size;
	else
		*size = cmd->offset < dmabuf->size ? dmabuf->size - cmd->offset : 0;
	dma_buf_put(dmabuf);
	return 0;
}

static int pib_bench(const struct pib_cmd *cmd, struct seq_buf *out)
{
	int access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_WRITE;
	u64 best_reg = U64_MAX, best_dereg = U64_MAX, size, sum = 0;
	unsigned int i, reps = cmd->reps ?: 5, old_max_seg;
	unsigned long pgsz = 0;
	struct ib_device *own;
	struct pci_dev *nic;
	size_t blocks = 0;
	int ret;

	ret = pib_size(cmd, &size, out);
	if (ret)
		return ret;
	nic = pci_get_domain_bus_and_slot(cmd->nic[0], cmd->nic[1],
					  PCI_DEVFN(cmd->nic[2], cmd->nic[3]));
	if (!nic) {
		seq_buf_printf(out, "error=no PCI device %04x:%02x:%02x.%x\n", cmd->nic[0],
			       cmd->nic[1], cmd->nic[2], cmd->nic[3]);
		return -ENODEV;
	}
	own = pib_alloc_own(&nic->dev);
	if (!own) {
		pci_dev_put(nic);
		return -ENOMEM;
	}
	old_max_seg = dma_get_max_seg_size(&nic->dev);
	if (cmd->max_seg)
		dma_set_max_seg_size(&nic->dev, cmd->max_seg);
	seq_buf_printf(out, "max_seg=%u\n", dma_get_max_seg_size(&nic->dev));
	for (i = 0; i < reps; i++) {
		struct ib_umem_dmabuf *umem;
		struct ib_block_iter biter;
		u64 t0, t1, t2;

		t0 = ktime_get_ns();
		if (cmd->mode == PIB_PINNED) {
			umem = ib_umem_dmabuf_get_pinned_with_dma_device(own, &nic->dev,
									 cmd->offset, size,
									 cmd->fd, access);
		} else {
			umem = ib_umem_dmabuf_get_pinned_revocable_and_lock(own, cmd->offset, size,
									    cmd->fd, access);
			if (!IS_ERR(umem)) {
				ib_umem_dmabuf_set_revoke_locked(umem, pib_bench_revoke, NULL);
				dma_resv_unlock(umem->attach->dmabuf->resv);
			}
		}
		if (IS_ERR(umem)) {
			seq_buf_printf(out, "get=%ld\n", PTR_ERR(umem));
			goto out;
		}
		/* As the driver fills its page list: pinned, so no reservation lock needed. */
		pgsz = ib_umem_find_best_pgsz(&umem->umem, PIB_PGSZ_BITMAP, cmd->iova);
		blocks = 0;
		if (pgsz) {
			rdma_umem_for_each_dma_block(&umem->umem, &biter, pgsz) {
				sum += rdma_block_iter_dma_address(&biter);
				blocks++;
			}
		}
		t1 = ktime_get_ns();
		ib_umem_release(&umem->umem);
		t2 = ktime_get_ns();
		best_reg = min(best_reg, t1 - t0);
		best_dereg = min(best_dereg, t2 - t1);
	}
	seq_buf_puts(out, "get=0\n");
	seq_buf_printf(out, "mode=%s\n", pib_mode_names[cmd->mode]);
	seq_buf_printf(out, "size=%llu\n", size);
	seq_buf_printf(out, "reps=%u\n", reps);
	seq_buf_printf(out, "pgsz=%lu\n", pgsz);
	seq_buf_printf(out, "blocks=%zu\n", blocks);
	/* Keeps the walk from being optimised away; meaningless otherwise. */
	seq_buf_printf(out, "block_sum=0x%llx\n", sum);
	seq_buf_printf(out, "reg_ns=%llu\n", best_reg);
	seq_buf_printf(out, "dereg_ns=%llu\n", best_dereg);
out:
	if (cmd->max_seg)
		dma_set_max_seg_size(&nic->dev, old_max_seg);
	ib_dealloc_device(own);
	pci_dev_put(nic);
	return 0;
}

static void pib_release_one(struct pib_import *p, struct seq_buf *out)
{
	list_del(&p->node);
	if (out) {
		dma_resv_lock(p->umem->attach->dmabuf->resv, NULL);
		pib_report_state_locked(p, out);
		dma_resv_unlock(p->umem->attach->dmabuf->resv);
	}
	pib_free(p);
}

static int pib_held_cmd(const struct pib_cmd *cmd, struct seq_buf *out)
{
	struct pib_import *p, *next;
	int ret = 0;

	mutex_lock(&pib_held_lock);
	if (cmd->all) {
		unsigned int n = 0;

		list_for_each_entry_safe(p, next, &pib_held, node) {
			pib_release_one(p, NULL);
			n++;
		}
		seq_buf_printf(out, "released=%u\n", n);
		goto out;
	}
	list_for_each_entry(p, &pib_held, node)
		if (p->id == cmd->id)
			goto found;
	seq_buf_printf(out, "error=no held import id=%u\n", cmd->id);
	ret = -ENOENT;
	goto out;
found:
	if (!strcmp(cmd->verb, "release")) {
		pib_release_one(p, out);
	} else {
		dma_resv_lock(p->umem->attach->dmabuf->resv, NULL);
		pib_report_state_locked(p, out);
		dma_resv_unlock(p->umem->attach->dmabuf->resv);
	}
out:
	mutex_unlock(&pib_held_lock);
	return ret;
}

static void pib_info(struct seq_buf *out)
{
	mutex_lock(&pib_rxe_lock);
	if (pib_rxe) {
		seq_buf_printf(out, "rxe=%s\n", dev_name(&pib_rxe->dev));
		if (pib_rxe->dma_device)
			seq_buf_printf(out, "rxe_dma_device=%s\n",
				       dev_name(pib_rxe->dma_device));
		else
			seq_buf_puts(out, "rxe_dma_device=null\n");
	} else {
		seq_buf_puts(out, "rxe=none\n");
	}
	mutex_unlock(&pib_rxe_lock);
	seq_buf_printf(out, "pgsz_bitmap=0x%lx\n", (unsigned long)PIB_PGSZ_BITMAP);
}

/* One command line: "run ...", "info", or a command on a held import. */
static int pib_handle(char *line, struct seq_buf *out)
{
	struct pib_cmd cmd;
	int ret = pib_parse(line, &cmd, out);

	if (ret)
		return ret;
	if (!strcmp(cmd.verb, "run"))
		return pib_run(&cmd, out);
	if (!strcmp(cmd.verb, "bench"))
		return pib_bench(&cmd, out);
	if (!strcmp(cmd.verb, "info")) {
		pib_info(out);
		return 0;
	}
	return pib_held_cmd(&cmd, out);
}

CMDFILE_FOPS(pib_fops, pib_handle);

static int __init pib_init(void)
{
	int ret;

	ret = ib_register_client(&pib_client);
	if (ret)
		return ret;
	pib_dir = debugfs_create_dir("peerdirect_ibimport", NULL);
	if (IS_ERR(pib_dir)) {
		ib_unregister_client(&pib_client);
		return PTR_ERR(pib_dir);
	}
	debugfs_create_file("run", 0600, pib_dir, NULL, &pib_fops);
	return 0;
}

static void __exit pib_exit(void)
{
	struct pib_import *p, *next;

	debugfs_remove(pib_dir);
	mutex_lock(&pib_held_lock);
	list_for_each_entry_safe(p, next, &pib_held, node)
		pib_release_one(p, NULL);
	mutex_unlock(&pib_held_lock);
	ib_unregister_client(&pib_client);
}

module_init(pib_init);
module_exit(pib_exit);

MODULE_DESCRIPTION("Test-only ib_core dma-buf importer (ib_umem_dmabuf_*) for peerdirect tests");
MODULE_AUTHOR("The peerdirect developers");
MODULE_LICENSE("GPL");

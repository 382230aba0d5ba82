// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only: plays an RDMA NIC importing a dma-buf, the way ib_core's umem_dmabuf.c does for
 * mlx5 (dynamic), EFA (pinned) and irdma (pinned, revocable), with any PCI device of the guest
 * standing in as the importing device. Never installed, never loaded outside the test guest.
 *
 * Interface: /sys/kernel/debug/peerdirect_importer/run. Each open file keeps the result of its
 * last command; write a command line (in one write), then read the result back as
 * "key=value" lines: reads after a write return the result from its start up to its end.
 *
 *   fd=N dev=DDDD:BB:SS.F mode=dynamic|pinned|revocable|static [hbm=DDDD:BB:SS.F]
 *        [dir=bidir|to_device|from_device] [p2p=0|1] [hold=0|1] [stall=MS] [defer=MS]
 *        [max_seg=BYTES] [cycles=N] [maps=1|2] [scribble=1]
 *	attach dma-buf fd N (an fd of the writing process) to PCI device dev, (pin,) map, walk
 *	the sg table, then unmap, (unpin,) detach, unless hold=1: then the attachment stays
 *	mapped until "release id=I". With hbm=, also reports the kernel's P2P distance from
 *	that device (the exporter's) to dev. p2p=0 attaches without allow_peer2peer; mode=static
 *	attaches without importer ops at all (dma_buf_attach, as a non-P2P importer does).
 *	stall=MS (dynamic and revocable only) makes each invalidation of the attachment sleep MS
 *	milliseconds first, as a NIC does that waits for its hardware to stop using a mapping;
 *	the exporter's revocation then holds whatever locks it holds for that long.
 *	defer=MS (dynamic only) makes an invalidation keep the mapping and unmap it from a work
 *	item MS milliseconds later, as a NIC does that must first quiesce its hardware: the
 *	exporter's removal then waits for a revocable mapping after revoking.
 *	max_seg=BYTES (not with hold=1) sets dev's DMA max segment size for the command, and
 *	puts the old one back after: an RDMA NIC's (EFA: UINT_MAX, mlx5: 2 GiB) where the
 *	stand-in has the PCI default (64 KiB).
 *	cycles=N (not with hold=1) repeats the whole cycle N times in all (N-1 more times after
 *	the reported one, each mapping as many entries as the first) and adds each step's
 *	median time over the N cycles (attach_ns_p50, map_ns_p50, unmap_detach_ns_p50), so that
 *	a benchmark's numbers are not single samples.
 *	maps=2 maps the attachment a second time while the first mapping is still mapped (the
 *	dma-buf core keeps no sg table per attachment, so each map reaches the exporter), and
 *	unmaps that second mapping at once; the first is then held or unmapped as usual. The
 *	result adds map2= and map2_nents=.
 *	scribble=1 (not with hold=1) rewrites every entry's DMA address in the sg table (one
 *	page further on) after the walk and before the unmap, as a buggy or hostile importer
 *	could: the exporter must unmap what it mapped, not what the table now says. The result
 *	adds scribbled=N, the entries rewritten.
 *   stalls		how many stalled invalidations have started (takes no lock)
 *   status id=I	invalidations seen, whether mapped, whether revoked
 *   remap id=I		map again an attachment whose mapping the exporter invalidated
 *   release id=I | release all
 *
 * Failures of the dma-buf calls are results ("attach=-95"), not write errors; the write fails
 * only when the command is malformed or names no such fd, device or id. Nothing here WARNs.
 */

#include <linux/atomic.h>
#include <linux/debugfs.h>
#include <linux/delay.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/device.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/scatterlist.h>
#include <linux/seq_buf.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "cmdfile.h"

MODULE_IMPORT_NS("DMA_BUF");

/* sg entries listed one by one in a result (the rest are only counted). */
#define PDI_SG_LISTED 8

enum pdi_mode { PDI_DYNAMIC, PDI_PINNED, PDI_REVOCABLE, PDI_STATIC };

static const char *const pdi_mode_names[] = {
	[PDI_DYNAMIC] = "dynamic",
	[PDI_PINNED] = "pinned",
	[PDI_REVOCABLE] = "revocable",
	[PDI_STATIC] = "static",
};

/* One attachment; the fields below @dir are protected by the dma-buf's reservation lock. */
struct pdi_attachment {
	struct list_head node; /* in pdi_held, when held */
	u32 id;
	enum pdi_mode mode;
	enum dma_data_direction dir;
	struct pci_dev *nic; /* reference */
	struct dma_buf *dmabuf; /* reference from dma_buf_get() */
	struct dma_buf_attachment *attach;

	struct sg_table *sgt; /* the current mapping, if any */
	bool pinned;
	bool revoked;
	unsigned int invalidations;
	unsigned int stall_ms;
	unsigned int defer_ms;
	struct delayed_work unmap_work; /* defer=: the invalidated mapping's late unmap */
};

static LIST_HEAD(pdi_held);
static DEFINE_MUTEX(pdi_held_lock); /* taken before any reservation lock */
static u32 pdi_next_id = 1;
static atomic_t pdi_stalls = ATOMIC_INIT(0);
static struct dentry *pdi_dir;

/* An importer told to invalidate may sleep under the reservation lock: stall=MS does. */
static void pdi_stall(struct pdi_attachment *p)
{
	if (!p->stall_ms)
		return;
	atomic_inc(&pdi_stalls);
	msleep(p->stall_ms);
}

/* mlx5-style: the mapping is dropped at once and rebuilt on the next use (remap). */
static void pdi_invalidate_dynamic(struct dma_buf_attachment *attach)
{
	struct pdi_attachment *p = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	pdi_stall(p);
	p->invalidations++;
	if (p->sgt && p->defer_ms) {
		schedule_delayed_work(&p->unmap_work, msecs_to_jiffies(p->defer_ms));
		return;
	}
	if (p->sgt) {
		dma_buf_unmap_attachment(attach, p->sgt, p->dir);
		p->sgt = NULL;
	}
}

/* defer=: the unmap an invalidation asked for, done late (the mapping is not used meanwhile). */
static void pdi_deferred_unmap(struct work_struct *work)
{
	struct pdi_attachment *p = container_of(to_delayed_work(work), struct pdi_attachment,
						unmap_work);

	dma_resv_lock(p->dmabuf->resv, NULL);
	if (p->sgt) {
		dma_buf_unmap_attachment(p->attach, p->sgt, p->dir);
		p->sgt = NULL;
	}
	dma_resv_unlock(p->dmabuf->resv);
}

/* ib_umem_dmabuf_revoke_locked(): unmap, unpin, and never map again by itself. */
static void pdi_revoke_locked(struct pdi_attachment *p)
{
	if (p->revoked)
		return;
	if (p->sgt) {
		dma_buf_unmap_attachment(p->attach, p->sgt, p->dir);
		p->sgt = NULL;
	}
	if (p->pinned) {
		dma_buf_unpin(p->attach);
		p->pinned = false;
	}
	p->revoked = true;
}

static void pdi_invalidate_revocable(struct dma_buf_attachment *attach)
{
	struct pdi_attachment *p = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	pdi_stall(p);
	p->invalidations++;
	pdi_revoke_locked(p);
}

/* [mode][allow_peer2peer]. Pinned is EFA's ib_umem_dmabuf_attach_pinned_ops: no callback. */
static const struct dma_buf_attach_ops pdi_ops[3][2] = {
	[PDI_DYNAMIC] = {
		{ .allow_peer2peer = false, .invalidate_mappings = pdi_invalidate_dynamic },
		{ .allow_peer2peer = true, .invalidate_mappings = pdi_invalidate_dynamic },
	},
	[PDI_PINNED] = {
		{ .allow_peer2peer = false },
		{ .allow_peer2peer = true },
	},
	[PDI_REVOCABLE] = {
		{ .allow_peer2peer = false, .invalidate_mappings = pdi_invalidate_revocable },
		{ .allow_peer2peer = true, .invalidate_mappings = pdi_invalidate_revocable },
	},
};

struct pdi_cmd {
	const char *verb;
	int fd;
	bool has_fd, has_dev, has_hbm, has_id, all;
	unsigned int dev[4], hbm[4];
	enum pdi_mode mode;
	bool has_mode;
	enum dma_data_direction dir;
	bool p2p, hold, scribble;
	unsigned int stall_ms, defer_ms, max_seg, cycles, maps;
	u32 id;
};

/* The most cycles= one command runs. */
#define PDI_MAX_CYCLES 100000

static int pdi_parse(char *line, struct pdi_cmd *cmd, struct seq_buf *out)
{
	char *tok, *val;
	int ret = 0;
	bool first = true;

	memset(cmd, 0, sizeof(*cmd));
	cmd->verb = "run";
	cmd->dir = DMA_BIDIRECTIONAL;
	cmd->p2p = true;
	cmd->maps = 1;

	while ((tok = strsep(&line, " \t\n")) != NULL) {
		if (!*tok)
			continue;
		val = strchr(tok, '=');
		if (!val) {
			if (first && (!strcmp(tok, "run") || !strcmp(tok, "release") ||
				      !strcmp(tok, "status") || !strcmp(tok, "remap") ||
				      !strcmp(tok, "stalls"))) {
				cmd->verb = tok;
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
		} else if (!strcmp(tok, "dev")) {
			ret = cmdfile_parse_bdf(val, cmd->dev);
			cmd->has_dev = true;
		} else if (!strcmp(tok, "hbm")) {
			ret = cmdfile_parse_bdf(val, cmd->hbm);
			cmd->has_hbm = true;
		} else if (!strcmp(tok, "id")) {
			ret = kstrtou32(val, 10, &cmd->id);
			cmd->has_id = true;
		} else if (!strcmp(tok, "mode")) {
			ret = match_string(pdi_mode_names, ARRAY_SIZE(pdi_mode_names), val);
			if (ret >= 0) {
				cmd->mode = ret;
				cmd->has_mode = true;
				ret = 0;
			}
		} else if (!strcmp(tok, "dir")) {
			if (!strcmp(val, "bidir"))
				cmd->dir = DMA_BIDIRECTIONAL;
			else if (!strcmp(val, "to_device"))
				cmd->dir = DMA_TO_DEVICE;
			else if (!strcmp(val, "from_device"))
				cmd->dir = DMA_FROM_DEVICE;
			else
				ret = -EINVAL;
		} else if (!strcmp(tok, "p2p")) {
			ret = kstrtobool(val, &cmd->p2p);
		} else if (!strcmp(tok, "hold")) {
			ret = kstrtobool(val, &cmd->hold);
		} else if (!strcmp(tok, "scribble")) {
			ret = kstrtobool(val, &cmd->scribble);
		} else if (!strcmp(tok, "stall")) {
			ret = kstrtouint(val, 10, &cmd->stall_ms);
		} else if (!strcmp(tok, "defer")) {
			ret = kstrtouint(val, 10, &cmd->defer_ms);
		} else if (!strcmp(tok, "cycles")) {
			ret = kstrtouint(val, 10, &cmd->cycles);
			if (!ret && (!cmd->cycles || cmd->cycles > PDI_MAX_CYCLES))
				ret = -EINVAL;
		} else if (!strcmp(tok, "maps")) {
			ret = kstrtouint(val, 10, &cmd->maps);
			if (!ret && cmd->maps != 1 && cmd->maps != 2)
				ret = -EINVAL;
		} else if (!strcmp(tok, "max_seg")) {
			ret = kstrtouint(val, 0, &cmd->max_seg);
			if (!ret && cmd->max_seg < PAGE_SIZE)
				ret = -EINVAL;
		} else {
			seq_buf_printf(out, "error=unknown key '%s'\n", tok);
			return -EINVAL;
		}
		if (ret) {
			seq_buf_printf(out, "error=bad value for %s: '%s'\n", tok, val);
			return -EINVAL;
		}
	}

	if (!strcmp(cmd->verb, "run")) {
		if (!cmd->has_fd || !cmd->has_dev || !cmd->has_mode) {
			seq_buf_puts(out, "error=run needs fd=, dev= and mode=\n");
			return -EINVAL;
		}
		if (cmd->max_seg && cmd->hold) {
			seq_buf_puts(out, "error=max_seg= needs hold=0\n");
			return -EINVAL;
		}
		if (cmd->cycles && cmd->hold) {
			seq_buf_puts(out, "error=cycles= needs hold=0\n");
			return -EINVAL;
		}
		if (cmd->scribble && cmd->hold) {
			seq_buf_puts(out, "error=scribble= needs hold=0\n");
			return -EINVAL;
		}
		if (cmd->defer_ms && cmd->mode != PDI_DYNAMIC) {
			seq_buf_puts(out, "error=defer= needs mode=dynamic\n");
			return -EINVAL;
		}
		if (cmd->stall_ms && cmd->mode != PDI_DYNAMIC && cmd->mode != PDI_REVOCABLE) {
			seq_buf_puts(out, "error=stall= needs mode=dynamic or mode=revocable\n");
			return -EINVAL;
		}
	} else if (!strcmp(cmd->verb, "stalls")) {
		return 0;
	} else if (!cmd->has_id && !(cmd->all && !strcmp(cmd->verb, "release"))) {
		seq_buf_printf(out, "error=%s needs id=%s\n", cmd->verb,
			       strcmp(cmd->verb, "release") ? "" : " or all");
		return -EINVAL;
	}
	return 0;
}

/* Walks the DMA side of @sgt and reports it. */
static void pdi_report_sgt(struct seq_buf *out, struct sg_table *sgt, struct device *dev)
{
	unsigned int max_seg = dma_get_max_seg_size(dev);
	u64 total = 0, first = 0, last = 0, end = 0, min_len = U64_MAX, max_len = 0;
	unsigned int over_max_seg = 0, unaligned = 0, nents = 0;
	bool contiguous = true;
	struct scatterlist *sg;
	int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		u64 addr = sg_dma_address(sg);
		u64 len = sg_dma_len(sg);

		if (nents == 0)
			first = addr;
		else if (addr != end)
			contiguous = false;
		if (nents < PDI_SG_LISTED)
			seq_buf_printf(out, "sg%u=0x%llx+0x%llx\n", nents, addr, len);
		last = addr;
		end = addr + len;
		total += len;
		min_len = min(min_len, len);
		max_len = max(max_len, len);
		if (len > max_seg)
			over_max_seg++;
		if (!PAGE_ALIGNED(addr) || !PAGE_ALIGNED(len))
			unaligned++;
		nents++;
	}
	seq_buf_printf(out, "nents=%u\n", nents);
	seq_buf_printf(out, "dma_first=0x%llx\n", first);
	seq_buf_printf(out, "dma_last=0x%llx\n", last);
	seq_buf_printf(out, "dma_end=0x%llx\n", end);
	seq_buf_printf(out, "dma_total=%llu\n", total);
	seq_buf_printf(out, "contiguous=%d\n", nents ? contiguous : 0);
	seq_buf_printf(out, "min_entry=%llu\n", nents ? min_len : 0);
	seq_buf_printf(out, "max_entry=%llu\n", max_len);
	seq_buf_printf(out, "max_seg=%u\n", max_seg);
	seq_buf_printf(out, "over_max_seg=%u\n", over_max_seg);
	seq_buf_printf(out, "unaligned=%u\n", unaligned);
}

/* Undoes everything of a live attachment: unmap, unpin, detach, and drops the references. */
static void pdi_teardown(struct pdi_attachment *p)
{
	struct dma_resv *resv = p->dmabuf->resv;

	/* A late unmap still pending runs now (it takes the reservation lock: not held here). */
	flush_delayed_work(&p->unmap_work);
	dma_resv_lock(resv, NULL);
	if (p->mode == PDI_REVOCABLE) {
		/* ib_umem_dmabuf_release(): a revoke that has not happened yet happens now. */
		pdi_revoke_locked(p);
	} else {
		if (p->sgt) {
			dma_buf_unmap_attachment(p->attach, p->sgt, p->dir);
			p->sgt = NULL;
		}
		if (p->pinned) {
			dma_buf_unpin(p->attach);
			p->pinned = false;
		}
	}
	dma_resv_unlock(resv);
	dma_buf_detach(p->dmabuf, p->attach);
	p->attach = NULL;
	/*
	 * An invalidation between the flush above and the lock (the exporter's device going
	 * away) may have queued another late unmap, with the mapping still there: the unmap
	 * above made it a no-op, but its timer must not outlive p. Detached, none is queued
	 * again.
	 */
	cancel_delayed_work_sync(&p->unmap_work);
}

static void pdi_free(struct pdi_attachment *p)
{
	dma_buf_put(p->dmabuf);
	pci_dev_put(p->nic);
	kfree(p);
}

static struct pci_dev *pdi_pci_dev(const unsigned int *bdf)
{
	return pci_get_domain_bus_and_slot(bdf[0], bdf[1], PCI_DEVFN(bdf[2], bdf[3]));
}

static int pdi_run_on(const struct pdi_cmd *cmd, struct seq_buf *out, struct pci_dev *nic);

/* "run": on the PCI device dev=, with its max segment size set for the command if asked. */
static int pdi_run(const struct pdi_cmd *cmd, struct seq_buf *out)
{
	unsigned int old_max_seg;
	struct pci_dev *nic;
	int ret;

	nic = pdi_pci_dev(cmd->dev);
	if (!nic) {
		seq_buf_printf(out, "error=no PCI device %04x:%02x:%02x.%x\n", cmd->dev[0],
			       cmd->dev[1], cmd->dev[2], cmd->dev[3]);
		return -ENODEV;
	}
	old_max_seg = dma_get_max_seg_size(&nic->dev);
	if (cmd->max_seg)
		dma_set_max_seg_size(&nic->dev, cmd->max_seg);
	/* pdi_run_on() takes this reference over; ours keeps nic until the old size is back. */
	ret = pdi_run_on(cmd, out, pci_dev_get(nic));
	if (cmd->max_seg)
		dma_set_max_seg_size(&nic->dev, old_max_seg);
	pci_dev_put(nic);
	return ret;
}

/* Attaches p's buffer for p's device as cmd's mode says (static: no importer ops at all). */
static struct dma_buf_attachment *pdi_attach(const struct pdi_cmd *cmd, struct pdi_attachment *p)
{
	if (cmd->mode == PDI_STATIC)
		return dma_buf_attach(p->dmabuf, &p->nic->dev);
	return dma_buf_dynamic_attach(p->dmabuf, &p->nic->dev, &pdi_ops[cmd->mode][cmd->p2p], p);
}

static int pdi_cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

/* The median of n > 0 samples (sorted in place). */
static u64 pdi_median(u64 *t, unsigned int n)
{
	sort(t, n, sizeof(*t), pdi_cmp_u64, NULL);
	return t[n / 2];
}

/*
 * cycles=N: N-1 more attach, (pin,) map, unmap, (unpin,) detach cycles of p's buffer by p's
 * device, after the reported first one whose times are first[] and which mapped nents
 * entries; then the median of each step over all N. p is torn down (not freed) on entry
 * and on return.
 */
static void pdi_cycles(const struct pdi_cmd *cmd, struct pdi_attachment *p, unsigned int nents,
		      const u64 first[3], struct seq_buf *out)
{
	struct dma_resv *resv = p->dmabuf->resv;
	unsigned int i, n = cmd->cycles;
	struct sg_table *sgt;
	u64 *t, t0, t1;
	int ret = 0;

	t = kmalloc_array(3 * n, sizeof(*t), GFP_KERNEL);
	if (!t) {
		seq_buf_printf(out, "cycles_failed=%d\n", -ENOMEM);
		return;
	}
	t[0] = first[0];
	t[n] = first[1];
	t[2 * n] = first[2];
	for (i = 1; i < n; i++) {
		t0 = ktime_get_ns();
		p->attach = pdi_attach(cmd, p);
		t1 = ktime_get_ns();
		if (IS_ERR(p->attach)) {
			ret = PTR_ERR(p->attach);
			p->attach = NULL;
			seq_buf_printf(out, "cycles_error=cycle %u: attach failed with %d\n", i + 1, ret);
			break;
		}
		t[i] = t1 - t0;
		dma_resv_lock(resv, NULL);
		if (cmd->mode == PDI_PINNED || cmd->mode == PDI_REVOCABLE) {
			ret = dma_buf_pin(p->attach);
			if (ret) {
				seq_buf_printf(out, "cycles_error=cycle %u: pin failed with %d\n", i + 1,
					       ret);
				dma_resv_unlock(resv);
				pdi_teardown(p);
				break;
			}
			p->pinned = true;
		}
		t0 = ktime_get_ns();
		sgt = dma_buf_map_attachment(p->attach, p->dir);
		t1 = ktime_get_ns();
		if (IS_ERR(sgt)) {
			ret = PTR_ERR(sgt);
			seq_buf_printf(out, "cycles_error=cycle %u: map failed with %d\n", i + 1, ret);
			dma_resv_unlock(resv);
			pdi_teardown(p);
			break;
		}
		p->sgt = sgt;
		t[n + i] = t1 - t0;
		dma_resv_wait_timeout(resv, DMA_RESV_USAGE_KERNEL, false, MAX_SCHEDULE_TIMEOUT);
		dma_resv_unlock(resv);
		if (sgt->nents != nents) {
			seq_buf_printf(out, "cycles_error=cycle %u: %u entries, the first cycle mapped %u\n",
				       i + 1, sgt->nents, nents);
			ret = -EIO;
			pdi_teardown(p);
			break;
		}
		t0 = ktime_get_ns();
		pdi_teardown(p);
		t1 = ktime_get_ns();
		t[2 * n + i] = t1 - t0;
	}
	seq_buf_printf(out, "cycles_failed=%d\n", ret);
	if (!ret) {
		seq_buf_printf(out, "cycles=%u\n", n);
		seq_buf_printf(out, "attach_ns_p50=%llu\n", pdi_median(t, n));
		seq_buf_printf(out, "map_ns_p50=%llu\n", pdi_median(t + n, n));
		seq_buf_printf(out, "unmap_detach_ns_p50=%llu\n", pdi_median(t + 2 * n, n));
	}
	kfree(t);
}

static int pdi_run_on(const struct pdi_cmd *cmd, struct seq_buf *out, struct pci_dev *nic)
{
	u64 first[3] = {};
	unsigned int nents = 0;
	struct device *dev = &nic->dev;
	struct pdi_attachment *p;
	struct dma_buf *dmabuf;
	struct dma_resv *resv;
	struct sg_table *sgt;
	u64 t0, t1;
	long wait;
	int ret;

	seq_buf_printf(out, "mode=%s\n", pdi_mode_names[cmd->mode]);
	seq_buf_printf(out, "importer=%s\n", pci_name(nic));
	seq_buf_printf(out, "importer_iommu=%d\n", device_iommu_mapped(dev));
	seq_buf_printf(out, "dma_mask=0x%llx\n", dma_get_mask(dev));
	seq_buf_printf(out, "max_seg=%u\n", dma_get_max_seg_size(dev));

	if (cmd->has_hbm) {
		struct pci_dev *hbm = pdi_pci_dev(cmd->hbm);

		if (!hbm) {
			seq_buf_printf(out, "error=no PCI device %04x:%02x:%02x.%x\n",
				       cmd->hbm[0], cmd->hbm[1], cmd->hbm[2], cmd->hbm[3]);
			pci_dev_put(nic);
			return -ENODEV;
		}
		seq_buf_printf(out, "p2p_distance=%d\n",
			       pci_p2pdma_distance_many(hbm, &dev, 1, true));
		pci_dev_put(hbm);
	}

	dmabuf = dma_buf_get(cmd->fd);
	if (IS_ERR(dmabuf)) {
		ret = PTR_ERR(dmabuf);
		seq_buf_printf(out, "error=fd %d is not a dma-buf (%d)\n", cmd->fd, ret);
		pci_dev_put(nic);
		return ret;
	}
	resv = dmabuf->resv;
	seq_buf_printf(out, "exporter=%s\n", dmabuf->exp_name ?: "");
	seq_buf_printf(out, "dmabuf_size=%zu\n", dmabuf->size);

	p = kzalloc_obj(*p);
	if (!p) {
		dma_buf_put(dmabuf);
		pci_dev_put(nic);
		return -ENOMEM;
	}
	p->mode = cmd->mode;
	p->dir = cmd->dir;
	p->stall_ms = cmd->stall_ms;
	p->defer_ms = cmd->defer_ms;
	INIT_DELAYED_WORK(&p->unmap_work, pdi_deferred_unmap);
	p->nic = nic;
	p->dmabuf = dmabuf;

	t0 = ktime_get_ns();
	p->attach = pdi_attach(cmd, p);
	t1 = ktime_get_ns();
	ret = PTR_ERR_OR_ZERO(p->attach);
	seq_buf_printf(out, "attach=%d\n", ret);
	seq_buf_printf(out, "attach_ns=%llu\n", t1 - t0);
	first[0] = t1 - t0;
	if (ret) {
		p->attach = NULL;
		pdi_free(p);
		return 0;
	}
	seq_buf_printf(out, "peer2peer=%d\n", p->attach->peer2peer);
	seq_buf_printf(out, "revocable=%d\n", dma_buf_attach_revocable(p->attach));

	dma_resv_lock(resv, NULL);
	if (cmd->mode == PDI_PINNED || cmd->mode == PDI_REVOCABLE) {
		t0 = ktime_get_ns();
		ret = dma_buf_pin(p->attach);
		t1 = ktime_get_ns();
		seq_buf_printf(out, "pin=%d\n", ret);
		seq_buf_printf(out, "pin_ns=%llu\n", t1 - t0);
		if (ret)
			goto out_unlock;
		p->pinned = true;
	}

	t0 = ktime_get_ns();
	sgt = dma_buf_map_attachment(p->attach, p->dir);
	t1 = ktime_get_ns();
	ret = PTR_ERR_OR_ZERO(sgt);
	seq_buf_printf(out, "map=%d\n", ret);
	seq_buf_printf(out, "map_ns=%llu\n", t1 - t0);
	if (ret)
		goto out_unlock;
	p->sgt = sgt;
	first[1] = t1 - t0;
	nents = sgt->nents;

	/* As ib_umem_dmabuf_map_pages(): the contents are valid once the kernel fences signal. */
	wait = dma_resv_wait_timeout(resv, DMA_RESV_USAGE_KERNEL, false, MAX_SCHEDULE_TIMEOUT);
	seq_buf_printf(out, "fence_wait=%ld\n", wait < 0 ? wait : 0);
	pdi_report_sgt(out, sgt, dev);

	if (cmd->maps == 2) {
		struct sg_table *sgt2 = dma_buf_map_attachment(p->attach, p->dir);

		ret = PTR_ERR_OR_ZERO(sgt2);
		seq_buf_printf(out, "map2=%d\n", ret);
		if (!ret) {
			seq_buf_printf(out, "map2_nents=%u\n", sgt2->nents);
			dma_buf_unmap_attachment(p->attach, sgt2, p->dir);
		}
		ret = 0;
	}

	if (cmd->scribble) {
		struct scatterlist *sg;
		unsigned int i;

		for_each_sgtable_dma_sg(sgt, sg, i)
			sg_dma_address(sg) += PAGE_SIZE;
		seq_buf_printf(out, "scribbled=%u\n", sgt->nents);
	}

	if (cmd->hold) {
		dma_resv_unlock(resv);
		mutex_lock(&pdi_held_lock);
		p->id = pdi_next_id++;
		list_add_tail(&p->node, &pdi_held);
		mutex_unlock(&pdi_held_lock);
		seq_buf_printf(out, "id=%u\n", p->id);
		return 0;
	}

out_unlock:
	dma_resv_unlock(resv);
	t0 = ktime_get_ns();
	pdi_teardown(p);
	t1 = ktime_get_ns();
	seq_buf_printf(out, "unmap_detach_ns=%llu\n", t1 - t0);
	seq_buf_printf(out, "invalidations=%u\n", p->invalidations);
	first[2] = t1 - t0;
	/* More cycles only after a first one that mapped: a failure is its result. */
	if (cmd->cycles > 1 && nents)
		pdi_cycles(cmd, p, nents, first, out);
	pdi_free(p);
	return 0;
}

static struct pdi_attachment *pdi_find_locked(u32 id)
{
	struct pdi_attachment *p;

	lockdep_assert_held(&pdi_held_lock);
	list_for_each_entry(p, &pdi_held, node)
		if (p->id == id)
			return p;
	return NULL;
}

static void pdi_report_state_locked(struct pdi_attachment *p, struct seq_buf *out)
{
	dma_resv_assert_held(p->dmabuf->resv);
	seq_buf_printf(out, "id=%u\n", p->id);
	seq_buf_printf(out, "mode=%s\n", pdi_mode_names[p->mode]);
	seq_buf_printf(out, "invalidations=%u\n", p->invalidations);
	seq_buf_printf(out, "mapped=%d\n", !!p->sgt);
	seq_buf_printf(out, "pinned=%d\n", p->pinned);
	seq_buf_printf(out, "revoked=%d\n", p->revoked);
}

static void pdi_release_one(struct pdi_attachment *p, struct seq_buf *out)
{
	u64 t0, t1;

	list_del(&p->node);
	dma_resv_lock(p->dmabuf->resv, NULL);
	if (out)
		pdi_report_state_locked(p, out);
	dma_resv_unlock(p->dmabuf->resv);
	t0 = ktime_get_ns();
	pdi_teardown(p);
	t1 = ktime_get_ns();
	if (out)
		seq_buf_printf(out, "unmap_detach_ns=%llu\n", t1 - t0);
	pdi_free(p);
}

static int pdi_held_cmd(const struct pdi_cmd *cmd, struct seq_buf *out)
{
	struct pdi_attachment *p, *next;
	struct sg_table *sgt;
	int ret = 0;

	mutex_lock(&pdi_held_lock);
	if (cmd->all) {
		unsigned int n = 0;

		list_for_each_entry_safe(p, next, &pdi_held, node) {
			pdi_release_one(p, NULL);
			n++;
		}
		seq_buf_printf(out, "released=%u\n", n);
		goto out;
	}
	p = pdi_find_locked(cmd->id);
	if (!p) {
		seq_buf_printf(out, "error=no held attachment id=%u\n", cmd->id);
		ret = -ENOENT;
		goto out;
	}
	if (!strcmp(cmd->verb, "release")) {
		pdi_release_one(p, out);
		goto out;
	}

	dma_resv_lock(p->dmabuf->resv, NULL);
	if (!strcmp(cmd->verb, "remap")) {
		if (p->sgt) {
			seq_buf_puts(out, "already_mapped=1\n");
		} else {
			u64 t0 = ktime_get_ns(), t1;

			sgt = dma_buf_map_attachment(p->attach, p->dir);
			t1 = ktime_get_ns();
			seq_buf_printf(out, "map=%d\n", (int)PTR_ERR_OR_ZERO(sgt));
			seq_buf_printf(out, "map_ns=%llu\n", t1 - t0);
			if (!IS_ERR(sgt)) {
				p->sgt = sgt;
				pdi_report_sgt(out, sgt, &p->nic->dev);
			}
		}
	}
	pdi_report_state_locked(p, out);
	dma_resv_unlock(p->dmabuf->resv);
out:
	mutex_unlock(&pdi_held_lock);
	return ret;
}

/* One command line: "run ..." or a command on a held attachment. */
static int pdi_handle(char *line, struct seq_buf *out)
{
	struct pdi_cmd cmd;
	int ret = pdi_parse(line, &cmd, out);

	if (ret)
		return ret;
	if (!strcmp(cmd.verb, "run"))
		return pdi_run(&cmd, out);
	if (!strcmp(cmd.verb, "stalls")) {
		seq_buf_printf(out, "stalls=%d\n", atomic_read(&pdi_stalls));
		return 0;
	}
	return pdi_held_cmd(&cmd, out);
}

CMDFILE_FOPS(pdi_fops, pdi_handle);

static int __init pdi_init(void)
{
	pdi_dir = debugfs_create_dir("peerdirect_importer", NULL);
	if (IS_ERR(pdi_dir))
		return PTR_ERR(pdi_dir);
	debugfs_create_file("run", 0600, pdi_dir, NULL, &pdi_fops);
	return 0;
}

static void __exit pdi_exit(void)
{
	struct pdi_attachment *p, *next;

	debugfs_remove(pdi_dir);
	mutex_lock(&pdi_held_lock);
	list_for_each_entry_safe(p, next, &pdi_held, node)
		pdi_release_one(p, NULL);
	mutex_unlock(&pdi_held_lock);
}

module_init(pdi_init);
module_exit(pdi_exit);

MODULE_DESCRIPTION("Test-only dma-buf importer standing in for an RDMA NIC (peerdirect tests)");
MODULE_AUTHOR("The peerdirect developers");
MODULE_LICENSE("GPL");

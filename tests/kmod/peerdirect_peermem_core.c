// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only CONTRACT TEST of peerdirect's PeerDirect peer-memory client: this module stands in
 * for an MLNX_OFED-style ib_core by providing the peer-memory API (kmod/peermem/peer_mem.h:
 * ib_register_peer_memory_client / ib_unregister_peer_memory_client) and driving a registered
 * client the way that contract describes. It is NOT ib_core and knows no ib_device, MR or NIC
 * hardware: it checks the client against the contract, nothing more. Upstream ib_core has no
 * such API. Never installed, never loaded outside the test guest. Like MLNX_OFED, it exports
 * the API with plain EXPORT_SYMBOL, which symbol_get() does not resolve since Linux 6.6: the
 * client, peerdirect_peermem.ko, links against it (built with this module's Module.symvers)
 * and must be loaded after it and after peerdirect.ko.
 *
 * Interface: /sys/kernel/debug/peerdirect_peermem_core/run. Each open file keeps the result of
 * its last command; write a command line (in one write), then read the result back as
 * "key=value" lines.
 *
 *   register addr=0xA size=N dev=DDDD:BB:SS.F [write=0|1]
 *	as for a memory registration by the writing process: acquire(addr, size) (reports
 *	acquired=1|0, stops at 0), get_page_size, get_pages (one sg entry per page), dma_map
 *	for PCI device dev (reports nmap and the DMA addresses). A mapped registration is kept
 *	(reports id=I) until "release id=I"; a failed step undoes the earlier ones.
 *   status id=I	invalidated=0|1, invalidations, mapped, pages
 *   release id=I | release all
 *	dma_unmap (if still mapped), put_pages (if still held), release
 *
 * The core's invalidate callback (what the client calls when its memory goes away) does what
 * MLNX_OFED's core does for an invalidated registration: stops using it, dma_unmap and
 * put_pages at once; release comes with "release". Failures of client calls are results
 * ("dma_map=-95"), not write errors. Nothing here WARNs.
 */

#include <linux/debugfs.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/seq_buf.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "cmdfile.h"

#include "../../kmod/peermem/peer_mem.h"


/* One registration, as a memory region of the core would hold it. */
struct pdpc_reg {
	struct list_head node; /* in pdpc_regs */
	u32 id; /* also the core_context handed to get_pages */
	void *client_context;
	struct sg_table sg_head;
	struct pci_dev *nic; /* reference */
	bool pages; /* get_pages done, put_pages not yet */
	bool mapped; /* dma_map done, dma_unmap not yet */
	bool invalidated;
	unsigned int invalidations;
};

/* One client at a time; pdpc_lock is taken before any lock the client takes. */
static DEFINE_MUTEX(pdpc_lock);
static const struct peer_memory_client *pdpc_client;
static LIST_HEAD(pdpc_regs);
static u32 pdpc_next_id = 1;
static struct dentry *pdpc_dir;
/* The registration handle; its address is all that matters. */
static int pdpc_handle;

static struct pdpc_reg *pdpc_find_locked(u64 id)
{
	struct pdpc_reg *reg;

	lockdep_assert_held(&pdpc_lock);
	list_for_each_entry(reg, &pdpc_regs, node)
		if (reg->id == id)
			return reg;
	return NULL;
}

/* The core stops using the memory: dma_unmap and put_pages, as far as not done yet. */
static void pdpc_unmap_put_locked(struct pdpc_reg *reg)
{
	lockdep_assert_held(&pdpc_lock);
	if (reg->mapped) {
		pdpc_client->dma_unmap(&reg->sg_head, reg->client_context, &reg->nic->dev);
		reg->mapped = false;
	}
	if (reg->pages) {
		pdpc_client->put_pages(&reg->sg_head, reg->client_context);
		reg->pages = false;
	}
}

/*
 * The core's invalidate, handed to the client at registration. Called by the client without
 * its locks held (the contract), possibly racing with "release": a registration already gone
 * is not an error of the client's.
 */
static int pdpc_invalidate(void *reg_handle, u64 core_context)
{
	struct pdpc_reg *reg;

	if (reg_handle != &pdpc_handle) {
		pr_err("peerdirect_peermem_core: invalidate with a foreign handle\n");
		return -EINVAL;
	}
	mutex_lock(&pdpc_lock);
	reg = pdpc_find_locked(core_context);
	if (reg) {
		reg->invalidations++;
		reg->invalidated = true;
		pdpc_unmap_put_locked(reg);
	}
	mutex_unlock(&pdpc_lock);
	return reg ? 0 : -ENOENT;
}

void *ib_register_peer_memory_client(const struct peer_memory_client *peer_client,
				     invalidate_peer_memory *invalidate_callback)
{
	mutex_lock(&pdpc_lock);
	if (pdpc_client) {
		mutex_unlock(&pdpc_lock);
		pr_info("peerdirect_peermem_core: refusing a second client \"%s\"\n",
			peer_client->name);
		return NULL;
	}
	pdpc_client = peer_client;
	*invalidate_callback = pdpc_invalidate;
	mutex_unlock(&pdpc_lock);
	pr_info("peerdirect_peermem_core: contract test: peer-memory client \"%.*s\" version \"%.*s\" registered\n",
		IB_PEER_MEMORY_NAME_MAX, peer_client->name, IB_PEER_MEMORY_VER_MAX,
		peer_client->version);
	return &pdpc_handle;
}
EXPORT_SYMBOL(ib_register_peer_memory_client);

/* Ends a registration: releases it without pdpc_lock (the client may wait for its invalidate). */
static void pdpc_release_unlocked(const struct peer_memory_client *client, struct pdpc_reg *reg)
{
	client->release(reg->client_context);
	pci_dev_put(reg->nic);
	kfree(reg);
}

void ib_unregister_peer_memory_client(void *reg_handle)
{
	const struct peer_memory_client *client;
	struct pdpc_reg *reg, *next;
	LIST_HEAD(left);

	mutex_lock(&pdpc_lock);
	client = pdpc_client;
	if (reg_handle != &pdpc_handle || !client) {
		mutex_unlock(&pdpc_lock);
		pr_err("peerdirect_peermem_core: unregister of an unknown handle\n");
		return;
	}
	list_for_each_entry_safe(reg, next, &pdpc_regs, node) {
		pdpc_unmap_put_locked(reg);
		list_move_tail(&reg->node, &left);
	}
	mutex_unlock(&pdpc_lock);
	list_for_each_entry_safe(reg, next, &left, node) {
		pr_info("peerdirect_peermem_core: releasing registration %u at unregister\n",
			reg->id);
		pdpc_release_unlocked(client, reg);
	}
	mutex_lock(&pdpc_lock);
	pdpc_client = NULL;
	mutex_unlock(&pdpc_lock);
	pr_info("peerdirect_peermem_core: peer-memory client unregistered\n");
}
EXPORT_SYMBOL(ib_unregister_peer_memory_client);

struct pdpc_cmd {
	const char *verb;
	bool has_addr, has_size, has_dev, has_id, all, write;
	unsigned long addr;
	size_t size;
	unsigned int dev[4];
	u32 id;
};

static int pdpc_parse(char *line, struct pdpc_cmd *cmd, struct seq_buf *out)
{
	bool first = true;
	char *tok, *val;
	int ret = 0;

	memset(cmd, 0, sizeof(*cmd));
	cmd->write = true;
	while ((tok = strsep(&line, " \t\n")) != NULL) {
		if (!*tok)
			continue;
		val = strchr(tok, '=');
		if (!val) {
			if (first && (!strcmp(tok, "register") || !strcmp(tok, "status") ||
				      !strcmp(tok, "release"))) {
				cmd->verb = tok;
				first = false;
				continue;
			}
			if (cmd->verb && !strcmp(cmd->verb, "release") && !strcmp(tok, "all")) {
				cmd->all = true;
				continue;
			}
			seq_buf_printf(out, "error=unknown word '%s'\n", tok);
			return -EINVAL;
		}
		if (first) {
			seq_buf_puts(out, "error=a command starts with register, status or release\n");
			return -EINVAL;
		}
		*val++ = '\0';
		if (!strcmp(tok, "addr")) {
			ret = kstrtoul(val, 0, &cmd->addr);
			cmd->has_addr = true;
		} else if (!strcmp(tok, "size")) {
			unsigned long size;

			ret = kstrtoul(val, 0, &size);
			cmd->size = size;
			cmd->has_size = true;
		} else if (!strcmp(tok, "dev")) {
			ret = cmdfile_parse_bdf(val, cmd->dev);
			cmd->has_dev = true;
		} else if (!strcmp(tok, "id")) {
			ret = kstrtou32(val, 10, &cmd->id);
			cmd->has_id = true;
		} else if (!strcmp(tok, "write")) {
			ret = kstrtobool(val, &cmd->write);
		} else {
			seq_buf_printf(out, "error=unknown key '%s'\n", tok);
			return -EINVAL;
		}
		if (ret) {
			seq_buf_printf(out, "error=bad value for %s: '%s'\n", tok, val);
			return -EINVAL;
		}
	}
	if (!cmd->verb) {
		seq_buf_puts(out, "error=empty command\n");
		return -EINVAL;
	}
	if (!strcmp(cmd->verb, "register")) {
		if (!cmd->has_addr || !cmd->has_size || !cmd->has_dev) {
			seq_buf_puts(out, "error=register needs addr=, size= and dev=\n");
			return -EINVAL;
		}
	} else if (!cmd->has_id && !cmd->all) {
		seq_buf_printf(out, "error=%s needs id=\n", cmd->verb);
		return -EINVAL;
	}
	return 0;
}

/* Reports the DMA side of the first @nmap entries of @sgt. */
static void pdpc_report_dma(struct seq_buf *out, struct sg_table *sgt, int nmap)
{
	u64 first = 0, last = 0, end = 0, total = 0;
	bool contiguous = true;
	struct scatterlist *sg;
	int i;

	for_each_sg(sgt->sgl, sg, nmap, i) {
		u64 addr = sg_dma_address(sg), len = sg_dma_len(sg);

		if (i == 0)
			first = addr;
		else if (addr != end)
			contiguous = false;
		last = addr;
		end = addr + len;
		total += len;
	}
	seq_buf_printf(out, "dma_first=0x%llx\n", first);
	seq_buf_printf(out, "dma_last=0x%llx\n", last);
	seq_buf_printf(out, "dma_end=0x%llx\n", end);
	seq_buf_printf(out, "dma_total=%llu\n", total);
	seq_buf_printf(out, "contiguous=%d\n", nmap > 0 && contiguous);
}

static int pdpc_register(const struct pdpc_cmd *cmd, struct seq_buf *out)
{
	const struct peer_memory_client *client;
	struct pdpc_reg *reg;
	unsigned long page_size;
	struct pci_dev *nic;
	void *ctx = NULL;
	int nmap = 0;
	int ret;

	nic = pci_get_domain_bus_and_slot(cmd->dev[0], cmd->dev[1],
					  PCI_DEVFN(cmd->dev[2], cmd->dev[3]));
	if (!nic) {
		seq_buf_printf(out, "error=no PCI device %04x:%02x:%02x.%x\n", cmd->dev[0],
			       cmd->dev[1], cmd->dev[2], cmd->dev[3]);
		return -ENODEV;
	}
	reg = kzalloc_obj(*reg);
	if (!reg) {
		pci_dev_put(nic);
		return -ENOMEM;
	}
	reg->nic = nic;

	mutex_lock(&pdpc_lock);
	client = pdpc_client;
	if (!client) {
		mutex_unlock(&pdpc_lock);
		seq_buf_puts(out, "error=no peer-memory client registered\n");
		kfree(reg);
		pci_dev_put(nic);
		return -ENODEV;
	}
	seq_buf_printf(out, "client=%.*s\n", IB_PEER_MEMORY_NAME_MAX, client->name);
	ret = client->acquire(cmd->addr, cmd->size, NULL, NULL, &ctx);
	if (ret <= 0) {
		mutex_unlock(&pdpc_lock);
		seq_buf_printf(out, "acquired=0\nacquire=%d\n", ret);
		kfree(reg);
		pci_dev_put(nic);
		return 0;
	}
	seq_buf_puts(out, "acquired=1\n");
	reg->client_context = ctx;
	reg->id = pdpc_next_id++;

	ret = client->get_pages(cmd->addr, cmd->size, cmd->write, 0, &reg->sg_head, ctx, reg->id);
	seq_buf_printf(out, "get_pages=%d\n", ret);
	if (ret)
		goto out_release;
	reg->pages = true;
	page_size = client->get_page_size(ctx);
	seq_buf_printf(out, "page_size=%lu\n", page_size);
	seq_buf_printf(out, "nents=%u\n", reg->sg_head.nents);

	ret = client->dma_map(&reg->sg_head, ctx, &nic->dev, 0, &nmap);
	seq_buf_printf(out, "dma_map=%d\n", ret);
	if (ret)
		goto out_release;
	reg->mapped = true;
	seq_buf_printf(out, "nmap=%d\n", nmap);
	pdpc_report_dma(out, &reg->sg_head, nmap);
	seq_buf_printf(out, "id=%u\n", reg->id);
	list_add_tail(&reg->node, &pdpc_regs);
	mutex_unlock(&pdpc_lock);
	return 0;

out_release:
	pdpc_unmap_put_locked(reg);
	mutex_unlock(&pdpc_lock);
	pdpc_release_unlocked(client, reg);
	return 0;
}

static void pdpc_report_state_locked(struct pdpc_reg *reg, struct seq_buf *out)
{
	seq_buf_printf(out, "id=%u\n", reg->id);
	seq_buf_printf(out, "invalidated=%d\n", reg->invalidated);
	seq_buf_printf(out, "invalidations=%u\n", reg->invalidations);
	seq_buf_printf(out, "mapped=%d\n", reg->mapped);
	seq_buf_printf(out, "pages=%d\n", reg->pages);
}

static int pdpc_id_cmd(const struct pdpc_cmd *cmd, struct seq_buf *out)
{
	const struct peer_memory_client *client;
	struct pdpc_reg *reg, *next;
	LIST_HEAD(ending);
	unsigned int n = 0;

	mutex_lock(&pdpc_lock);
	client = pdpc_client;
	if (cmd->all) {
		list_for_each_entry_safe(reg, next, &pdpc_regs, node) {
			pdpc_unmap_put_locked(reg);
			list_move_tail(&reg->node, &ending);
			n++;
		}
	} else {
		reg = pdpc_find_locked(cmd->id);
		if (!reg) {
			mutex_unlock(&pdpc_lock);
			seq_buf_printf(out, "error=no registration id=%u\n", cmd->id);
			return -ENOENT;
		}
		pdpc_report_state_locked(reg, out);
		if (!strcmp(cmd->verb, "release")) {
			pdpc_unmap_put_locked(reg);
			list_move_tail(&reg->node, &ending);
			n++;
		}
	}
	mutex_unlock(&pdpc_lock);
	list_for_each_entry_safe(reg, next, &ending, node)
		pdpc_release_unlocked(client, reg);
	if (!strcmp(cmd->verb, "release"))
		seq_buf_printf(out, "released=%u\n", n);
	return 0;
}

/* One command line: "register ..." or a command on a registration. */
static int pdpc_command(char *line, struct seq_buf *out)
{
	struct pdpc_cmd cmd;
	int ret = pdpc_parse(line, &cmd, out);

	if (ret)
		return ret;
	if (!strcmp(cmd.verb, "register"))
		return pdpc_register(&cmd, out);
	return pdpc_id_cmd(&cmd, out);
}

CMDFILE_FOPS(pdpc_fops, pdpc_command);

static int __init pdpc_init(void)
{
	pdpc_dir = debugfs_create_dir("peerdirect_peermem_core", NULL);
	if (IS_ERR(pdpc_dir))
		return PTR_ERR(pdpc_dir);
	debugfs_create_file("run", 0600, pdpc_dir, NULL, &pdpc_fops);
	return 0;
}

/*
 * A registered client's module links against this one and holds it, so no client and no
 * registration is left by the time this runs.
 */
static void __exit pdpc_exit(void)
{
	debugfs_remove(pdpc_dir);
}

module_init(pdpc_init);
module_exit(pdpc_exit);

MODULE_DESCRIPTION("Test-only contract test of peerdirect's PeerDirect peer-memory client (stands in for an MLNX_OFED ib_core's peer-memory API; not ib_core)");
MODULE_AUTHOR("The peerdirect developers");
MODULE_LICENSE("GPL");

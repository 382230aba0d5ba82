// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only: what the page table of the writing process holds for one of its PFN mappings (a
 * CPU mapping of a dma-buf): the entry's size, whether it is writable, and the memory type
 * the CPU uses for it (x86 PAT), read from the entry itself with follow_pfnmap_start(), as
 * vfio and KVM read PFN mappings. Never installed, never loaded outside the test guest.
 *
 * Interface: /sys/kernel/debug/peerdirect_pte/run (tests/kmod/cmdfile.h). One command:
 *
 *   addr=0xADDR
 *	the entry mapping ADDR in the writer's address space: mapped=0 when there is none (no
 *	such VMA, not a PFN mapping, or not faulted in yet); else mapped=1, phys= (of ADDR's
 *	page),
 *	size=4096|2097152|1073741824 (PTE, PMD or PUD), writable=0|1, and cachemode=wb, wc,
 *	uc-, uc, wt or wp (the first whose PAT bits the entry carries), with pat=0|1 (whether
 *	PAT is on: without it, every type but wb and uc- falls back to uc-).
 */

#include <linux/debugfs.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/seq_buf.h>
#include <linux/string.h>
#include <asm/memtype.h>
#include <asm/pgtable.h>

#include "cmdfile.h"

static struct dentry *pte_dir;

static const struct {
	enum page_cache_mode mode;
	const char *name;
} pte_modes[] = {
	{ _PAGE_CACHE_MODE_WB, "wb" },	     { _PAGE_CACHE_MODE_WC, "wc" },
	{ _PAGE_CACHE_MODE_UC_MINUS, "uc-" }, { _PAGE_CACHE_MODE_UC, "uc" },
	{ _PAGE_CACHE_MODE_WT, "wt" },	     { _PAGE_CACHE_MODE_WP, "wp" },
};

static const char *pte_cachemode(pgprot_t prot, unsigned long size)
{
	unsigned long bits;
	unsigned int i;

	/* A PMD or PUD entry keeps its PAT bit elsewhere (bit 7 there is the huge-page bit). */
	if (size > PAGE_SIZE)
		prot = pgprot_large_2_4k(prot);
	bits = pgprot_val(prot) & _PAGE_CACHE_MASK;
	for (i = 0; i < ARRAY_SIZE(pte_modes); i++)
		if (bits == cachemode2protval(pte_modes[i].mode))
			return pte_modes[i].name;
	return "?";
}

static int pte_handle(char *line, struct seq_buf *out)
{
	struct mm_struct *mm = current->mm;
	struct follow_pfnmap_args args = {};
	unsigned long addr, size;
	char *val = strim(line);

	if (!str_has_prefix(val, "addr=") || kstrtoul(val + 5, 0, &addr)) {
		seq_buf_puts(out, "error=expected addr=0xADDR\n");
		return -EINVAL;
	}
	if (!mm)
		return -EINVAL;
	mmap_read_lock(mm);
	args.vma = vma_lookup(mm, addr);
	args.address = addr;
	if (!args.vma || !(args.vma->vm_flags & VM_PFNMAP) || follow_pfnmap_start(&args)) {
		mmap_read_unlock(mm);
		seq_buf_puts(out, "mapped=0\n");
		return 0;
	}
	size = ~args.addr_mask + 1;
	seq_buf_puts(out, "mapped=1\n");
	seq_buf_printf(out, "phys=0x%llx\n", (u64)args.pfn << PAGE_SHIFT);
	seq_buf_printf(out, "size=%lu\n", size);
	seq_buf_printf(out, "writable=%d\n", args.writable);
	seq_buf_printf(out, "cachemode=%s\n", pte_cachemode(args.pgprot, size));
	follow_pfnmap_end(&args);
	mmap_read_unlock(mm);
	seq_buf_printf(out, "pat=%d\n", pat_enabled());
	return 0;
}

CMDFILE_FOPS(pte_fops, pte_handle);

static int __init pte_init(void)
{
	pte_dir = debugfs_create_dir("peerdirect_pte", NULL);
	if (IS_ERR(pte_dir))
		return PTR_ERR(pte_dir);
	debugfs_create_file("run", 0600, pte_dir, NULL, &pte_fops);
	return 0;
}

static void __exit pte_exit(void)
{
	debugfs_remove(pte_dir);
}

module_init(pte_init);
module_exit(pte_exit);
MODULE_DESCRIPTION("peerdirect test: the page-table entry and memory type of a PFN mapping");
MODULE_LICENSE("GPL");

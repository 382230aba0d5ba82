// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/mm.rs: pages, VMAs and files.
 */
#include <linux/fs.h>
#include <linux/mm.h>

#include "helpers.h"

/*
 * Sets @bits in the u32 at @offset of @page, a page userspace maps read-only, with release
 * semantics: a reader that sees them (acquire) sees what the kernel did before.
 */
void peerdirect_page_set_bits(struct page *page, size_t offset, u32 bits)
{
	u32 *word = page_address(page) + offset;

	smp_store_release(word, READ_ONCE(*word) | bits);
}

/* Adds 1 to the u32 at @offset of @page, as peerdirect_page_set_bits() sets bits. */
void peerdirect_page_count(struct page *page, size_t offset)
{
	u32 *word = page_address(page) + offset;

	smp_store_release(word, READ_ONCE(*word) + 1);
}

/* Reads the u32 at @offset of @page with acquire semantics, as userspace reads it. */
u32 peerdirect_page_load(struct page *page, size_t offset)
{
	return smp_load_acquire((u32 *)(page_address(page) + offset));
}

unsigned long peerdirect_vma_pgoff(struct vm_area_struct *vma)
{
	return vma->vm_pgoff;
}

/*
 * Gives an open @file the operations @fops instead of the misc core's (replace_fops, as
 * misc_open itself does). Both belong to this module, whose reference the open holds, so
 * fops_get() cannot fail.
 */
void peerdirect_file_replace_fops(struct file *file, const struct file_operations *fops)
{
	replace_fops(file, fops_get(fops));
}

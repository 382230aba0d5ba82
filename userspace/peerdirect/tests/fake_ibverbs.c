// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for libibverbs.so.1 that keeps the rules real verbs impose and counts what
 * breaks them: the host test ibverbs_lifetime.rs loads it through IbverbsRegistrar::open_with.
 * One device, "fake0". A protection domain with memory regions cannot be deallocated (EBUSY,
 * as rdma-core answers), and a memory region used after its context was closed is a
 * use-after-free in real libibverbs: here a counted violation. The dma-buf offset and IOVA of
 * the last ibv_reg_dmabuf_mr are kept for the test to read. Only the head of each struct
 * that callers read is laid out as rdma-core's stable ABI has it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_device {
	char name[16];
};

struct fake_context {
	void *device;
	int open;
	int pds;
};

struct fake_pd {
	struct fake_context *context;
	int live;
	int mrs;
};

/* The head of struct ibv_mr. */
struct fake_mr {
	void *context;
	void *pd;
	void *addr;
	size_t length;
	uint32_t handle, lkey, rkey;
};

static struct fake_device device = { "fake0" };
static int live_contexts, live_pds, live_mrs, violations;
static uint64_t last_offset, last_iova;
static char last_violation[256];

static void violation(const char *what)
{
	violations++;
	snprintf(last_violation, sizeof(last_violation), "%s", what);
}

void **ibv_get_device_list(int *num)
{
	void **list = calloc(2, sizeof(*list));

	if (!list)
		return NULL;
	list[0] = &device;
	if (num)
		*num = 1;
	return list;
}

void ibv_free_device_list(void **list)
{
	free(list);
}

const char *ibv_get_device_name(void *dev)
{
	return ((struct fake_device *)dev)->name;
}

void *ibv_open_device(void *dev)
{
	struct fake_context *ctx = calloc(1, sizeof(*ctx));

	if (!ctx)
		return NULL;
	ctx->device = dev;
	ctx->open = 1;
	live_contexts++;
	return ctx;
}

int ibv_close_device(void *context)
{
	struct fake_context *ctx = context;

	if (!ctx->open) {
		violation("ibv_close_device of a closed context");
		return EINVAL;
	}
	if (ctx->pds)
		violation("ibv_close_device with a protection domain still allocated");
	ctx->open = 0; /* kept, so that later misuse is seen rather than crashing */
	live_contexts--;
	return 0;
}

void *ibv_alloc_pd(void *context)
{
	struct fake_context *ctx = context;
	struct fake_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return NULL;
	pd->context = ctx;
	pd->live = 1;
	ctx->pds++;
	live_pds++;
	return pd;
}

int ibv_dealloc_pd(void *p)
{
	struct fake_pd *pd = p;

	if (!pd->context->open)
		violation("ibv_dealloc_pd after its context was closed");
	if (pd->mrs)
		return EBUSY;
	pd->live = 0;
	pd->context->pds--;
	live_pds--;
	return 0;
}

struct fake_mr *ibv_reg_dmabuf_mr(void *p, uint64_t offset, size_t length, uint64_t iova,
				  int fd, int access)
{
	struct fake_pd *pd = p;
	struct fake_mr *mr;
	static uint32_t next_key = 1;

	last_offset = offset;
	last_iova = iova;
	(void)fd;
	(void)access;
	if (!pd->live || !pd->context->open) {
		violation("ibv_reg_dmabuf_mr on a dead protection domain");
		errno = EINVAL;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = (void *)(uintptr_t)iova;
	mr->length = length;
	mr->lkey = mr->rkey = next_key++;
	pd->mrs++;
	live_mrs++;
	return mr;
}

int ibv_dereg_mr(struct fake_mr *mr)
{
	struct fake_pd *pd = mr->pd;

	if (!pd->context->open) {
		violation("ibv_dereg_mr after its context was closed (use-after-free in libibverbs)");
		return EINVAL;
	}
	pd->mrs--;
	live_mrs--;
	free(mr);
	return 0;
}

/* For the test. */
int fake_ibv_live_contexts(void) { return live_contexts; }
int fake_ibv_live_pds(void) { return live_pds; }
int fake_ibv_live_mrs(void) { return live_mrs; }
int fake_ibv_violations(void) { return violations; }
const char *fake_ibv_last_violation(void) { return last_violation; }
uint64_t fake_ibv_last_offset(void) { return last_offset; }
uint64_t fake_ibv_last_iova(void) { return last_iova; }

// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/global.rs: a mutex initialized at build time, under which each static
 * lock of the Rust side is initialized at its first use.
 */
#include <linux/mutex.h>

#include "helpers.h"

static DEFINE_MUTEX(peerdirect_global_init);

void peerdirect_global_init_lock(void)
{
	mutex_lock(&peerdirect_global_init);
}

void peerdirect_global_init_unlock(void)
{
	mutex_unlock(&peerdirect_global_init);
}

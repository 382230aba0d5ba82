// SPDX-License-Identifier: GPL-2.0
/*
 * The C helpers of sys/task.rs: the calling task.
 */
#include <linux/capability.h>
#include <linux/sched.h>

#include "helpers.h"

bool peerdirect_capable_sys_admin(void)
{
	return capable(CAP_SYS_ADMIN);
}

/* The calling process's id as its own PID namespace sees it (for debugfs listings). */
pid_t peerdirect_current_tgid(void)
{
	return task_tgid_vnr(current);
}

bool peerdirect_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

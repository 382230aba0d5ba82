// SPDX-License-Identifier: GPL-2.0

//! The calling task.

use super::raw;

/// Whether the calling task has `CAP_SYS_ADMIN` (in the initial user namespace).
pub(crate) fn capable_sys_admin() -> bool {
    // SAFETY: `capable` only reads the current task's credentials; any process context.
    unsafe { raw::peerdirect_capable_sys_admin() }
}

/// The calling process's id, as its PID namespace sees it.
pub(crate) fn current_tgid() -> i32 {
    // SAFETY: `task_tgid_vnr(current)` may be called from any process context.
    unsafe { raw::peerdirect_current_tgid() }
}

/// Whether the calling task was sent a fatal signal (`SIGKILL`, or one it does not handle
/// whose default is to end it): a wait it asked for should end at once.
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: reads the current task's pending signals; any process context.
    unsafe { raw::peerdirect_fatal_signal_pending() }
}

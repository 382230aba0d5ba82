//! The process's heavy memory barrier: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which
//! makes every other running thread of the process execute a full memory barrier before it
//! returns (by an IPI to each CPU that runs one; a thread not running gets one at its next
//! context switch). Paired with a compiler fence on the other side, it orders a store before a
//! load as a full fence would, at no cost to the side that runs often ([`super::lock`]'s
//! biased readers) and a system call to the side that runs rarely (a writer that ends a
//! bias).
//!
//! The command needs the process registered once (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`);
//! the registration belongs to the address space, so a forked child keeps it and an `exec`
//! drops it with everything else. Where the kernel lacks the command (not built with
//! `CONFIG_MEMBARRIER`, or a seccomp filter refuses it), [`available`] is false and the lock
//! never biases.

use std::sync::OnceLock;

use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};

/// Whether the heavy barrier works in this process: queried and registered on first use.
pub(super) fn available() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        membarrier_query().contains_command(MembarrierCommand::PrivateExpedited)
            && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
    })
}

/// Heavy barriers run in this process so far (each one a system call that interrupts every
/// CPU running a thread of it).
static HEAVY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many heavy barriers ran in this process so far.
#[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
pub fn heavy_count() -> u64 {
    HEAVY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Every running thread of the process executes a full memory barrier before this returns.
/// Only called once [`available`] said yes.
///
/// # Panics
///
/// If the kernel refuses the command after it accepted the registration: no such failure is
/// documented, and without the barrier a biased reader could overlap the caller's write.
pub(super) fn heavy() {
    HEAVY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Err(error) = membarrier(MembarrierCommand::PrivateExpedited) {
        // MEMBARRIER_CMD_GLOBAL waits for an RCU grace period instead: every CPU passes
        // through a full barrier. Slow (milliseconds), and only here.
        if membarrier(MembarrierCommand::Global).is_err() {
            panic!(
                "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after registration: {error}"
            );
        }
    }
}

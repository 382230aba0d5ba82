// SPDX-License-Identifier: GPL-2.0

//! Test-only: provokes one kind of kernel report at load, so that the QEMU harness proves it
//! notices each (tests/system/harness.sh). Never installed, never loaded otherwise.
//!
//! `mode`: 0 a WARNING; 1 a leak of four 1000-byte allocations (kmemleak); 2 a read of freed
//! memory (KASAN: load it on the KASAN kernel); 3 a wait that never ends, uninterruptible, in
//! the loading process (the hung task detector); 4 two locks of its own taken in both orders,
//! one after the other (lockdep's circular dependency report; nothing deadlocks).

use kernel::prelude::*;
use kernel::sync::{new_mutex, Completion, Mutex};

module! {
    type: SplatSelftest,
    name: "peerdirect_splat_selftest",
    authors: ["The peerdirect developers"],
    description: "Provokes a kernel report for peerdirect's harness self-test",
    license: "GPL v2",
    params: {
        mode: u32 {
            default: 0,
            description: "0: WARN, 1: leak, 2: use after free, 3: hang in D state, 4: lock inversion",
        },
    },
}

/// What the leak and the use after free allocate: big enough to tell apart in a report.
const BYTES: usize = 1000;
/// How many allocations the leak loses.
const LEAKS: usize = 4;

struct SplatSelftest;

#[pin_data]
struct TwoLocks {
    #[pin]
    first: Mutex<()>,
    #[pin]
    second: Mutex<()>,
}

impl kernel::Module for SplatSelftest {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        match module_parameters::mode.value() {
            0 => {
                pr_info!("provoking a WARN on purpose for the harness self-test\n");
                kernel::warn_on!(true);
            }
            1 => {
                pr_info!(
                    "leaking {LEAKS} times {BYTES} bytes on purpose for the harness self-test\n"
                );
                for _ in 0..LEAKS {
                    // Nothing keeps the address once init returns.
                    KBox::leak(KBox::new([0x5au8; BYTES], GFP_KERNEL)?);
                }
            }
            2 => {
                pr_info!("reading freed memory on purpose for the harness self-test\n");
                let freed: *const u8 = KBox::new([0xa5u8; BYTES], GFP_KERNEL)?.as_ptr();
                // SAFETY: none: this reads memory that was just freed, on purpose, for KASAN
                // to report it; the value is never used.
                let _ = unsafe { core::ptr::read_volatile(freed.add(BYTES / 2)) };
            }
            3 => {
                pr_info!("waiting forever on purpose for the harness self-test\n");
                // Never completed: the loading process stays in D state until the guest ends.
                KBox::pin_init(Completion::new(), GFP_KERNEL)?.wait_for_completion();
            }
            4 => {
                pr_info!("taking two locks in both orders on purpose for the harness self-test\n");
                let locks = KBox::pin_init(
                    pin_init!(TwoLocks {
                        first <- new_mutex!((), "peerdirect_selftest_first"),
                        second <- new_mutex!((), "peerdirect_selftest_second"),
                    }),
                    GFP_KERNEL,
                )?;
                {
                    let _first = locks.first.lock();
                    let _second = locks.second.lock();
                }
                let _second = locks.second.lock();
                let _first = locks.first.lock();
            }
            _ => return Err(EINVAL),
        }
        Ok(Self)
    }
}

// SPDX-License-Identifier: GPL-2.0

//! Test-only: provokes one kernel WARNING at load, so that the QEMU harness's splat check can
//! prove it notices one (tests/guest/splat-selftest). Never installed, never loaded otherwise.

use kernel::prelude::*;

module! {
    type: SplatSelftest,
    name: "peerdirect_splat_selftest",
    authors: ["The peerdirect developers"],
    description: "Provokes a WARN for peerdirect's harness self-test",
    license: "GPL v2",
}

struct SplatSelftest;

impl kernel::Module for SplatSelftest {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        pr_info!("provoking a WARN on purpose for the harness self-test\n");
        kernel::warn_on!(true);
        Ok(Self)
    }
}

// SPDX-License-Identifier: GPL-2.0

//! peerdirect: accelerator HBM exported as DMA-BUF for peer-to-peer RDMA.
//!
//! The module is a PCI driver for HBM devices (Habana Gaudi, or any BAR-memory device bound
//! through `driver_override`). Each bound device gets a misc device `/dev/peerdirectN` whose
//! ioctls are defined by `include/uapi/peerdirect.h`.
//!
//! One file per concern: [`provider`] binds the PCI device, [`hbm`] is what the rest of the
//! module knows of it, [`memory`] and [`heap`] keep and allocate its BAR, [`allocation`] is one range owned by a file
//! and its dma-bufs, [`export`] is the DMA-BUF exporter over the small exporter abstraction in
//! [`dmabuf`], [`chardev`] is the misc device and its ioctls, [`uapi`] the ABI, [`debugfs`]
//! the debug files, [`index`] the `/dev/peerdirectN` numbering, [`ffi`] the C helpers and the
//! PeerDirect peer-memory client (`peer_mem.c`, registered where ib_core offers that API).

mod allocation;
mod chardev;
mod debugfs;
mod dmabuf;
mod export;
mod ffi;
mod hbm;
mod heap;
mod index;
mod memory;
mod p2p;
mod provider;
mod status;
mod uapi;

use kernel::{driver, pci, prelude::*};

module! {
    type: Peerdirect,
    name: "peerdirect",
    authors: ["The peerdirect developers"],
    description: "Accelerator HBM as DMA-BUF for peer-to-peer RDMA",
    license: "GPL v2",
    imports_ns: ["DMA_BUF"],
}

#[pin_data(PinnedDrop)]
struct Peerdirect {
    #[pin]
    driver: driver::Registration<pci::Adapter<provider::HbmDriver>>,
    /// Registered after the driver, unregistered after it. No registration outlives the
    /// module: each holds a dma-buf, and a dma-buf holds the module.
    _peer_mem: ffi::PeerMemClient,
}

impl kernel::InPlaceModule for Peerdirect {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        // Before the driver registers: probing devices use both.
        debugfs::init_root();
        memory::init();
        try_pin_init!(Self {
            driver <- driver::Registration::new(c"peerdirect", module),
            _peer_mem: ffi::PeerMemClient::register()?,
        })
    }
}

#[pinned_drop]
impl PinnedDrop for Peerdirect {
    fn drop(self: Pin<&mut Self>) {
        // The driver unregisters right after (field drop); device directories hold the root,
        // bound devices their memory.
        debugfs::release_root();
        memory::release_all();
    }
}

// SPDX-License-Identifier: GPL-2.0

//! peerdirect: accelerator HBM exported as DMA-BUF for peer-to-peer RDMA.
//!
//! The module is a PCI driver for HBM devices (Habana Gaudi, or any BAR-memory device bound
//! through `driver_override`). Each bound device gets a misc device `/dev/peerdirectN` whose
//! ioctls are defined by `include/uapi/peerdirect.h`.
//!
//! One file per concern: [`provider`] binds the PCI device, [`hbm`] is what the rest of the
//! module knows of it, [`chardev`] is the misc device and its ioctls, [`uapi`] the ABI,
//! [`index`] the `/dev/peerdirectN` numbering, [`ffi`] the only raw FFI.

mod chardev;
mod ffi;
mod hbm;
mod index;
mod provider;
mod uapi;

kernel::module_pci_driver! {
    type: provider::HbmDriver,
    name: "peerdirect",
    authors: ["The peerdirect developers"],
    description: "Accelerator HBM as DMA-BUF for peer-to-peer RDMA",
    license: "GPL v2",
}

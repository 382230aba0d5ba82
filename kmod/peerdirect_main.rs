// SPDX-License-Identifier: GPL-2.0

//! peerdirect: accelerator HBM exported as DMA-BUF for peer-to-peer RDMA.
//!
//! The module is a PCI driver for HBM devices (Habana Gaudi, or any BAR-memory device bound
//! through `driver_override`). Each bound device gets a misc device `/dev/peerdirectN` whose
//! ioctls are defined by `include/uapi/peerdirect.h`.
//!
//! One file per concern, each using only those below it (Documentation/layers.md; no import
//! cycle, `scripts/layers` checks it):
//!
//! - this root wires them: the module parameter, the bus notifier's events, load and unload;
//! - [`companion`] and [`driver`] are the two providers: companion devices named on
//!   `/dev/peerdirect-ctl`, and the PCI driver that binds a device ([`ids`]: the devices known
//!   by ID);
//! - [`device`] is a device as served: its misc device, debugfs directory and index, the order
//!   they go in, and the list of companions;
//! - [`chardev`] is the misc device and its ioctls, [`debugfs`] the debug files;
//! - [`export`] is the DMA-BUF exporter, over an [`allocation`], one range owned by a file;
//! - [`hbm`] is what the rest of the module knows of a device: its state, its exports, the
//!   removal protocol; [`p2p`] the P2P verdicts and each importer's route;
//! - leaves: [`memory`] and [`heap`] keep and allocate the BAR, [`index`] numbers
//!   `/dev/peerdirectN`, [`status`] is the status page, [`uapi`] the ABI;
//! - [`sys`] is the floor below them all: the raw FFI (the C helpers of `sys/helpers/` and what
//!   the kernel crate does not wrap) and the abstractions over it (the dma-buf exporter's among
//!   them), the only place with `unsafe` and `bindings` once the baseline is empty, knowing
//!   nothing of peerdirect's types.
//!
//! The PeerDirect peer-memory client is a C module of its own (`kmod/peermem/`), for hosts
//! whose ib_core offers that API.

mod allocation;
mod chardev;
mod companion;
mod debugfs;
mod device;
mod driver;
mod export;
mod hbm;
mod heap;
mod ids;
mod index;
mod memory;
mod p2p;
mod status;
mod sys;
mod uapi;

use kernel::{driver::Registration, miscdevice::MiscDeviceRegistration, prelude::*};
use sys::{
    owner_link::OwnerLinks,
    pci_driver::ResetAware,
    pci_notifier::{PciBusEvents, PciGeneration},
};

module! {
    type: Peerdirect,
    name: "peerdirect",
    authors: ["The peerdirect developers"],
    description: "Accelerator HBM as DMA-BUF for peer-to-peer RDMA",
    license: "GPL v2",
    imports_ns: ["DMA_BUF"],
    params: {
        companion: bool {
            default: false,
            description: "Allow companion devices: HBM BARs of PCI devices another driver owns, named on /dev/peerdirect-ctl by CAP_SYS_ADMIN (Documentation/companion.md)",
        },
    },
}

/// Whether the module was loaded with `companion=1`.
fn companion_mode() -> bool {
    module_parameters::companion.value()
}

/// Fields drop in declaration order: first the control device (no companion is added after
/// it), then the companions, then the driver unregisters (no probe can
/// run after it, and every device is removed), and only then the state devices share
/// ([`Shared`]).
#[pin_data]
struct Peerdirect {
    #[pin]
    control: MiscDeviceRegistration<companion::ControlFile>,
    _companions: Companions,
    #[pin]
    driver: Registration<ResetAware<driver::HbmDriver>>,
    _shared: Shared,
}

/// What the PCI bus notifier tells the module: the P2P verdict caches hear of devices added
/// and deleted.
struct BusEvents;

impl PciBusEvents for BusEvents {
    fn device_changed(device: usize) {
        p2p::pci_device_changed(device);
    }
}

/// Removes the companion devices when dropped.
struct Companions;

impl Drop for Companions {
    fn drop(&mut self) {
        companion::remove_all();
    }
}

/// What every device uses: the debugfs root and the BARs' heaps. Made before the driver
/// registers (probing devices use both) and released after it is gone, also when loading
/// fails half-way.
struct Shared {
    /// Tells the P2P verdict caches of PCI devices added and deleted; registered before any
    /// device binds, unregistered after all are gone (the last field to drop).
    _generation: PciGeneration,
    /// Destroys the companions' owner links once dropped; made before any companion is added,
    /// drained after all are gone.
    _links: OwnerLinks,
}

impl Shared {
    fn new() -> Result<Self> {
        let generation = PciGeneration::register::<BusEvents>()?;
        let links = OwnerLinks::new()?;
        debugfs::init_root();
        companion::init(companion_mode());
        Ok(Self {
            _generation: generation,
            _links: links,
        })
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        debugfs::release_root();
        memory::release_all();
        p2p::release_all();
    }
}

impl kernel::InPlaceModule for Peerdirect {
    fn init(module: &'static ThisModule) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            _shared: Shared::new()?,
            driver <- Registration::new(c"peerdirect", module),
            _companions: Companions,
            control <- companion::control_device(),
        })
    }
}

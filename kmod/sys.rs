// SPDX-License-Identifier: GPL-2.0

//! The abstraction floor: the only place of `unsafe` and `bindings` (the kernel's C), and the
//! Rust side of the C helpers in `sys/helpers/` (`scripts/layers` checks that no other file
//! has either). Each file wraps one subject of the kernel in safe
//! functions and types (or in `unsafe fn`s whose `# Safety` sections say what their callers
//! vouch for) and knows nothing of peerdirect's own types; the domain above it is safe Rust
//! over them, and what the kernel tells the module through the floor (the PCI bus notifier,
//! an owner's unbind) reaches it through a trait the crate root implements.
//!
//! - [`raw`]: every `extern "C"` declaration of the C helpers, and the C structs they name;
//!   nothing outside this floor calls them.
//! - [`pci`]: PCI devices: references and borrows, the device lock and the bound driver's name,
//!   BAR facts, bridges, ACS, host bridges, IOMMU and P2P distance.
//! - [`pci_driver`]: a PCI driver registered with error handlers, which tell it of its
//!   devices' resets ([`pci_driver::ResetDriver`]).
//! - [`pci_notifier`]: the PCI bus notifier and the [`pci_notifier::PciBusEvents`] it
//!   dispatches to.
//! - [`owner_link`]: a device link to a PCI device another driver owns, which tells the module
//!   before that driver unbinds ([`owner_link::OwnerUnbinds`]).
//! - [`dma_buf`]: the DMA-BUF exporter abstraction (the `Exporter` trait, the `dma_buf_ops`
//!   built from it, attachments typed by what each callback may do), and our dma-bufs' peer
//!   and host-bridge tables, mmap, naming, revocation and attachment listing, and the
//!   exporter-private word of an attachment.
//! - [`debugfs`]: a debugfs scope under a directory looked up when it is initialized.
//! - [`global`]: mutexes in statics ([`global::global_mutex!`]), initialized at first use.
//! - [`misc`]: a misc device registered with data its opens reach, whose files answer `poll`
//!   (the kernel crate's abstraction has neither).
//! - [`mm`]: pages, VMAs and files.
//! - [`plain`]: `FromBytes` and `AsBytes` for a `repr(C)` struct, proven at build time
//!   ([`plain::plain_struct!`]).
//! - [`task`]: the calling task.
//! - [`util`]: error pointers.
//!
//! The C helpers are in `helpers/`, one file per file of the floor that wraps them (`pci.c`
//! for [`pci`], and so on), all declared in `helpers/helpers.h`.

pub(crate) mod debugfs;
pub(crate) mod dma_buf;
pub(crate) mod global;
pub(crate) mod misc;
pub(crate) mod mm;
pub(crate) mod owner_link;
pub(crate) mod pci;
pub(crate) mod pci_driver;
pub(crate) mod pci_notifier;
pub(crate) mod plain;
mod raw;
pub(crate) mod task;
mod util;

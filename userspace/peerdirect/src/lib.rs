//! Userspace access to peerdirect, the kernel module that exports accelerator HBM (a PCI BAR)
//! as DMA-BUF for peer-to-peer RDMA. Each HBM device is a misc device `/dev/peerdirectN`.
//!
//! ```no_run
//! for device in peerdirect::devices()? {
//!     let info = device.info()?;
//!     println!("{}: {} bytes of HBM at bus address {:#x}", info.pci_address, info.hbm_bytes, info.hbm_bus_addr);
//! }
//! # Ok::<(), peerdirect::Error>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod device;
mod error;
mod info;
mod sys;
pub mod uapi;

pub use device::{device_path, devices, Device};
pub use error::{Error, Operation};
pub use info::{DeviceInfo, PciAddress, Provider};
pub use rustix::io::Errno;
pub use sys::RawInfo;

//! `/dev/peerdirect-ctl`: the administrator's control device. It names companion devices: PCI
//! devices that another driver owns (habanalabs), whose HBM BAR peerdirect then serves as
//! `/dev/peerdirectN` beside that driver (Documentation/companion.md).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::error::Operation;
use crate::sys::{
    self, RawCompanionAdd, RawCompanionRemove, RawCompanionResetDone, RawCompanionResetPrepare,
    RawRequest,
};
use crate::uapi::{self, CONTROL_DEVICE};
use crate::{Error, PciAddress};

/// The control device node: `/dev/peerdirect-ctl`.
pub fn control_path() -> PathBuf {
    Path::new("/dev").join(CONTROL_DEVICE)
}

/// An open control device. Its commands need `CAP_SYS_ADMIN` and the module loaded with
/// `companion=1`.
#[derive(Debug)]
pub struct Control {
    fd: OwnedFd,
    path: PathBuf,
}

impl Control {
    /// Opens `/dev/peerdirect-ctl`.
    pub fn open() -> Result<Self, Error> {
        Self::open_path(control_path())
    }

    /// Opens the control device at `path`.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let fd = rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|errno| Error::os(Operation::OpenControl, path, errno))?;
        Ok(Self {
            fd,
            path: path.to_owned(),
        })
    }

    /// Serves the HBM BAR `bar` of `device` (`None`: the BAR peerdirect's ID table gives, for
    /// Gaudi devices) as a companion device; returns N of its `/dev/peerdirectN`.
    pub fn add_companion(&self, device: PciAddress, bar: Option<u8>) -> Result<u32, Error> {
        let mut raw = RawCompanionAdd::<0>::new();
        set_address(&mut raw.companion, device);
        raw.companion.bar = bar.unwrap_or(uapi::PEERDIRECT_COMPANION_BAR_DEFAULT as u8);
        self.add_companion_raw(&mut raw)?;
        Ok(raw.companion.index)
    }

    /// Stops serving `device` as a companion: its `/dev/peerdirectN` goes, and everything
    /// exported from it is revoked first.
    pub fn remove_companion(&self, device: PciAddress) -> Result<(), Error> {
        let mut raw = RawCompanionRemove::<0>::new();
        set_address(&mut raw.companion, device);
        self.remove_companion_raw(&mut raw)
    }

    /// Tells peerdirect that the owner of the companion `device` is about to reset it (the PCI
    /// core tells only the owner's driver): every dma-buf exported from it is revoked, the
    /// reset is counted on its status page, and exports are refused (`EBUSY`) until
    /// [`Control::companion_reset_done`].
    pub fn companion_reset_prepare(&self, device: PciAddress) -> Result<(), Error> {
        let mut raw = RawCompanionResetPrepare::<0>::new();
        set_address(&mut raw.companion, device);
        self.send(Operation::CompanionResetPrepare, &mut raw)
    }

    /// The reset [`Control::companion_reset_prepare`] announced is over: the companion exports
    /// again (what was exported before stays revoked). `EINVAL` if no reset was announced.
    pub fn companion_reset_done(&self, device: PciAddress) -> Result<(), Error> {
        let mut raw = RawCompanionResetDone::<0>::new();
        set_address(&mut raw.companion, device);
        self.send(Operation::CompanionResetDone, &mut raw)
    }

    /// Sends `PEERDIRECT_IOC_COMPANION_ADD` with an argument the caller built, malformed ones
    /// included. For testing the module's checks.
    pub fn add_companion_raw<const TAIL: usize>(
        &self,
        raw: &mut RawCompanionAdd<TAIL>,
    ) -> Result<(), Error> {
        self.send(Operation::CompanionAdd, raw)
    }

    /// Sends `PEERDIRECT_IOC_COMPANION_REMOVE` with an argument the caller built.
    pub fn remove_companion_raw<const TAIL: usize>(
        &self,
        raw: &mut RawCompanionRemove<TAIL>,
    ) -> Result<(), Error> {
        self.send(Operation::CompanionRemove, raw)
    }

    fn send<R: RawRequest>(&self, operation: Operation, raw: &mut R) -> Result<(), Error> {
        crate::device::check_request_size(operation, &self.path, raw)?;
        sys::send(self.fd.as_fd(), raw).map_err(|errno| Error::os(operation, &self.path, errno))
    }
}

fn set_address(raw: &mut uapi::peerdirect_companion, device: PciAddress) {
    raw.pci_domain = device.domain;
    raw.pci_bus = device.bus;
    raw.pci_slot = device.slot;
    raw.pci_func = device.func;
}

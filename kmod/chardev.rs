// SPDX-License-Identifier: GPL-2.0

//! `/dev/peerdirectN`: the misc device of one HBM device, and its ioctls.

use crate::{
    hbm::Hbm,
    provider::HbmDevice,
    uapi::{peerdirect_info, Request, PEERDIRECT_IOC_INFO, PEERDIRECT_PROVIDER_OWNED},
};
use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    prelude::*,
    seq_file::SeqFile,
    seq_print,
    sync::Arc,
};

/// An open `/dev/peerdirectN`.
pub(crate) struct HbmFile {
    hbm: Arc<Hbm>,
}

impl HbmFile {
    /// `PEERDIRECT_IOC_INFO`: describe the HBM device.
    fn info(&self, arg: usize) -> Result {
        let mut req = Request::<peerdirect_info>::read(arg)?;
        if req.value.flags != 0 {
            return Err(EOPNOTSUPP);
        }
        if req.value.__reserved0 != 0 || req.value.__reserved1 != 0 {
            return Err(EINVAL);
        }
        let info = self.hbm.info()?;
        req.value = peerdirect_info {
            hbm_bytes: info.bytes,
            hbm_bus_addr: info.bus_addr,
            hbm_phys_addr: info.phys_addr,
            bar_index: info.bar.get(),
            numa_node: info
                .numa_node
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(-1),
            pci_domain: info.address.domain,
            pci_bus: info.address.bus,
            pci_slot: info.address.slot,
            pci_func: info.address.func,
            vendor_id: info.vendor_id,
            device_id: info.device_id,
            index: info.index,
            provider: PEERDIRECT_PROVIDER_OWNED,
            ..Default::default()
        };
        req.answer()
    }
}

#[vtable]
impl MiscDevice for HbmFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        let hbm = HbmDevice::of_registration(misc).hbm().clone();
        Ok(KBox::new(Self { hbm }, GFP_KERNEL)?)
    }

    fn ioctl(me: &Self, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            PEERDIRECT_IOC_INFO => me.info(arg)?,
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }

    fn show_fdinfo(me: &Self, m: &SeqFile, _file: &File) {
        let info = me.hbm.recorded();
        seq_print!(
            m,
            "peerdirect-device:\tpeerdirect{}\npeerdirect-pci:\t{}\npeerdirect-hbm-bytes:\t{}\npeerdirect-present:\t{}\n",
            info.index,
            info.address,
            info.bytes,
            me.hbm.is_present()
        );
    }
}

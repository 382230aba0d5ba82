//! The typed view of `struct peerdirect_info`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};

use crate::uapi;
use crate::Error;

/// A PCI function address, `DDDD:BB:SS.F` like the names under /sys/bus/pci/devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// Domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Slot (device) number.
    pub slot: u8,
    /// Function number.
    pub func: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.func
        )
    }
}

impl Serialize for PciAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// How peerdirect reaches the device's HBM (`PEERDIRECT_PROVIDER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// peerdirect is the device's PCI driver and owns the BAR.
    Owned,
}

impl Provider {
    fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            uapi::PEERDIRECT_PROVIDER_OWNED => Some(Self::Owned),
            _ => None,
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Owned => "owned",
        })
    }
}

/// What `PEERDIRECT_IOC_INFO` tells about one HBM device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// The device node, e.g. `/dev/peerdirect0`.
    pub path: PathBuf,
    /// N of `/dev/peerdirectN`.
    pub index: u32,
    /// Where the device sits on PCI.
    pub pci_address: PciAddress,
    /// PCI vendor ID.
    pub vendor_id: u16,
    /// PCI device ID.
    pub device_id: u16,
    /// Index of the HBM BAR.
    pub bar_index: u32,
    /// Size of the HBM BAR in bytes.
    pub hbm_bytes: u64,
    /// PCI bus address of the HBM BAR: what a peer device DMAs to.
    pub hbm_bus_addr: u64,
    /// CPU physical address of the HBM BAR.
    pub hbm_phys_addr: u64,
    /// NUMA node of the device, if it has one.
    pub numa_node: Option<u32>,
    /// How peerdirect reaches the HBM.
    pub provider: Provider,
}

impl DeviceInfo {
    /// Checks and converts what the kernel wrote for the device node at `path`.
    pub fn from_raw(path: &Path, raw: &uapi::peerdirect_info) -> Result<Self, Error> {
        let unknown = |field, value| Error::UnknownValue {
            path: path.to_owned(),
            field,
            value,
        };
        let numa_node = match raw.numa_node {
            -1 => None,
            node => Some(u32::try_from(node).map_err(|_| unknown("numa_node", node.into()))?),
        };
        let provider = Provider::from_raw(raw.provider)
            .ok_or_else(|| unknown("provider", raw.provider.into()))?;
        Ok(Self {
            path: path.to_owned(),
            index: raw.index,
            pci_address: PciAddress {
                domain: raw.pci_domain,
                bus: raw.pci_bus,
                slot: raw.pci_slot,
                func: raw.pci_func,
            },
            vendor_id: raw.vendor_id,
            device_id: raw.device_id,
            bar_index: raw.bar_index,
            hbm_bytes: raw.hbm_bytes,
            hbm_bus_addr: raw.hbm_bus_addr,
            hbm_phys_addr: raw.hbm_phys_addr,
            numa_node,
            provider,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> uapi::peerdirect_info {
        uapi::peerdirect_info {
            size: uapi::PEERDIRECT_INFO_SIZE_VER0,
            hbm_bytes: 1 << 30,
            hbm_bus_addr: 0xfe00_0000_0000,
            hbm_phys_addr: 0x3_8000_0000_0000,
            bar_index: 2,
            numa_node: 1,
            pci_domain: 0,
            pci_bus: 0xaf,
            pci_slot: 0x1f,
            pci_func: 7,
            vendor_id: 0x1b36,
            device_id: 0x0010,
            index: 3,
            provider: uapi::PEERDIRECT_PROVIDER_OWNED,
            ..Default::default()
        }
    }

    #[test]
    fn converts_every_field() {
        let info = DeviceInfo::from_raw(Path::new("/dev/peerdirect3"), &raw()).unwrap();
        assert_eq!(
            info,
            DeviceInfo {
                path: "/dev/peerdirect3".into(),
                index: 3,
                pci_address: PciAddress {
                    domain: 0,
                    bus: 0xaf,
                    slot: 0x1f,
                    func: 7
                },
                vendor_id: 0x1b36,
                device_id: 0x0010,
                bar_index: 2,
                hbm_bytes: 1 << 30,
                hbm_bus_addr: 0xfe00_0000_0000,
                hbm_phys_addr: 0x3_8000_0000_0000,
                numa_node: Some(1),
                provider: Provider::Owned,
            }
        );
    }

    #[test]
    fn pci_address_is_formatted_like_sysfs() {
        let info = DeviceInfo::from_raw(Path::new("/dev/peerdirect3"), &raw()).unwrap();
        assert_eq!(info.pci_address.to_string(), "0000:af:1f.7");
        let wide = PciAddress {
            domain: 0x1_0000,
            bus: 1,
            slot: 2,
            func: 3,
        };
        assert_eq!(wide.to_string(), "10000:01:02.3");
    }

    #[test]
    fn numa_node_minus_one_is_none() {
        let raw = uapi::peerdirect_info {
            numa_node: -1,
            ..raw()
        };
        let info = DeviceInfo::from_raw(Path::new("/dev/peerdirect3"), &raw).unwrap();
        assert_eq!(info.numa_node, None);
    }

    #[test]
    fn other_negative_numa_node_is_an_error() {
        let raw = uapi::peerdirect_info {
            numa_node: -2,
            ..raw()
        };
        let err = DeviceInfo::from_raw(Path::new("/dev/peerdirect3"), &raw).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnknownValue {
                    field: "numa_node",
                    value: -2,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn unknown_provider_is_an_error() {
        for provider in [0, 2, u32::MAX] {
            let raw = uapi::peerdirect_info { provider, ..raw() };
            let err = DeviceInfo::from_raw(Path::new("/dev/peerdirect3"), &raw).unwrap_err();
            match err {
                Error::UnknownValue {
                    ref path,
                    field: "provider",
                    value,
                } => {
                    assert_eq!(path, Path::new("/dev/peerdirect3"));
                    assert_eq!(value, i64::from(provider));
                }
                _ => panic!("{err:?}"),
            }
            assert!(err.to_string().contains("provider = "), "{err}");
        }
    }

    #[test]
    fn provider_names() {
        assert_eq!(Provider::Owned.to_string(), "owned");
    }
}

//! The typed view of `struct peerdirect_info`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};

use crate::error::Operation;
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

impl PciAddress {
    /// The address of the device `bus << 8 | devfn` in `domain`, as the module reports bridges.
    pub fn from_id(domain: u32, id: u16) -> Self {
        let [bus, devfn] = id.to_be_bytes();
        Self {
            domain,
            bus,
            slot: devfn >> 3,
            func: devfn & 7,
        }
    }
}

impl std::str::FromStr for PciAddress {
    type Err = String;

    /// Parses `DDDD:BB:SS.F` (as in /sys/bus/pci/devices) or `BB:SS.F` (domain 0), hex.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || format!("{s:?} is not a PCI address: expected DDDD:BB:SS.F, e.g. 0000:03:00.0");
        let (domain, rest) = match s.split(':').count() {
            3 => {
                let (domain, rest) = s.split_once(':').ok_or_else(bad)?;
                (u32::from_str_radix(domain, 16).map_err(|_| bad())?, rest)
            }
            2 => (0, s),
            _ => return Err(bad()),
        };
        let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (slot, func) = rest.split_once('.').ok_or_else(bad)?;
        let hex = |field: &str, max: u8| {
            u8::from_str_radix(field, 16)
                .ok()
                .filter(|&v| v <= max && !field.is_empty() && field.len() <= 2)
                .ok_or_else(bad)
        };
        Ok(Self {
            domain,
            bus: hex(bus, 0xff)?,
            slot: hex(slot, 31)?,
            func: hex(func, 7)?,
        })
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
    /// Another driver (or none) owns the device; peerdirect serves its BAR beside it
    /// ([`crate::Control::add_companion`]), with no allocator.
    Companion,
}

impl Provider {
    fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            uapi::PEERDIRECT_PROVIDER_OWNED => Some(Self::Owned),
            uapi::PEERDIRECT_PROVIDER_COMPANION => Some(Self::Companion),
            _ => None,
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Owned => "owned",
            Self::Companion => "companion",
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
    /// The PCI driver bound to the device: `peerdirect` for an owned device, the owner
    /// (`habanalabs`, `vfio-pci`) or `None` for a companion. `PEERDIRECT_IOC_INFO` says it
    /// since `PEERDIRECT_INFO_SIZE_VER1`; with a module older than that,
    /// [`crate::Device::info`] reads it from sysfs and [`DeviceInfo::from_raw`] leaves it
    /// `None`.
    pub driver: Option<String>,
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
        // NUL-padded; a module older than the field answered a smaller size.
        let driver = if raw.size >= uapi::PEERDIRECT_INFO_SIZE_VER1 {
            let end =
                raw.driver
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or_else(|| Error::InvalidReply {
                        operation: Operation::Info,
                        path: path.to_owned(),
                        field: "driver (no NUL)",
                        value: raw.driver.len() as i64,
                    })?;
            let name = &raw.driver[..end];
            (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
        } else {
            None
        };
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
            driver,
        })
    }
}

/// The driver bound to the PCI device at `address`, as sysfs says (`None`: no driver).
pub(crate) fn pci_driver(address: PciAddress) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/bus/pci/devices/{address}/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
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
                driver: None,
            }
        );
    }

    #[test]
    fn pci_address_parses_sysfs_names() {
        let parse = |s: &str| s.parse::<PciAddress>();
        assert_eq!(
            parse("0000:af:1f.7"),
            Ok(PciAddress {
                domain: 0,
                bus: 0xaf,
                slot: 0x1f,
                func: 7
            })
        );
        assert_eq!(parse("10000:01:02.3").unwrap().to_string(), "10000:01:02.3");
        assert_eq!(parse("03:00.1").unwrap().to_string(), "0000:03:00.1");
        for bad in [
            "",
            "0000:03:00",
            "0000:03:20.0",
            "0000:03:00.8",
            "0000:103:00.0",
            "x:03:00.0",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("is not a PCI address"), "{bad:?}: {err}");
        }
        assert_eq!(PciAddress::from_id(0, 0x0308).to_string(), "0000:03:01.0");
        assert_eq!(PciAddress::from_id(1, 0x00ff).to_string(), "0001:00:1f.7");
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
    fn driver_comes_from_a_module_that_knows_the_field() {
        let with = |size: u32, name: &[u8]| {
            let mut raw = uapi::peerdirect_info { size, ..raw() };
            raw.driver[..name.len()].copy_from_slice(name);
            DeviceInfo::from_raw(Path::new("/dev/peerdirect3"), &raw)
        };
        let ver1 = uapi::PEERDIRECT_INFO_SIZE_VER1;
        assert_eq!(
            with(ver1, b"vfio-pci").unwrap().driver.as_deref(),
            Some("vfio-pci")
        );
        // A companion with no driver bound.
        assert_eq!(with(ver1, b"").unwrap().driver, None);
        // An older module answers the first version's size: its bytes past it mean nothing.
        assert_eq!(
            with(uapi::PEERDIRECT_INFO_SIZE_VER0, b"stale")
                .unwrap()
                .driver,
            None
        );
        let err = with(ver1, &[b'x'; uapi::PEERDIRECT_DRIVER_NAME_LEN as usize]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidReply {
                    field: "driver (no NUL)",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn unknown_provider_is_an_error() {
        for provider in [0, 3, u32::MAX] {
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
        assert_eq!(Provider::Companion.to_string(), "companion");
    }
}

//! The kernel's verdict on peer-to-peer DMA between an HBM device and another PCI device
//! (`PEERDIRECT_IOC_P2P`), and what it means in words.

use std::fmt;

use serde::Serialize;

use crate::uapi;
use crate::PciAddress;

/// How a peer's DMA reaches the HBM when the kernel allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum P2pMapping {
    /// Below a shared bridge, by PCI bus address: the traffic never leaves the switch.
    BusAddress,
    /// Up through the host bridge, which the kernel trusts for P2P (its allowlist, or the
    /// CPU's own guarantee).
    ThroughHostBridge,
}

/// What `PEERDIRECT_IOC_P2P` reports about the path from an HBM device to one peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct P2pPath {
    /// The HBM device.
    pub hbm: PciAddress,
    /// The peer asked about.
    pub peer: PciAddress,
    /// The kernel's verdict (`pci_p2pdma_distance_many`): PCI hops between the two, `None`
    /// when its P2P rules give no path. The exporter refuses exactly those peers' attaches.
    pub distance: Option<u32>,
    /// The bridge where the two paths meet below the host bridge.
    pub common_bridge: Option<PciAddress>,
    /// The first bridge on that path that redirects P2P requests upstream (ACS).
    pub acs_bridge: Option<PciAddress>,
    /// How many bridges on that path redirect.
    pub acs_bridges: u16,
    /// Whether both devices are below the same host bridge.
    pub same_host_bridge: bool,
    /// Vendor and device ID of the HBM device's host bridge, as `vvvv:dddd`.
    pub host_bridge: Option<String>,
    /// Whether the peer's DMA is translated by an IOMMU.
    pub peer_iommu: bool,
}

impl P2pPath {
    /// Converts the kernel's answer about `peer`, asked of HBM device `hbm`.
    pub(crate) fn from_raw(hbm: PciAddress, raw: &uapi::peerdirect_p2p) -> Self {
        let peer = PciAddress {
            domain: raw.pci_domain,
            bus: raw.pci_bus,
            slot: raw.pci_slot,
            func: raw.pci_func,
        };
        let has = |bit: u32| raw.path & bit != 0;
        let bridge = |bit, id| has(bit).then(|| PciAddress::from_id(raw.pci_domain, id));
        Self {
            hbm,
            peer,
            distance: u32::try_from(raw.distance).ok(),
            common_bridge: bridge(uapi::PEERDIRECT_P2P_COMMON_BRIDGE, raw.common_bridge),
            acs_bridge: bridge(uapi::PEERDIRECT_P2P_ACS_REDIRECT, raw.acs_bridge),
            acs_bridges: raw.acs_bridges,
            same_host_bridge: has(uapi::PEERDIRECT_P2P_SAME_HOST_BRIDGE),
            host_bridge: (raw.host_bridge_vendor != 0).then(|| {
                format!(
                    "{:04x}:{:04x}",
                    raw.host_bridge_vendor, raw.host_bridge_device
                )
            }),
            peer_iommu: has(uapi::PEERDIRECT_P2P_PEER_IOMMU),
        }
    }

    /// Whether the kernel lets the peer DMA to this HBM (and the exporter lets it attach).
    pub fn reachable(&self) -> bool {
        self.distance.is_some()
    }

    /// How the peer's DMA gets there, when it does.
    pub fn mapping(&self) -> Option<P2pMapping> {
        self.distance?;
        Some(
            if self.common_bridge.is_some() && self.acs_bridge.is_none() {
                P2pMapping::BusAddress
            } else {
                P2pMapping::ThroughHostBridge
            },
        )
    }

    /// Why the verdict is what it is, in one sentence, with what to do about a refusal.
    pub fn why(&self) -> String {
        self.to_string()
    }

    fn host_bridge_name(&self) -> String {
        match &self.host_bridge {
            Some(ids) => format!("the host bridge [{ids}]"),
            None => "the host bridge".to_owned(),
        }
    }
}

impl fmt::Display for P2pPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = self.host_bridge_name();
        let hops = |d: u32| {
            if d == 1 {
                "1 hop".to_owned()
            } else {
                format!("{d} hops")
            }
        };
        match (self.distance, self.common_bridge, self.acs_bridge) {
            (Some(0), ..) => f.write_str("the peer is the HBM device itself"),
            (Some(d), Some(common), None) => write!(
                f,
                "the paths meet at {common} below the host bridge and no bridge on the way \
redirects P2P (ACS): DMA by bus address, {}",
                hops(d)
            ),
            (Some(d), _, acs) => {
                write!(
                    f,
                    "P2P goes up through {host}, which the kernel trusts for P2P"
                )?;
                if let Some(acs) = acs {
                    write!(f, " (ACS redirect on {acs} sends it there)")?;
                }
                write!(f, ", {}", hops(d))
            }
            (None, Some(common), Some(acs)) => write!(
                f,
                "ACS redirect on {acs}{} sends P2P up to {host}, which is not on the kernel's \
P2P allowlist; booting with pci=disable_acs_redir={acs} keeps it below {common}",
                match self.acs_bridges {
                    0 | 1 => String::new(),
                    n => format!(" and {} more bridge(s)", n - 1),
                }
            ),
            (None, None, _) => write!(
                f,
                "the paths meet only at {host}{}, which is not on the kernel's P2P allowlist: \
place both devices below one PCIe switch",
                if self.same_host_bridge {
                    ""
                } else {
                    " (different host bridges)"
                }
            ),
            (None, Some(common), None) => write!(
                f,
                "the kernel refused although the paths meet at {common} without ACS redirect; \
its log says why (pci_p2pdma_distance_many)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(
        distance: i32,
        path: u32,
        common: u16,
        acs: u16,
        acs_bridges: u16,
    ) -> uapi::peerdirect_p2p {
        uapi::peerdirect_p2p {
            size: uapi::PEERDIRECT_P2P_SIZE_VER0,
            pci_domain: 0,
            pci_bus: 3,
            pci_slot: 0,
            pci_func: 0,
            distance,
            path,
            common_bridge: common,
            acs_bridge: acs,
            acs_bridges,
            host_bridge_vendor: 0x8086,
            host_bridge_device: 0x29c0,
            ..Default::default()
        }
    }

    fn hbm() -> PciAddress {
        "0000:02:00.0".parse().unwrap()
    }

    const COMMON: u32 = uapi::PEERDIRECT_P2P_COMMON_BRIDGE;
    const ACS: u32 = uapi::PEERDIRECT_P2P_ACS_REDIRECT;
    const SAME: u32 = uapi::PEERDIRECT_P2P_SAME_HOST_BRIDGE;

    #[test]
    fn below_a_switch() {
        let path = P2pPath::from_raw(hbm(), &raw(4, COMMON | SAME, 0x0100, 0, 0));
        assert!(path.reachable());
        assert_eq!(path.distance, Some(4));
        assert_eq!(path.mapping(), Some(P2pMapping::BusAddress));
        assert_eq!(path.common_bridge.unwrap().to_string(), "0000:01:00.0");
        assert_eq!(path.acs_bridge, None);
        assert_eq!(path.host_bridge.as_deref(), Some("8086:29c0"));
        assert_eq!(
            path.why(),
            "the paths meet at 0000:01:00.0 below the host bridge and no bridge on the way \
redirects P2P (ACS): DMA by bus address, 4 hops"
        );
    }

    #[test]
    fn separate_root_ports() {
        let path = P2pPath::from_raw(hbm(), &raw(-1, SAME, 0, 0, 0));
        assert!(!path.reachable());
        assert_eq!(path.mapping(), None);
        assert_eq!(
            path.why(),
            "the paths meet only at the host bridge [8086:29c0], which is not on the kernel's \
P2P allowlist: place both devices below one PCIe switch"
        );
        let path = P2pPath::from_raw(hbm(), &raw(-1, 0, 0, 0, 0));
        assert!(
            path.why().contains("(different host bridges)"),
            "{}",
            path.why()
        );
    }

    #[test]
    fn acs_redirect() {
        let path = P2pPath::from_raw(hbm(), &raw(-1, COMMON | ACS | SAME, 0x0008, 0x0008, 1));
        assert_eq!(
            path.why(),
            "ACS redirect on 0000:00:01.0 sends P2P up to the host bridge [8086:29c0], which \
is not on the kernel's P2P allowlist; booting with pci=disable_acs_redir=0000:00:01.0 keeps \
it below 0000:00:01.0"
        );
        let path = P2pPath::from_raw(hbm(), &raw(-1, COMMON | ACS | SAME, 0x0100, 0x0208, 3));
        assert!(path
            .why()
            .starts_with("ACS redirect on 0000:02:01.0 and 2 more bridge(s)"));
        // Allowed through an allowlisted host bridge despite the redirect.
        let path = P2pPath::from_raw(hbm(), &raw(6, COMMON | ACS | SAME, 0x0100, 0x0208, 1));
        assert_eq!(path.mapping(), Some(P2pMapping::ThroughHostBridge));
        assert!(path
            .why()
            .contains("trusts for P2P (ACS redirect on 0000:02:01.0"));
    }

    #[test]
    fn same_device_and_unexplained() {
        let path = P2pPath::from_raw(hbm(), &raw(0, COMMON | SAME, 0x0200, 0, 0));
        assert_eq!(path.why(), "the peer is the HBM device itself");
        let path = P2pPath::from_raw(hbm(), &raw(-1, COMMON | SAME, 0x0100, 0, 0));
        assert!(path.why().contains("its log says why"));
    }

    #[test]
    fn serializes_addresses_as_strings() {
        let path = P2pPath::from_raw(hbm(), &raw(4, COMMON | SAME, 0x0100, 0, 0));
        let json = serde_json::to_value(&path).unwrap();
        assert_eq!(json["peer"], "0000:03:00.0");
        assert_eq!(json["common_bridge"], "0000:01:00.0");
        assert_eq!(json["acs_bridge"], serde_json::Value::Null);
        assert_eq!(json["distance"], 4);
    }
}

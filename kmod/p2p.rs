// SPDX-License-Identifier: GPL-2.0

//! `PEERDIRECT_IOC_P2P`: whether a PCI device (a NIC, another accelerator) can reach this HBM
//! peer-to-peer, as the kernel decides it, with the facts about the path that explain it.
//!
//! The verdict is the kernel's own (`pci_p2pdma_distance_many`, the rule the exporter's attach
//! enforces). The facts are read the way the p2pdma core walks the tree: the first bridge
//! both devices sit below, the bridges between them with ACS redirect enabled, whether they
//! share a host bridge, and that host bridge's IDs (what the kernel's allowlist is keyed by).

use crate::ffi::{PciDev, PciDevRef};
use kernel::{pci, prelude::*};

/// Importers whose verdict one HBM device keeps.
const VERDICTS: usize = 4;

/// The kernel's P2P verdicts for the importers of one HBM device, so that an attach does not
/// walk the PCI tree again (reading bridges' ACS control on the way) for an importer it has
/// seen. An importer's device is named by its address, which is valid only under the PCI
/// generation ([`crate::ffi::pci_generation`]) the verdict was taken at: a device deleted and
/// another allocated at its address make a new generation. Kept under a spinlock in
/// [`crate::hbm::Hbm`]; the oldest of [`VERDICTS`] entries makes room.
pub(crate) struct Verdicts {
    entries: [Option<Verdict>; VERDICTS],
    next: usize,
}

#[derive(Clone, Copy)]
struct Verdict {
    device: usize,
    generation: u64,
    distance: Option<u32>,
}

impl Verdicts {
    pub(crate) const fn new() -> Self {
        Self {
            entries: [None; VERDICTS],
            next: 0,
        }
    }

    /// The verdict for `device` under `generation`: `None` if not known.
    pub(crate) fn get(&self, device: usize, generation: u64) -> Option<Option<u32>> {
        self.entries
            .iter()
            .flatten()
            .find(|v| v.device == device && v.generation == generation)
            .map(|v| v.distance)
    }

    /// Records `device`'s verdict under `generation`, in place of its older one or of the
    /// oldest entry.
    pub(crate) fn put(&mut self, device: usize, generation: u64, distance: Option<u32>) {
        let verdict = Some(Verdict {
            device,
            generation,
            distance,
        });
        if let Some(slot) = self
            .entries
            .iter_mut()
            .find(|v| v.is_some_and(|v| v.device == device))
        {
            *slot = verdict;
            return;
        }
        self.entries[self.next] = verdict;
        self.next = (self.next + 1) % VERDICTS;
    }
}

/// What `PEERDIRECT_IOC_P2P` reports about one peer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct P2pPath {
    /// Hops between the devices; `None` when the kernel's P2P rules give no path.
    pub(crate) distance: Option<u32>,
    /// `bus << 8 | devfn` of the bridge where the two paths meet below the host bridge.
    pub(crate) common_bridge: Option<u16>,
    /// `bus << 8 | devfn` of the first bridge on that path that redirects P2P upstream.
    pub(crate) acs_bridge: Option<u16>,
    /// How many bridges on that path redirect.
    pub(crate) acs_bridges: u16,
    pub(crate) same_host_bridge: bool,
    /// Vendor and device ID of the HBM device's host bridge function.
    pub(crate) host_bridge: Option<(u16, u16)>,
    pub(crate) peer_iommu: bool,
}

/// The devices from `dev` up to, not including, `stop` (all of them when `stop` is `None`).
fn path_up<'a>(dev: PciDev<'a>, stop: Option<PciDev<'a>>) -> impl Iterator<Item = PciDev<'a>> {
    core::iter::successors(Some(dev), |d| d.upstream_bridge())
        .take_while(move |d| !matches!(stop, Some(s) if d.is(s)))
}

/// The lowest device that is `a` or above it and also `b` or above it.
fn common_upstream<'a>(a: PciDev<'a>, b: PciDev<'a>) -> Option<PciDev<'a>> {
    path_up(a, None).find(|x| path_up(b, None).any(|y| x.is(y)))
}

/// Whether `peer` reaches `hbm` by bus address: both below a bridge where their paths meet,
/// with no bridge on the way redirecting P2P upstream (the p2pdma core's
/// `PCI_P2PDMA_MAP_BUS_ADDR`); otherwise, when the kernel allows P2P at all, through the host
/// bridge.
pub(crate) fn by_bus_address(hbm: &pci::Device, peer: PciDev<'_>) -> bool {
    let hbm_dev = PciDev::of(hbm);
    match common_upstream(hbm_dev, peer) {
        Some(common) => {
            let below =
                Iterator::chain(path_up(hbm_dev, Some(common)), path_up(peer, Some(common)));
            !Iterator::chain(below, core::iter::once(common)).any(|d| d.acs_redirects())
        }
        None => false,
    }
}

/// The path from `hbm` to the device at `domain`:`bus`:`devfn`; `ENXIO` if there is none.
pub(crate) fn query(hbm: &pci::Device, domain: u32, bus: u8, devfn: u8) -> Result<P2pPath> {
    let peer_ref = PciDevRef::get(domain, bus, devfn).ok_or(ENXIO)?;
    let peer = peer_ref.as_dev();
    let hbm_dev = PciDev::of(hbm);
    let mut path = P2pPath {
        distance: peer.p2p_distance_from(hbm),
        same_host_bridge: hbm_dev.same_host_bridge(peer),
        host_bridge: hbm_dev.host_bridge_ids(),
        peer_iommu: peer.iommu_mapped(),
        ..P2pPath::default()
    };
    if let Some(common) = common_upstream(hbm_dev, peer) {
        path.common_bridge = Some(common.id());
        // As the p2pdma core counts them: the devices and bridges below the meeting point on
        // both sides, and the meeting point itself.
        // (`Iterator::chain` spelled out: `pin_init::Init` has a `chain` too.)
        let below = Iterator::chain(path_up(hbm_dev, Some(common)), path_up(peer, Some(common)));
        let mut redirecting =
            Iterator::chain(below, core::iter::once(common)).filter(|d| d.acs_redirects());
        if let Some(first) = redirecting.next() {
            path.acs_bridge = Some(first.id());
            path.acs_bridges = 1 + u16::try_from(redirecting.count()).unwrap_or(u16::MAX - 1);
        }
    }
    Ok(path)
}

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_p2p_verdicts)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_hold_per_device_and_generation() {
        let mut v = Verdicts::new();
        assert_eq!(v.get(0x1000, 7), None);
        v.put(0x1000, 7, Some(4));
        v.put(0x2000, 7, None);
        assert_eq!(v.get(0x1000, 7), Some(Some(4)));
        // A refusal is a verdict too.
        assert_eq!(v.get(0x2000, 7), Some(None));
        // Another generation: the address may name another device now.
        assert_eq!(v.get(0x1000, 8), None);
        v.put(0x1000, 8, Some(6));
        assert_eq!(v.get(0x1000, 8), Some(Some(6)));
        assert_eq!(v.get(0x1000, 7), None);
    }

    #[test]
    fn the_oldest_verdict_makes_room() {
        let mut v = Verdicts::new();
        for d in 1..=VERDICTS {
            v.put(d, 1, Some(2));
        }
        v.put(VERDICTS + 1, 1, Some(2));
        assert_eq!(v.get(1, 1), None);
        for d in 2..=VERDICTS + 1 {
            assert_eq!(v.get(d, 1), Some(Some(2)));
        }
    }
}

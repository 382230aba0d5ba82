// SPDX-License-Identifier: GPL-2.0

//! `PEERDIRECT_IOC_P2P`: whether a PCI device (a NIC, another accelerator) can reach this HBM
//! peer-to-peer, as the kernel decides it, with the facts about the path that explain it.
//!
//! The verdict is the kernel's own (`pci_p2pdma_distance_many`, the rule the exporter's attach
//! enforces). The facts are read the way the p2pdma core walks the tree: the first bridge
//! both devices sit below, the bridges between them with ACS redirect enabled, whether they
//! share a host bridge, and that host bridge's IDs (what the kernel's allowlist is keyed by).

use crate::ffi::{PciDev, PciDevRef};
use kernel::{
    new_spinlock, pci,
    prelude::*,
    sync::{
        atomic::{Acquire, Atomic, Relaxed, Release},
        SpinLock,
    },
};

/// Importers whose verdict one HBM device keeps.
const VERDICTS: usize = 16;

/// The kernel's P2P verdicts for the importers of one HBM device, so that an attach does not
/// walk the PCI tree again (reading bridges' ACS control on the way) for an importer it has
/// seen. An importer's device is named by its address, which is valid only under the PCI
/// generation ([`crate::ffi::pci_generation`]) the verdict was taken at: a device deleted and
/// another allocated at its address make a new generation.
///
/// Attach reads it without a lock, in two atomic loads (each one a call into the kernel on a
/// distro's kernel, built without inlined Rust helpers): a slot, once given to a device, is
/// never given to another, so the verdict in it is always that device's (the newest one put,
/// or an older one, whose generation then tells it is stale). A slot's device is published
/// after its first verdict. Writers are serialized by the lock they pass to
/// [`Verdicts::put`]. Every field is an atomic, so a read racing a write is a stale value,
/// never undefined behaviour.
///
/// A device is looked for from the slot its address hashes to, onwards. When every slot has
/// its device, another device is not kept: each of its attaches asks the kernel, as every
/// attach did before the cache. Slots are taken only by devices that attached, and an address
/// freed and reused (as a new VF's often is) finds its old slot; a device deleted keeps its
/// slot until the HBM device is bound again.
#[pin_data]
pub(crate) struct Verdicts {
    entries: [Slot; VERDICTS],
    /// Serializes writers; `true` once closed.
    #[pin]
    writer: SpinLock<bool>,
}

/// How an importer reaches the HBM device, when the kernel's P2P rules give it a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// The kernel's P2P distance (`pci_p2pdma_distance_many`).
    pub(crate) distance: u32,
    /// By bus address ([`by_bus_address`]), or else through the host bridge.
    pub(crate) by_bus_address: bool,
}

/// One verdict: `device` 0 when empty (no device lives at address 0).
struct Slot {
    device: Atomic<usize>,
    /// The PCI generation the verdict was taken at (its low 48 bits) above the route in the
    /// low [`ROUTE_BITS`]: the distance shifted left by one, the lowest bit set for a route by
    /// bus address; [`NO_PATH`] for none. Read in one load. [`CLOSED`] once the cache is.
    verdict: Atomic<u64>,
}

/// A slot's verdict once [`Verdicts::close`] ran.
const CLOSED: u64 = u64::MAX;

/// The bits of a slot's verdict that hold the route. Distances count the PCI hops between two
/// devices, far below what fits; a generation wraps only after 2^48 PCI devices added or
/// deleted.
const ROUTE_BITS: u32 = 16;

/// A slot's route when the kernel's P2P rules give no path.
const NO_PATH: u64 = (1 << ROUTE_BITS) - 1;

impl Route {
    /// The route as a slot keeps it; `None` if it does not fit.
    fn packed(route: Option<Self>) -> Option<u64> {
        let Some(route) = route else {
            return Some(NO_PATH);
        };
        let packed = u64::from(route.distance) << 1 | u64::from(route.by_bus_address);
        (packed < NO_PATH).then_some(packed)
    }

    fn unpacked(packed: u64) -> Option<Self> {
        (packed != NO_PATH).then_some(Self {
            // Below `NO_PATH` (`packed`), so it fits.
            distance: (packed >> 1) as u32,
            by_bus_address: packed & 1 == 1,
        })
    }
}

impl Slot {
    const fn new() -> Self {
        Self {
            device: Atomic::new(0),
            verdict: Atomic::new(0),
        }
    }
}

impl Verdicts {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            entries: [const { Slot::new() }; VERDICTS],
            writer <- new_spinlock!(false, "Verdicts::writer"),
        })
    }

    /// The slots to look for `device` in, in order.
    fn probe(&self, device: usize) -> impl Iterator<Item = &Slot> {
        // Addresses of `struct device`s differ in their low bits by at least their alignment.
        let start = (device >> 3) % VERDICTS;
        Iterator::chain(self.entries[start..].iter(), &self.entries[..start])
    }

    /// The verdict for `device` under `generation`: `None` if not known.
    pub(crate) fn get(&self, device: usize, generation: u64) -> Option<Option<Route>> {
        let slot = self.probe(device).find_map(|slot| {
            // Acquire: the verdict, written before the device was published, is read after.
            match slot.device.load(Acquire) {
                0 => Some(None),
                d if d == device => Some(Some(slot)),
                _ => None,
            }
        })??;
        let verdict = slot.verdict.load(Relaxed);
        if verdict == CLOSED || (verdict ^ generation << ROUTE_BITS) >> ROUTE_BITS != 0 {
            return None;
        }
        Some(Route::unpacked(verdict & NO_PATH))
    }

    /// Records `device`'s verdict under `generation`, in place of its older one or in a free
    /// slot; when there is none, it is not kept. A distance too large to keep is not kept
    /// either (never met: see [`ROUTE_BITS`]).
    pub(crate) fn put(&self, device: usize, generation: u64, route: Option<Route>) {
        let Some(route) = Route::packed(route) else {
            return;
        };
        let closed = self.writer.lock();
        if *closed {
            return;
        }
        let Some(slot) = self.probe(device).find(|slot| {
            let d = slot.device.load(Relaxed);
            d == device || d == 0
        }) else {
            return;
        };
        slot.verdict
            .store(generation << ROUTE_BITS | route, Relaxed);
        // Release: a reader that sees the device sees its verdict (this one or a later one).
        slot.device.store(device, Release);
    }

    /// Makes every later [`Verdicts::get`] a miss and every [`Verdicts::put`] a no-op: the
    /// device is going away, and an attach that misses finds that out (`Hbm::live`), so a hit
    /// means the device was there when it was looked up. A lookup already under way may still
    /// hit, as an attach already past any check would pass it.
    pub(crate) fn close(&self) {
        let mut closed = self.writer.lock();
        *closed = true;
        for slot in &self.entries {
            slot.verdict.store(CLOSED, Relaxed);
        }
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

    /// A route by bus address at `distance`.
    fn bus(distance: u32) -> Option<Route> {
        Some(Route {
            distance,
            by_bus_address: true,
        })
    }

    /// A route through the host bridge at `distance`.
    fn host(distance: u32) -> Option<Route> {
        Some(Route {
            distance,
            by_bus_address: false,
        })
    }

    #[test]
    fn verdicts_hold_per_device_and_generation() -> Result {
        let v = KBox::pin_init(Verdicts::new(), GFP_KERNEL)?;
        assert_eq!(v.get(0x1000, 7), None);
        v.put(0x1000, 7, bus(4));
        v.put(0x2000, 7, None);
        v.put(0x3000, 7, host(5));
        assert_eq!(v.get(0x1000, 7), Some(bus(4)));
        // A refusal is a verdict too.
        assert_eq!(v.get(0x2000, 7), Some(None));
        assert_eq!(v.get(0x3000, 7), Some(host(5)));
        // Another generation: the address may name another device now.
        assert_eq!(v.get(0x1000, 8), None);
        v.put(0x1000, 8, host(6));
        assert_eq!(v.get(0x1000, 8), Some(host(6)));
        assert_eq!(v.get(0x1000, 7), None);
        Ok(())
    }

    #[test]
    fn a_closed_cache_keeps_nothing() -> Result {
        let v = KBox::pin_init(Verdicts::new(), GFP_KERNEL)?;
        v.put(0x1000, 1, bus(2));
        v.close();
        assert_eq!(v.get(0x1000, 1), None);
        v.put(0x2000, 1, bus(2));
        assert_eq!(v.get(0x2000, 1), None);
        // Closed twice is still closed.
        v.close();
        v.put(0x1000, 1, bus(2));
        assert_eq!(v.get(0x1000, 1), None);
        Ok(())
    }

    #[test]
    fn a_distance_too_large_to_keep_is_not_kept() -> Result {
        let v = KBox::pin_init(Verdicts::new(), GFP_KERNEL)?;
        let largest = (NO_PATH >> 1) as u32 - 1;
        v.put(0x1000, 1, bus(largest));
        assert_eq!(v.get(0x1000, 1), Some(bus(largest)));
        // Would read back as "no path".
        v.put(0x2000, 1, bus(largest + 1));
        assert_eq!(v.get(0x2000, 1), None);
        v.put(0x1000, 2, host(u32::MAX));
        assert_eq!(v.get(0x1000, 2), None);
        // The older verdict stays what it was.
        assert_eq!(v.get(0x1000, 1), Some(bus(largest)));
        Ok(())
    }

    #[test]
    fn a_full_cache_keeps_its_devices() -> Result {
        let v = KBox::pin_init(Verdicts::new(), GFP_KERNEL)?;
        // Addresses as apart as `struct device`s are, some hashing to the same slot.
        let device = |i: usize| 0x1000 + i * 8 * (VERDICTS - 1);
        for i in 0..VERDICTS {
            v.put(device(i), 1, bus(2));
        }
        v.put(device(VERDICTS), 1, bus(3));
        assert_eq!(v.get(device(VERDICTS), 1), None);
        for i in 0..VERDICTS {
            assert_eq!(v.get(device(i), 1), Some(bus(2)));
        }
        // A kept device's newer verdict goes in its own slot.
        v.put(device(5), 2, host(4));
        assert_eq!(v.get(device(5), 2), Some(host(4)));
        assert_eq!(v.get(device(5), 1), None);
        Ok(())
    }

    /// Writers on the system workqueue rewrite every slot as fast as they can, each verdict a
    /// function of its device and generation, while this thread reads: a read must be a miss
    /// or that function's value, never fields of two writes (a device with another's
    /// distance or generation). Bounded: the writers stop after a fixed number of rounds.
    #[test]
    fn reads_racing_writes_see_whole_verdicts() -> Result {
        use kernel::{
            sync::{atomic::Full, Arc},
            workqueue,
        };
        const ROUNDS: u64 = 20_000;
        const WRITERS: usize = 2;
        fn route(device: usize, generation: u64) -> Option<Route> {
            let d = (device as u64 * 7 + generation) % 11;
            (d != 0).then_some(Route {
                distance: d as u32,
                by_bus_address: (device as u64 + generation) % 2 == 0,
            })
        }
        let v = Arc::pin_init(Verdicts::new(), GFP_KERNEL)?;
        let done = Arc::new(Atomic::new(0usize), GFP_KERNEL)?;
        for writer in 0..WRITERS {
            let (v, done) = (v.clone(), done.clone());
            workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
                for round in 0..ROUNDS {
                    // More devices than slots: every put replaces a slot.
                    let device = 1 + (round as usize * 3 + writer) % (2 * VERDICTS);
                    let generation = round % 5;
                    v.put(device, generation, route(device, generation));
                }
                done.fetch_add(1, Full);
            })?;
        }
        let (mut reads, mut hits) = (0u64, 0u64);
        while done.load(Acquire) < WRITERS {
            let device = 1 + (reads as usize % (2 * VERDICTS));
            let generation = reads % 5;
            if let Some(found) = v.get(device, generation) {
                assert_eq!(found, route(device, generation));
                hits += 1;
            }
            reads += 1;
        }
        kernel::pr_info!("verdicts race: {reads} reads, {hits} hits\n");
        // Not a vacuous pass: some reads met whole verdicts.
        assert!(hits > 0);
        Ok(())
    }

    #[test]
    fn a_slot_is_found_only_once_its_device_is_published() -> Result {
        let v = KBox::pin_init(Verdicts::new(), GFP_KERNEL)?;
        let device = 0x1000;
        let slot = v.probe(device).next().ok_or(EINVAL)?;
        // As `put` leaves it halfway: the verdict written, the device not yet.
        slot.verdict.store(3 << ROUTE_BITS | 4 << 1 | 1, Relaxed);
        assert_eq!(v.get(device, 3), None);
        slot.device.store(device, Release);
        assert_eq!(v.get(device, 3), Some(bus(4)));
        Ok(())
    }
}

//! `peerdirect-guest-tests`: checks the module's ioctl ABI against /dev/peerdirect0 from inside
//! a guest that has it loaded, and reports in TAP. Exits 0 iff every test passed.
//!
//! With `--lifecycle`, instead unbinds, rebinds, removes and rescans the device behind
//! /dev/peerdirect0 and unloads the module, checking what becomes of open files (see
//! [`lifecycle`]).

mod alloc_export;
mod bench_copy;
mod bench_exporters;
mod bench_hits;
mod cpu_mapping;
mod crash;
mod fabric;
mod fabric_close;
mod fabric_peer;
mod fabric_revoke;
mod fuzz;
mod ibimport;
mod ibverbs;
mod ibverbs_revoke;
mod importer;
mod lifecycle;
mod peermem;
mod pinned;
mod race;
mod release_revoke;
mod removal;
mod revoke;
mod support;
mod testmod;
mod usercopy;

use std::process::ExitCode;

use clap::Parser;
use peerdirect::uapi::{
    peerdirect_info, PEERDIRECT_DRIVER_NAME_LEN, PEERDIRECT_INFO_SIZE_VER0,
    PEERDIRECT_INFO_SIZE_VER1, PEERDIRECT_PROVIDER_OWNED, PEERDIRECT_STATUS_VERSION,
};
use peerdirect::{Device, Errno, PciAddress, Provider, RawInfo, RawP2p};

use support::{expect_eq, expect_errno, expect_errno_of, Outcome, Tap};

/// Run the peerdirect ABI tests against /dev/peerdirect0 and print TAP.
#[derive(Debug, Parser)]
#[command(version)]
#[command(group(clap::ArgGroup::new("hbm_users").args(["fabric", "fabric_revoke"])))]
struct Args {
    /// The HBM size the device must report, in bytes.
    #[arg(long, value_name = "N")]
    expect_hbm_bytes: Option<u64>,
    /// Test unbind, rebind, PCI remove and rescan, and module unload instead (leaves the
    /// module unloaded).
    #[arg(long, conflicts_with = "expect_hbm_bytes")]
    lifecycle: bool,
    /// Attach dma-bufs of /dev/peerdirect0 to the NIC through the test importer module
    /// instead (tests/kmod/peerdirect_importer.c), in the guest topology `--topology`.
    #[arg(long, requires = "topology", conflicts_with_all = ["expect_hbm_bytes", "lifecycle"])]
    importer: bool,
    /// Test PEERDIRECT_IOC_ALLOC, FREE and EXPORT and the dma-bufs they make instead.
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer"])]
    alloc_export: bool,
    /// Revoke dma-bufs of /dev/peerdirect0 that importers hold and CPUs map by removing the
    /// device instead: `unbind` (then rebinds it), or `unplug` (asks the host harness for a
    /// PCIe hot-unplug with `@@peerdirect-unplug hbm0`); or by resetting it (`reset`: its
    /// sysfs `reset`). Switch topology; leaves the module unloaded.
    #[arg(long, value_enum, value_name = "HOW", conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export"])]
    revoke: Option<revoke::Removal>,
    /// Internal to --revoke: the child that maps the dma-buf on its stdin and touches the
    /// mapping once the file named exists.
    #[arg(long, hide = true, value_name = "GO_FILE")]
    revoke_touch: Option<std::path::PathBuf>,
    /// Internal, for the test of the crash report: a thread of this name reads address 8,
    /// which is never mapped.
    #[arg(long, hide = true, value_name = "THREAD")]
    crash_in: Option<String>,
    /// Benchmark (not a test): sg entries and attach/map/unmap times of peerdirect's,
    /// udmabuf's and vfio-pci's dma-bufs imported by the NIC instead (`qemu/run --topology
    /// switch-iommu`; leaves the HBM device on vfio-pci).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    bench_exporters: bool,
    /// Not a test: N attach/map/unmap+detach cycles of a 2 MiB dma-buf from peerdirect, then
    /// from vfio-pci, each framed by a `# profile` line with CLOCK_MONOTONIC times, for
    /// `scripts/profile-exporters` (leaves the HBM device on vfio-pci).
    #[arg(long, value_name = "N", conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "bench_exporters"])]
    profile_exporters: Option<u64>,
    /// Benchmark (not a test): memcpy bandwidth of the CPU through a peerdirect dma-buf's
    /// mmap, vfio-pci's mmap of the same BAR and anonymous memory instead (`qemu/run
    /// --topology switch-iommu --hbm 2G --mem 3G`; leaves the HBM device on vfio-pci).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "bench_exporters"])]
    bench_cpu_copy: bool,
    /// Benchmark (not a test): the crate's cache hit (RegCache::get and the handle's drop) on
    /// libfabric's tcp domain from 1, 2 and 8 threads instead, timed as
    /// userspace/capi/benches/hits.c times the C ABI's (`qemu/run --userland trixie`).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "bench_exporters", "bench_cpu_copy"])]
    bench_hits: bool,
    /// With --bench-hits: the 2 MiB are a memfd registered as a foreign dma-buf instead of an
    /// allocation of /dev/peerdirect0, so that no device is needed (`scripts/bench-hits
    /// --native` runs it on the host's CPU, in the trixie userland).
    #[arg(long, requires = "bench_hits")]
    foreign: bool,
    /// Test the libfabric registrar with this provider instead (`tcp` under `qemu/run
    /// --userland trixie`, `verbs;ofi_rxm` under `--rxe`).
    #[arg(long, value_name = "PROVIDER")]
    fabric: Option<String>,
    /// With --fabric or --fabric-revoke: take the HBM from /dev/peerdirect0 as a companion
    /// device (ranges of its BAR this program hands out, exported with EXPORT_RANGE) instead
    /// of its allocations; --fabric-revoke then unbinds the companion's owner (vfio-pci).
    #[arg(long, requires = "hbm_users")]
    companion: bool,
    /// With --fabric: the provider is expected to register HBM directly (path dma_buf, nothing
    /// staged), as verbs does on the dma-buf capable rxe of `qemu/run --rxe-dmabuf`; without
    /// it verbs is expected to bounce through host memory with the provider's reason (tcp is
    /// always direct).
    #[arg(long, requires = "fabric")]
    direct: bool,
    /// libfabric RMA between two hosts' HBM instead: this host is node NODE (0 listens on the
    /// side channel, 1 connects to PEER_IP), `verbs;ofi_rxm` on guests whose NICs are linked
    /// (`qemu/run --rxe-dmabuf --link`; node 0 unbinds its HBM device and rebinds it; see
    /// [`fabric_peer`]).
    #[arg(long, num_args = 2, value_names = ["NODE", "PEER_IP"], conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "fabric"])]
    fabric_peer: Option<Vec<String>>,
    /// Import dma-bufs with ib_core's own functions through the test module
    /// peerdirect_ibimport.ko, and imports held across unbind instead (`qemu/run --rxe --hbm
    /// 8G`, switch topology; see [`ibimport`]).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    ibimport: bool,
    /// Register HBM on rxe0 through the crate's ibverbs registrar and cache instead: refused
    /// by Debian's rxe provider (`qemu/run --rxe`), or, with `--rxe-dmabuf`, registered and
    /// seen attached in debugfs (see [`ibverbs`]).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "ibimport"])]
    ibverbs: bool,
    /// With --ibverbs: the guest was booted with `qemu/run --rxe-dmabuf` (the test kernel's
    /// patched rxe and the patched rxe provider), so registrations must succeed.
    #[arg(long, requires = "ibverbs")]
    rxe_dmabuf: bool,
    /// Remove the HBM device while a RegCache holds verbs registrations of it instead
    /// (`qemu/run --rxe-dmabuf`; `unplug` needs `--hotplug` and leaves the device gone; see
    /// [`ibverbs_revoke`]).
    #[arg(long, value_enum, value_name = "WAY", conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "ibimport", "ibverbs"])]
    ibverbs_revoke: Option<ibverbs_revoke::Way>,
    /// Unbind the HBM device while libfabric's verbs;ofi_rxm moves its memory (fi_read and
    /// tagged streams) instead (`qemu/run --rxe-dmabuf`; see [`fabric_revoke`]).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "ibimport", "ibverbs", "ibverbs_revoke"])]
    fabric_revoke: bool,
    /// Close a verbs;ofi_rxm endpoint while its provider holds a message for it that nobody
    /// asked for instead (`qemu/run --rxe-dmabuf`, run with glibc's heap perturbed; see
    /// [`fabric_close`]).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "ibimport", "ibverbs", "ibverbs_revoke", "fabric_revoke"])]
    fabric_close: bool,
    /// Check that /dev/peerdirect0's device is idle (nothing allocated or exported, no
    /// peerdirect dma-buf left) instead: after programs that leave memory to their exit.
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke", "ibimport", "ibverbs", "ibverbs_revoke", "fabric_revoke"])]
    idle: bool,
    /// With --ibverbs-revoke race: how many rounds.
    #[arg(long, default_value_t = 6, requires = "ibverbs_revoke")]
    rounds: u32,
    /// Contract test of the PeerDirect peer-memory client against the test module
    /// peerdirect_peermem_core.ko instead, in the guest topology given (`qemu/run --no-bind
    /// --topology T`; loads and unloads the modules itself, see [`peermem`]).
    #[arg(long, value_enum, value_name = "TOPOLOGY", conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    peermem: Option<peermem::Topology>,
    /// Race the HBM device's removal against userspace instead, for `--seconds` (see
    /// [`race`]; `mmap-unplug` needs `qemu/run --hotplug` and leaves the module unloaded).
    #[arg(long, value_enum, value_name = "SUITE,...", value_delimiter = ',', conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    race: Vec<race::Suite>,
    /// Count the page faults of touching dma-buf mappings at different alignments instead
    /// (see [`cpu_mapping`]; needs `qemu/run --hbm 2G`).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    cpu_mapping: bool,
    /// Test the removal protocol for importers that cannot be revoked instead (see
    /// [`pinned`]; switch topology, needs the test importer module).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    pinned_removal: bool,
    /// Close dma-bufs while removal revokes the device's exports instead (see
    /// [`release_revoke`]; switch topology, needs the test importer module).
    #[arg(long, conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    release_revoke: bool,
    /// Run a randomized, seeded sequence of device operations from several threads instead
    /// (see [`fuzz`]), for `--seconds`.
    #[arg(long, value_name = "SEED", conflicts_with_all = ["expect_hbm_bytes", "lifecycle", "importer", "alloc_export", "revoke"])]
    fuzz: Option<u64>,
    /// With `--fuzz`: unbind and rebind the device meanwhile, and try to unload the module.
    #[arg(long, requires = "fuzz")]
    fuzz_removal: bool,
    /// How long each `--race` suite, or `--fuzz`, runs.
    #[arg(long, value_name = "N", default_value_t = 20)]
    seconds: u64,
    /// The PCIe topology the guest was booted with (`qemu/run --topology`).
    #[arg(long, value_enum, requires = "importer")]
    topology: Option<importer::Topology>,
}

const INDEX: u32 = 0;
/// The PCI devices bound to peerdirect, one link each, named by PCI address.
const SYSFS_DRIVER: &str = "/sys/bus/pci/drivers/peerdirect";

struct Test {
    description: String,
    run: Box<dyn Fn(&Device) -> Outcome>,
}

fn test(description: impl Into<String>, run: impl Fn(&Device) -> Outcome + 'static) -> Test {
    Test {
        description: description.into(),
        run: Box::new(run),
    }
}

fn tests(args: &Args) -> Vec<Test> {
    let expected_bytes = args.expect_hbm_bytes;
    vec![
        test(
            match expected_bytes {
                Some(bytes) => format!("INFO with size 96 succeeds, hbm_bytes == {bytes}"),
                None => "INFO with size 96 succeeds, hbm_bytes > 0".to_owned(),
            },
            move |device| {
                let info = info_ok(device, &mut RawInfo::<0>::new())?;
                match expected_bytes {
                    Some(bytes) => expect_eq("hbm_bytes", bytes, info.hbm_bytes),
                    None if info.hbm_bytes == 0 => Err("expected hbm_bytes > 0, got 0".to_owned()),
                    None => Ok(()),
                }
            },
        ),
        test("INFO index is 0, as in /dev/peerdirect0", |device| {
            let info = info_ok(device, &mut RawInfo::<0>::new())?;
            expect_eq("index", INDEX, info.index)
        }),
        test("INFO provider is owned, driver peerdirect", |device| {
            let info = info_ok(device, &mut RawInfo::<0>::new())?;
            expect_eq("raw provider", PEERDIRECT_PROVIDER_OWNED, info.provider)?;
            let mut driver = [0; PEERDIRECT_DRIVER_NAME_LEN as usize];
            driver[..10].copy_from_slice(b"peerdirect");
            expect_eq("raw driver", driver, info.driver)?;
            let info = device
                .info()
                .map_err(|err| format!("Device::info failed: {err}"))?;
            expect_eq("provider", Provider::Owned, info.provider)?;
            expect_eq("driver", Some("peerdirect"), info.driver.as_deref())
        }),
        test(
            format!("INFO pci_address and IDs name a device bound in {SYSFS_DRIVER}"),
            |device| {
                let info = info_ok(device, &mut RawInfo::<0>::new())?;
                let pci_address = pci_address(&info);
                let bound = format!("{SYSFS_DRIVER}/{pci_address}");
                let read_id = |file: &str| {
                    let path = format!("{bound}/{file}");
                    std::fs::read_to_string(&path)
                        .map(|s| s.trim().to_owned())
                        .map_err(|err| format!("cannot read {path}: {err}"))
                };
                expect_eq(
                    "vendor_id",
                    read_id("vendor")?,
                    format!("{:#06x}", info.vendor_id),
                )?;
                expect_eq(
                    "device_id",
                    read_id("device")?,
                    format!("{:#06x}", info.device_id),
                )
            },
        ),
        test("INFO with size 0 fails with EINVAL", |device| {
            let mut raw = RawInfo::<0>::new();
            raw.info.size = 0;
            expect_errno(device.info_raw(&mut raw), Errno::INVAL)
        }),
        test("INFO with size 63 fails with EINVAL", |device| {
            let mut raw = RawInfo::<0>::new();
            raw.info.size = PEERDIRECT_INFO_SIZE_VER0 - 1;
            expect_errno(device.info_raw(&mut raw), Errno::INVAL)
        }),
        test(
            "INFO with size 104 and a zero tail succeeds, same fields as size 96, tail untouched, answers size 96",
            |device| {
                let ver1 = info_ok(device, &mut RawInfo::<0>::new())?;
                let mut raw = RawInfo::<8>::new();
                raw.info.size = PEERDIRECT_INFO_SIZE_VER1 + 8;
                let longer = info_ok(device, &mut raw)?;
                expect_eq("fields (size aside)", fields(&ver1), fields(&longer))?;
                expect_eq("size answered", PEERDIRECT_INFO_SIZE_VER1, longer.size)?;
                expect_eq("tail", [0; 8], raw.tail)
            },
        ),
        test(
            "INFO with size 64 (a caller older than driver) succeeds, answers size 64, and leaves driver's bytes alone",
            |device| {
                let ver1 = info_ok(device, &mut RawInfo::<0>::new())?;
                let mut raw = RawInfo::<0>::new();
                raw.info.size = PEERDIRECT_INFO_SIZE_VER0;
                raw.info.driver = [0xa5; PEERDIRECT_DRIVER_NAME_LEN as usize];
                let older = info_ok(device, &mut raw)?;
                expect_eq("size answered", PEERDIRECT_INFO_SIZE_VER0, older.size)?;
                expect_eq(
                    "driver's bytes",
                    [0xa5; PEERDIRECT_DRIVER_NAME_LEN as usize],
                    older.driver,
                )?;
                let driver = [0; PEERDIRECT_DRIVER_NAME_LEN as usize];
                expect_eq(
                    "other fields (size aside)",
                    fields(&peerdirect_info { driver, ..ver1 }),
                    fields(&peerdirect_info { driver, ..older }),
                )
            },
        ),
        test(
            "INFO with size 104 and a nonzero tail fails with E2BIG",
            |device| {
                let mut raw = RawInfo::<8>::new();
                raw.info.size = PEERDIRECT_INFO_SIZE_VER1 + 8;
                raw.tail[7] = 1;
                expect_errno(device.info_raw(&mut raw), Errno::TOOBIG)
            },
        ),
        test("INFO with flags 0x1 fails with EOPNOTSUPP", |device| {
            let mut raw = RawInfo::<0>::new();
            raw.info.flags = 0x1;
            expect_errno(device.info_raw(&mut raw), Errno::OPNOTSUPP)
        }),
        test(
            "INFO with flags 0x80000000 fails with EOPNOTSUPP",
            |device| {
                let mut raw = RawInfo::<0>::new();
                raw.info.flags = 0x8000_0000;
                expect_errno(device.info_raw(&mut raw), Errno::OPNOTSUPP)
            },
        ),
        test("INFO with __reserved0 != 0 fails with EINVAL", |device| {
            let mut raw = RawInfo::<0>::new();
            raw.info.__reserved0 = 1;
            expect_errno(device.info_raw(&mut raw), Errno::INVAL)
        }),
        test("INFO with __reserved1 != 0 fails with EINVAL", |device| {
            let mut raw = RawInfo::<0>::new();
            raw.info.__reserved1 = 1;
            expect_errno(device.info_raw(&mut raw), Errno::INVAL)
        }),
        test(
            "unknown command _IO(0xBD, 0x7f) fails with ENOTTY",
            |device| expect_errno(device.command_raw(0x7f), Errno::NOTTY),
        ),
        test(
            "P2P about the HBM device itself: distance 0, the same host bridge",
            |device| {
                let hbm = pci_address(&info_ok(device, &mut RawInfo::<0>::new())?);
                let path = device
                    .p2p(hbm)
                    .map_err(|err| format!("expected P2P about {hbm} to succeed, got {err}"))?;
                expect_eq("distance", Some(0), path.distance)?;
                expect_eq("same_host_bridge", true, path.same_host_bridge)?;
                expect_eq("why", "the peer is the HBM device itself", path.why().as_str())
            },
        ),
        test("P2P about an address no device has fails with ENXIO", |device| {
            let nobody = PciAddress {
                domain: 0,
                bus: 0xfe,
                slot: 31,
                func: 7,
            };
            expect_errno_of("P2P", device.p2p(nobody), Errno::NXIO)
        }),
        test(
            "P2P with slot 32, function 8, size 39, flags 0x1 or a __reserved field != 0 fails (EINVAL, EOPNOTSUPP)",
            |device| {
                let hbm = info_ok(device, &mut RawInfo::<0>::new())?;
                let at_hbm = || {
                    let mut raw = RawP2p::<0>::new();
                    raw.p2p.pci_domain = hbm.pci_domain;
                    raw.p2p.pci_bus = hbm.pci_bus;
                    raw.p2p.pci_slot = hbm.pci_slot;
                    raw.p2p.pci_func = hbm.pci_func;
                    raw
                };
                type Breaker = fn(&mut RawP2p<0>);
                let cases: [(&str, Breaker, Errno); 7] = [
                    ("slot 32", |r| r.p2p.pci_slot = 32, Errno::INVAL),
                    ("function 8", |r| r.p2p.pci_func = 8, Errno::INVAL),
                    ("size 39", |r| r.p2p.size = 39, Errno::INVAL),
                    ("flags 0x1", |r| r.p2p.flags = 1, Errno::OPNOTSUPP),
                    ("__reserved0", |r| r.p2p.__reserved0 = 1, Errno::INVAL),
                    ("__reserved1", |r| r.p2p.__reserved1 = 1, Errno::INVAL),
                    ("__reserved2", |r| r.p2p.__reserved2 = 1, Errno::INVAL),
                ];
                let mut good = at_hbm();
                device.p2p_raw(&mut good).map_err(|err| {
                    format!("expected the well-formed request to succeed, got {err}")
                })?;
                for (what, break_it, errno) in cases {
                    let mut raw = at_hbm();
                    break_it(&mut raw);
                    expect_errno(device.p2p_raw(&mut raw), errno)
                        .map_err(|err| format!("{what}: {err}"))?;
                }
                Ok(())
            },
        ),
        test(
            "P2P with size 48 and a zero tail succeeds; a nonzero tail fails with E2BIG",
            |device| {
                let hbm = info_ok(device, &mut RawInfo::<0>::new())?;
                let mut raw = RawP2p::<8>::new();
                raw.p2p.size = 48;
                raw.p2p.pci_domain = hbm.pci_domain;
                raw.p2p.pci_bus = hbm.pci_bus;
                raw.p2p.pci_slot = hbm.pci_slot;
                raw.p2p.pci_func = hbm.pci_func;
                device.p2p_raw(&mut raw).map_err(|err| {
                    format!("expected size 48 with a zero tail to succeed, got {err}")
                })?;
                expect_eq("distance", 0, raw.p2p.distance)?;
                raw.p2p.size = 48;
                raw.tail[0] = 1;
                expect_errno(device.p2p_raw(&mut raw), Errno::TOOBIG)
            },
        ),
        test(
            "the status page maps read-only, one page at offset 0: version 1, not revoked",
            |device| {
                let page = rustix::param::page_size();
                expect_eq(
                    "version",
                    PEERDIRECT_STATUS_VERSION,
                    device.map_status_raw(page, 0, false).map_err(|err| {
                        format!("expected the status page to map, got {err}")
                    })?,
                )?;
                let status = device
                    .status()
                    .ok_or("expected Device::status to be mapped, got None")?;
                expect_eq("revoked", false, status.revoked())
            },
        ),
        test(
            "a writable status page mapping fails with EPERM; two pages or offset 4096 with EINVAL",
            |device| {
                let page = rustix::param::page_size();
                expect_errno_of("writable", device.map_status_raw(page, 0, true), Errno::PERM)?;
                expect_errno_of(
                    "two pages",
                    device.map_status_raw(2 * page, 0, false),
                    Errno::INVAL,
                )?;
                expect_errno_of(
                    "offset 4096",
                    device.map_status_raw(page, 4096, false),
                    Errno::INVAL,
                )
            },
        ),
        test(
            "INFO with size 96 writes nothing past the struct (canary in bytes 96..104 survives)",
            |device| {
                const CANARY: [u8; 8] = [0xa5, 0x5a, 0xc3, 0x3c, 0xde, 0xad, 0xbe, 0xef];
                let mut raw = RawInfo::<8>::new();
                raw.tail = CANARY;
                info_ok(device, &mut raw)?;
                expect_eq("bytes 96..104", CANARY, raw.tail)
            },
        ),
        // Each copy of user memory failed in turn (fault injection, `usercopy`).
        test(
            "INFO with each of its 3 copies of user memory failed in turn (fault injection): EFAULT each time; with none failed it answers",
            |_| usercopy::info(),
        ),
        test(
            "ALLOC with each of its 3 copies of user memory failed in turn: EFAULT each time and no allocation left, the answer's too (undone); with none failed it allocates",
            |_| usercopy::alloc(),
        ),
        test(
            "FREE with each of its 3 copies of user memory failed in turn: EFAULT each time and the allocation kept; with none failed it frees",
            |_| usercopy::free(),
        ),
        test(
            "EXPORT with each of its 3 copies of user memory failed in turn: EFAULT each time and no fd installed; with none failed it exports",
            |_| usercopy::export(),
        ),
    ]
}

/// Sends `raw` and returns what the kernel wrote back, expecting success.
fn info_ok<const TAIL: usize>(
    device: &Device,
    raw: &mut RawInfo<TAIL>,
) -> Result<peerdirect_info, String> {
    let size = raw.info.size;
    device
        .info_raw(raw)
        .map_err(|err| format!("expected INFO with size {size} to succeed, got {err}"))?;
    Ok(raw.info)
}

/// The PCI address INFO reported.
fn pci_address(info: &peerdirect_info) -> PciAddress {
    PciAddress {
        domain: info.pci_domain,
        bus: info.pci_bus,
        slot: info.pci_slot,
        func: info.pci_func,
    }
}

/// Every field but `size`, which the kernel may or may not rewrite.
fn fields(info: &peerdirect_info) -> String {
    format!("{:?}", peerdirect_info { size: 0, ..*info })
}

fn main() -> ExitCode {
    crash::report_fatal_signals();
    let args = Args::parse();
    if let Some(thread) = args.crash_in {
        crash::fault_in(&thread);
    }
    // Before any thread exists: soft-RoCE needs a smaller ofi_rxm universe than libfabric's.
    peerdirect::registrar::libfabric::default_universe_size();
    if args.lifecycle {
        return run_lifecycle();
    }
    if args.alloc_export {
        return alloc_export::run();
    }
    if args.ibimport {
        return ibimport::run_tests();
    }
    if args.ibverbs {
        return ibverbs::run(if args.rxe_dmabuf {
            ibverbs::Provider::Patched
        } else {
            ibverbs::Provider::Debian
        });
    }
    if let Some(way) = args.ibverbs_revoke {
        return ibverbs_revoke::run(way, args.rounds);
    }
    if args.idle {
        let mut tap = Tap::plan(1);
        tap.report(
            "the device is idle: nothing allocated or exported, all HBM free, and the dma-buf core lists no peerdirect buffer",
            &race::expect_idle(),
        );
        return tap.finish();
    }
    if args.fabric_close {
        return fabric_close::run();
    }
    if args.fabric_revoke {
        return fabric_revoke::run(args.companion);
    }
    if let Some([node, peer_ip]) = args.fabric_peer.as_deref() {
        return fabric_peer::run(node, peer_ip);
    }
    if let Some(provider) = &args.fabric {
        return fabric::run(provider, args.companion, args.direct);
    }
    if args.bench_exporters {
        return bench_exporters::run();
    }
    if let Some(cycles) = args.profile_exporters {
        return bench_exporters::profile(cycles);
    }
    if args.bench_cpu_copy {
        return bench_copy::run();
    }
    if args.bench_hits {
        return bench_hits::run(args.foreign);
    }
    if let Some(topology) = args.peermem {
        return peermem::run(topology);
    }
    if let Some(go) = &args.revoke_touch {
        return revoke::touch_child(go);
    }
    if args.cpu_mapping {
        return cpu_mapping::run();
    }
    if args.pinned_removal {
        return pinned::run();
    }
    if args.release_revoke {
        return release_revoke::run();
    }
    if let Some(seed) = args.fuzz {
        return fuzz::run(seed, args.seconds, args.fuzz_removal);
    }
    if !args.race.is_empty() {
        return race::run(&args.race, args.seconds);
    }
    if let Some(removal) = args.revoke {
        return revoke::run(removal);
    }
    if let (true, Some(topology)) = (args.importer, args.topology) {
        return importer::run(topology);
    }
    let tests = tests(&args);
    let path = peerdirect::device_path(INDEX);
    let mut tap = Tap::plan(1 + tests.len());

    let device = Device::open(&path);
    tap.report(
        &format!("{} opens", path.display()),
        &device.as_ref().map(drop).map_err(|err| err.to_string()),
    );
    for test in &tests {
        let outcome = match &device {
            Ok(device) => (test.run)(device),
            Err(_) => Err(format!("not run: {} did not open", path.display())),
        };
        tap.report(&test.description, &outcome);
    }
    tap.finish()
}

fn run_lifecycle() -> ExitCode {
    let steps = lifecycle::steps();
    let mut tap = Tap::plan(1 + steps.len());
    let start = lifecycle::start();
    support::run_sequence(
        lifecycle::START,
        start,
        &steps,
        |_| {},
        &mut |description, outcome| tap.report(description, outcome),
    );
    tap.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expect_hbm_bytes_is_optional() {
        let args = Args::try_parse_from(["peerdirect-guest-tests"]).unwrap();
        assert_eq!(args.expect_hbm_bytes, None);
        let args =
            Args::try_parse_from(["peerdirect-guest-tests", "--expect-hbm-bytes", "1048576"])
                .unwrap();
        assert_eq!(args.expect_hbm_bytes, Some(1 << 20));
        assert!(
            Args::try_parse_from(["peerdirect-guest-tests", "--expect-hbm-bytes", "1M"]).is_err()
        );
    }

    #[test]
    fn lifecycle_is_a_mode_of_its_own() {
        let args = Args::try_parse_from(["peerdirect-guest-tests"]).unwrap();
        assert!(!args.lifecycle);
        let args = Args::try_parse_from(["peerdirect-guest-tests", "--lifecycle"]).unwrap();
        assert!(args.lifecycle);
        assert!(Args::try_parse_from([
            "peerdirect-guest-tests",
            "--lifecycle",
            "--expect-hbm-bytes",
            "1048576"
        ])
        .is_err());
    }

    /// A regular file answers every ioctl with ENOTTY: each test that expects anything else
    /// must report a failure, which shows the tests can fail.
    #[test]
    fn tests_fail_on_a_file_that_is_not_a_peerdirect_device() {
        let path =
            std::env::temp_dir().join(format!("peerdirect-guest-tests-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();

        let tests = tests(&Args::parse_from([
            "peerdirect-guest-tests",
            "--expect-hbm-bytes",
            "1073741824",
        ]));
        assert_eq!(tests.len(), 25);
        for test in &tests {
            let outcome = (test.run)(&device);
            if test.description.starts_with("unknown command") {
                assert_eq!(outcome, Ok(()), "{}", test.description);
            } else {
                let diagnostic = outcome.expect_err(&test.description);
                assert!(diagnostic.contains("expected"), "{diagnostic}");
            }
        }
        let size0 = tests
            .iter()
            .find(|test| test.description.contains("size 0 "))
            .unwrap();
        let size0 = (size0.run)(&device).unwrap_err();
        assert!(size0.starts_with("expected EINVAL, got ENOTTY"), "{size0}");
    }
}

//! `--ibimport`: peerdirect's dma-bufs imported by ib_core's own functions, through the test
//! module `peerdirect_ibimport.ko` (tests/kmod): `ib_umem_dmabuf_get_pinned_with_dma_device`
//! (EFA's pinned path, with rxe's ib_device and the NIC's PCI device doing the DMA),
//! `ib_umem_dmabuf_get_pinned_revocable_and_lock` (irdma) and `ib_umem_dmabuf_get` (mlx5,
//! dynamic), each followed by `ib_umem_find_best_pgsz` with an EFA-like page-size bitmap and a
//! walk of the DMA blocks. Last, a revocable, a pinned and a dynamic import held while the HBM
//! device is unbound from peerdirect.
//!
//! Needs the switch topology, `--hbm 8G` and `--rxe` (`tests/system/ibimport.sh`).

use std::fs;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use peerdirect::{Device, DeviceInfo, DmaBuf, ExportFlags};

use crate::removal::{expect_going, expect_waiting, expect_waits_log, waits_reports, Unbinding};
use crate::support::{expect_eq, find_nic, run_command as run, size_name, Outcome, Tap};
use crate::testmod::{stats, TestModule};
use crate::{INDEX, SYSFS_DRIVER};

const MODULE_PATH: &str = "/lib/peerdirect/tests/peerdirect_ibimport.ko";
const RUN_FILE: &str = "/sys/kernel/debug/peerdirect_ibimport/run";
const RXE: &str = "rxe0";
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The module's page-size bitmap: 4 KiB .. 2 GiB, as EFA's.
const PGSZ_BITMAP: u64 = 0xffff_f000;

/// `ib_umem_find_best_pgsz` for one DMA-contiguous range at `dma` of `len` bytes, registered
/// at `iova` (an independent implementation of the kernel's rule).
pub(crate) fn best_pgsz(dma: u64, len: u64, iova: u64, bitmap: u64) -> u64 {
    let last = iova + len - 1;
    let x = iova ^ last;
    let bits = if x == 0 { 1 } else { 64 - x.leading_zeros() };
    let mut mask = if bits < 64 {
        bitmap & (u64::MAX << bits)
    } else {
        0
    };
    mask |= dma ^ iova;
    let mut allowed = bitmap;
    if mask != 0 {
        let tz = mask.trailing_zeros();
        allowed &= if tz >= 63 {
            u64::MAX
        } else {
            (1u64 << (tz + 1)) - 1
        };
    }
    if allowed == 0 {
        0
    } else {
        1u64 << (63 - allowed.leading_zeros())
    }
}

/// `ib_umem_num_dma_blocks`.
pub(crate) fn num_blocks(iova: u64, len: u64, pgsz: u64) -> u64 {
    ((iova + len).next_multiple_of(pgsz) - iova / pgsz * pgsz) / pgsz
}

/// Loads ib_core and the module unless they are loaded already, and opens its command file.
pub(crate) fn load_module() -> Result<TestModule, String> {
    if !Path::new("/sys/module/ib_core").exists() {
        run("modprobe", &["ib_core"])?;
    }
    TestModule::load("peerdirect_ibimport", MODULE_PATH, RUN_FILE)
}

/// How an import is made; `Pinned` with rxe's ib_device, the others with the test-owned one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pinned,
    Revocable,
    Dynamic,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Pinned, Mode::Revocable, Mode::Dynamic];
    fn name(self) -> &'static str {
        match self {
            Self::Pinned => "pinned",
            Self::Revocable => "revocable",
            Self::Dynamic => "dynamic",
        }
    }
    fn ibdev_kind(self) -> &'static str {
        match self {
            Self::Pinned => "rxe",
            _ => "own",
        }
    }
}

/// One exported allocation: `len` bytes aligned to `align`, placed (with a filler) at an
/// offset that is a multiple of `align` but not of `2 * align` when `odd` is set.
struct Layout {
    len: u64,
    align: u64,
    odd: bool,
    /// The smallest page size the import must reach.
    min_pgsz: u64,
}

const LAYOUTS: [Layout; 5] = [
    Layout {
        len: 64 * MIB,
        align: 2 * MIB,
        odd: true,
        min_pgsz: 2 * MIB,
    },
    Layout {
        len: 64 * MIB,
        align: 64 * MIB,
        odd: false,
        min_pgsz: 64 * MIB,
    },
    Layout {
        len: GIB,
        align: GIB,
        odd: false,
        min_pgsz: GIB,
    },
    Layout {
        len: 3 * GIB,
        align: GIB,
        odd: false,
        min_pgsz: GIB,
    },
    Layout {
        len: 5 * GIB,
        align: GIB,
        odd: false,
        min_pgsz: GIB,
    },
];

impl Layout {
    fn describe(&self) -> String {
        format!(
            "{} export at a {}{}-aligned offset",
            size_name(self.len),
            if self.odd { "only " } else { "" },
            size_name(self.align)
        )
    }
}

struct Ctx {
    module: TestModule,
    device: Device,
    info: DeviceInfo,
    nic: String,
    /// The unbind, while it waits for the pinned import.
    unbinding: Option<Unbinding>,
}

/// Allocates and exports per `layout`; returns the dma-buf and its BAR offset.
fn export(device: &Device, layout: &Layout) -> Result<(DmaBuf, u64), String> {
    let filler = if layout.odd {
        Some(
            device
                .alloc(layout.align, Some(layout.align))
                .map_err(|e| format!("filler alloc: {e}"))?,
        )
    } else {
        None
    };
    let allocation = device
        .alloc(layout.len, Some(layout.align))
        .map_err(|e| format!("alloc of {}: {e}", size_name(layout.len)))?;
    let offset = allocation.hbm_offset();
    if !offset.is_multiple_of(layout.align)
        || (layout.odd && offset.is_multiple_of(2 * layout.align))
    {
        return Err(format!(
            "precondition: allocation at {offset:#x} is not {}",
            layout.describe()
        ));
    }
    let dmabuf = allocation
        .export(0, layout.len, ExportFlags::CLOEXEC | ExportFlags::RDWR)
        .map_err(|e| format!("export: {e}"))?;
    drop(filler);
    // The dma-buf keeps the allocation; the handle is freed when `allocation` drops.
    drop(allocation);
    Ok((dmabuf, offset))
}

fn import(ctx: &mut Ctx, layout: &Layout, mode: Mode) -> Outcome {
    let (dmabuf, offset) = export(&ctx.device, layout)?;
    let line = format!(
        "run fd={} nic={} mode={}",
        dmabuf.as_fd().as_raw_fd(),
        ctx.nic,
        mode.name()
    );
    let r = ctx.module.command(&line)?;
    r.expect(&[("get", 0)])?;
    expect_eq("ibdev_kind", mode.ibdev_kind(), r.get("ibdev_kind")?)?;
    let dma = ctx.info.hbm_bus_addr + offset;
    expect_eq(
        "dma_start (hbm_bus_addr + offset)",
        dma,
        r.uint("dma_start")?,
    )?;
    let pgsz = r.uint("pgsz")?;
    let want_pgsz = best_pgsz(dma, layout.len, 0, PGSZ_BITMAP);
    expect_eq("pgsz", want_pgsz, pgsz)?;
    if pgsz < layout.min_pgsz {
        return Err(format!("pgsz {pgsz:#x} < {:#x}", layout.min_pgsz));
    }
    let blocks = num_blocks(0, layout.len, pgsz);
    expect_eq("blocks", blocks, r.uint("blocks")?)?;
    expect_eq("num_dma_blocks", blocks, r.uint("num_dma_blocks")?)?;
    let first = dma / pgsz * pgsz;
    expect_eq("block_first", first, r.uint("block_first")?)?;
    expect_eq(
        "block_last",
        first + (blocks - 1) * pgsz,
        r.uint("block_last")?,
    )?;
    r.expect(&[("blocks_contiguous", 1), ("peer2peer", 1)])?;
    println!(
        "# ibimport: {} mode={} ibdev={} pgsz={} blocks={} block_first={:#x} block_last={:#x} umem_nents={} revocable={}",
        layout.describe(),
        mode.name(),
        r.get("ibdev")?,
        size_name(pgsz),
        blocks,
        first,
        r.uint("block_last")?,
        r.get("umem_nents")?,
        r.get("revocable")?
    );
    Ok(())
}

struct Held {
    revocable: u32,
    pinned: u32,
    dynamic: u32,
    pinned_dma: u64,
}

fn hold(ctx: &mut Ctx) -> Result<Held, String> {
    let mut ids = Vec::new();
    let mut pinned_dma = 0;
    for mode in Mode::ALL {
        let (dmabuf, _) = export(&ctx.device, &LAYOUTS[1])?;
        let r = ctx.module.command(&format!(
            "run fd={} nic={} mode={} hold=1",
            dmabuf.as_fd().as_raw_fd(),
            ctx.nic,
            mode.name()
        ))?;
        r.expect(&[("get", 0)])?;
        if mode == Mode::Pinned {
            pinned_dma = r.uint("dma_start")?;
        }
        ids.push(u32::try_from(r.uint("id")?).map_err(|e| e.to_string())?);
    }
    Ok(Held {
        pinned: ids[0],
        revocable: ids[1],
        dynamic: ids[2],
        pinned_dma,
    })
}

type Step = (
    String,
    Box<dyn FnOnce(&mut Option<Ctx>, &mut Option<Held>) -> Outcome>,
);

fn with_ctx(
    description: impl Into<String>,
    f: impl FnOnce(&mut Ctx, &mut Option<Held>) -> Outcome + 'static,
) -> Step {
    (
        description.into(),
        Box::new(move |ctx, held| match ctx {
            Some(ctx) => f(ctx, held),
            None => Err("not run: setup failed".into()),
        }),
    )
}

fn steps() -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    steps.push(with_ctx(
        format!(
            "ib_client sees {RXE}, whose dma_device is NULL (so only _with_dma_device can use it)"
        ),
        |ctx, _| {
            let r = ctx.module.command("info")?;
            expect_eq("rxe", RXE, r.get("rxe")?)?;
            expect_eq("rxe_dma_device", "null", r.get("rxe_dma_device")?)
        },
    ));
    steps.push(with_ctx(
        "ibdev=rxe with a variant that attaches ibdev->dma_device is refused by the module, not attempted",
        |ctx, _| {
            let (dmabuf, _) = export(&ctx.device, &LAYOUTS[1])?;
            let line = format!("run fd={} nic={} mode=revocable ibdev=rxe", dmabuf.as_fd().as_raw_fd(), ctx.nic);
            match ctx.module.command(&line) {
                Err(e) if e.contains("no dma_device") => Ok(()),
                other => Err(format!("expected a refusal naming dma_device, got {other:?}")),
            }
        },
    ));
    for layout in &LAYOUTS {
        for mode in Mode::ALL {
            steps.push(with_ctx(
                format!(
                    "{}: {} import ({}), page size = ib_umem_find_best_pgsz (>= {}), blocks and DMA addresses = HBM bus address + offset",
                    layout.describe(),
                    mode.name(),
                    match mode {
                        Mode::Pinned => "ib_umem_dmabuf_get_pinned_with_dma_device, rxe ib_device, NIC dma device",
                        Mode::Revocable => "ib_umem_dmabuf_get_pinned_revocable_and_lock, test-owned ib_device",
                        Mode::Dynamic => "ib_umem_dmabuf_get + map_pages, test-owned ib_device",
                    },
                    size_name(layout.min_pgsz)
                ),
                move |ctx, _| import(ctx, layout, mode),
            ));
        }
    }
    steps.push(with_ctx(
        "a pinned (rxe), a revocable and a dynamic import of 64 MiB exports are held",
        |ctx, held| {
            *held = Some(hold(ctx)?);
            let s = stats()?;
            expect_eq("mappings_pinned", 1, s.int("mappings_pinned")?)?;
            expect_eq("mappings_revocable", 2, s.int("mappings_revocable")?)
        },
    ));
    steps.push(with_ctx(
        format!("unbinding the HBM device ({SYSFS_DRIVER}/unbind, in a thread) starts its removal: the device file polls POLLPRI | POLLHUP, and the kernel reports that removal waits for the pinned import"),
        |ctx, _| {
            let seen = waits_reports()?;
            ctx.unbinding = Some(Unbinding::start(&ctx.info.pci_address.to_string()));
            expect_going(&ctx.device, Duration::from_secs(5))?;
            expect_waiting(seen, Duration::from_secs(5))
        },
    ));
    steps.push(with_ctx(
        "revocable import: the revoke callback ran once, before ib_core unmapped (still mapped when called); now revoked, unmapped, unpinned",
        |ctx, held| {
            let id = held.as_ref().ok_or("no held imports")?.revocable;
            let r = ctx.module.command(&format!("status id={id}"))?;
            r.expect(&[("revoke_calls", 1), ("revoke_saw_mapped", 1), ("revoked", 1), ("mapped", 0), ("pinned", 0)])
        },
    ));
    steps.push(with_ctx(
        "dynamic import: move-notify ran once and dropped the mapping",
        |ctx, held| {
            let id = held.as_ref().ok_or("no held imports")?.dynamic;
            let r = ctx.module.command(&format!("status id={id}"))?;
            r.expect(&[("invalidations", 1), ("mapped", 0), ("revoked", 0)])
        },
    ));
    steps.push(with_ctx(
        "non-revocable pinned import (EFA's path): keeps its mapping at the same DMA address, the unbind waits for it, and the kernel log names the NIC as the importer it waits for",
        |ctx, held| {
            let held = held.as_ref().ok_or("no held imports")?;
            let r = ctx.module.command(&format!("status id={}", held.pinned))?;
            r.expect(&[("mapped", 1), ("pinned", 1), ("revoked", 0), ("revoke_calls", 0)])?;
            expect_eq("dma_start", held.pinned_dma, r.uint("dma_start")?)?;
            ctx.unbinding.as_ref().ok_or("no unbind is running")?.expect_pending()?;
            expect_waits_log(&[format!("mapped by {}", ctx.nic)])
        },
    ));
    steps.push(with_ctx(
        "releasing every import (released=3) lets the unbind return within 5 s; rebound, stats show mappings_pinned 0",
        |ctx, _| {
            let r = ctx.module.command("release all")?;
            expect_eq("released", 3, r.int("released")?)?;
            let unbinding = ctx.unbinding.take().ok_or("no unbind is running")?;
            let took = unbinding.finish(Duration::from_secs(5))?;
            println!("# the unbind returned after {} ms", took.as_millis());
            let bdf = ctx.info.pci_address.to_string();
            fs::write(format!("{SYSFS_DRIVER}/bind"), &bdf).map_err(|e| format!("bind {bdf}: {e}"))?;
            let s = stats()?;
            expect_eq("mappings_pinned after rebind", 0, s.int("mappings_pinned")?)
        },
    ));
    steps.push((
        "rmmod peerdirect_ibimport succeeds".into(),
        Box::new(|ctx, _| {
            drop(ctx.take());
            run("rmmod", &["peerdirect_ibimport"])
        }),
    ));
    steps
}

pub(crate) fn run_tests() -> ExitCode {
    let steps = steps();
    let mut tap = Tap::plan(1 + steps.len());
    let setup = (|| {
        let module = load_module()?;
        let nic = find_nic()?;
        let device = Device::open_index(INDEX).map_err(|e| e.to_string())?;
        let info = device.info().map_err(|e| e.to_string())?;
        Ok::<_, String>(Ctx {
            module,
            device,
            info,
            nic,
            unbinding: None,
        })
    })();
    tap.report(
        "ib_core and peerdirect_ibimport.ko load; /dev/peerdirect0 and the NIC are found",
        &setup.as_ref().map(drop).map_err(Clone::clone),
    );
    let mut ctx = setup.ok();
    let mut held = None;
    for (description, step) in steps {
        let outcome = step(&mut ctx, &mut held);
        tap.report(&description, &outcome);
    }
    tap.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testmod::Report;

    fn report(text: &str) -> Report {
        Report::parse("peerdirect_ibimport", text, '=')
    }

    const BUS: u64 = 0xf8_0000_0000; // an 8 GiB BAR, naturally aligned

    #[test]
    fn page_size_follows_dma_alignment_and_length() {
        assert_eq!(best_pgsz(BUS + 2 * MIB, 64 * MIB, 0, PGSZ_BITMAP), 2 * MIB);
        assert_eq!(
            best_pgsz(BUS + 64 * MIB, 64 * MIB, 0, PGSZ_BITMAP),
            64 * MIB
        );
        assert_eq!(best_pgsz(BUS + GIB, GIB, 0, PGSZ_BITMAP), GIB);
        assert_eq!(best_pgsz(BUS, 3 * GIB, 0, PGSZ_BITMAP), 2 * GIB);
        assert_eq!(best_pgsz(BUS + GIB, 3 * GIB, 0, PGSZ_BITMAP), GIB);
        assert_eq!(best_pgsz(BUS, 5 * GIB, 0, PGSZ_BITMAP), 2 * GIB);
        assert_eq!(best_pgsz(BUS + 4096, 8192, 0, PGSZ_BITMAP), 4096);
        assert_eq!(best_pgsz(BUS + 2048, 8192, 0, PGSZ_BITMAP), 0);
    }

    #[test]
    fn block_counts() {
        assert_eq!(num_blocks(0, 64 * MIB, 2 * MIB), 32);
        assert_eq!(num_blocks(0, 5 * GIB, 2 * GIB), 3);
        assert_eq!(num_blocks(0, 3 * GIB, GIB), 3);
    }

    #[test]
    fn reports_parse_and_mismatches_fail() {
        let r = report("get=0\npgsz=2097152\nblock_first=0x10\n");
        assert_eq!(r.uint("block_first").unwrap(), 16);
        assert!(r.expect(&[("get", 0)]).is_ok());
        assert!(r.expect(&[("get", -95)]).is_err());
        assert!(r.get("blocks").is_err());
    }
}

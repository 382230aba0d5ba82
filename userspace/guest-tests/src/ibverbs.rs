//! `--ibverbs`: the crate's ibverbs registrar (`IbverbsRegistrar` through `RegCache`) on rxe0.
//! What must happen depends on the rxe provider the suite booted, which it names:
//! - Debian's (`qemu/run --rxe`), which has no `reg_dmabuf_mr`: the registration is refused
//!   with `DmaBufUnsupported`, `EOPNOTSUPP`, naming the device, provider and alternatives;
//! - the patched one over the test kernel's patched rxe (`qemu/run --rxe-dmabuf`, flag
//!   `--rxe-dmabuf`): it registers (direct, the dma_buf path), a second request inside it is a
//!   cache hit, and the kernel's side is witnessed independently in peerdirect's debugfs
//!   (`exports`): the NIC under rxe0 is attached to the export, pinned, while the registration
//!   lives, and no importer is left once it is deregistered.

use std::fs;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use peerdirect::cache::{Access, ByteRange, CacheLimits, ExportId, RegCache};
use peerdirect::registrar::ibverbs::{IbverbsError, IbverbsRegistrar};
use peerdirect::{Allocation, Device, DmaBuf, Errno, ExportFlags, RegPath};

use crate::support::{expect_eq, wait_for, Outcome, Tap, SYSFS_PCI_DEVICES};
use crate::INDEX;

pub(crate) const RXE: &str = "rxe0";
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const EXPORT_LEN: u64 = 4 * MIB;
/// The first request: 2 MiB at 1 MiB into the export; the second: 64 KiB inside it.
pub(crate) const FIRST: (u64, u64) = (MIB, 2 * MIB);
const SECOND: (u64, u64) = (MIB + MIB / 2, 64 << 10);

/// The rxe provider of the boot, as the suite booted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    /// Debian's (`qemu/run --rxe`): no `reg_dmabuf_mr`.
    Debian,
    /// rdma-core's rxe provider with `qemu/rdma-core`'s patch, on the test kernel's patched
    /// rxe (`qemu/run --rxe-dmabuf`).
    Patched,
}

/// An allocation of `EXPORT_LEN` bytes of `device`, and a dma-buf of all of it (RDWR).
pub(crate) fn alloc_export(device: &Device) -> Result<(Allocation<'_>, DmaBuf), String> {
    let allocation = device
        .alloc(EXPORT_LEN, None)
        .map_err(|e| format!("alloc: {e}"))?;
    let dmabuf = allocation
        .export(0, EXPORT_LEN, ExportFlags::CLOEXEC | ExportFlags::RDWR)
        .map_err(|e| format!("export: {e}"))?;
    Ok((allocation, dmabuf))
}

/// One exported allocation of `EXPORT_LEN` bytes: the dma-buf and where it is in the BAR.
fn export(device: &Device) -> Result<(DmaBuf, u64), String> {
    let (allocation, dmabuf) = alloc_export(device)?;
    // The dma-buf keeps the memory; the handle is freed when `allocation` drops.
    Ok((dmabuf, allocation.hbm_offset()))
}

pub(crate) fn registrar() -> Result<Arc<IbverbsRegistrar>, String> {
    let registrar = IbverbsRegistrar::open(RXE).map_err(|e| e.to_string())?;
    expect_eq("provider", "rxe", registrar.provider())?;
    Ok(Arc::new(registrar))
}

pub(crate) fn range((offset, length): (u64, u64)) -> Result<ByteRange, String> {
    ByteRange::new(offset, length).map_err(|e| e.to_string())
}

/// Debian's provider: the registration is refused, and says why and what to use instead.
pub(crate) fn refused(device: &Device) -> Outcome {
    let (dmabuf, _) = export(device)?;
    let registrar = registrar()?;
    let cache = RegCache::new(CacheLimits::default());
    let export = ExportId::of_dma_buf(INDEX, &dmabuf).map_err(|e| e.to_string())?;
    let err = match cache.get(&registrar, &dmabuf, export, range(FIRST)?, Access::all()) {
        Ok(_) => return Err("ibv_reg_dmabuf_mr on rxe0 succeeded; expected EOPNOTSUPP".into()),
        Err(err) => err,
    };
    println!("# ibverbs: {err}");
    expect_eq("errno", Some(Errno::OPNOTSUPP), err.errno())?;
    if !matches!(err, IbverbsError::DmaBufUnsupported { .. }) {
        return Err(format!("expected DmaBufUnsupported, got {err:?}"));
    }
    let text = err.to_string();
    for part in [
        "ibv_reg_dmabuf_mr on rxe0",
        "provider rxe",
        "EOPNOTSUPP",
        "EFA, mlx5, irdma",
        "host-bounce",
    ] {
        if !text.contains(part) {
            return Err(format!("{part:?} missing from: {text}"));
        }
    }
    Ok(())
}

pub(crate) const REFUSED: &str = "ibv_reg_dmabuf_mr on rxe0 with Debian's rxe provider, through the crate (IbverbsRegistrar via RegCache), fails with EOPNOTSUPP, naming device, provider and alternatives";

/// The PCI device under rxe0: the PCI device that rxe0's netdev (sysfs `parent`) sits on
/// (its `device` is the virtio device, a child of the PCI function).
pub(crate) fn nic_under_rxe() -> Result<String, String> {
    let parent = format!("/sys/class/infiniband/{RXE}/parent");
    let netdev = fs::read_to_string(&parent).map_err(|e| format!("{parent}: {e}"))?;
    let link = format!("/sys/class/net/{}/device", netdev.trim());
    let device = fs::canonicalize(&link).map_err(|e| format!("{link}: {e}"))?;
    device
        .ancestors()
        .filter_map(Path::file_name)
        .map(|name| name.to_string_lossy().into_owned())
        .find(|name| Path::new(SYSFS_PCI_DEVICES).join(name).exists())
        .ok_or_else(|| format!("{link} -> {}: on no PCI device", device.display()))
}

/// The importer lines debugfs lists under the export at `bar_offset` (`None`: no such export).
fn importers(bar_offset: u64) -> Result<Option<Vec<String>>, String> {
    let path = format!("/sys/kernel/debug/peerdirect/peerdirect{INDEX}/exports");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let export = format!("offset={bar_offset:#x} length={EXPORT_LEN:#x}");
    let mut lines = text.lines().skip_while(|l| !l.ends_with(&export));
    if lines.next().is_none() {
        return Ok(None);
    }
    Ok(Some(
        lines
            .take_while(|l| l.starts_with("  "))
            .map(|l| l.trim().to_owned())
            .collect(),
    ))
}

/// Whether `line` says `nic` holds a pinned, mapped attachment, as the patched rxe's import
/// (irdma's: pinned and revocable) makes it.
fn pinned_by(line: &str, nic: &str) -> bool {
    let fields: Vec<&str> = line.split_whitespace().collect();
    matches!(
        fields.as_slice(),
        [importer, "revocable", "pinned=1", entries]
            if importer.strip_prefix("importer=") == Some(nic)
                && entries
                    .strip_prefix("mapped_entries=")
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|n| n > 0)
    )
}

/// The patched provider's checks, in order; their descriptions are [`REGISTERS`]'s.
fn registers(device: &Device) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(REGISTERS.len());
    let result = (|| {
        let nic = nic_under_rxe()?;
        let (dmabuf, bar_offset) = export(device)?;
        let registrar = registrar()?;
        let cache = RegCache::new(CacheLimits::default());
        let export = ExportId::of_dma_buf(INDEX, &dmabuf).map_err(|e| e.to_string())?;
        let before = importers(bar_offset)?;
        if before.as_ref().is_none_or(|lines| !lines.is_empty()) {
            return Err(format!(
                "before registering, debugfs lists the export at {bar_offset:#x} with importers {before:?}; expected it with none"
            ));
        }

        let first = cache
            .get(&registrar, &dmabuf, export, range(FIRST)?, Access::all())
            .map_err(|e| format!("RegCache::get: {e}"))?;
        let mr = first.mr();
        println!(
            "# ibverbs: registered {} at {:#x} of the export: lkey {:#x}, rkey {:#x}, iova {:#x}, path {:?}",
            mr.length,
            FIRST.0,
            mr.lkey,
            mr.rkey,
            mr.iova,
            mr.path()
        );
        let stats = cache.stats();
        outcomes.push((|| {
            expect_eq("path", &RegPath::DmaBuf, mr.path())?;
            expect_eq(
                "(misses, registrations)",
                (1, 1),
                (stats.misses, stats.registrations),
            )?;
            expect_eq("iova (the offset: a dma-buf alone)", FIRST.0, mr.iova)?;
            expect_eq("length", FIRST.1, mr.length)?;
            if mr.rkey == 0 || mr.lkey == 0 {
                return Err(format!("keys lkey {:#x}, rkey {:#x}", mr.lkey, mr.rkey));
            }
            Ok(())
        })());

        let second = cache
            .get(&registrar, &dmabuf, export, range(SECOND)?, Access::all())
            .map_err(|e| format!("RegCache::get of the sub-range: {e}"))?;
        let stats = cache.stats();
        outcomes.push((|| {
            expect_eq(
                "(hits, registrations)",
                (1, 1),
                (stats.hits, stats.registrations),
            )?;
            expect_eq("rkey", mr.rkey, second.mr().rkey)?;
            expect_eq(
                "offset in the registration",
                SECOND.0 - FIRST.0,
                second.offset_in_mr(),
            )
        })());

        let held = importers(bar_offset)?.unwrap_or_default();
        println!("# debugfs while registered: {held:?}");
        outcomes.push(match held.as_slice() {
            [line] if pinned_by(line, &nic) => Ok(()),
            _ => Err(format!(
                "debugfs lists {held:?} under the export at {bar_offset:#x}; expected one line: importer={nic} revocable pinned=1 mapped_entries=N (N > 0)"
            )),
        });

        drop((first, second));
        let dropped = cache.invalidate_export(export);
        let mut left = None;
        let gone = wait_for(Duration::from_secs(5), || {
            left = importers(bar_offset).ok().flatten();
            left.as_ref().is_some_and(Vec::is_empty)
        });
        let stats = cache.stats();
        outcomes.push((|| {
            expect_eq("entries dropped", 1, dropped)?;
            expect_eq("deregistrations", 1, stats.deregistrations)?;
            gone.map_err(|ms| {
                format!("after {ms} ms debugfs still lists {left:?} under the export at {bar_offset:#x}")
            })
        })());
        Ok(())
    })();
    if let Err(err) = result {
        outcomes.push(Err(err));
    }
    while outcomes.len() < REGISTERS.len() {
        outcomes.push(Err("not run: an earlier step failed".into()));
    }
    outcomes
}

const REGISTERS: [&str; 4] = [
    "ibv_reg_dmabuf_mr on rxe0 with the patched rxe and provider, through the crate (IbverbsRegistrar via RegCache): 2 MiB at 1 MiB of a 4 MiB export registers, direct (path dma_buf), a miss and one registration, at IOVA = its offset, with keys",
    "a second request, 64 KiB inside it, is a cache hit on the same registration (same rkey, its offset in the registration)",
    "peerdirect's debugfs lists the NIC under rxe0 (rxe0's netdev's PCI device) as the export's one importer, revocable, pinned, with mapped entries, while the registration lives (none before)",
    "handles dropped and the export invalidated in the cache (one entry, deregistered): debugfs lists no importer of the export",
];

/// Prints TAP for `--ibverbs`; success iff every test passed.
pub(crate) fn run(provider: Provider) -> ExitCode {
    let checks = match provider {
        Provider::Debian => 1,
        Provider::Patched => REGISTERS.len(),
    };
    let mut tap = Tap::plan(1 + checks);
    let device = Device::open_index(INDEX).map_err(|e| e.to_string());
    tap.report(
        &format!(
            "/dev/peerdirect{INDEX} opens ({RXE} with {})",
            match provider {
                Provider::Debian => "Debian's rxe provider",
                Provider::Patched => "the patched rxe and provider",
            }
        ),
        &device.as_ref().map(drop).map_err(Clone::clone),
    );
    match (provider, device) {
        (Provider::Debian, Ok(device)) => tap.report(REFUSED, &refused(&device)),
        (Provider::Debian, Err(_)) => tap.report(REFUSED, &Err("not run: no device".into())),
        (Provider::Patched, Ok(device)) => {
            for (description, outcome) in REGISTERS.iter().zip(registers(&device)) {
                tap.report(description, &outcome);
            }
        }
        (Provider::Patched, Err(_)) => {
            for description in REGISTERS {
                tap.report(description, &Err("not run: no device".into()));
            }
        }
    }
    tap.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_attachment_of_the_nic_with_entries() {
        let nic = "0000:00:03.0";
        assert!(pinned_by(
            "importer=0000:00:03.0 revocable pinned=1 mapped_entries=32",
            nic
        ));
        for other in [
            "importer=0000:00:03.0 revocable pinned=0 mapped_entries=32",
            "importer=0000:00:03.0 revocable pinned=1 mapped_entries=0",
            "importer=0000:00:03.0 not-revocable pinned=1 mapped_entries=32",
            "importer=0000:00:04.0 revocable pinned=1 mapped_entries=32",
            "importer=0000:00:03.0 revocable pinned=1",
        ] {
            assert!(!pinned_by(other, nic), "{other}");
        }
    }
}

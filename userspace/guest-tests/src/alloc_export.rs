//! `--alloc-export`: PEERDIRECT_IOC_ALLOC, FREE and EXPORT on /dev/peerdirect0. First one test
//! per malformed request, each expecting its exact errno; then what allocations and their
//! dma-bufs do (placement, fdinfo, mmap, lifetime); last, that the module holds nothing once
//! every file is closed (debugfs stats).
//!
//! Every test opens the files it needs and closes them before it returns, so each starts from
//! a device with nothing allocated.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use peerdirect::uapi::{
    PEERDIRECT_ALLOC_ALIGN_DEFAULT, PEERDIRECT_ALLOC_SIZE_VER0, PEERDIRECT_EXPORT_CLOEXEC,
};
use peerdirect::{
    pattern, Allocation, Device, DmaBuf, Errno, Error, ExportFlags, RawAlloc, RawExport, RawFree,
    Stats, SyncFlags,
};

use crate::support::{
    expect_eq, expect_errno_of, expect_fdinfo, fdinfo, fdinfo_value, Outcome, Tap,
};
use crate::INDEX;

const PAGE: u64 = 4096;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// A flag bit no version of the ABI defines.
const UNKNOWN_FLAG: u32 = 1 << 31;
const RW: ExportFlags = ExportFlags::CLOEXEC.union(ExportFlags::RDWR);
const RO: ExportFlags = ExportFlags::CLOEXEC;
/// `O_CLOEXEC` and `O_ACCMODE` in the octal `flags:` of /proc/self/fdinfo.
const O_CLOEXEC: u64 = 0o2_000_000;
const O_ACCMODE: u64 = 0o3;
const O_RDWR: u64 = 0o2;

/// What every test knows: the device node and the size of its HBM.
pub(crate) struct Env {
    path: PathBuf,
    hbm_bytes: u64,
}

pub(crate) struct Case {
    description: String,
    run: Box<dyn Fn(&Env) -> Outcome>,
}

fn case(description: impl Into<String>, run: impl Fn(&Env) -> Outcome + 'static) -> Case {
    Case {
        description: description.into(),
        run: Box::new(run),
    }
}

const START: &str = "/dev/peerdirect0 opens and INFO reports its HBM size";

pub(crate) fn run() -> ExitCode {
    let cases = cases();
    let mut tap = Tap::plan(1 + cases.len());
    let env = start();
    tap.report(START, &env.as_ref().map(drop).map_err(Clone::clone));
    for case in &cases {
        let outcome = match &env {
            Ok(env) => (case.run)(env),
            Err(_) => Err(format!("not run: \"{START}\" failed")),
        };
        tap.report(&case.description, &outcome);
    }
    tap.finish()
}

fn start() -> Result<Env, String> {
    let path = peerdirect::device_path(INDEX);
    let device =
        Device::open(&path).map_err(|err| format!("expected open to succeed, got {err}"))?;
    let info = device
        .info()
        .map_err(|err| format!("expected INFO to succeed, got {err}"))?;
    Ok(Env {
        path,
        hbm_bytes: info.hbm_bytes,
    })
}

pub(crate) fn cases() -> Vec<Case> {
    vec![
        // The malformed requests, one each.
        case("ALLOC with length 0 fails with EINVAL", |env| {
            let device = open(env)?;
            expect_errno_of("ALLOC", alloc_raw(&device, 0, 0), Errno::INVAL)
        }),
        case("ALLOC with length hbm_bytes + 4096 fails with EINVAL", |env| {
            let device = open(env)?;
            expect_errno_of(
                "ALLOC",
                alloc_raw(&device, env.hbm_bytes + PAGE, 0),
                Errno::INVAL,
            )
        }),
        case("ALLOC with align 3 (not a power of two) fails with EINVAL", |env| {
            let device = open(env)?;
            expect_errno_of("ALLOC", alloc_raw(&device, PAGE, 3), Errno::INVAL)
        }),
        case("ALLOC with align 2048 (below the page size) fails with EINVAL", |env| {
            let device = open(env)?;
            expect_errno_of("ALLOC", alloc_raw(&device, PAGE, 2048), Errno::INVAL)
        }),
        case(
            "FREE whose answer cannot be written (its argument read-only) fails with EFAULT and frees nothing: a FREE from writable memory frees the handle after",
            |env| {
                let device = open(env)?;
                let mut raw = alloc_request(2 * MIB, 0);
                device
                    .alloc_raw(&mut raw)
                    .map_err(|err| format!("expected ALLOC to succeed, got {err}"))?;
                let handle = raw.alloc.handle;
                let read_only = free_from_read_only(&device, &free_request(handle))?;
                expect_eq("FREE from read-only memory", Err(Errno::FAULT), read_only)?;
                device.free_raw(&mut free_request(handle)).map_err(|err| {
                    format!("expected handle {handle} still allocated and its FREE to succeed, got {err}")
                })
            },
        ),
        case(
            "EXPORT with offset 0xfffffffffffff000 and length 4096 (offset + length overflows, the offset past the allocation) fails with EOVERFLOW",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 2 * MIB, None)?;
                expect_errno_of("EXPORT", allocation.export(!(PAGE - 1), PAGE, RW), Errno::OVERFLOW)
            },
        ),
        case(
            "EXPORT with offset 4096 and length 0xfffffffffffff000 (offset + length overflows) fails with EOVERFLOW",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 2 * MIB, None)?;
                expect_errno_of(
                    "EXPORT",
                    allocation.export(PAGE, !(PAGE - 1), RW),
                    Errno::OVERFLOW,
                )
            },
        ),
        case(
            "EXPORT of 128 KiB from a 64 KiB allocation (past its end) fails with EINVAL",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 64 * KIB, None)?;
                expect_errno_of("EXPORT", allocation.export(0, 128 * KIB, RW), Errno::INVAL)?;
                expect_errno_of(
                    "EXPORT at offset 32 KiB, length 64 KiB",
                    allocation.export(32 * KIB, 64 * KIB, RW),
                    Errno::INVAL,
                )
            },
        ),
        case("EXPORT with offset 100 (not page aligned) fails with EINVAL", |env| {
            let device = open(env)?;
            let allocation = alloc(&device, 64 * KIB, None)?;
            expect_errno_of("EXPORT", allocation.export(100, PAGE, RW), Errno::INVAL)
        }),
        case("EXPORT with length 6000 (not page aligned) fails with EINVAL", |env| {
            let device = open(env)?;
            let allocation = alloc(&device, 64 * KIB, None)?;
            expect_errno_of("EXPORT", allocation.export(0, 6000, RW), Errno::INVAL)
        }),
        case("ALLOC with __reserved0 != 0 fails with EINVAL", |env| {
            let device = open(env)?;
            let mut raw = alloc_request(PAGE, 0);
            raw.alloc.__reserved0 = 1;
            expect_errno_of("ALLOC", device.alloc_raw(&mut raw), Errno::INVAL)
        }),
        case(
            "FREE with __reserved0 != 0 fails with EINVAL and leaves the allocation",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, PAGE, None)?;
                let mut raw = free_request(allocation.handle());
                raw.free.__reserved0 = 1;
                expect_errno_of("FREE", device.free_raw(&mut raw), Errno::INVAL)?;
                free(allocation)
            },
        ),
        case("ALLOC with flags 0x80000000 fails with EOPNOTSUPP", |env| {
            let device = open(env)?;
            let mut raw = alloc_request(PAGE, 0);
            raw.alloc.flags = UNKNOWN_FLAG;
            expect_errno_of("ALLOC", device.alloc_raw(&mut raw), Errno::OPNOTSUPP)
        }),
        case(
            "FREE with flags 0x80000000 fails with EOPNOTSUPP and leaves the allocation",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, PAGE, None)?;
                let mut raw = free_request(allocation.handle());
                raw.free.flags = UNKNOWN_FLAG;
                expect_errno_of("FREE", device.free_raw(&mut raw), Errno::OPNOTSUPP)?;
                free(allocation)
            },
        ),
        case("EXPORT with flags 0x80000000 fails with EOPNOTSUPP", |env| {
            let device = open(env)?;
            let allocation = alloc(&device, PAGE, None)?;
            let mut raw = export_request(allocation.handle(), 0, 0);
            raw.export.flags = UNKNOWN_FLAG | PEERDIRECT_EXPORT_CLOEXEC;
            expect_errno_of("EXPORT", device.export_raw(&mut raw), Errno::OPNOTSUPP)
        }),
        case(
            "FREE and EXPORT on file B of a handle made on file A fail with ENOENT; on A both work",
            |env| {
                let a = open(env)?;
                let b = open(env)?;
                let allocation = alloc(&a, 64 * KIB, None)?;
                let handle = allocation.handle();
                expect_errno_of(
                    "EXPORT on B",
                    b.export_raw(&mut export_request(handle, 0, 0)),
                    Errno::NOENT,
                )?;
                expect_errno_of(
                    "FREE on B",
                    b.free_raw(&mut free_request(handle)),
                    Errno::NOENT,
                )?;
                let on_b = alloc(&b, 64 * KIB, None)?;
                if on_b.handle() == handle {
                    return Err(format!(
                        "expected handles unique per device, got {handle} on both files"
                    ));
                }
                export(&allocation, 0, 0, RO)?;
                free(allocation)
            },
        ),
        case("FREE of a freed handle (double free) fails with ENOENT", |env| {
            let device = open(env)?;
            let allocation = alloc(&device, PAGE, None)?;
            let handle = allocation.handle();
            free(allocation)?;
            expect_errno_of(
                "second FREE",
                device.free_raw(&mut free_request(handle)),
                Errno::NOENT,
            )
        }),
        case("FREE of handle 0 (never valid) fails with ENOENT", |env| {
            let device = open(env)?;
            expect_errno_of("FREE", device.free_raw(&mut free_request(0)), Errno::NOENT)
        }),
        case("EXPORT of a freed handle fails with ENOENT", |env| {
            let device = open(env)?;
            let allocation = alloc(&device, PAGE, None)?;
            let handle = allocation.handle();
            free(allocation)?;
            expect_errno_of(
                "EXPORT",
                device.export_raw(&mut export_request(handle, 0, 0)),
                Errno::NOENT,
            )
        }),
        case("ALLOC with size 8 (short struct) fails with EINVAL", |env| {
            let device = open(env)?;
            let mut raw = alloc_request(PAGE, 0);
            raw.alloc.size = 8;
            expect_errno_of("ALLOC", device.alloc_raw(&mut raw), Errno::INVAL)
        }),
        case("ALLOC with size 48 and a nonzero tail fails with E2BIG", |env| {
            let device = open(env)?;
            let mut raw = RawAlloc::<8>::new();
            raw.alloc.size = 48;
            raw.alloc.length = PAGE;
            raw.tail[7] = 1;
            expect_errno_of("ALLOC", device.alloc_raw(&mut raw), Errno::TOOBIG)
        }),
        case(
            "ALLOC with size 48 and a zero tail succeeds, writes back size 40 and leaves the tail",
            |env| {
                let device = open(env)?;
                let mut raw = RawAlloc::<8>::new();
                raw.alloc.size = 48;
                raw.alloc.length = PAGE;
                device
                    .alloc_raw(&mut raw)
                    .map_err(|err| format!("expected ALLOC to succeed, got {err}"))?;
                expect_eq("size", PEERDIRECT_ALLOC_SIZE_VER0, raw.alloc.size)?;
                expect_eq("tail", [0; 8], raw.tail)?;
                expect_eq("length", PAGE, raw.alloc.length)?;
                device
                    .free_raw(&mut free_request(raw.alloc.handle))
                    .map_err(|err| format!("expected FREE to succeed, got {err}"))
            },
        ),
        // What allocations are.
        case(
            "ALLOC with the default alignment places allocations 2 MiB aligned",
            |env| {
                let device = open(env)?;
                let _small = alloc(&device, PAGE, Some(PAGE))?;
                let first = alloc(&device, PAGE, None)?;
                let second = alloc(&device, 3 * MIB, None)?;
                let default = u64::from(PEERDIRECT_ALLOC_ALIGN_DEFAULT);
                for allocation in [&first, &second] {
                    expect_aligned(allocation, default)?;
                }
                expect_disjoint(&[&first, &second])
            },
        ),
        case("ALLOC with align 4096 places allocations 4 KiB aligned", |env| {
            let device = open(env)?;
            let a = alloc(&device, PAGE, Some(PAGE))?;
            let b = alloc(&device, 3 * PAGE, Some(PAGE))?;
            let c = alloc(&device, PAGE, Some(PAGE))?;
            for allocation in [&a, &b, &c] {
                expect_aligned(allocation, PAGE)?;
            }
            expect_disjoint(&[&a, &b, &c])
        }),
        case(
            "ALLOC rounds the length up to the page size and writes it back (1 -> 4096, 5000 -> 8192)",
            |env| {
                let device = open(env)?;
                let one = alloc(&device, 1, None)?;
                expect_eq("length for 1", PAGE, one.length())?;
                let more = alloc(&device, 5000, None)?;
                expect_eq("length for 5000", 2 * PAGE, more.length())
            },
        ),
        case(
            "16 allocations of mixed sizes and alignments lie inside HBM, do not overlap, and have distinct nonzero handles",
            |env| {
                let device = open(env)?;
                let mut allocations = Vec::new();
                for k in 0..16u64 {
                    let length = (k % 5 + 1) * 12 * KIB + k;
                    let align = [None, Some(PAGE), Some(64 * KIB), Some(MIB)][(k % 4) as usize];
                    let allocation = alloc(&device, length, align)?;
                    expect_aligned(&allocation, align.unwrap_or(u64::from(PEERDIRECT_ALLOC_ALIGN_DEFAULT)))?;
                    if allocation.hbm_offset() + allocation.length() > env.hbm_bytes {
                        return Err(format!(
                            "expected allocations inside the {}-byte HBM, got {}",
                            env.hbm_bytes,
                            describe(&allocation)
                        ));
                    }
                    allocations.push(allocation);
                }
                expect_disjoint(&allocations.iter().collect::<Vec<_>>())?;
                let mut handles: Vec<u32> = allocations.iter().map(Allocation::handle).collect();
                handles.sort_unstable();
                handles.dedup();
                expect_eq("distinct handles", allocations.len(), handles.len())?;
                if handles.first() == Some(&0) {
                    return Err("expected nonzero handles, got 0".to_owned());
                }
                Ok(())
            },
        ),
        case(
            "ALLOC of all of HBM succeeds at offset 0; then even 4 KiB fails with ENOMEM",
            |env| {
                let device = open(env)?;
                let all = alloc(&device, env.hbm_bytes, None)?;
                expect_eq("hbm_offset", 0, all.hbm_offset())?;
                expect_errno_of("ALLOC of 4 KiB", device.alloc(PAGE, Some(PAGE)), Errno::NOMEM)
            },
        ),
        // What their dma-bufs are.
        case(
            "EXPORT gives a dma-buf fd whose fdinfo says exp_name peerdirect and size = the exported length",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 3 * MIB, None)?;
                let dma_buf = export(&allocation, 0, 0, RW)?;
                expect_eq("length (lseek SEEK_END)", 3 * MIB, dma_buf.length())?;
                let fdinfo = fdinfo(&dma_buf)?;
                expect_fdinfo(&fdinfo, "exp_name", "peerdirect")?;
                expect_fdinfo(&fdinfo, "size", &(3 * MIB).to_string())
            },
        ),
        case(
            "EXPORT of a sub-range (offset 256 KiB, length 128 KiB of 1 MiB) has that size and that range's data",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, MIB, None)?;
                let whole = export(&allocation, 0, 0, RW)?;
                write_pattern(&whole, 11)?;
                let part = export(&allocation, 256 * KIB, 128 * KIB, RO)?;
                expect_eq("length", 128 * KIB, part.length())?;
                expect_fdinfo(&fdinfo(&part)?, "size", &(128 * KIB).to_string())?;
                expect_pattern(&part, 11, 256 * KIB)
            },
        ),
        case(
            "EXPORT with length 0 exports up to the end of the allocation",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 256 * KIB, None)?;
                let whole = export(&allocation, 0, 0, RW)?;
                write_pattern(&whole, 12)?;
                let tail = export(&allocation, 64 * KIB, 0, RO)?;
                expect_eq("length", 192 * KIB, tail.length())?;
                expect_pattern(&tail, 12, 64 * KIB)
            },
        ),
        case(
            "EXPORT sets the fd's close-on-exec and access mode from CLOEXEC and RDWR",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, PAGE, None)?;
                for flags in [
                    ExportFlags::empty(),
                    ExportFlags::CLOEXEC,
                    ExportFlags::RDWR,
                    RW,
                ] {
                    let dma_buf = export(&allocation, 0, 0, flags)?;
                    let open_flags = fdinfo_flags(&dma_buf)?;
                    expect_eq(
                        &format!("O_CLOEXEC with {flags:?}"),
                        flags.contains(ExportFlags::CLOEXEC),
                        open_flags & O_CLOEXEC != 0,
                    )?;
                    expect_eq(
                        &format!("O_RDWR with {flags:?}"),
                        flags.contains(ExportFlags::RDWR),
                        open_flags & O_ACCMODE == O_RDWR,
                    )?;
                }
                Ok(())
            },
        ),
        case(
            "mmap of an RDWR export: a pattern written through it reads back through it and through a second mapping",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 2 * MIB, None)?;
                let dma_buf = export(&allocation, 0, 0, RW)?;
                let mut map = mmap(&dma_buf, true)?;
                let mut data = vec![0; map.length()];
                pattern::fill(13, 0, &mut data);
                sync(&dma_buf, SyncFlags::START_WRITE)?;
                map.write(0, &data);
                sync(&dma_buf, SyncFlags::END_WRITE)?;
                let mut back = vec![0; map.length()];
                map.read(0, &mut back);
                expect_matches(13, 0, &back)?;
                expect_pattern(&dma_buf, 13, 0)
            },
        ),
        case(
            "DMA_BUF_IOCTL_SYNC accepts start/end with read/write and refuses flags 0x8 with EINVAL",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, PAGE, None)?;
                let dma_buf = export(&allocation, 0, 0, RW)?;
                let read_write = SyncFlags::READ | SyncFlags::WRITE;
                for flags in [
                    SyncFlags::START_READ,
                    SyncFlags::END_READ,
                    SyncFlags::START_WRITE,
                    SyncFlags::END_WRITE,
                    read_write,
                    read_write | SyncFlags::END,
                ] {
                    sync(&dma_buf, flags)?;
                }
                expect_errno_of(
                    "SYNC with flags 0x8",
                    dma_buf.sync(SyncFlags::from_bits_retain(0x8)),
                    Errno::INVAL,
                )
            },
        ),
        case(
            "a dma-buf has a default name naming peerdirect0; DMA_BUF_SET_NAME replaces it",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, PAGE, None)?;
                let dma_buf = export(&allocation, 0, 0, RW)?;
                let default = fdinfo_value(&fdinfo(&dma_buf)?, "name")
                    .map(str::to_owned)
                    .ok_or("name: expected a default name, got no name line in fdinfo")?;
                if !default.contains("peerdirect0") {
                    return Err(format!(
                        "name: expected a default name naming peerdirect0, got {default:?}"
                    ));
                }
                dma_buf
                    .set_name("alloc-export-test")
                    .map_err(|err| format!("expected DMA_BUF_SET_NAME to succeed, got {err}"))?;
                expect_fdinfo(&fdinfo(&dma_buf)?, "name", "alloc-export-test")
            },
        ),
        case(
            "an export without RDWR maps read-only; PROT_WRITE fails with EACCES",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, 64 * KIB, None)?;
                let dma_buf = export(&allocation, 0, 0, RO)?;
                let map = mmap(&dma_buf, false)?;
                map.read(0, &mut [0; 64]);
                expect_errno_of("writable mmap", dma_buf.mmap(true), Errno::ACCESS)
            },
        ),
        // How long memory lives.
        case(
            "a dma-buf keeps its data after FREE of its handle",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, MIB, None)?;
                let dma_buf = export(&allocation, 0, 0, RW)?;
                write_pattern(&dma_buf, 14)?;
                free(allocation)?;
                expect_pattern(&dma_buf, 14, 0)
            },
        ),
        case(
            "a dma-buf keeps its data after its device file is closed, through a mapping made before and one made after",
            |env| {
                let device = open(env)?;
                let allocation = alloc(&device, MIB, None)?;
                let dma_buf = export(&allocation, 0, 0, RW)?;
                write_pattern(&dma_buf, 15)?;
                let before = mmap(&dma_buf, false)?;
                allocation.into_handle();
                drop(device);
                let mut data = vec![0; before.length()];
                before.read(0, &mut data);
                expect_matches(15, 0, &data)?;
                expect_pattern(&dma_buf, 15, 0)
            },
        ),
        case(
            "memory a dma-buf holds is not reused after FREE: ALLOC fails with ENOMEM until the dma-buf is closed",
            |env| {
                let device = open(env)?;
                let all = alloc(&device, env.hbm_bytes, None)?;
                let dma_buf = export(&all, 0, 0, RO)?;
                free(all)?;
                expect_errno_of(
                    "ALLOC of 4 KiB while the dma-buf lives",
                    device.alloc(PAGE, Some(PAGE)),
                    Errno::NOMEM,
                )?;
                drop(dma_buf);
                alloc(&device, env.hbm_bytes, None).map(drop)
            },
        ),
        case(
            "debugfs stats count allocations and exports, freed allocations that a dma-buf holds included",
            |env| {
                let device = open(env)?;
                let base = stats()?;
                let allocation = alloc(&device, MIB, None)?;
                let dma_buf = export(&allocation, 0, 0, RO)?;
                let counts = |s: Stats| {
                    (
                        s.allocations - base.allocations,
                        s.allocated_bytes - base.allocated_bytes,
                        s.exports - base.exports,
                    )
                };
                let what = "(allocations, allocated_bytes, exports) over the start";
                expect_eq(
                    &format!("{what}, allocated and exported"),
                    (1, MIB, 1),
                    counts(stats()?),
                )?;
                free(allocation)?;
                expect_eq(&format!("{what}, after FREE"), (1, MIB, 1), counts(stats()?))?;
                drop(dma_buf);
                expect_eq(
                    &format!("{what}, after closing the dma-buf"),
                    (0, 0, 0),
                    counts(stats()?),
                )
            },
        ),
        case(
            "1000 allocations of 64 KiB (align 4 KiB) do not overlap; freed in scrambled order they coalesce: all of HBM then allocates at once",
            |env| {
                let device = open(env)?;
                let mut allocations = Vec::with_capacity(1000);
                for _ in 0..1000 {
                    allocations.push(alloc(&device, 64 * KIB, Some(PAGE))?);
                }
                expect_disjoint(&allocations.iter().collect::<Vec<_>>())?;
                let mut order: Vec<usize> = (0..allocations.len()).collect();
                scramble(&mut order);
                let mut slots: Vec<Option<Allocation<'_>>> =
                    allocations.into_iter().map(Some).collect();
                for k in order {
                    if let Some(allocation) = slots[k].take() {
                        free(allocation)?;
                    }
                }
                let all = alloc(&device, env.hbm_bytes, None)?;
                expect_eq("hbm_offset of all of HBM", 0, all.hbm_offset())
            },
        ),
        case(
            "with every file closed, debugfs stats show allocations: 0, allocated_bytes: 0, exports: 0 and INFO's hbm_bytes",
            |env| {
                let stats = stats()?;
                expect_eq(
                    "(allocations, allocated_bytes, exports, hbm_bytes)",
                    (0, 0, 0, env.hbm_bytes),
                    (
                        stats.allocations,
                        stats.allocated_bytes,
                        stats.exports,
                        stats.hbm_bytes,
                    ),
                )
            },
        ),
    ]
}

fn open(env: &Env) -> Result<Device, String> {
    Device::open(&env.path).map_err(|err| format!("expected open to succeed, got {err}"))
}

fn alloc(device: &Device, length: u64, align: Option<u64>) -> Result<Allocation<'_>, String> {
    device.alloc(length, align).map_err(|err| {
        format!("expected ALLOC of {length} bytes, align {align:?} to succeed, got {err}")
    })
}

fn free(allocation: Allocation<'_>) -> Outcome {
    let handle = allocation.handle();
    allocation
        .free()
        .map_err(|err| format!("expected FREE of handle {handle} to succeed, got {err}"))
}

fn export(
    allocation: &Allocation<'_>,
    offset: u64,
    length: u64,
    flags: ExportFlags,
) -> Result<DmaBuf, String> {
    allocation.export(offset, length, flags).map_err(|err| {
        format!(
            "expected EXPORT of {offset:#x}+{length:#x} of {} with {flags:?} to succeed, got {err}",
            describe(allocation)
        )
    })
}

fn mmap(dma_buf: &DmaBuf, writable: bool) -> Result<peerdirect::DmaBufMap, String> {
    dma_buf
        .mmap(writable)
        .map_err(|err| format!("expected mmap (writable: {writable}) to succeed, got {err}"))
}

fn sync(dma_buf: &DmaBuf, flags: SyncFlags) -> Outcome {
    dma_buf
        .sync(flags)
        .map_err(|err| format!("expected SYNC {flags:?} to succeed, got {err}"))
}

fn stats() -> Result<Stats, String> {
    Stats::read(INDEX).map_err(|err| format!("expected to read the debugfs stats, got {err}"))
}

/// Sends ALLOC of `length` bytes with alignment `align` (0: the default) as a raw request.
fn alloc_raw(device: &Device, length: u64, align: u64) -> Result<(), Error> {
    device.alloc_raw(&mut alloc_request(length, align))
}

fn alloc_request(length: u64, align: u64) -> RawAlloc<0> {
    let mut raw = RawAlloc::new();
    raw.alloc.length = length;
    raw.alloc.align = align;
    raw
}

fn free_request(handle: u32) -> RawFree<0> {
    let mut raw = RawFree::new();
    raw.free.handle = handle;
    raw
}

fn export_request(handle: u32, offset: u64, length: u64) -> RawExport<0> {
    let mut raw = RawExport::new();
    raw.export.handle = handle;
    raw.export.offset = offset;
    raw.export.length = length;
    raw.export.flags = PEERDIRECT_EXPORT_CLOEXEC;
    raw
}

/// Sends FREE with `request` in a read-only page: the module can read it but not write its
/// answer back. The ioctl's outcome.
fn free_from_read_only(device: &Device, request: &RawFree<0>) -> Result<Result<(), Errno>, String> {
    let len = PAGE as usize;
    // SAFETY: a new anonymous private mapping, which nothing else refers to; unmapped below.
    let page = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .map_err(|err| format!("expected an anonymous mapping, got {err}"))?;
    // SAFETY: `page` is `len` writable bytes, more than the request's, and a new mapping does
    // not overlap the request.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(request).cast::<u8>(),
            page.cast::<u8>(),
            size_of::<RawFree<0>>(),
        );
    }
    // SAFETY: the mapping made above, whose bytes no Rust reference points to.
    unsafe { rustix::mm::mprotect(page, len, rustix::mm::MprotectFlags::READ) }
        .map_err(|err| format!("expected mprotect to succeed, got {err}"))?;
    // SAFETY: FREE reads a struct peerdirect_free at the pointer and writes its answer there:
    // the page is this process's and mapped; read-only, the write fails (EFAULT), which is
    // what is tested. The fd is the device's, open for the call.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&device.as_fd()),
            peerdirect::uapi::PEERDIRECT_IOC_FREE as _,
            page,
        )
    };
    let outcome = if rc == 0 {
        Ok(())
    } else {
        Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
    };
    // SAFETY: the mapping made above, used no more.
    unsafe { rustix::mm::munmap(page, len) }
        .map_err(|err| format!("expected munmap to succeed, got {err}"))?;
    Ok(outcome)
}

fn describe(allocation: &Allocation<'_>) -> String {
    format!(
        "handle {} at {:#x}+{:#x}",
        allocation.handle(),
        allocation.hbm_offset(),
        allocation.length()
    )
}

fn expect_aligned(allocation: &Allocation<'_>, align: u64) -> Outcome {
    if allocation.hbm_offset() % align == 0 {
        Ok(())
    } else {
        Err(format!(
            "expected hbm_offset aligned to {align:#x}, got {}",
            describe(allocation)
        ))
    }
}

/// Checks that no two allocations share a byte.
fn expect_disjoint(allocations: &[&Allocation<'_>]) -> Outcome {
    let ranges: Vec<(u64, u64)> = allocations
        .iter()
        .map(|a| (a.hbm_offset(), a.length()))
        .collect();
    match first_overlap(&ranges) {
        None => Ok(()),
        Some((a, b)) => Err(format!(
            "expected disjoint allocations, got {:#x}+{:#x} and {:#x}+{:#x}",
            a.0, a.1, b.0, b.1
        )),
    }
}

/// Two of the `(offset, length)` ranges that overlap, if any.
fn first_overlap(ranges: &[(u64, u64)]) -> Option<((u64, u64), (u64, u64))> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|pair| pair[0].0 + pair[0].1 > pair[1].0)
        .map(|pair| (pair[0], pair[1]))
}

/// Shuffles `items` the same way every run (Fisher-Yates driven by the test pattern).
fn scramble<T>(items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = (pattern::word(0x5eed, i as u64) % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// Writes the pattern with `seed` over the whole dma-buf through a new writable mapping.
fn write_pattern(dma_buf: &DmaBuf, seed: u64) -> Outcome {
    let mut map = mmap(dma_buf, true)?;
    let mut data = vec![0; map.length()];
    pattern::fill(seed, 0, &mut data);
    sync(dma_buf, SyncFlags::START_WRITE)?;
    map.write(0, &data);
    sync(dma_buf, SyncFlags::END_WRITE)
}

/// Checks through a new read-only mapping that the dma-buf holds bytes `offset..` of the
/// pattern with `seed`.
fn expect_pattern(dma_buf: &DmaBuf, seed: u64, offset: u64) -> Outcome {
    let map = mmap(dma_buf, false)?;
    let mut data = vec![0; map.length()];
    sync(dma_buf, SyncFlags::START_READ)?;
    map.read(0, &mut data);
    sync(dma_buf, SyncFlags::END_READ)?;
    expect_matches(seed, offset, &data)
}

fn expect_matches(seed: u64, offset: u64, data: &[u8]) -> Outcome {
    match pattern::first_mismatch(seed, offset, data) {
        None => Ok(()),
        Some(m) => Err(format!(
            "expected pattern {seed} from byte {offset:#x}, got {:#04x} instead of {:#04x} at pattern byte {:#x}",
            m.found, m.expected, m.offset
        )),
    }
}

/// The open flags fdinfo shows (octal), `O_CLOEXEC` included.
fn fdinfo_flags(fd: &impl AsFd) -> Result<u64, String> {
    let fdinfo = fdinfo(fd)?;
    fdinfo_value(&fdinfo, "flags")
        .and_then(|flags| u64::from_str_radix(flags, 8).ok())
        .ok_or_else(|| format!("flags: expected an octal number, got fdinfo:\n{fdinfo}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::errno_name;
    use std::fs;

    #[test]
    fn overlaps_are_found_in_any_order() {
        assert_eq!(first_overlap(&[]), None);
        assert_eq!(first_overlap(&[(0, 4096), (4096, 4096), (8192, 1)]), None);
        assert_eq!(
            first_overlap(&[(8192, 4096), (0, 4096), (4095, 2)]),
            Some(((0, 4096), (4095, 2)))
        );
        assert_eq!(
            first_overlap(&[(0, 8192), (4096, 4096)]),
            Some(((0, 8192), (4096, 4096)))
        );
    }

    #[test]
    fn scramble_is_a_fixed_permutation() {
        let mut a: Vec<usize> = (0..1000).collect();
        scramble(&mut a);
        let mut b: Vec<usize> = (0..1000).collect();
        scramble(&mut b);
        assert_eq!(a, b);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        a.sort_unstable();
        assert_eq!(a, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn fdinfo_values_and_flags() {
        let fdinfo = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\nsize:\t4096\n\
            count:\t1\nexp_name:\tpeerdirect\nname:\tpeerdirect0:1:0x0+0x1000\n";
        assert_eq!(fdinfo_value(fdinfo, "exp_name"), Some("peerdirect"));
        assert_eq!(
            fdinfo_value(fdinfo, "name"),
            Some("peerdirect0:1:0x0+0x1000")
        );
        assert_eq!(fdinfo_value(fdinfo, "nam"), None);
        assert_eq!(expect_fdinfo(fdinfo, "size", "4096"), Ok(()));
        let flags = u64::from_str_radix(fdinfo_value(fdinfo, "flags").unwrap(), 8).unwrap();
        assert_ne!(flags & O_CLOEXEC, 0);
        assert_eq!(flags & O_ACCMODE, O_RDWR);
    }

    #[test]
    fn errno_labels_cover_what_the_tests_expect() {
        for (errno, name) in [
            (Errno::INVAL, "EINVAL"),
            (Errno::TOOBIG, "E2BIG"),
            (Errno::OPNOTSUPP, "EOPNOTSUPP"),
            (Errno::NOENT, "ENOENT"),
            (Errno::NOMEM, "ENOMEM"),
            (Errno::OVERFLOW, "EOVERFLOW"),
            (Errno::ACCESS, "EACCES"),
        ] {
            assert_eq!(errno_name(errno), name);
        }
    }

    /// A regular file answers every ioctl with ENOTTY: every test must report a failure that
    /// says what it expected, which shows the tests can fail.
    #[test]
    fn tests_fail_on_a_file_that_is_not_a_peerdirect_device() {
        let path = std::env::temp_dir().join(format!(
            "peerdirect-guest-tests-alloc-{}",
            std::process::id()
        ));
        fs::write(&path, b"").unwrap();
        let env = Env {
            path: path.clone(),
            hbm_bytes: 256 * MIB,
        };
        let cases = cases();
        for case in &cases {
            let diagnostic = (case.run)(&env).expect_err(&case.description);
            assert!(
                diagnostic.contains("expected"),
                "{}: {diagnostic}",
                case.description
            );
        }
        fs::remove_file(&path).unwrap();
        let size0 = cases
            .iter()
            .find(|case| case.description.starts_with("ALLOC with length 0 "))
            .unwrap();
        let diagnostic = (size0.run)(&Env {
            path: "/dev/null".into(),
            hbm_bytes: 0,
        })
        .unwrap_err();
        assert!(
            diagnostic.starts_with("ALLOC: expected EINVAL, got ENOTTY"),
            "{diagnostic}"
        );
    }
}

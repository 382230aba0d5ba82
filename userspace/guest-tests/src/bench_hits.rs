//! `--bench-hits`: a benchmark, not a test. The crate's cache hit as a runtime pays it:
//! [`RegCache::get`] of a range already registered, then the drop of the handle it returned,
//! on libfabric's tcp domain over 127.0.0.1, from 1, 2 and 8 threads at once, all asking for
//! the same 2 MiB allocation of /dev/peerdirect0 (so all hit one entry).
//!
//! Timed exactly as `userspace/capi/benches/hits.c` times the C ABI's hit (`pd_register` and
//! `pd_mr_release`), for `scripts/bench-hits` to set the two side by side: each thread times
//! batches of [`BATCH`] hit+drop pairs with `Instant` (CLOCK_MONOTONIC, as the C program
//! reads it), after [`WARM`] untimed batches; per thread count one line gives the median and
//! 99th percentile over every thread's batches of the time per pair, and the hits per second
//! per thread:
//!
//! ```text
//! hits rust threads 2 p50_ns 55.1 p99_ns 80.3 mhits_per_thread 16.9
//! ```
//!
//! With `--foreign` no device is needed, so that `scripts/bench-hits --native` runs it on the
//! host's CPU: the 2 MiB are a memfd, registered under its foreign identity
//! ([`ExportId::foreign`]) through its mapping, as hits.c's `--foreign` registers the same
//! stand-in (libfabric's tcp provider takes an FI_MR_DMABUF registration by its address and
//! ignores the fd); the lines end in `foreign`. It then also times, in lines `hits rust-at`,
//! what the C ABI's hit there is made of, written in Rust: the lookup by address in the
//! crate's [`AddressTable`] and a hit only ([`RegCache::get_cached`]), so that the C hit is
//! set beside the same operation as well as beside `get`.

use std::hint::black_box;
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use peerdirect::cache::{Access, AddressTable, ByteRange, CacheLimits, ExportId, RegCache};
use peerdirect::registrar::libfabric::{Fabric, LibfabricRegistrar, MappedDmaBuf};
use peerdirect::{Device, DmaBuf, ExportFlags};
use rustix::fs::MemfdFlags;

use crate::INDEX;

const LENGTH: u64 = 2 << 20;
/// Pairs per timed batch, batches per thread, and untimed batches first: as hits.c.
const BATCH: usize = 64;
const BATCHES: usize = 2000;
const WARM: usize = 100;
/// The thread counts, as hits.c's default.
const THREADS: [usize; 3] = [1, 2, 8];

/// Where the 2 MiB are in the table of [`AddressTable`] lookups: bytes `[base, base + size)`
/// of `export`, as the C ABI's table holds each dma-buf registered at the caller's addresses.
#[derive(Clone, Copy, PartialEq)]
struct At {
    base: u64,
    size: u64,
    export: ExportId,
}

/// What one thread measured: ns per pair of each batch, and the seconds all batches took.
struct Thread {
    per_pair: Vec<f64>,
    seconds: f64,
}

pub fn run(foreign: bool) -> ExitCode {
    match bench(foreign) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hits: {err}");
            ExitCode::FAILURE
        }
    }
}

fn bench(foreign: bool) -> Result<(), String> {
    // No device nor allocation with `foreign`: a memfd stands in for the dma-buf.
    let device = if foreign {
        None
    } else {
        Some(Device::open_index(INDEX).map_err(|e| format!("opening device {INDEX}: {e}"))?)
    };
    let alloc = device
        .as_ref()
        .map(|device| device.alloc(LENGTH, None))
        .transpose()
        .map_err(|e| format!("alloc: {e}"))?;
    let dma_buf = match &alloc {
        Some(alloc) => alloc
            .export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)
            .map_err(|e| format!("export: {e}"))?,
        None => rustix::fs::memfd_create("hits", MemfdFlags::CLOEXEC)
            .and_then(|fd| rustix::fs::ftruncate(&fd, LENGTH).map(|()| fd))
            .map_err(|e| format!("a memfd of 2 MiB: {e}"))
            .and_then(|fd| DmaBuf::from_fd(fd).map_err(|e| format!("memfd: {e}")))?,
    };
    let export = if foreign {
        ExportId::foreign(&dma_buf)
    } else {
        ExportId::of_dma_buf(INDEX, &dma_buf)
    }
    .map_err(|e| format!("fstat: {e}"))?;
    let mode = if foreign { " foreign" } else { "" };
    let source = MappedDmaBuf::new(dma_buf).map_err(|e| format!("mapping: {e}"))?;
    let registrar = Fabric::open("tcp", Some("127.0.0.1"))
        .map(|fabric| Arc::new(LibfabricRegistrar::new(fabric)))
        .map_err(|e| format!("opening tcp: {e}"))?;
    let cache = RegCache::new(CacheLimits::default());
    let range = ByteRange::new(0, LENGTH).map_err(|e| e.to_string())?;
    let access = Access::LOCAL_READ | Access::LOCAL_WRITE;
    // The first registration (a miss) is held for the whole run: every timed call hits.
    let held = cache
        .get(&registrar, &source, export, range, access)
        .map_err(|e| format!("register: {e}"))?;
    // The lookup by address that the C ABI's pd_register_addr makes (the crate's table, then
    // a hit only), written in Rust: with --foreign, the C hit's own operation.
    let table = AddressTable::default();
    let base = source.base_addr();
    table.set(&[At {
        base,
        size: LENGTH,
        export,
    }]);
    let get = || {
        let mr = cache.get(&registrar, &source, export, range, access);
        let hit = mr.is_ok();
        drop(black_box(mr));
        hit
    };
    let at_address = || {
        let addr = black_box(base);
        let mr = addr.checked_add(LENGTH).and_then(|end| {
            let at = table.find(|at| at.base <= addr && end <= at.base.saturating_add(at.size))?;
            let range = ByteRange::new(addr - at.base, LENGTH).ok()?;
            cache.get_cached(&registrar, at.export, range, access)
        });
        let hit = mr.is_some();
        drop(black_box(mr));
        hit
    };
    for threads in THREADS {
        println!("{}", measure("rust", threads, get, mode)?);
        if foreign {
            println!("{}", measure("rust-at", threads, at_address, mode)?);
        }
    }
    let stats = cache.stats();
    if stats.misses != 1 {
        return Err(format!(
            "{} misses where only the first call should miss",
            stats.misses
        ));
    }
    println!("hits rust calls {} misses 1{mode}", stats.hits);
    drop(held);
    Ok(())
}

/// Times `pair` (a hit and the drop of its handle; `false` if it made no handle) from
/// `threads` threads at once, as hits.c times its pairs: the line that reports it.
fn measure(
    name: &str,
    threads: usize,
    pair: impl Fn() -> bool + Sync,
    mode: &str,
) -> Result<String, String> {
    let barrier = Barrier::new(threads);
    let measured: Vec<Option<Thread>> = thread::scope(|scope| {
        let running: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    let mut hits = true;
                    for _ in 0..WARM * BATCH {
                        hits &= pair();
                    }
                    let mut per_pair = Vec::with_capacity(BATCHES);
                    let mut seconds = 0.0;
                    for _ in 0..BATCHES {
                        let start = Instant::now();
                        for _ in 0..BATCH {
                            hits &= pair();
                        }
                        let took = start.elapsed().as_secs_f64();
                        per_pair.push(took * 1e9 / BATCH as f64);
                        seconds += took;
                    }
                    hits.then_some(Thread { per_pair, seconds })
                })
            })
            .collect();
        running
            .into_iter()
            .map(|t| t.join().expect("bench thread"))
            .collect()
    });
    let measured: Vec<Thread> = measured
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{name}: a timed call made no handle"))?;
    let seconds: f64 = measured.iter().map(|t| t.seconds).sum();
    let mut all: Vec<f64> = measured.into_iter().flat_map(|t| t.per_pair).collect();
    all.sort_unstable_by(f64::total_cmp);
    let n = all.len();
    Ok(format!(
        "hits {name} threads {threads} p50_ns {:.1} p99_ns {:.1} mhits_per_thread {:.2}{mode}",
        all[n / 2],
        all[n * 99 / 100],
        (BATCHES * BATCH * threads) as f64 / seconds / 1e6
    ))
}

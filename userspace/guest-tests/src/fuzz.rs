//! `--fuzz SEED`: a randomized, seeded sequence of what userspace can do to `/dev/peerdirect0`
//! from several threads at once: open and close files (one shared by every thread at first,
//! private ones per thread; a file of a device that went away is replaced by a new one), ALLOC, FREE and EXPORT with valid and invalid arguments, close dma-bufs,
//! map them (also privately, executably, past their end), touch and unmap the mappings. With
//! `--fuzz-removal`, the main thread meanwhile unbinds and rebinds the device and tries to
//! unload the module, which must refuse while files are open.
//!
//! Every call's answer must be one the ABI allows for its arguments (Documentation/uapi.md);
//! afterwards, with every file closed, the device must be back to nothing allocated, nothing
//! exported and all HBM free. With `--fuzz-removal` the removals must have been met: some
//! answers `ENODEV` (from files and dma-bufs that outlived a removal) and some `rmmod` refused
//! (touches that fault on mappings revoked while held are counted too); without it, neither
//! `ENODEV` nor a fault may come. The seed is printed first, and again with a failure: `--fuzz SEED` (with
//! `--fuzz-removal` if it was given) replays the same choices (the interleaving of the threads
//! differs from run to run).

use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::{Device, Errno, Error, ExportFlags, RawAlloc, RawExport, RawFree};

use crate::race::{self, Mapping};
use crate::support::{all_of, errno_name, join_all, FirstFailure, Outcome, Tap};
use crate::INDEX;

const PAGE: u64 = 4096;
const THREADS: u64 = 4;
/// Bounds on what one thread holds, so a run never exhausts memory or fds.
const MAX_HELD: usize = 64;

/// SplitMix64: small, seedable, and good enough to choose operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The first answer the ABI does not allow, with the operation that got it; and how many
/// answers said the device was gone.
#[derive(Default)]
struct Violations {
    first: FirstFailure,
    gone: AtomicU64,
}

impl Violations {
    fn check(&self, op: &str, got: Result<(), Errno>, allowed: &[Errno]) {
        if got == Err(Errno::NODEV) {
            self.gone.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(errno) = got {
            if !allowed.contains(&errno) {
                let names: Vec<_> = allowed.iter().map(|&e| errno_name(e)).collect();
                self.first.record(format!(
                    "{op}: expected success or one of {names:?}, got {errno} ({})",
                    errno_name(errno)
                ));
            }
        }
    }

    /// `op` succeeded although its arguments (or the file's mode) call for `errno`.
    fn succeeded(&self, op: &str, errno: Errno) {
        self.first.record(format!(
            "{op}: expected {errno} ({}), got success",
            errno_name(errno)
        ));
    }

    fn outcome(&self) -> Outcome {
        self.first.outcome()
    }
}

fn errno_of(result: Result<(), Error>) -> Result<(), Errno> {
    result.map_err(|err| err.errno().unwrap_or(Errno::IO))
}

fn free(file: &Device, handle: u32) -> Result<(), Error> {
    let mut raw = RawFree::<0>::new();
    raw.free.handle = handle;
    file.free_raw(&mut raw)
}

/// What one thread holds.
#[derive(Default)]
struct Held {
    files: Vec<Arc<Device>>,
    /// (file, handle, length)
    allocations: Vec<(Arc<Device>, u32, u64)>,
    /// (dma-buf, length, writable)
    dmabufs: Vec<(OwnedFd, u64, bool)>,
    mappings: Vec<Mapping>,
}

pub(crate) fn run(seed: u64, seconds: u64, removal: bool) -> ExitCode {
    let mut tap = Tap::plan(2);
    let replay = format!(
        "--fuzz {seed}{}",
        if removal { " --fuzz-removal" } else { "" }
    );
    println!("# seed {seed} (replay: {replay})");
    let outcome = fuzz(seed, Duration::from_secs(seconds), removal);
    tap.report(
        &format!(
            "{THREADS} threads run random device operations for {seconds} s{}, and every answer is one the ABI allows",
            if removal { " while the device is unbound and rebound" } else { "" }
        ),
        &outcome.map_err(|err| format!("{err}\nseed {seed}: replay with {replay}")),
    );
    tap.report(
        "afterwards the device works, with nothing allocated or exported and all HBM free",
        &race::expect_idle(),
    );
    tap.finish()
}

fn fuzz(seed: u64, budget: Duration, removal: bool) -> Outcome {
    let shared = Arc::new(
        Device::open_index(INDEX).map_err(|err| format!("cannot open the device: {err}"))?,
    );
    let bdf = race::bound_device()?;
    let hbm_bytes = shared
        .info()
        .map_err(|err| format!("INFO failed: {err}"))?
        .hbm_bytes;
    let stop = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(Violations::default());
    // Touches of mappings revoked while held fault: the trap counts them.
    race::sigbus::forget();
    let _trap = race::sigbus::Trap::install()?;
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (shared, stop, violations) = (shared.clone(), stop.clone(), violations.clone());
            let mut rng = Rng(seed ^ t.wrapping_mul(0x2545_f491_4f6c_dd1d));
            thread::spawn(move || {
                let mut held = Held::default();
                held.files.push(shared);
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    step(&mut rng, &mut held, hbm_bytes, &violations);
                    ops += 1;
                }
                ops
            })
        })
        .collect();
    drop(shared);
    let start = Instant::now();
    let (mut cycles, mut refused, mut outcome) = (0u64, 0u64, Ok(()));
    while start.elapsed() < budget {
        if !removal {
            thread::sleep(Duration::from_millis(100));
            continue;
        }
        thread::sleep(Duration::from_millis(200));
        // Files are open: the module must refuse to go.
        if crate::support::run_command("rmmod", &["peerdirect"]).is_ok() {
            outcome = Err("rmmod peerdirect succeeded while files were open".to_owned());
            break;
        }
        refused += 1;
        if let Err(err) = race::unbind(&bdf).and_then(|()| race::rebind(&bdf)) {
            outcome = Err(err);
            break;
        }
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (ops, joined) = join_all("fuzzing thread", threads);
    let (gone, faulted) = (
        violations.gone.load(Ordering::Relaxed),
        race::sigbus::trapped(),
    );
    println!(
        "# operations per thread {ops:?}; {cycles} unbind/rebind cycles, {refused} rmmods refused; {gone} answers ENODEV, {faulted} touches faulted"
    );
    all_of([outcome, joined, violations.outcome()])?;
    race::expect_raced("operations", ops.iter().sum(), 1000)?;
    if removal {
        // Faulting touches are counted, not required: a few per run (4 in 7 cycles).
        race::expect_met(&[
            ("unbind/rebind cycle", cycles),
            ("rmmod refused while files were open", refused),
            (
                "answer ENODEV from a file or dma-buf that outlived a removal",
                gone,
            ),
        ])
    } else if gone + faulted > 0 {
        Err(format!(
            "expected no ENODEV and no SIGBUS while the device stays bound, got {gone} ENODEV answers and {faulted} faulting touches"
        ))
    } else {
        Ok(())
    }
}

/// One random operation of one thread.
fn step(rng: &mut Rng, held: &mut Held, hbm_bytes: u64, v: &Violations) {
    use Errno as E;
    match rng.below(12) {
        0 if held.files.len() < 3 => match Device::open_index(INDEX) {
            Ok(device) => held.files.push(Arc::new(device)),
            Err(err) => v.check("open", errno_of(Err(err)), &[E::NOENT, E::NODEV, E::NXIO]),
        },
        1 if held.files.len() > 1 => {
            // Each thread keeps one file at least: open files keep the module from unloading.
            let i = rng.below(held.files.len() as u64) as usize;
            close_file(held, i);
        }
        2 | 3 if held.allocations.len() < MAX_HELD => {
            let file = held.files[rng.below(held.files.len() as u64) as usize].clone();
            let valid = rng.chance(85);
            let (length, align) = if valid {
                (1 + rng.below(4 << 20), PAGE << rng.below(10))
            } else {
                match rng.below(3) {
                    0 => (0, 0),
                    1 => (hbm_bytes + PAGE, 0),
                    _ => (PAGE, 3 * PAGE),
                }
            };
            let mut raw = RawAlloc::<0>::new();
            raw.alloc.length = length;
            raw.alloc.align = align;
            match file.alloc_raw(&mut raw) {
                Ok(()) => held
                    .allocations
                    .push((file, raw.alloc.handle, raw.alloc.length)),
                Err(err) => {
                    let allowed: &[Errno] = if valid {
                        &[E::NOMEM, E::NODEV]
                    } else {
                        &[E::INVAL, E::NODEV]
                    };
                    v.check("ALLOC", errno_of(Err(err)), allowed)
                }
            }
        }
        4 if !held.allocations.is_empty() => {
            let i = rng.below(held.allocations.len() as u64) as usize;
            let (file, handle, _) = held.allocations.swap_remove(i);
            v.check("FREE", errno_of(free(&file, handle)), &[]);
        }
        5 => {
            // A handle this thread never had: another file's, or none.
            let file = &held.files[rng.below(held.files.len() as u64) as usize];
            let handle = (rng.next() as u32) | 0x8000_0000;
            v.check(
                "FREE of a foreign handle",
                errno_of(free(file, handle)),
                &[E::NOENT],
            );
        }
        6 | 7 if !held.allocations.is_empty() && held.dmabufs.len() < MAX_HELD => {
            let (file, handle, len) =
                held.allocations[rng.below(held.allocations.len() as u64) as usize].clone();
            let pages = len / PAGE;
            let valid = rng.chance(85);
            let mut raw = RawExport::<0>::new();
            raw.export.handle = handle;
            raw.export.flags = if rng.chance(50) {
                ExportFlags::RDWR.bits()
            } else {
                0
            };
            let expected = if valid {
                raw.export.offset = rng.below(pages) * PAGE;
                raw.export.length = rng.below(pages - raw.export.offset / PAGE + 1) * PAGE;
                None
            } else {
                match rng.below(3) {
                    0 => {
                        raw.export.offset = 1;
                        Some(E::INVAL)
                    }
                    1 => {
                        raw.export.length = len + PAGE;
                        Some(E::INVAL)
                    }
                    _ => {
                        raw.export.flags |= 1 << 30;
                        Some(E::OPNOTSUPP)
                    }
                }
            };
            match file.export_raw(&mut raw) {
                Ok(dmabuf) => {
                    let length = dmabuf.length();
                    let writable = raw.export.flags & ExportFlags::RDWR.bits() != 0;
                    held.dmabufs.push((OwnedFd::from(dmabuf), length, writable));
                    if let Some(errno) = expected {
                        v.succeeded("EXPORT with bad arguments", errno);
                    }
                }
                Err(err) => {
                    let allowed: &[Errno] = match expected {
                        None => &[E::NODEV],
                        Some(E::OPNOTSUPP) => &[E::OPNOTSUPP],
                        Some(errno) => &[errno, E::NODEV],
                    };
                    v.check("EXPORT", errno_of(Err(err)), allowed)
                }
            }
        }
        8 if !held.dmabufs.is_empty() => {
            let i = rng.below(held.dmabufs.len() as u64) as usize;
            drop(held.dmabufs.swap_remove(i));
        }
        9 if !held.dmabufs.is_empty() && held.mappings.len() < MAX_HELD => {
            let i = rng.below(held.dmabufs.len() as u64) as usize;
            let (fd, len, writable) = &held.dmabufs[i];
            let (len, writable) = (*len as usize, *writable);
            let (flags, prot_exec, size, expected) = match rng.below(10) {
                0 => (rustix::mm::MapFlags::PRIVATE, false, len, Some(E::INVAL)),
                1 => (rustix::mm::MapFlags::SHARED, true, len, Some(E::PERM)),
                2 => (
                    rustix::mm::MapFlags::SHARED,
                    false,
                    len + PAGE as usize,
                    Some(E::INVAL),
                ),
                _ => (rustix::mm::MapFlags::SHARED, false, len, None),
            };
            let want_write = rng.chance(50);
            match Mapping::with(fd.as_fd(), size, want_write, prot_exec, flags) {
                Ok(map) => {
                    if let Some(errno) = expected {
                        v.succeeded("mmap with bad arguments", errno);
                    } else if want_write && !writable {
                        v.succeeded("writable mmap of a read-only dma-buf", E::ACCESS);
                    }
                    held.mappings.push(map);
                }
                Err(errno) => {
                    // The VFS refuses a shared writable mapping of a read-only file first.
                    let mut allowed = vec![E::NODEV];
                    allowed.extend(expected);
                    if want_write && !writable && flags == rustix::mm::MapFlags::SHARED {
                        allowed.push(E::ACCESS);
                    }
                    v.check("mmap", Err(errno), &allowed)
                }
            }
        }
        10 if !held.mappings.is_empty() => {
            // Touch: after a removal this faults, and the trap lets the thread go on.
            let map = &held.mappings[rng.below(held.mappings.len() as u64) as usize];
            map.read_first();
        }
        11 if !held.mappings.is_empty() => {
            let i = rng.below(held.mappings.len() as u64) as usize;
            drop(held.mappings.swap_remove(i));
        }
        _ => {
            // INFO on a random file; a file of a device that went away is replaced.
            let i = rng.below(held.files.len() as u64) as usize;
            match errno_of(held.files[i].info().map(drop)) {
                Err(E::NODEV) => {
                    v.gone.fetch_add(1, Ordering::Relaxed);
                    if let Ok(device) = Device::open_index(INDEX) {
                        held.files.push(Arc::new(device));
                        close_file(held, i);
                    }
                }
                got => v.check("INFO", got, &[]),
            }
        }
    }
}

/// Closes file `i` of this thread, with the allocations it made (its dma-bufs stay).
fn close_file(held: &mut Held, i: usize) {
    let file = held.files.swap_remove(i);
    held.allocations.retain(|(f, _, _)| !Arc::ptr_eq(f, &file));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_makes_the_same_choices() {
        let (mut a, mut b, mut c) = (Rng(7), Rng(7), Rng(8));
        let first: Vec<_> = (0..64).map(|_| a.below(12)).collect();
        assert_eq!(first, (0..64).map(|_| b.below(12)).collect::<Vec<_>>());
        assert_ne!(first, (0..64).map(|_| c.below(12)).collect::<Vec<_>>());
        assert!(first.iter().all(|&op| op < 12));
    }

    #[test]
    fn violations_keep_the_first_disallowed_answer() {
        let v = Violations::default();
        v.check("FREE", Ok(()), &[]);
        v.check("EXPORT", Err(Errno::NODEV), &[Errno::NODEV]);
        assert_eq!(v.outcome(), Ok(()));
        assert_eq!(v.gone.load(Ordering::Relaxed), 1);
        v.check("mmap", Err(Errno::INVAL), &[Errno::NODEV]);
        v.check("ALLOC", Err(Errno::PERM), &[]);
        let first = v.outcome().unwrap_err();
        assert!(
            first.starts_with("mmap: expected success or one of [\"ENODEV\"]"),
            "{first}"
        );
    }
}

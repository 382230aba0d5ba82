//! `--fabric-revoke`: the HBM device is unbound while libfabric's verbs provider moves its
//! memory (`verbs;ofi_rxm` with `FI_MR_DMABUF` on the test kernel's dma-buf capable rxe,
//! `qemu/run --rxe-dmabuf`), every registration made through a [`RegCache`] attached to the
//! device, as a runtime's transfers would be when its accelerator goes away under them.
//!
//! With `--companion`, `/dev/peerdirect0` is a companion of the HBM device, which vfio-pci
//! owns (Documentation/companion.md): the buffers are ranges of its BAR (`EXPORT_RANGE`), the
//! owner's driver unbinds, and the last check is that the companion is gone.
//!
//! Two streams run, each on endpoints of its own, with every endpoint's timeout at
//! [`STALL`]: an RMA stream (a reader's `fi_read`s of an owner's HBM, 1 MiB at a time, into
//! its own HBM; the owner's completion queue read by another thread) and a tagged stream
//! (1 MiB messages from HBM to HBM, which ofi_rxm hands to the NIC: rendezvous, rxe reading
//! the sender's HBM). Once each has moved its bytes a few times (the first transfer's
//! destination checked), the device is unbound:
//!
//! - the unbind returns without waiting for the registrations (rxe's import is revocable);
//! - each stream ends with an error from the crate's `Endpoint` within [`ENDS`] of the unbind's
//!   return: the error completion libfabric reports, or `TransferRevoked` once the cache knows
//!   (ofi_rxm's rendezvous sender is told nothing); never the crate's own timeout, `Stalled`
//!   (a failure nobody reports would be a hang a runtime cannot tell from a slow peer); each
//!   registration's next transfer is refused at once with `TransferRevoked`;
//! - the cache lets go by itself: its listener is told of each registration (cause device),
//!   and once the streams' handles are dropped every registration is deregistered; the
//!   dma-buf core lists no device attached to any of the dma-bufs any more;
//! - a new request fails with `ENODEV`, naming the device whose export is revoked;
//! - the device rebinds; of the old device, only the sender's allocation is left if the
//!   unbind came while a rendezvous of it was in flight (its registration
//!   `FabricMr::stranded`), else nothing: ofi_rxm neither completes nor cancels a rendezvous
//!   send whose receiver failed, and the crate keeps an endpoint with operations it could not
//!   cancel open for the life of the process, with their memory (closing it under them
//!   crashed libfabric 2.1's ofi_rxm). `--idle`, run after this program, sees that go with
//!   the process.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::cache::{Access, ByteRange, CacheLimits, ExportId};
use peerdirect::registrar::libfabric::{
    Endpoint, Fabric, LibfabricError, LibfabricRegistrar, MappedDmaBuf,
};
use peerdirect::{pattern, Allocation, Cause, Device, ExportFlags, RegCache, Registration};

use crate::ibverbs::nic_under_rxe;
use crate::ibverbs_revoke::{bufinfo, BufInfo};
use crate::race::{bound_device, one_bound_to, rebind};
use crate::removal::{waits_reports, Unbinding};
use crate::support::{expect_eq, wait_for, Outcome, Tap};
use crate::testmod::stats;
use crate::{INDEX, SYSFS_DRIVER};

type Cache = RegCache<LibfabricRegistrar>;

const PROVIDER: &str = "verbs;ofi_rxm";
/// Each buffer, and each stream's transfer (ofi_rxm's rendezvous for messages: above its
/// segmentation limit, 128 KiB).
const LEN: u64 = 1 << 20;
/// Transfers each stream completes before the unbind.
const BEFORE_UNBIND: u64 = 3;
/// The endpoints' timeout: a transfer with no completion for this long fails `Stalled`.
const STALL: Duration = Duration::from_secs(20);
/// How long after the unbind's return each stream must have ended.
const ENDS: Duration = Duration::from_secs(15);
/// How long the streams get to reach [`BEFORE_UNBIND`].
const WARM_UP: Duration = Duration::from_secs(60);
/// How long an unbind gets to return.
const UNBIND_LIMIT: Duration = Duration::from_secs(10);
/// How long the cache gets to let go once the handles are dropped.
const BY_ITSELF: Duration = Duration::from_secs(10);
/// The streams' sources' patterns.
const SEEDS: [u64; 2] = [0x5eed_f1e0, 0x5eed_f1e1];
const TAG: u64 = 0x7e0 << 32;

const SETUP: &str = "four 1 MiB HBM buffers (an RMA owner and reader, a sender and a receiver: allocations, or ranges of a companion's BAR) registered through a RegCache attached to /dev/peerdirect0 on verbs;ofi_rxm with FI_MR_DMABUF, host bounce off: every registration path dma_buf, nothing staged, and the dma-buf core lists the NIC under rxe0 attached to each";
const STREAMING: &str = "an fi_read stream (owner's HBM into reader's HBM) and a tagged stream (sender's HBM to receiver's HBM, rendezvous), on endpoints of their own, each complete 3 transfers, the first of each landing its source's pattern";
const UNBOUND: &str = "writing the device to the driver's unbind (a companion's: its owner's) during both streams returns within 10 s, without waiting for the registrations (the kernel reports no 'removal waits')";
const READ_ENDS: &str = "the fi_read stream ends within 15 s of the unbind's return, with the completion error libfabric reports or TransferRevoked once the cache knows (not the endpoint's own timeout), and the next fi_read on the registration is refused at once with TransferRevoked";
const TAGGED_ENDS: &str = "the tagged stream ends within 15 s of the unbind's return, sender and receiver each with the completion error libfabric reports or TransferRevoked (not the endpoint's own timeout), and each one's next transfer is refused at once with TransferRevoked";
const LET_GO: &str = "the listener is told of each of the 4 registrations once (cause device); with the streams' handles dropped the cache holds no entry and has deregistered all 4, and the dma-buf core lists no device attached to any of the dma-bufs";
const REQUEST: &str = "a new request for the owner's range fails with ENODEV (LibfabricError::Revoked naming /dev/peerdirect0 as the device whose export is revoked), and caches nothing";
const REBOUND: &str = "with the files closed the device rebinds, and of the old device's HBM only what the sender's endpoint keeps is left: its 1 MiB allocation (its export revoked, uncounted) if a rendezvous of it was stranded (never completed, never cancelled by ofi_rxm: kept for the life of the process), else nothing";

const GONE: &str =
    "the companion is gone once its owner's unbind returned: /dev/peerdirect0 no longer exists";

/// The driver that owns a companion's device (tests/system/ibimport.sh binds it).
const OWNER_DRIVER: &str = "/sys/bus/pci/drivers/vfio-pci";

/// Prints TAP for `--fabric-revoke` (with `companion`: `/dev/peerdirect0` is a companion of a
/// device [`OWNER_DRIVER`] owns, its HBM ranges of the BAR, and the owner's driver unbinds);
/// success iff every test passed.
pub(crate) fn run(companion: bool) -> ExitCode {
    let mut tap = Tap::plan(8);
    let bdf = if companion {
        one_bound_to(OWNER_DRIVER)
    } else {
        bound_device()
    };
    let device = bdf
        .clone()
        .and_then(|_| Device::open_index(INDEX).map_err(|e| e.to_string()));
    let set = device
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|device| setup(device, companion));
    let last = if companion { GONE } else { REBOUND };
    tap.report(SETUP, &set.as_ref().map(drop).map_err(Clone::clone));
    let (Ok(bdf), Ok(set)) = (bdf, set) else {
        for description in [
            STREAMING,
            UNBOUND,
            READ_ENDS,
            TAGGED_ENDS,
            LET_GO,
            REQUEST,
            last,
        ] {
            tap.report(description, &Err("not run: the setup failed".into()));
        }
        return tap.finish();
    };
    let driver = if companion {
        OWNER_DRIVER
    } else {
        SYSFS_DRIVER
    };
    let sender_stranded = exercise(set, driver, &bdf, &mut tap);
    drop(device);
    if companion {
        let node = format!("/dev/peerdirect{INDEX}");
        let gone = wait_for(UNBIND_LIMIT, || !Path::new(&node).exists())
            .map_err(|secs| format!("{node} still exists {secs} s after the owner's unbind"));
        tap.report(GONE, &gone);
    } else {
        let left = rebind(&bdf).and_then(|()| rebound_but_sender(sender_stranded));
        tap.report(REBOUND, &left);
    }
    tap.finish()
}

/// Everything between the setup and the rebind; closes the endpoints and the dma-bufs.
/// Whether the sender's registration was stranded (its endpoint then keeps it).
fn exercise(set: Set<'_>, driver: &str, bdf: &str, tap: &mut Tap) -> bool {
    let outcomes = streams(&set, driver, bdf);
    let sender_stranded = lock(&set.buffers[2].registration)
        .as_ref()
        .is_some_and(|r| r.mr().stranded());
    println!("# the sender's registration stranded: {sender_stranded}");
    for (description, outcome) in [STREAMING, UNBOUND, READ_ENDS, TAGGED_ENDS]
        .into_iter()
        .zip(outcomes)
    {
        tap.report(description, &outcome);
    }
    tap.report(LET_GO, &let_go(&set.cache, &set.told, &set.buffers));
    tap.report(
        REQUEST,
        &request(&set.cache, &set.registrar, &set.buffers[0]),
    );
    sender_stranded
}

/// [`REBOUND`]: of the old device, only the sender's allocation is left if its registration
/// was stranded (the unbind came while a rendezvous of it was in flight), else nothing (it
/// came between two sends: the next was refused before anything was posted).
fn rebound_but_sender(stranded: bool) -> Outcome {
    let report = stats()?;
    let left = (
        report.uint("allocations")?,
        report.uint("allocated_bytes")?,
        report.uint("exports")?,
    );
    println!("# after the rebind, (allocations, allocated_bytes, exports): {left:?}");
    let kept = if stranded { (1, LEN, 0) } else { (0, 0, 0) };
    expect_eq("(allocations, allocated_bytes, exports)", kept, left)
}

/// One HBM buffer: its allocation (kept, not freed: freeing through the crate would
/// invalidate the export's entries, which the test must see go by themselves), its dma-buf
/// mapped, its identity, the dma-buf core's entry of it before registering, and the handle.
struct Buffer<'d> {
    /// `None` on a companion, whose ranges are the program's to hand out.
    _allocation: Option<Allocation<'d>>,
    hbm: MappedDmaBuf,
    export: ExportId,
    before: BufInfo,
    registration: Mutex<Option<Registration<LibfabricRegistrar>>>,
}

/// What one registration was told.
type Told = Arc<Mutex<Vec<(u64, Cause)>>>;

struct Set<'d> {
    registrar: Arc<LibfabricRegistrar>,
    cache: Arc<Cache>,
    told: Told,
    /// Owner, reader, sender, receiver.
    buffers: Vec<Buffer<'d>>,
    /// The RMA stream's reader and owner, the tagged stream's sender and receiver.
    endpoints: [Endpoint; 4],
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn setup(device: &Device, companion: bool) -> Result<Set<'_>, String> {
    let nic = nic_under_rxe()?;
    let fabric = Fabric::open(PROVIDER, None).map_err(|e| format!("opening {PROVIDER}: {e}"))?;
    let registrar = Arc::new(LibfabricRegistrar::new(fabric));
    registrar.set_host_bounce(false);
    let told: Told = Arc::default();
    let cache = Arc::new(Cache::new(CacheLimits::default()));
    cache.attach(device);
    let heard = Arc::clone(&told);
    cache.set_listener(Some(Arc::new(move |invalidated| {
        lock(&heard).push((invalidated.mr.key(), invalidated.cause));
    })));
    let accesses = [
        (Access::REMOTE_READ, Some(SEEDS[0])),
        (Access::LOCAL_WRITE, None),
        (Access::LOCAL_READ, Some(SEEDS[1])),
        (Access::LOCAL_WRITE, None),
    ];
    let mut buffers = Vec::new();
    let flags = ExportFlags::CLOEXEC | ExportFlags::RDWR;
    for (i, (access, seed)) in (0u64..).zip(accesses) {
        let (allocation, dma_buf) = if companion {
            let dma_buf = device
                .export_range(i * LEN, LEN, flags)
                .map_err(|e| format!("EXPORT_RANGE {:#x}+{LEN:#x}: {e}", i * LEN))?;
            (None, dma_buf)
        } else {
            let allocation = device
                .alloc(LEN, None)
                .map_err(|e| format!("alloc {LEN}: {e}"))?;
            let dma_buf = allocation
                .export(0, 0, flags)
                .map_err(|e| format!("export: {e}"))?;
            (Some(allocation), dma_buf)
        };
        let (export, hbm) = mapped(device, dma_buf, LEN, seed)?;
        let ino = export.dma_buf_inode();
        let before = bufinfo(ino)?.ok_or_else(|| format!("bufinfo lists no inode {ino}"))?;
        let range = ByteRange::new(0, LEN).map_err(|e| e.to_string())?;
        let registration = cache
            .get(&registrar, &hbm, export, range, access)
            .map_err(|e| format!("RegCache::get: {e}"))?;
        let mr = registration.mr();
        if !mr.path().is_direct() || mr.staging_bytes() != 0 {
            return Err(format!(
                "path {:?}, {} bytes staged",
                mr.path(),
                mr.staging_bytes()
            ));
        }
        let during = bufinfo(ino)?;
        let attached = during.as_ref().map(|b| b.attached.clone());
        expect_eq(
            "devices attached while registered",
            Some(vec![nic.clone()]),
            attached,
        )?;
        buffers.push(Buffer {
            _allocation: allocation,
            hbm,
            export,
            before,
            registration: Mutex::new(Some(registration)),
        });
    }
    let endpoint = || {
        registrar.fabric().endpoint().map(|mut e| {
            e.set_timeout(STALL);
            e
        })
    };
    let endpoints = [endpoint(), endpoint(), endpoint(), endpoint()];
    let [Ok(a), Ok(b), Ok(c), Ok(d)] = endpoints else {
        return Err(format!("fi_endpoint: {:?}", endpoints.map(|e| e.err())));
    };
    Ok(Set {
        registrar,
        cache,
        told,
        buffers,
        endpoints: [a, b, c, d],
    })
}

/// `dma_buf` (an export of `device`) mapped, its identity, and its first `len` bytes written:
/// `seed`'s pattern, or zeros.
pub(crate) fn mapped(
    device: &Device,
    dma_buf: peerdirect::DmaBuf,
    len: u64,
    seed: Option<u64>,
) -> Result<(ExportId, MappedDmaBuf), String> {
    let export = device
        .export_id(&dma_buf)
        .map_err(|e| format!("fstat of the dma-buf: {e}"))?;
    let mut hbm = MappedDmaBuf::new(dma_buf).map_err(|e| e.to_string())?;
    let mut data = vec![0u8; usize::try_from(len).map_err(|e| e.to_string())?];
    if let Some(seed) = seed {
        pattern::fill(seed, 0, &mut data);
    }
    hbm.write(0, &data);
    Ok((export, hbm))
}

/// How a stream ended.
struct End {
    /// Transfers completed.
    done: u64,
    /// The error, and when it came.
    error: Option<(LibfabricError, Instant)>,
}

/// Runs both streams, unbinds the device once each has completed [`BEFORE_UNBIND`]
/// transfers, and judges [`STREAMING`], [`UNBOUND`], [`READ_ENDS`], [`TAGGED_ENDS`].
fn streams(set: &Set<'_>, driver: &str, bdf: &str) -> [Outcome; 4] {
    let [reader, owner, sender, receiver] = &set.endpoints;
    let mr = |i: usize| {
        lock(&set.buffers[i].registration)
            .as_ref()
            .map(|r| r.mr().remote(0, set.registrar.fabric().caps().mr_virt_addr))
    };
    let (Some(Some(remote)), Ok(to_owner), Ok(to_receiver)) = (
        mr(0),
        owner
            .address()
            .and_then(|a| reader.insert_peer(&a))
            .and_then(|p| owner.insert_peer(&reader.address()?).map(|_| p)),
        receiver
            .address()
            .and_then(|a| sender.insert_peer(&a))
            .and_then(|p| receiver.insert_peer(&sender.address()?).map(|_| p)),
    ) else {
        let not = Err("not run: no RMA address or the endpoints' addresses".to_owned());
        return [not.clone(), not.clone(), not.clone(), not];
    };
    let counts = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let first_wrong: Mutex<Vec<String>> = Mutex::default();
    let stop = AtomicBool::new(false);
    let check_first = |n: u64, buffer: usize, seed: u64, what: &str| {
        if n != 0 {
            return;
        }
        let mut got = vec![0u8; LEN as usize];
        set.buffers[buffer].hbm.read(0, &mut got);
        if let Some(m) = pattern::first_mismatch(seed, 0, &got) {
            lock(&first_wrong).push(format!(
                "{what}: byte {:#x} is {:#04x}, expected {:#04x}",
                m.offset, m.found, m.expected
            ));
        }
    };
    let read = || {
        let mr = lock(&set.buffers[1].registration);
        let mr = mr.as_ref().expect("held until the end").mr();
        reader.read(mr, 0, LEN, to_owner, remote)?;
        check_first(
            counts[0].load(SeqCst),
            1,
            SEEDS[0],
            "the reader's first fi_read",
        );
        Ok(())
    };
    let send = || {
        let mr = lock(&set.buffers[2].registration);
        let mr = mr.as_ref().expect("held until the end").mr();
        sender.send(mr, 0, LEN, to_receiver, TAG)
    };
    let recv = || {
        let mr = lock(&set.buffers[3].registration);
        let mr = mr.as_ref().expect("held until the end").mr();
        receiver.recv(mr, 0, LEN, TAG)?;
        check_first(
            counts[2].load(SeqCst),
            3,
            SEEDS[1],
            "the receiver's first message",
        );
        Ok(())
    };
    thread::scope(|s| {
        // The RMA target posts nothing; its CQ is read for progress, until the end.
        s.spawn(|| {
            while !stop.load(SeqCst) {
                let _ = owner.progress();
                thread::yield_now();
            }
        });
        let handles = [
            s.spawn(|| stream(&counts[0], &stop, read)),
            s.spawn(|| stream(&counts[1], &stop, send)),
            s.spawn(|| stream(&counts[2], &stop, recv)),
        ];
        let warm = wait_for(WARM_UP, || {
            counts.iter().all(|c| c.load(SeqCst) >= BEFORE_UNBIND)
        });
        let seen = counts.each_ref().map(|c| c.load(SeqCst));
        let streaming = warm
            .map_err(|secs| format!("after {secs} s: reads, sends, receives completed: {seen:?}"))
            .and_then(|()| match lock(&first_wrong).first() {
                Some(wrong) => Err(wrong.clone()),
                None => Ok(()),
            });
        let mut unbound = Err("not run: the streams did not start".to_owned());
        let mut returned = Instant::now();
        if streaming.is_ok() {
            let waits = waits_reports();
            let unbinding = Unbinding::of_driver(driver, bdf);
            unbound = unbinding.finish(UNBIND_LIMIT).and_then(|took| {
                returned = Instant::now();
                println!(
                    "# the unbind returned {} ms after it started, with {:?} reads, sends, receives done",
                    took.as_millis(),
                    counts.each_ref().map(|c| c.load(SeqCst))
                );
                let after = waits_reports()?;
                expect_eq("'removal waits' reports", 0, after - waits?)
            });
        }
        // Whatever happened, every stream ends by the deadline or is stopped then.
        let deadline = returned + ENDS;
        let _ = wait_for(ENDS + Duration::from_secs(1), || {
            handles.iter().all(|h| h.is_finished()) || Instant::now() > deadline
        });
        stop.store(true, SeqCst);
        let ends = handles.map(|h| h.join().expect("a stream panicked"));
        let judge = |what: &str, end: &End, again: &dyn Fn() -> Result<(), LibfabricError>| {
            let Some((error, at)) = &end.error else {
                return Err(format!(
                    "{what}: still running {} s after the unbind returned ({} done)",
                    ENDS.as_secs(),
                    end.done
                ));
            };
            let after = at.saturating_duration_since(returned);
            println!(
                "# {what}: ended {} ms after the unbind returned, {} done: {error}",
                after.as_millis(),
                end.done
            );
            match error {
                LibfabricError::Completion { .. } => {}
                LibfabricError::TransferRevoked {
                    hbm_device: INDEX, ..
                } => {}
                other => {
                    return Err(format!(
                        "{what}: expected a completion error or TransferRevoked, got {other:?}"
                    ))
                }
            }
            if after > ENDS {
                return Err(format!(
                    "{what}: ended {} ms after the unbind",
                    after.as_millis()
                ));
            }
            let asked = Instant::now();
            match again() {
                Err(LibfabricError::TransferRevoked {
                    hbm_device: INDEX, ..
                }) if asked.elapsed() < Duration::from_secs(1) => Ok(()),
                other => Err(format!(
                    "{what}: the next transfer got {other:?} after {} ms; expected TransferRevoked at once",
                    asked.elapsed().as_millis()
                )),
            }
        };
        let not_unbound = |o: Outcome| o.and_then(|()| unbound.clone());
        let read_ends = not_unbound(judge("the fi_read stream", &ends[0], &read));
        let sender = judge("the sender", &ends[1], &send);
        let receiver = judge("the receiver", &ends[2], &recv);
        let tagged = not_unbound(sender.and(receiver));
        [streaming, unbound.clone(), read_ends, tagged]
    })
}

/// Runs `step` until it fails or `stop` is set, counting its successes in `count`.
fn stream(
    count: &AtomicU64,
    stop: &AtomicBool,
    step: impl Fn() -> Result<(), LibfabricError>,
) -> End {
    loop {
        if stop.load(SeqCst) {
            return End {
                done: count.load(SeqCst),
                error: None,
            };
        }
        if let Err(e) = step() {
            return End {
                done: count.load(SeqCst),
                error: Some((e, Instant::now())),
            };
        }
        count.fetch_add(1, SeqCst);
    }
}

/// [`LET_GO`].
fn let_go(cache: &Cache, told: &Told, buffers: &[Buffer<'_>]) -> Outcome {
    let keys: Vec<u64> = buffers
        .iter()
        .filter_map(|b| lock(&b.registration).as_ref().map(|r| r.mr().key()))
        .collect();
    wait_for(BY_ITSELF, || lock(told).len() >= keys.len())
        .map_err(|secs| format!("within {secs} s the listener was told {:?}", lock(told)))?;
    for buffer in buffers {
        drop(lock(&buffer.registration).take());
    }
    let stats = cache.stats();
    let done = wait_for(BY_ITSELF, || {
        let stats = cache.stats();
        stats.entries == 0 && stats.deregistrations == 4
    });
    done.map_err(|secs| format!("within {secs} s: {:?}", cache.stats()))?;
    let mut heard = lock(told).clone();
    heard.sort_by_key(|&(key, _)| key);
    let mut expected: Vec<(u64, Cause)> = keys.iter().map(|&k| (k, Cause::Device)).collect();
    expected.sort_by_key(|&(key, _)| key);
    expect_eq("told", expected, heard)?;
    expect_eq("registrations", 4, stats.registrations)?;
    for buffer in buffers {
        let ino = buffer.export.dma_buf_inode();
        let mut now = None;
        wait_for(BY_ITSELF, || {
            now = bufinfo(ino).ok().flatten();
            now.as_ref() == Some(&buffer.before)
        })
        .map_err(|secs| {
            format!(
                "within {secs} s, bufinfo lists {now:?} for inode {ino}; expected {:?}, as before the registration",
                buffer.before
            )
        })?;
    }
    Ok(())
}

/// [`REQUEST`].
fn request(cache: &Cache, registrar: &Arc<LibfabricRegistrar>, owner: &Buffer<'_>) -> Outcome {
    let range = ByteRange::new(0, LEN).map_err(|e| e.to_string())?;
    let err = match cache.get(
        registrar,
        &owner.hbm,
        owner.export,
        range,
        Access::REMOTE_READ,
    ) {
        Ok(r) => return Err(format!("the request got a registration: {:?}", r.mr())),
        Err(err) => err,
    };
    println!("# after the removal: {err}");
    expect_eq("errno", Some(rustix::io::Errno::NODEV), err.errno())?;
    let text = err.to_string();
    let export = format!("the export of /dev/peerdirect{INDEX} is revoked");
    if !text.contains(&export) {
        return Err(format!("{export:?} missing from: {text}"));
    }
    expect_eq("entries", 0, cache.stats().entries)
}

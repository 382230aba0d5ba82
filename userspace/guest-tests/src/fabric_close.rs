//! `--fabric-close`: an endpoint closed while its provider still holds a message for it that
//! nobody asked for, as a runtime's endpoint is closed while a peer is still sending to it
//! (`qemu/run --rxe-dmabuf`; `verbs;ofi_rxm` on rxe0, HBM registered with `FI_MR_DMABUF`).
//!
//! libfabric 2.1's ofi_rxm (Debian trixie's) closes each connection's endpoint and only then
//! handles the completions left in its queue: for a message received there it posts a new
//! receive buffer on the endpoint it has just freed. The crate's endpoint reads its queue
//! before closing ([`peerdirect::registrar::libfabric::Endpoint`]'s drop), so that ofi_rxm
//! handles the message while the connection is open. The program runs with glibc's heap
//! perturbed (`GLIBC_TUNABLES=glibc.malloc.perturb=N`, which the suite sets and the setup
//! checks): freed memory is overwritten, so a use of the freed endpoint crashes the program
//! (its report, `crash.rs`, names the frames) instead of reading what happens to be left.

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use peerdirect::cache::{Access, ByteRange, CacheLimits};
use peerdirect::registrar::libfabric::{Endpoint, Fabric, LibfabricRegistrar, MappedDmaBuf, Peer};
use peerdirect::{pattern, Allocation, Device, ExportFlags, RegCache, Registration};

use crate::fabric_revoke::mapped;
use crate::support::Tap;
use crate::INDEX;

const PROVIDER: &str = "verbs;ofi_rxm";
/// Each message: one chunk, below ofi_rxm's eager limit (sent without a rendezvous, so that it
/// lands in the receiver's buffers whether or not the receiver's program takes part).
const LEN: u64 = 4096;
/// The HBM allocated for each side.
const ALLOCATION: u64 = 1 << 20;
const TAG: u64 = 0xc105 << 32;
const SEED: u64 = 0x5eed_c105;
/// How long the unread message gets to land in the receiver's queue after the sender's
/// completion (rxe completes the receive before it acknowledges the send).
const LAND: Duration = Duration::from_millis(200);

const SETUP: &str = "glibc's heap perturbed (GLIBC_TUNABLES=glibc.malloc.perturb), two endpoints on verbs;ofi_rxm, each with 1 MiB of HBM registered through a RegCache with FI_MR_DMABUF";
const FIRST: &str = "a first 4 KiB tagged message from A reaches B, which receives it (A and B are connected), with A's bytes";
const UNREAD: &str = "a second message, which B never asks for and never reads its queue for, completes at A (ofi_rxm's eager protocol: it lands in B's receive buffers)";
const CLOSED: &str = "B's endpoint closes with that message unhandled in its provider's queue, then A's, and the program goes on (libfabric 2.1's ofi_rxm would repost B's receive buffer on the endpoint it freed)";

type Cache = RegCache<LibfabricRegistrar>;

/// One side: its HBM, mapped, and its registration.
struct Side<'d> {
    _allocation: Allocation<'d>,
    hbm: MappedDmaBuf,
    registration: Registration<LibfabricRegistrar>,
}

/// Prints TAP for `--fabric-close`; success iff every test passed.
pub(crate) fn run() -> ExitCode {
    let mut tap = Tap::plan(4);
    let device = Device::open_index(INDEX).map_err(|e| e.to_string());
    let set = device.as_ref().map_err(Clone::clone).and_then(setup);
    tap.report(SETUP, &set.as_ref().map(drop).map_err(Clone::clone));
    let Ok((_registrar, _cache, [a, b], [side_a, side_b])) = set else {
        for description in [FIRST, UNREAD, CLOSED] {
            tap.report(description, &Err("not run: the setup failed".into()));
        }
        return tap.finish();
    };
    let first = first(&a, &b, &side_a, &side_b);
    tap.report(FIRST, &first.as_ref().map(drop).map_err(Clone::clone));
    let unread = first.and_then(|to_b| {
        a.send(side_a.registration.mr(), 0, LEN, to_b, TAG + 1)
            .map_err(|e| format!("the second send: {e}"))
    });
    tap.report(UNREAD, &unread);
    let closed = unread.map(|()| {
        thread::sleep(LAND);
        drop(b);
        drop(a);
    });
    tap.report(CLOSED, &closed);
    tap.finish()
}

type Set<'d> = (
    Arc<LibfabricRegistrar>,
    Arc<Cache>,
    [Endpoint; 2],
    [Side<'d>; 2],
);

fn setup(device: &Device) -> Result<Set<'_>, String> {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if !tunables.contains("glibc.malloc.perturb=") {
        return Err(format!(
            "GLIBC_TUNABLES is {tunables:?}: run with glibc.malloc.perturb=N, so that a use of freed memory crashes"
        ));
    }
    let fabric = Fabric::open(PROVIDER, None).map_err(|e| format!("opening {PROVIDER}: {e}"))?;
    let registrar = Arc::new(LibfabricRegistrar::new(fabric));
    registrar.set_host_bounce(false);
    let cache = Arc::new(Cache::new(CacheLimits::default()));
    cache.attach(device);
    let side = |access, seed: Option<u64>| -> Result<Side<'_>, String> {
        let allocation = device
            .alloc(ALLOCATION, None)
            .map_err(|e| format!("alloc {ALLOCATION}: {e}"))?;
        let dma_buf = allocation
            .export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)
            .map_err(|e| format!("export: {e}"))?;
        let (export, hbm) = mapped(device, dma_buf, LEN, seed)?;
        let range = ByteRange::new(0, ALLOCATION).map_err(|e| e.to_string())?;
        let registration = cache
            .get(&registrar, &hbm, export, range, access)
            .map_err(|e| format!("RegCache::get: {e}"))?;
        if !registration.mr().path().is_direct() {
            return Err(format!("path {:?}", registration.mr().path()));
        }
        Ok(Side {
            _allocation: allocation,
            hbm,
            registration,
        })
    };
    let sides = [
        side(Access::LOCAL_READ, Some(SEED))?,
        side(Access::LOCAL_WRITE, None)?,
    ];
    let endpoint = || {
        registrar
            .fabric()
            .endpoint()
            .map_err(|e| format!("fi_endpoint: {e}"))
    };
    let endpoints = [endpoint()?, endpoint()?];
    Ok((registrar, cache, endpoints, sides))
}

/// [`FIRST`]: B receives in a thread of its own (its reads drive the connection's set-up
/// on its side) while A sends. A's address of B.
fn first(a: &Endpoint, b: &Endpoint, side_a: &Side<'_>, side_b: &Side<'_>) -> Result<Peer, String> {
    let to_b = a
        .insert_peer(&b.address().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    b.insert_peer(&a.address().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let (sent, received) = thread::scope(|s| {
        let receiving = s.spawn(|| b.recv(side_b.registration.mr(), 0, LEN, TAG));
        let sent = a.send(side_a.registration.mr(), 0, LEN, to_b, TAG);
        (sent, receiving.join().expect("the receiver panicked"))
    });
    sent.map_err(|e| format!("the first send: {e}"))?;
    received.map_err(|e| format!("the first receive: {e}"))?;
    let mut got = vec![0u8; LEN as usize];
    side_b.hbm.read(0, &mut got);
    match pattern::first_mismatch(SEED, 0, &got) {
        Some(m) => Err(format!(
            "byte {:#x} of B's buffer is {:#04x}, expected {:#04x}",
            m.offset, m.found, m.expected
        )),
        None => Ok(to_b),
    }
}

//! `--fabric-peer NODE PEER_IP`: libfabric RMA between the HBMs of two hosts, as HCL moves
//! bytes: `fi_write` and `fi_read` on `verbs;ofi_rxm` endpoints, HBM registered with
//! `FI_MR_DMABUF` through the crate's cache and registrar, on two guests whose NICs are linked
//! (`qemu/run --rxe-dmabuf --link`, rxe0 on each: tests/system/rxe-dmabuf.sh's `two_hosts`).
//! Node 0 listens on a TCP side channel, node 1 connects to it at `PEER_IP`; the side channel
//! carries what libfabric needs from the peer (the endpoint's address, the RMA addresses and
//! keys of A and B) and the barriers. TAP, the same plan on both nodes.
//!
//! - Three 4 MiB ranges of this host's HBM: A with this host's pattern (seed
//!   [`SEED`] + node), B and C zeroed, registered (A for remote reads, B for remote writes, C
//!   as an `fi_read` destination) with host bounce disallowed: each must be path `dma_buf`.
//! - Each host `fi_write`s its A into the peer's B and `fi_read`s the peer's A into its C, at
//!   the same time as the peer does the same (each endpoint is initiator and target at once; a
//!   thread drives its progress throughout); C is checked at once, B once the peer's message
//!   on the side channel, sent after its write completed, arrives. Both are reported for the
//!   host to check in the HBM backing file (`# hbm-b`, `# hbm-c`).
//! - Revocation across the link: node 1 streams 1 MiB `fi_read`s (one operation each) out of
//!   node 0's A; after some good ones it says so and node 0 unbinds its HBM device. Node 0's
//!   unbind must return within 10 s; node 1's stream must end in an `fi_read` completion error
//!   (`FI_EIO`: node 0's rxe answers with a remote access error), not in a stall
//!   ([`LibfabricError::Stalled`]: libfabric never reporting the failure), with every read
//!   accounted for and none started after the unbind returned succeeding.
//! - Everything closes (node 1's endpoint with its broken connection among it), and the device
//!   (node 0's rebound) has nothing allocated or exported.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::cache::{Access, ByteRange, CacheLimits, ExportId, RegCache};
use peerdirect::registrar::libfabric::{
    Endpoint, Fabric, FabricMr, LibfabricError, LibfabricRegistrar, MappedDmaBuf, Peer, RemoteMr,
};
use peerdirect::{pattern, Allocation, Device, ExportFlags, RegPath};

use crate::fabric::progressing;
use crate::race::{bound_device, expect_idle, rebind};
use crate::removal::Unbinding;
use crate::support::{Outcome, Tap};
use crate::INDEX;

/// What both hosts run: verbs on rxe0 under ofi_rxm's reliable datagrams, as HCL does.
const PROVIDER: &str = "verbs;ofi_rxm";
/// Each range.
const LEN: u64 = 4 << 20;
/// Allocated first and kept: the ranges lie past the three that `rxe_dmabuf peer`, which runs
/// before in the same boot, left for the host to check (the allocator starts again at the
/// bottom once that program's are freed, or after a rebind).
const PAD: u64 = 3 * LEN;
/// A's pattern is seeded with this plus the node.
const SEED: u64 = 0x5eed_1000;
/// The side channel's port (`rxe_dmabuf peer` uses 18515).
const PORT: u16 = 18517;
/// How long either side waits for the other on the side channel: the guests boot side by
/// side, not in step, and one may be slower (KASAN).
const PEER_WAIT: Duration = Duration::from_secs(120);
/// Each read of the revocation stream: one `fi_read` operation ([`peerdirect`]'s chunk).
const STREAM_READ: u64 = 1 << 20;
/// Good reads of the stream before node 1 asks node 0 to unbind.
const GOOD_BEFORE: u64 = 8;
/// How long node 1's endpoint waits for a completion before it calls the transfer stalled.
const STREAM_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the stream may go on once node 0's unbind returned.
const STREAM_LIMIT: Duration = Duration::from_secs(40);
/// libfabric's `FI_EIO` (errno's `EIO`).
const FI_EIO: i32 = 5;
/// How long node 0's unbind gets to return: rxe's import is revocable, nothing is waited for.
const UNBIND_LIMIT: Duration = Duration::from_secs(10);

const SETUP: &str = "three 4 MiB ranges of this host's HBM (A with its pattern, B and C zeroed) registered through a RegCache with LibfabricRegistrar on verbs;ofi_rxm, host bounce disallowed: A (remote read), B (remote write) and C (fi_read destination) all path dma_buf, nothing staged";
const CONNECTED: &str = "the endpoint's address and the RMA addresses and keys of A and B exchanged with the peer over a TCP side channel, the peer's endpoint inserted in the address vector";
const WRITE: &str =
    "fi_write of 4 MiB from this host's A into the peer's B, HBM to HBM across the link, completes";
const READ: &str =
    "fi_read of 4 MiB of the peer's A into this host's C completes, and C holds the peer's pattern";
const WRITTEN: &str = "once the peer's fi_write completed (its side-channel message after it arrived), this host's B holds the peer's pattern";
const UNBOUND: &str =
    "unbinding this host's HBM device while node 1 streams fi_reads out of A returns within 10 s";
const STREAM: &str = "node 0 unbinding its HBM device while this host streams 1 MiB fi_reads out of its A: the stream ends in an fi_read completion error (FI_EIO, not a stall) within the endpoint's 20 s timeout, every posted read completed, none started after the unbind returned succeeded";
const IDLE_0: &str = "with the endpoint, registrations and files closed, the HBM device rebinds with nothing allocated or exported and all HBM free";
const IDLE_1: &str = "the endpoint (its connection to node 0 broken), registrations and files close, and the HBM device has nothing allocated or exported and all HBM free";

type Cache = RegCache<LibfabricRegistrar>;
type Handle = peerdirect::Registration<LibfabricRegistrar>;

/// Prints TAP for `--fabric-peer`; success iff every test passed.
pub(crate) fn run(node: &str, peer_ip: &str) -> ExitCode {
    let mut tap = Reports {
        tap: Tap::plan(7),
        done: 0,
    };
    let node: u8 = match node {
        "0" => 0,
        "1" => 1,
        other => {
            println!("Bail out! NODE must be 0 or 1, got {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(peer_ip) = peer_ip.parse::<Ipv4Addr>() else {
        println!("Bail out! PEER_IP must be an IPv4 address, got {peer_ip:?}");
        return ExitCode::FAILURE;
    };
    // Node 0 unbinds its device, and binds it again at the end.
    let started = (if node == 0 {
        bound_device().map(Some)
    } else {
        Ok(None)
    })
    .and_then(|bdf| Ok((bdf, Device::open_index(INDEX).map_err(|e| e.to_string())?)));
    let rest = match started {
        Ok((bdf, device)) => {
            let released = two_hosts(&mut tap, node, peer_ip, bdf.as_deref(), &device);
            drop(device);
            released.map(|()| bdf)
        }
        Err(err) => Err(format!("not run: {err}")),
    };
    let idle = match rest {
        Ok(Some(bdf)) => rebind(&bdf).and_then(|()| expect_idle()),
        Ok(None) => expect_idle(),
        Err(err) => {
            // What was left unreported.
            while tap.done < 6 {
                tap.report(description(tap.done + 1, node), &Err(err.clone()));
            }
            Err("not run: an earlier step failed".to_owned())
        }
    };
    tap.report(description(7, node), &idle);
    tap.tap.finish()
}

/// The TAP output, and how many tests it reported.
struct Reports {
    tap: Tap,
    done: usize,
}

impl Reports {
    fn report(&mut self, description: &str, outcome: &Outcome) {
        self.tap.report(description, outcome);
        self.done += 1;
    }
}

/// Test `n`'s description on `node`.
fn description(n: usize, node: u8) -> &'static str {
    match (n, node) {
        (1, _) => SETUP,
        (2, _) => CONNECTED,
        (3, _) => WRITE,
        (4, _) => READ,
        (5, _) => WRITTEN,
        (6, 0) => UNBOUND,
        (6, _) => STREAM,
        (_, 0) => IDLE_0,
        _ => IDLE_1,
    }
}

/// A range of this host's HBM, mapped (to seed and check it only) and exported RDWR.
struct Range<'d> {
    alloc: Allocation<'d>,
    hbm: MappedDmaBuf,
    export: ExportId,
}

impl<'d> Range<'d> {
    fn new(device: &'d Device, seed: Option<u64>) -> Result<Self, String> {
        let alloc = device
            .alloc(LEN, None)
            .map_err(|e| format!("alloc {LEN}: {e}"))?;
        let dma_buf = alloc
            .export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)
            .map_err(|e| format!("export: {e}"))?;
        let export = ExportId::of_dma_buf(INDEX, &dma_buf).map_err(|e| format!("fstat: {e}"))?;
        let mut hbm = MappedDmaBuf::new(dma_buf).map_err(|e| e.to_string())?;
        let mut data = vec![0u8; LEN as usize];
        if let Some(seed) = seed {
            pattern::fill(seed, 0, &mut data);
        }
        hbm.write(0, &data);
        Ok(Self { alloc, hbm, export })
    }

    fn register(
        &self,
        cache: &Cache,
        registrar: &Arc<LibfabricRegistrar>,
        what: &str,
        access: Access,
    ) -> Result<Handle, String> {
        let whole = ByteRange::new(0, LEN).map_err(|e| e.to_string())?;
        let mr = cache
            .get(registrar, &self.hbm, self.export, whole, access)
            .map_err(|e| format!("registering {what}: {e}"))?;
        match mr.mr().path() {
            RegPath::DmaBuf if mr.mr().staging_bytes() == 0 => Ok(mr),
            path => Err(format!(
                "{what}: expected path dma_buf with nothing staged, got {path:?} with {} bytes staged",
                mr.mr().staging_bytes()
            )),
        }
    }

    /// Whether it holds `seed`'s pattern.
    fn expect(&self, what: &str, seed: u64) -> Outcome {
        let mut got = vec![0u8; LEN as usize];
        self.hbm.read(0, &mut got);
        match pattern::first_mismatch(seed, 0, &got) {
            None => Ok(()),
            Some(m) => Err(format!(
                "{what} differs from the pattern of seed {seed:#x} at byte {:#x}: expected {:#04x}, found {:#04x}",
                m.offset, m.expected, m.found
            )),
        }
    }
}

/// Tests 1 to 6; then everything of this host's is closed (the device file by the caller).
/// `Err` if a step failed before test 6 was reported, with the reason for the rest.
fn two_hosts(
    tap: &mut Reports,
    node: u8,
    peer_ip: Ipv4Addr,
    bdf: Option<&str>,
    device: &Device,
) -> Result<(), String> {
    let (seed, peer_seed) = (SEED + u64::from(node), SEED + u64::from(1 - node));
    // Set-up: the ranges, the registrar, the registrations, the endpoint.
    let setup = (|| {
        let pad = device
            .alloc(PAD, None)
            .map_err(|e| format!("alloc {PAD}: {e}"))?;
        let ranges = [
            Range::new(device, Some(seed))?,
            Range::new(device, None)?,
            Range::new(device, None)?,
        ];
        let fabric =
            Fabric::open(PROVIDER, None).map_err(|e| format!("opening {PROVIDER}: {e}"))?;
        let registrar = Arc::new(LibfabricRegistrar::new(fabric));
        registrar.set_host_bounce(false);
        let cache = RegCache::new(CacheLimits::default());
        let a = ranges[0].register(
            &cache,
            &registrar,
            "A",
            Access::LOCAL_READ | Access::REMOTE_READ,
        )?;
        let b = ranges[1].register(
            &cache,
            &registrar,
            "B",
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let c = ranges[2].register(&cache, &registrar, "C", Access::LOCAL_WRITE)?;
        let stats = registrar.path_stats();
        if (stats.dma_buf, stats.host_bounce) != (3, 0) {
            return Err(format!(
                "expected 3 dma_buf registrations and no host bounce, got {stats:?}"
            ));
        }
        let caps = registrar.fabric().caps().clone();
        if !caps.rma {
            return Err(format!(
                "{PROVIDER} on {} does not advertise FI_RMA",
                caps.domain
            ));
        }
        let endpoint = registrar.fabric().endpoint().map_err(|e| e.to_string())?;
        println!(
            "# {} on {}: FI_MR_VIRT_ADDR {}, keys A {:#x} B {:#x} C {:#x}",
            caps.provider,
            caps.domain,
            caps.mr_virt_addr,
            a.mr().key(),
            b.mr().key(),
            c.mr().key()
        );
        // For the host: where B and C are in the HBM BAR, and what they must hold.
        for (name, range) in [("hbm-b", &ranges[1]), ("hbm-c", &ranges[2])] {
            println!(
                "# {name} offset={:#x} length={LEN:#x} seed={peer_seed:#x}",
                range.alloc.hbm_offset()
            );
        }
        Ok((pad, ranges, registrar, cache, [a, b, c], endpoint))
    })();
    tap.report(SETUP, &setup.as_ref().map(drop).map_err(Clone::clone));
    let (pad, ranges, registrar, cache, [a, b, c], mut endpoint) =
        setup.map_err(|_| "not run: the set-up failed".to_owned())?;
    let virt_addr = registrar.fabric().caps().mr_virt_addr;

    // The side channel, and what the peer needs.
    let connected = (|| {
        let mut channel = SideChannel::connect(node, peer_ip)?;
        let remote = |mr: &Handle, what| {
            mr.mr()
                .remote(0, virt_addr)
                .ok_or_else(|| format!("{what}'s dma_buf registration offers no RMA address"))
        };
        let me = Info {
            address: endpoint.address().map_err(|e| e.to_string())?,
            a: remote(&a, "A")?,
            b: remote(&b, "B")?,
        };
        let them = Info::decode(&channel.swap(&me.encode())?)?;
        let peer = endpoint
            .insert_peer(&them.address)
            .map_err(|e| e.to_string())?;
        channel.barrier(b'c')?;
        println!(
            "# this endpoint's address {}; the peer's {}; the peer's A at {:#x} key {:#x}, B at {:#x} key {:#x}",
            hex(&me.address),
            hex(&them.address),
            them.a.addr,
            them.a.key,
            them.b.addr,
            them.b.key
        );
        Ok((channel, them, peer))
    })();
    tap.report(
        CONNECTED,
        &connected.as_ref().map(drop).map_err(Clone::clone),
    );
    let (mut channel, them, peer) =
        connected.map_err(|_| "not run: no connection to the peer".to_owned())?;

    // Tests 3 to 5 under libfabric's default timeout (a 4 MiB transfer's first chunk may take
    // long under KASAN), the revocation under a shorter one.
    exchange_hbm(
        tap,
        &mut channel,
        &endpoint,
        peer,
        &them,
        (a.mr(), c.mr()),
        &ranges,
        peer_seed,
    );
    endpoint.set_timeout(STREAM_TIMEOUT);
    let revoked = progressing(&endpoint, || {
        if node == 0 {
            unbind(&mut channel, bdf.expect("node 0 knows its device"))
        } else {
            stream(&mut channel, &endpoint, peer, them.a, c.mr())
        }
    });
    tap.report(if node == 0 { UNBOUND } else { STREAM }, &revoked);
    // Node 1's endpoint's connection is broken now: closing it must not crash (ofi_rxm), nor
    // closing the registrations, the domain and the fabric after it.
    drop(endpoint);
    drop((a, b, c));
    drop(cache);
    drop(registrar);
    drop(ranges);
    drop(pad);
    drop(channel);
    Ok(())
}

/// Tests 3 to 5: this host's `fi_write` of its A into the peer's B and `fi_read` of the
/// peer's A into its C, the peer doing the same meanwhile, and B once the peer's write is
/// done.
#[allow(clippy::too_many_arguments)]
fn exchange_hbm(
    tap: &mut Reports,
    channel: &mut SideChannel,
    endpoint: &Endpoint,
    peer: Peer,
    them: &Info,
    (a, c): (&FabricMr, &FabricMr),
    ranges: &[Range<'_>; 3],
    peer_seed: u64,
) {
    let (written, read, synced) = progressing(endpoint, || {
        let start = Instant::now();
        let written = endpoint.write(a, 0, LEN, peer, them.b);
        let write_secs = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let read = endpoint.read(c, 0, LEN, peer, them.a);
        let read_secs = start.elapsed().as_secs_f64();
        // This host's write completed (or failed): the peer may look at its B once this
        // arrives, and this host at its own once the peer's does (the peer may still be
        // reading this host's A until then).
        let synced = channel.barrier(if written.is_ok() { b'w' } else { b'x' });
        ((written, write_secs), (read, read_secs), synced)
    });
    for (what, (result, secs)) in [("fi_write", &written), ("fi_read", &read)] {
        if result.is_ok() {
            println!(
                "# timing: {what} of 4 MiB HBM to HBM across the link in {secs:.3} s ({:.1} MiB/s)",
                4.0 / secs
            );
        }
    }
    let (written, read) = (written.0, read.0);
    tap.report(
        WRITE,
        &written
            .as_ref()
            .map(drop)
            .map_err(|e| format!("fi_write: {e}")),
    );
    tap.report(
        READ,
        &read
            .as_ref()
            .map_err(|e| format!("fi_read: {e}"))
            .and_then(|()| ranges[2].expect("C", peer_seed)),
    );
    tap.report(
        WRITTEN,
        &match synced {
            Ok(()) => ranges[1].expect("B", peer_seed),
            Err(e) if e.contains("got 'x'") => Err("the peer's fi_write failed".to_owned()),
            Err(e) => Err(e),
        },
    );
}

/// Node 0's side of the revocation: waits for node 1's word that its stream runs, unbinds the
/// device, tells node 1, and waits for its stream to end (whatever the unbind did: nothing of
/// this host's closes before node 1's stream has ended).
fn unbind(channel: &mut SideChannel, bdf: &str) -> Outcome {
    channel.barrier(b's')?;
    let took = Unbinding::start(bdf).finish(UNBIND_LIMIT);
    let told = channel.barrier(b'u').and_then(|()| channel.barrier(b'e'));
    let took = took?;
    println!(
        "# timing: the unbind returned {} ms after it started, node 1 streaming fi_reads out of A",
        took.as_millis()
    );
    told
}

/// What node 1's stream did.
#[derive(Default)]
struct Stream {
    posted: AtomicU64,
    good: AtomicU64,
    /// Good reads that started after node 0's unbind returned.
    good_after: AtomicU64,
    /// Node 0's unbind has returned.
    unbound: AtomicBool,
    stop: AtomicBool,
}

/// Node 1's side: streams 1 MiB `fi_read`s of node 0's A into C until one fails; after
/// [`GOOD_BEFORE`] good ones, asks node 0 to unbind.
fn stream(
    channel: &mut SideChannel,
    endpoint: &Endpoint,
    peer: Peer,
    a: RemoteMr,
    c: &FabricMr,
) -> Outcome {
    let counts = Stream::default();
    let (running_tx, running) = mpsc::channel();
    let (ended_tx, ended) = mpsc::channel();
    let (asked, unbound, ended) = thread::scope(|s| {
        s.spawn(|| {
            let mut at = 0;
            let error = loop {
                if counts.stop.load(SeqCst) {
                    break None;
                }
                let after = counts.unbound.load(SeqCst);
                counts.posted.fetch_add(1, SeqCst);
                let remote = RemoteMr {
                    addr: a.addr + at,
                    key: a.key,
                };
                let posted = Instant::now();
                match endpoint.read(c, at, STREAM_READ, peer, remote) {
                    Ok(()) => {
                        if counts.good.fetch_add(1, SeqCst) + 1 == GOOD_BEFORE {
                            let _ = running_tx.send(());
                        }
                        if after {
                            counts.good_after.fetch_add(1, SeqCst);
                        }
                    }
                    Err(e) => break Some((e, posted, Instant::now())),
                }
                at = (at + STREAM_READ) % LEN;
            };
            let _ = ended_tx.send(error);
        });
        // Once the stream runs, node 0 may unbind.
        let asked = Instant::now();
        let unbound = running
            .recv_timeout(PEER_WAIT)
            .map_err(|_| format!("the stream made no {GOOD_BEFORE} good reads"))
            .and_then(|()| channel.barrier(b's'))
            .and_then(|()| channel.barrier(b'u'));
        counts.unbound.store(true, SeqCst);
        let ended = ended.recv_timeout(STREAM_LIMIT);
        counts.stop.store(true, SeqCst);
        (asked, unbound, ended)
    });
    // Node 0 may close its side once this is through.
    let closed = channel.barrier(b'e');
    let (posted, good, good_after) = (
        counts.posted.load(SeqCst),
        counts.good.load(SeqCst),
        counts.good_after.load(SeqCst),
    );
    let ended = ended.ok().flatten();
    println!(
        "# stream: {posted} fi_read(s) of 1 MiB posted, {good} good, {good_after} of them started after the unbind returned; {}",
        match &ended {
            Some((e, posted, at)) => format!(
                "the stream ended {} ms after it started, its last read failing {} ms after it was posted: {e}",
                at.duration_since(asked).as_millis(),
                at.duration_since(*posted).as_millis()
            ),
            None => "no error".to_owned(),
        }
    );
    unbound?;
    let Some((error, ..)) = ended else {
        return Err(format!(
            "the stream did not end in an error within {} s of the unbind",
            STREAM_LIMIT.as_secs()
        ));
    };
    match &error {
        // ofi_rxm's error entry for the read: verbs reports a failed work completion as
        // FI_EIO (a flushed one as FI_ECANCELED), with rxe's status as the provider's error.
        LibfabricError::Completion {
            call: "fi_read",
            errno: FI_EIO,
            prov_text: Some(text),
            ..
        } if text == "remote access error" => {}
        LibfabricError::Stalled { .. } => {
            return Err(format!(
                "the stream stalled: libfabric reported no completion for the read ({error})"
            ))
        }
        other => {
            return Err(format!(
                "expected an fi_read completion error with FI_EIO, got {other:?}"
            ))
        }
    }
    if good + 1 != posted {
        return Err(format!(
            "{posted} read(s) posted, {good} good and one failed"
        ));
    }
    if good_after > 0 {
        return Err(format!(
            "{good_after} read(s) started after node 0's unbind returned succeeded"
        ));
    }
    closed
}

/// What each host tells the other.
struct Info {
    /// Its endpoint's address (`fi_getname`).
    address: Vec<u8>,
    /// Where A and B are for RMA.
    a: RemoteMr,
    b: RemoteMr,
}

impl Info {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for word in [self.a.addr, self.a.key, self.b.addr, self.b.key] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&self.address);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() <= 32 {
            return Err(format!("the peer's information is {} bytes", bytes.len()));
        }
        let word =
            |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("eight bytes"));
        Ok(Self {
            a: RemoteMr {
                addr: word(0),
                key: word(1),
            },
            b: RemoteMr {
                addr: word(2),
                key: word(3),
            },
            address: bytes[32..].to_vec(),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The TCP connection to the peer: node 0 listens, node 1 connects.
struct SideChannel(TcpStream);

impl SideChannel {
    /// Node 0 waits for node 1 for up to [`PEER_WAIT`]; node 1 tries every second as long.
    fn connect(node: u8, peer_ip: Ipv4Addr) -> Result<Self, String> {
        let deadline = Instant::now() + PEER_WAIT;
        let stream = if node == 0 {
            let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT))
                .map_err(|e| format!("listening on port {PORT}: {e}"))?;
            listener.set_nonblocking(true).map_err(|e| e.to_string())?;
            loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => return Err(format!("waiting for node 1 on port {PORT}: {e}")),
                }
            }
        } else {
            let address = SocketAddr::from((peer_ip, PORT));
            loop {
                match TcpStream::connect_timeout(&address, Duration::from_secs(5)) {
                    Ok(stream) => break stream,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        thread::sleep(Duration::from_secs(1));
                    }
                    Err(e) => {
                        return Err(format!(
                            "connecting to node 0 at {address} for {} s: {e}",
                            PEER_WAIT.as_secs()
                        ))
                    }
                }
            }
        };
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(PEER_WAIT))
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Self(stream))
    }

    /// Sends `message` (length first) and returns the peer's.
    fn swap(&mut self, message: &[u8]) -> Result<Vec<u8>, String> {
        let err = |e: std::io::Error| format!("the side channel to the peer: {e}");
        let len = u32::try_from(message.len()).map_err(|e| e.to_string())?;
        self.0.write_all(&len.to_le_bytes()).map_err(err)?;
        self.0.write_all(message).map_err(err)?;
        let mut len = [0u8; 4];
        self.0.read_exact(&mut len).map_err(err)?;
        let mut got = vec![0u8; u32::from_le_bytes(len) as usize];
        self.0.read_exact(&mut got).map_err(err)?;
        Ok(got)
    }

    /// Both sides reached the step `what`.
    fn barrier(&mut self, what: u8) -> Outcome {
        match self.swap(&[what])?.as_slice() {
            [got] if *got == what => Ok(()),
            got => Err(format!(
                "the side channel: expected the peer at step '{}', got '{}'",
                what as char,
                String::from_utf8_lossy(got)
            )),
        }
    }
}

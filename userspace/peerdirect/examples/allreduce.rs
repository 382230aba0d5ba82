//! A ring all-reduce of float32 buffers in HBM across ranks on one or more hosts, written
//! against this crate the way a collective library (HCCL, NCCL) uses it: each rank exports its
//! HBM buffers as dma-bufs, registers them through a [`RegCache`] (once: every later request
//! is a hit), exchanges endpoint addresses with the other ranks, then runs reduce-scatter and
//! all-gather with tagged messages straight between the HBM of neighbouring ranks.
//!
//! ```text
//! allreduce --rank R --ranks N --root ADDR:PORT [--provider P] [--node ADDR]
//!           [--sizes 64K,1M,...] [--iterations K] [--device I] [--timeout S] [--json FILE]
//! ```
//!
//! Rank 0 listens on `--root` (the bootstrap: addresses, barriers and results travel over
//! plain TCP there, as runtimes bootstrap over a side channel); the others connect to it. With
//! a provider that takes dma-buf memory (`tcp`; `verbs;ofi_rxm` on an RDMA device whose kernel
//! driver and provider register dma-bufs) every registration is direct and the library copies
//! nothing with the CPU; with one that refuses it (`verbs;ofi_rxm` on Debian's soft-RoCE) the
//! registrations fall back to host bounce, say why, and count the bytes they copy. Each
//! record names the path of both of a rank's registrations (data and scratch).
//!
//! Every rank fills its buffer with [`value`] of its rank, the element and the iteration
//! before each iteration, and checks every element of the result after it; the last
//! iteration's result stays in HBM for the host to check from outside (its `# allreduce-hbm`
//! line). Adding the vector is the CPU's work here (through the dma-buf's mapping): on an
//! accelerator it is a kernel on the device, and moving the bytes, which is what this measures,
//! is the same.
//!
//! Rank 0 prints a line per size as it finishes and a table of all ranks at the end; `--json`
//! writes the same to a file. The exit status is 0 only when every rank's every result was
//! right.

use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peerdirect::cache::{Access, ByteRange, ExportId};
use peerdirect::registrar::libfabric::{
    default_universe_size, Endpoint, Fabric, FabricMr, LibfabricRegistrar, MappedDmaBuf,
    MrEndpoint, Peer, TAG_LIMIT,
};
use peerdirect::size::{human_bytes, parse_number, parse_size};
use peerdirect::{CacheStats, Device, ExportFlags, RegCache, RegPath, Registration};
use serde_json::{json, Value};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;
type Cache = RegCache<LibfabricRegistrar>;

const USAGE: &str = "usage: allreduce --rank R --ranks N --root ADDR:PORT [--provider P] \
    [--node ADDR] [--sizes 64K,1M,...] [--iterations K] [--device I] [--timeout S] \
    [--json FILE]";

/// The first tag of this program's messages; a step's messages add its sequence number
/// (shifted past the chunk indices the library adds, and taken modulo 2^16: steps run one
/// after another, so tags may come round again), all below the library's `TAG_LIMIT` (its
/// top 16 bits carry each transfer's chunk count).
const TAG_BASE: u64 = 0xa1 << 40;
const TAG_STEP_SHIFT: u32 = 24;
const TAG_STEPS: u64 = 1 << 16;
const _: () = assert!(TAG_BASE + (TAG_STEPS << TAG_STEP_SHIFT) <= TAG_LIMIT);

/// Element `index` of rank `rank`'s buffer before iteration `iteration`. Small integers, so
/// that sums over up to 256 ranks are exact in float32 and the host can recompute them
/// (tests/hbm-pattern allreduce).
fn value(rank: usize, index: usize, iteration: u64) -> f32 {
    ((index as u64 * 31 + rank as u64 * 1009 + iteration * 7919) % 65521) as f32
}

/// What every rank's element `index` holds after iteration `iteration`.
fn reduced(ranks: usize, index: usize, iteration: u64) -> f32 {
    (0..ranks).map(|r| value(r, index, iteration)).sum()
}

struct Options {
    rank: usize,
    ranks: usize,
    root: SocketAddr,
    provider: String,
    node: Option<String>,
    sizes: Vec<u64>,
    iterations: u64,
    device: u32,
    timeout: Duration,
    json: Option<PathBuf>,
}

fn options() -> Result<Options> {
    let mut args = std::env::args().skip(1);
    let (mut rank, mut ranks, mut root) = (None, None, None);
    let mut o = Options {
        rank: 0,
        ranks: 0,
        root: SocketAddr::from(([127, 0, 0, 1], 0)),
        provider: "tcp".into(),
        node: None,
        sizes: vec![64 << 10, 1 << 20, 4 << 20],
        iterations: 5,
        device: 0,
        timeout: Duration::from_secs(60),
        json: None,
    };
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let arg = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number =
            |what: &str| parse_number(&arg).map_err(|e| format!("{flag} {arg}: {e}: give {what}"));
        match flag.as_str() {
            "--rank" => rank = Some(number("a rank, from 0")? as usize),
            "--ranks" => ranks = Some(number("the number of ranks")? as usize),
            "--root" => {
                root = Some(
                    arg.to_socket_addrs()
                        .map_err(|e| format!("--root {arg}: {e}: give rank 0's ADDR:PORT"))?
                        .next()
                        .ok_or_else(|| format!("--root {arg}: no address"))?,
                )
            }
            "--provider" => o.provider = arg,
            "--node" => o.node = Some(arg),
            "--sizes" => {
                o.sizes = arg
                    .split(',')
                    .map(|s| parse_size(s).map_err(|e| format!("--sizes: {s}: {e}")))
                    .collect::<std::result::Result<_, _>>()?
            }
            "--iterations" => o.iterations = number("a count")?,
            "--device" => {
                o.device = u32::try_from(number("a device index")?).map_err(|_| {
                    format!("--device {arg}: does not fit in 32 bits: give N of /dev/peerdirectN")
                })?
            }
            "--timeout" => o.timeout = Duration::from_secs(number("seconds")?),
            "--json" => o.json = Some(arg.into()),
            _ => return Err(format!("unknown option {flag}\n{USAGE}").into()),
        }
    }
    let missing = |what| format!("{what} is required\n{USAGE}");
    o.rank = rank.ok_or_else(|| missing("--rank"))?;
    o.ranks = ranks.ok_or_else(|| missing("--ranks"))?;
    o.root = root.ok_or_else(|| missing("--root"))?;
    if o.ranks < 2 || o.ranks > 256 || o.rank >= o.ranks {
        return Err(format!(
            "--rank {} --ranks {}: need 2 to 256 ranks and a rank below their number",
            o.rank, o.ranks
        )
        .into());
    }
    if o.iterations == 0 || o.sizes.is_empty() {
        return Err("need at least one size and one iteration".into());
    }
    let unit = 4 * o.ranks as u64;
    if let Some(bad) = o.sizes.iter().find(|&&s| s == 0 || s % unit != 0) {
        return Err(format!(
            "--sizes: {bad} bytes is not a positive multiple of 4 x {} ranks: each rank's \
             share must be whole float32 elements",
            o.ranks
        )
        .into());
    }
    Ok(o)
}

/// The side channel: every rank's blob to every rank, through rank 0, over TCP. Reads time
/// out after the run's timeout, so that a rank that died is noticed.
enum Bootstrap {
    /// Rank 0: a connection to each other rank, in rank order.
    Root(Vec<BufReader<TcpStream>>),
    /// Another rank: its connection to rank 0.
    Member(BufReader<TcpStream>),
}

impl Bootstrap {
    fn start(o: &Options) -> Result<Self> {
        let deadline = Instant::now() + o.timeout;
        if o.rank == 0 {
            let listener = TcpListener::bind(o.root)
                .map_err(|e| format!("listening on {} for the other ranks: {e}", o.root))?;
            listener.set_nonblocking(true)?;
            let mut members: Vec<Option<BufReader<TcpStream>>> =
                (1..o.ranks).map(|_| None).collect();
            while members.iter().any(Option::is_none) {
                match listener.accept() {
                    Ok((stream, from)) => {
                        stream.set_nonblocking(false)?;
                        stream.set_read_timeout(Some(o.timeout))?;
                        let mut stream = BufReader::new(stream);
                        let line = read_line(&mut stream, "a rank's hello")
                            .map_err(|e| format!("from {from}: {e}"))?;
                        let rank = line
                            .strip_prefix("rank ")
                            .and_then(|r| r.parse::<usize>().ok())
                            .filter(|&r| r > 0 && r < o.ranks)
                            .ok_or_else(|| format!("{from} sent {line:?}, not a rank"))?;
                        if members[rank - 1].replace(stream).is_some() {
                            return Err(format!("rank {rank} connected twice").into());
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let absent: Vec<String> = (1..o.ranks)
                                .filter(|r| members[r - 1].is_none())
                                .map(|r| r.to_string())
                                .collect();
                            return Err(format!(
                                "rank(s) {} did not connect to {} within {} s: are they \
                                 running, with the same --root, and can they reach it?",
                                absent.join(", "),
                                o.root,
                                o.timeout.as_secs()
                            )
                            .into());
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => return Err(format!("accepting on {}: {e}", o.root).into()),
                }
            }
            Ok(Self::Root(members.into_iter().flatten().collect()))
        } else {
            let stream = loop {
                match TcpStream::connect_timeout(&o.root, Duration::from_secs(2)) {
                    Ok(stream) => break stream,
                    Err(e) if Instant::now() > deadline => {
                        return Err(format!(
                            "rank 0 at {} could not be reached within {} s: {e}",
                            o.root,
                            o.timeout.as_secs()
                        )
                        .into())
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            };
            stream.set_read_timeout(Some(o.timeout))?;
            stream.set_nodelay(true)?;
            let mut stream = BufReader::new(stream);
            writeln!(stream.get_mut(), "rank {}", o.rank)?;
            Ok(Self::Member(stream))
        }
    }

    /// Every rank's `mine`, in rank order (an all-gather through rank 0). `what` names the
    /// exchange in errors.
    fn all_gather(&mut self, mine: &str, what: &str) -> Result<Vec<String>> {
        match self {
            Self::Root(members) => {
                let mut all = vec![mine.to_string()];
                for (i, member) in members.iter_mut().enumerate() {
                    let line =
                        read_line(member, what).map_err(|e| format!("rank {}: {e}", i + 1))?;
                    all.push(line);
                }
                let joined = all.join("\t");
                for (i, member) in members.iter_mut().enumerate() {
                    writeln!(member.get_mut(), "{joined}")
                        .map_err(|e| format!("sending {what} to rank {}: {e}", i + 1))?;
                }
                Ok(all)
            }
            Self::Member(root) => {
                writeln!(root.get_mut(), "{mine}")
                    .map_err(|e| format!("sending {what} to rank 0: {e}"))?;
                let line = read_line(root, what).map_err(|e| format!("rank 0: {e}"))?;
                Ok(line.split('\t').map(str::to_string).collect())
            }
        }
    }
}

fn read_line(stream: &mut BufReader<TcpStream>, what: &str) -> Result<String> {
    let mut line = String::new();
    match stream.read_line(&mut line) {
        Ok(0) => Err(format!("closed the connection before {what}: it has stopped").into()),
        Ok(_) => Ok(line.trim_end_matches('\n').to_string()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(format!("sent nothing for {what} within the timeout: it has died or hangs").into())
        }
        Err(e) => Err(format!("reading {what}: {e}").into()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return Err(format!("odd hex {text:?}").into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&text[i..i + 2], 16)?))
        .collect()
}

/// One of a rank's HBM buffers: an allocation, exported and mapped.
struct Buffer<'d> {
    allocation: peerdirect::Allocation<'d>,
    mapped: MappedDmaBuf,
    export: ExportId,
}

impl<'d> Buffer<'d> {
    fn new(device: &'d Device, length: u64) -> Result<Self> {
        let allocation = device
            .alloc(length, None)
            .map_err(|e| format!("allocating {length} bytes of HBM: {e}"))?;
        let dma_buf = allocation
            .export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)
            .map_err(|e| format!("exporting HBM: {e}"))?;
        let export = ExportId::of_dma_buf(device.index(), &dma_buf)?;
        let mapped = MappedDmaBuf::new(dma_buf)?;
        Ok(Self {
            allocation,
            mapped,
            export,
        })
    }

    /// A registration of all of it: the cache's, registered on the first request.
    fn registration(
        &self,
        cache: &Cache,
        registrar: &Arc<LibfabricRegistrar>,
    ) -> Result<Registration<LibfabricRegistrar>> {
        let whole = ByteRange::new(0, self.allocation.length())?;
        let access = Access::LOCAL_READ | Access::LOCAL_WRITE;
        Ok(cache.get(registrar, &self.mapped, self.export, whole, access)?)
    }

    fn read_f32(&self, offset: usize, count: usize) -> Vec<f32> {
        let mut bytes = vec![0u8; count * 4];
        self.mapped.read(offset, &mut bytes);
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn write_f32(&mut self, offset: usize, values: &[f32]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.mapped.write(offset, &bytes);
    }
}

/// A rank's part in the ring.
struct Ring<'d> {
    rank: usize,
    ranks: usize,
    endpoint: Endpoint,
    next: Peer,
    cache: Arc<Cache>,
    registrar: Arc<LibfabricRegistrar>,
    data: Buffer<'d>,
    scratch: Buffer<'d>,
    /// Steps taken: every rank takes the same steps in the same order, so it names a step's
    /// messages alike on both ends.
    steps: u64,
}

/// Where a step failed, for the message.
struct Step<'a> {
    phase: &'a str,
    index: usize,
}

/// `len` bytes at offset `at` of a registration.
struct Span<'a> {
    mr: &'a FabricMr,
    at: u64,
    len: u64,
}

impl<'a> Span<'a> {
    /// Elements `[start, end)` (float32) of a buffer registered in `mr` from `base` on.
    fn elements(mr: &'a FabricMr, base: u64, (start, end): (usize, usize)) -> Self {
        Self {
            mr,
            at: base + (start * 4) as u64,
            len: ((end - start) * 4) as u64,
        }
    }
}

impl Ring<'_> {
    /// Elements `[start, end)` of share `c` of `count`.
    fn share(&self, count: usize, c: usize) -> (usize, usize) {
        (c * count / self.ranks, (c + 1) * count / self.ranks)
    }

    /// Sends `send` to the next rank while receiving into `recv` what the previous rank sends.
    fn step(&mut self, step: Step<'_>, send: Span<'_>, recv: Span<'_>) -> Result<()> {
        let tag = TAG_BASE | ((self.steps % TAG_STEPS) << TAG_STEP_SHIFT);
        self.steps += 1;
        let (endpoint, next) = (&self.endpoint, self.next);
        let prev = (self.rank + self.ranks - 1) % self.ranks;
        let next_rank = (self.rank + 1) % self.ranks;
        let where_ = |what: &str, rank: usize| {
            format!(
                "{} step {} of {}: {what} rank {rank}",
                step.phase,
                step.index + 1,
                self.ranks - 1
            )
        };
        std::thread::scope(|s| {
            let received = s.spawn(|| endpoint.recv(recv.mr, recv.at, recv.len, tag));
            let sent = endpoint.send(send.mr, send.at, send.len, next, tag);
            let received = received
                .join()
                .expect("the receiving thread does not panic");
            sent.map_err(|e| format!("{}: {e}", where_("sending to", next_rank)))?;
            received.map_err(|e| format!("{}: {e}", where_("receiving from", prev)))?;
            Ok(())
        })
    }

    /// One all-reduce of the first `count` elements of `data`. What the registrations say
    /// after it.
    fn all_reduce(&mut self, count: usize) -> Result<Registrations> {
        let data_reg = self.data.registration(&self.cache, &self.registrar)?;
        let scratch_reg = self.scratch.registration(&self.cache, &self.registrar)?;
        let (data, scratch) = (data_reg.mr(), scratch_reg.mr());
        let (data_at, scratch_at) = (data_reg.offset_in_mr(), scratch_reg.offset_in_mr());
        let n = self.ranks;
        // Reduce-scatter: after step s, this rank's share (rank - s - 1) holds s + 2 ranks'
        // sum; after n - 1 steps, share rank + 1 holds all of them.
        for s in 0..n - 1 {
            let send = self.share(count, (self.rank + n - s) % n);
            let recv_share = (self.rank + 2 * n - s - 1) % n;
            let (start, end) = self.share(count, recv_share);
            self.step(
                Step {
                    phase: "reduce-scatter",
                    index: s,
                },
                Span::elements(data, data_at, send),
                // Into the scratch buffer's start, to be added to this rank's share.
                Span::elements(scratch, scratch_at, (0, end - start)),
            )?;
            let mut sum = self.data.read_f32(start * 4, end - start);
            let got = self.scratch.read_f32(0, end - start);
            sum.iter_mut().zip(&got).for_each(|(a, b)| *a += b);
            self.data.write_f32(start * 4, &sum);
        }
        // All-gather: pass the complete shares on around the ring, received in place.
        for s in 0..n - 1 {
            let send = self.share(count, (self.rank + 1 + n - s) % n);
            let recv = self.share(count, (self.rank + n - s) % n);
            self.step(
                Step {
                    phase: "all-gather",
                    index: s,
                },
                Span::elements(data, data_at, send),
                Span::elements(data, data_at, recv),
            )?;
        }
        Ok(Registrations {
            staged_bytes: data.staged_bytes() + scratch.staged_bytes(),
            paths: [data.path().clone(), scratch.path().clone()],
        })
    }
}

/// What a rank's registrations say after an all-reduce.
struct Registrations {
    /// Bytes the library copied with the CPU through them (host bounce), since they were
    /// made.
    staged_bytes: u64,
    /// The data buffer's path and the scratch buffer's.
    paths: [RegPath; 2],
}

/// A path's name in the JSON, and the provider's reason for host bounce.
fn path_name(path: &RegPath) -> (&'static str, Option<String>) {
    match path {
        RegPath::DmaBuf => ("dma_buf", None),
        RegPath::PeerMemVa => ("peermem_va", None),
        RegPath::HostBounce { reason } => ("host_bounce", Some(reason.clone())),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the sizes; this rank's record of each.
fn run(o: &Options, ring: &mut Ring<'_>, bootstrap: &mut Bootstrap) -> Result<Vec<Value>> {
    let mut records = Vec::new();
    let mut iteration = 0u64;
    let mut staged_so_far = 0;
    for &size in &o.sizes {
        let count = (size / 4) as usize;
        let before: CacheStats = ring.cache.stats();
        let mut times = Vec::new();
        let mut last = None;
        for i in 0..o.iterations {
            iteration += 1;
            let mine: Vec<f32> = (0..count).map(|e| value(o.rank, e, iteration)).collect();
            ring.data.write_f32(0, &mine);
            bootstrap.all_gather(
                "ready",
                &format!("the start of {} iteration {}", human_bytes(size), i + 1),
            )?;
            let start = Instant::now();
            let registrations = ring
                .all_reduce(count)
                .map_err(|e| format!("{}, iteration {}: {e}", human_bytes(size), i + 1))?;
            let seconds = start.elapsed().as_secs_f64();
            times.push(seconds);
            last = Some(registrations);
            let got = ring.data.read_f32(0, count);
            if let Some((e, v)) = got
                .iter()
                .enumerate()
                .find(|&(e, &v)| v != reduced(o.ranks, e, iteration))
            {
                return Err(format!(
                    "{}, iteration {}: element {e} is {v}, not {}: the reduction is wrong",
                    human_bytes(size),
                    i + 1,
                    reduced(o.ranks, e, iteration)
                )
                .into());
            }
            if o.rank == 0 {
                println!(
                    "progress: {} {}: iteration {}/{} in {:.2} ms, every element right on rank 0",
                    o.provider,
                    human_bytes(size),
                    i + 1,
                    o.iterations,
                    seconds * 1e3
                );
            }
        }
        let after = ring.cache.stats();
        let last = last.expect("at least one iteration");
        // The registrations live as long as the run (the cache never needs the room), so
        // their count of copied bytes only grows.
        let staged = last.staged_bytes.saturating_sub(staged_so_far);
        staged_so_far = last.staged_bytes;
        let [(data_path, data_reason), (scratch_path, scratch_reason)] =
            last.paths.each_ref().map(path_name);
        // Both buffers' registrations: one path when they agree, else each named.
        let path = if data_path == scratch_path {
            data_path.to_string()
        } else {
            format!("data={data_path} scratch={scratch_path}")
        };
        let seconds = median(times.clone());
        let n = o.ranks as f64;
        let algbw = size as f64 / seconds;
        records.push(json!({
            "rank": o.rank,
            "size": size,
            "iterations": o.iterations,
            "seconds": seconds,
            "first_seconds": times[0],
            "algbw": algbw,
            "busbw": algbw * 2.0 * (n - 1.0) / n,
            "cpu_copied_bytes": staged,
            "registrations": after.registrations - before.registrations,
            "hits": after.hits - before.hits,
            "path": path,
            "paths": { "data": data_path, "scratch": scratch_path },
            "reason": data_reason.or(scratch_reason),
            "correct": true,
        }));
    }
    // The last result, for the host to read in the HBM backing file.
    let last = *o.sizes.last().expect("sizes checked");
    println!(
        "# allreduce-hbm rank={} ranks={} iteration={iteration} offset={:#x} count={}",
        o.rank,
        o.ranks,
        ring.data.allocation.hbm_offset(),
        last / 4
    );
    Ok(records)
}

fn setup<'d>(o: &Options, device: &'d Device) -> Result<(Ring<'d>, Bootstrap)> {
    let largest = *o.sizes.iter().max().expect("sizes checked");
    let data = Buffer::new(device, largest)?;
    let scratch = Buffer::new(device, largest.div_ceil(o.ranks as u64))?;
    let fabric = Fabric::open(&o.provider, o.node.as_deref())
        .map_err(|e| format!("opening libfabric's {}: {e}", o.provider))?;
    let registrar = Arc::new(LibfabricRegistrar::new(fabric));
    let cache = Arc::new(Cache::from_env()?);
    cache.attach(device);
    let mut endpoint = registrar.fabric().endpoint()?;
    endpoint.set_timeout(o.timeout);
    // Where the provider has FI_MR_ENDPOINT, registrations are bound to the ring's endpoint
    // (elsewhere this binds nothing).
    registrar.set_endpoint(Some(MrEndpoint::of(&endpoint)))?;
    let mut bootstrap = Bootstrap::start(o)?;
    let addresses = bootstrap.all_gather(&hex(&endpoint.address()?), "endpoint addresses")?;
    let next = (o.rank + 1) % o.ranks;
    let next = endpoint
        .insert_peer(&unhex(&addresses[next])?)
        .map_err(|e| format!("adding rank {next}'s address: {e}"))?;
    Ok((
        Ring {
            rank: o.rank,
            ranks: o.ranks,
            endpoint,
            next,
            cache,
            registrar,
            data,
            scratch,
            steps: 0,
        },
        bootstrap,
    ))
}

/// Rank 0's table of all ranks' records: per size, the slowest rank's time and the sums of
/// the rest.
fn table(o: &Options, all: &[Vec<Value>]) -> Vec<Value> {
    let mut rows = Vec::new();
    for (i, &size) in o.sizes.iter().enumerate() {
        let of = |key: &'static str| column(all, i, key);
        let seconds = of("seconds").filter_map(|v| v.as_f64()).fold(0.0, f64::max);
        let n = o.ranks as f64;
        let algbw = size as f64 / seconds;
        let sum = |key: &'static str| of(key).filter_map(|v| v.as_u64()).sum::<u64>();
        let mut paths: Vec<String> = of("path")
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        paths.sort();
        paths.dedup();
        let reason = of("reason").find_map(|v| v.as_str().map(str::to_string));
        rows.push(json!({
            "size": size,
            "ranks": o.ranks,
            "iterations": o.iterations,
            "seconds": seconds,
            "algbw": algbw,
            "busbw": algbw * 2.0 * (n - 1.0) / n,
            "cpu_copied_bytes": sum("cpu_copied_bytes"),
            "registrations": sum("registrations"),
            "hits": sum("hits"),
            "path": paths.join(","),
            "reason": reason,
            "correct": of("correct").all(|v| v == json!(true)),
        }));
    }
    rows
}

/// Field `key` of every rank's record `i`.
fn column<'a>(all: &'a [Vec<Value>], i: usize, key: &'a str) -> impl Iterator<Item = Value> + 'a {
    all.iter().filter_map(move |r| r.get(i)?.get(key).cloned())
}

fn print_table(o: &Options, rows: &[Value]) {
    println!(
        "all-reduce of float32 in HBM, {} ranks, provider {}, {} iterations per size (median)",
        o.ranks, o.provider, o.iterations
    );
    println!(
        "{:>9} {:>10} {:>11} {:>11} {:>12} {:>6} {:>6}  path",
        "size", "time", "algbw MB/s", "busbw MB/s", "CPU-copied", "regs", "hits"
    );
    for r in rows {
        println!(
            "{:>9} {:>8.2}ms {:>11.1} {:>11.1} {:>12} {:>6} {:>6}  {}",
            human_bytes(r["size"].as_u64().unwrap_or(0)),
            r["seconds"].as_f64().unwrap_or(0.0) * 1e3,
            r["algbw"].as_f64().unwrap_or(0.0) / 1e6,
            r["busbw"].as_f64().unwrap_or(0.0) / 1e6,
            human_bytes(r["cpu_copied_bytes"].as_u64().unwrap_or(0)),
            r["registrations"],
            r["hits"],
            r["path"].as_str().unwrap_or("?"),
        );
    }
    if let Some(reason) = rows.iter().find_map(|r| r["reason"].as_str()) {
        println!("host bounce because: {reason}");
    }
}

fn main_result(o: &Options) -> Result<()> {
    let device = Device::open_index(o.device).map_err(|e| {
        format!(
            "opening HBM device {}: {e} (is peerdirect.ko loaded and bound?)",
            o.device
        )
    })?;
    let (mut ring, mut bootstrap) = setup(o, &device)?;
    let records = run(o, &mut ring, &mut bootstrap)?;
    let mine = serde_json::to_string(&records)?;
    let all = bootstrap.all_gather(&mine, "the results")?;
    if o.rank == 0 {
        let all: Vec<Vec<Value>> = all
            .iter()
            .map(|r| serde_json::from_str(r))
            .collect::<std::result::Result<_, _>>()?;
        let rows = table(o, &all);
        print_table(o, &rows);
        if let Some(path) = &o.json {
            let report = json!({
                "provider": o.provider,
                "ranks": o.ranks,
                "rows": rows,
                "per_rank": all,
            });
            std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    // Freeing the HBM leaves its bytes where they are, for the host to read.
    Ok(())
}

fn main() -> ExitCode {
    default_universe_size();
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("allreduce: {e}");
            return ExitCode::from(2);
        }
    };
    match main_result(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allreduce: rank {}: {e}", o.rank);
            ExitCode::FAILURE
        }
    }
}

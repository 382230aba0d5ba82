//! Registration cache latency: `RegCache` next to a plain `Mutex<HashMap>` of registrations,
//! in the same run, with a fake registrar whose registration takes a set time.
//!
//! `cargo bench --bench regcache [-- --register-us N --threads N]`, or `scripts/bench`.

use std::collections::HashMap;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::cache::{Access, ByteRange, CacheLimits, DomainId, ExportId, RegKey};
use peerdirect::{RegCache, Registrar, Registration};

const MIB: u64 = 1 << 20;
/// Hits: 64 exports of 16 chunks of 2 MiB each cached, 1024 registrations.
const EXPORTS: u64 = 64;
const CHUNKS: u64 = 16;
const CHUNK: u64 = 2 * MIB;
/// RegCache and the baseline take turns, so that both see the same background load.
const ROUNDS: usize = 20;
const HITS_PER_ROUND: usize = 10_000;
const MISSES_PER_ROUND: usize = 100;

/// A NIC whose registrations take `cost` of busy CPU time, as a real one's do (pinning,
/// translation tables); deregistration is free.
struct FakeNic {
    cost: Duration,
    next: AtomicU64,
}

impl Registrar for FakeNic {
    type Source = ();
    type Mr = u64;
    type Error = std::convert::Infallible;

    fn domain(&self) -> DomainId {
        DomainId(1)
    }

    fn register(&self, _: &(), _: &RegKey) -> Result<u64, Self::Error> {
        let start = Instant::now();
        while start.elapsed() < self.cost {
            std::hint::spin_loop();
        }
        Ok(self.next.fetch_add(1, Relaxed))
    }

    fn deregister(&self, mr: u64) {
        black_box(mr);
    }
}

/// A `Device` on a regular file named `peerdirect0` that holds a status page saying "live":
/// the cache's revocation check on every request reads it, as it reads a real device's.
struct StandInDevice {
    dir: std::path::PathBuf,
    device: peerdirect::Device,
}

impl StandInDevice {
    fn new() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("peerdirect-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("peerdirect0");
        let mut page = vec![0u8; 4096];
        page[..4].copy_from_slice(&peerdirect::uapi::PEERDIRECT_STATUS_VERSION.to_ne_bytes());
        std::fs::write(&path, &page).map_err(|e| format!("{}: {e}", path.display()))?;
        let device = peerdirect::Device::open(&path).map_err(|e| e.to_string())?;
        if device.status().is_none() {
            return Err("the stand-in device's status page did not map".into());
        }
        Ok(Self { dir, device })
    }
}

impl Drop for StandInDevice {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Something that hands out registrations.
trait Cache: Sync {
    /// A handle to a registration, dropped by the caller after timing the call.
    type Handle;
    fn fetch(&self, nic: &Arc<FakeNic>, key: &RegKey) -> Self::Handle;
}

impl Cache for RegCache<FakeNic> {
    type Handle = Registration<FakeNic>;

    fn fetch(&self, nic: &Arc<FakeNic>, key: &RegKey) -> Self::Handle {
        self.get(nic, &(), key.export, key.range, key.access)
            .unwrap_or_else(|never| match never {})
    }
}

/// The baseline: exact keys in a hash map behind a mutex, registering outside the lock like
/// `RegCache`, never evicting.
#[derive(Default)]
struct MapCache(Mutex<HashMap<RegKey, Arc<u64>>>);

impl Cache for MapCache {
    type Handle = Arc<u64>;

    fn fetch(&self, nic: &Arc<FakeNic>, key: &RegKey) -> Self::Handle {
        if let Some(mr) = self.0.lock().unwrap().get(key) {
            return Arc::clone(mr);
        }
        let mr = nic
            .register(&(), key)
            .unwrap_or_else(|never| match never {});
        let mut map = self.0.lock().unwrap();
        Arc::clone(map.entry(*key).or_insert_with(|| Arc::new(mr)))
    }
}

fn key(export: u64, offset: u64, length: u64) -> RegKey {
    RegKey {
        domain: DomainId(1),
        export: ExportId::new(0, export),
        range: ByteRange::new(offset, length).expect("non-empty"),
        access: Access::all(),
    }
}

/// The cached chunks.
fn chunks() -> impl Iterator<Item = RegKey> {
    (0..EXPORTS).flat_map(|export| (0..CHUNKS).map(move |c| key(export, c * CHUNK, CHUNK)))
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % n
    }
}

/// `count` requests for cached chunks: whole ones, or 4 KiB to 64 KiB inside one.
fn hit_requests(seed: u64, count: usize, sub_range: bool) -> Vec<RegKey> {
    let mut rng = Rng(seed | 1);
    (0..count)
        .map(|_| {
            let (export, chunk) = (rng.below(EXPORTS), rng.below(CHUNKS));
            if sub_range {
                let pages = 1 + rng.below(16);
                let offset = rng.below(CHUNK / 4096 - pages) * 4096;
                key(export, chunk * CHUNK + offset, pages * 4096)
            } else {
                key(export, chunk * CHUNK, CHUNK)
            }
        })
        .collect()
}

/// `count` requests for exports never seen before by `thread` in `round`.
fn miss_requests(round: usize, thread: usize, count: usize) -> Vec<RegKey> {
    let first = 1_000_000 * (1 + round * 64 + thread) as u64;
    (0..count as u64)
        .map(|i| key(first + i, 0, CHUNK))
        .collect()
}

/// Each thread's requests, timed one by one: every call's latency in ns, and the wall time.
fn run<C: Cache>(
    cache: &C,
    nic: &Arc<FakeNic>,
    requests: Vec<Vec<RegKey>>,
) -> (Vec<u64>, Duration) {
    let barrier = Barrier::new(requests.len());
    let start = Instant::now();
    let latencies: Vec<u64> = thread::scope(|scope| {
        let threads: Vec<_> = requests
            .into_iter()
            .map(|requests| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let mut latencies = Vec::with_capacity(requests.len());
                    for key in &requests {
                        let start = Instant::now();
                        let handle = black_box(cache.fetch(nic, key));
                        latencies.push(start.elapsed().as_nanos() as u64);
                        drop(handle);
                    }
                    latencies
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().expect("bench thread"))
            .collect()
    });
    (latencies, start.elapsed())
}

struct Percentiles {
    p50: u64,
    p99: u64,
    calls_per_s: f64,
}

/// Latencies of several runs.
#[derive(Default)]
struct Samples {
    latencies: Vec<u64>,
    wall: Duration,
}

impl Samples {
    fn add(&mut self, (latencies, wall): (Vec<u64>, Duration)) {
        self.latencies.extend(latencies);
        self.wall += wall;
    }

    fn percentiles(mut self) -> Percentiles {
        self.latencies.sort_unstable();
        let n = self.latencies.len();
        Percentiles {
            p50: self.latencies[n / 2],
            p99: self.latencies[n * 99 / 100],
            calls_per_s: n as f64 / self.wall.as_secs_f64(),
        }
    }
}

/// `ROUNDS` runs of `requests(round)` on `ours` and, taking turns, on `baseline`.
fn compare<C: Cache>(
    ours: &RegCache<FakeNic>,
    baseline: Option<&C>,
    nic: &Arc<FakeNic>,
    requests: impl Fn(usize) -> Vec<Vec<RegKey>>,
) -> (Percentiles, Option<Percentiles>) {
    let (mut our_samples, mut base_samples) = (Samples::default(), Samples::default());
    for round in 0..ROUNDS {
        our_samples.add(run(ours, nic, requests(round)));
        if let Some(baseline) = baseline {
            base_samples.add(run(baseline, nic, requests(round)));
        }
    }
    (
        our_samples.percentiles(),
        baseline.map(|_| base_samples.percentiles()),
    )
}

/// What an empty timed call costs: the floor under every number.
fn timer_overhead() -> u64 {
    let mut samples: Vec<u64> = (0..100_000)
        .map(|_| {
            let start = Instant::now();
            black_box(());
            start.elapsed().as_nanos() as u64
        })
        .collect();
    samples.sort_unstable();
    samples[samples.len() / 2]
}

struct Options {
    register: Duration,
    threads: usize,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        register: Duration::from_micros(20),
        threads: 8,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{name} takes a number"))
        };
        match arg.as_str() {
            "--register-us" => options.register = Duration::from_micros(value("--register-us")?),
            "--threads" => options.threads = value("--threads")?.max(1) as usize,
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    Ok(options)
}

struct Row {
    case: String,
    threads: usize,
    reg_cache: Percentiles,
    baseline: Option<Percentiles>,
}

/// The goals of the cache's hit and miss paths, each judged on this run's rows: hit p50 at
/// most 50 ns (net of the timer) and at most the baseline's, with 1 and with many threads;
/// hit p99 at most the baseline's with many threads; the miss overhead (free registration)
/// at most 1.2x the baseline's at p50.
fn print_goals(rows: &[Row], timer: u64) {
    println!();
    println!("goals (a report, not a gate):");
    let ratio = |ours: u64, base: u64| ours as f64 / base.max(1) as f64;
    let verdict = |met: bool| if met { "met" } else { "not met" };
    for row in rows {
        let Some(base) = &row.baseline else { continue };
        let ours = &row.reg_cache;
        if row.case.starts_with("hit") {
            let net = ours.p50.saturating_sub(timer);
            let met = net <= 50 && ours.p50 <= base.p50;
            println!(
                "  hit p50, {} thread(s): {} ns ({net} ns net of the timer) vs baseline {} ns, {:.2}x; goal <= 50 ns net and <= 1.00x: {}",
                row.threads,
                ours.p50,
                base.p50,
                ratio(ours.p50, base.p50),
                verdict(met)
            );
            if row.threads > 1 {
                println!(
                    "  hit p99, {} threads: {} ns vs baseline {} ns, {:.2}x; goal <= 1.00x: {}",
                    row.threads,
                    ours.p99,
                    base.p99,
                    ratio(ours.p99, base.p99),
                    verdict(ours.p99 <= base.p99)
                );
            }
        } else if row.case.contains("(overhead)") {
            let r = ratio(ours.p50, base.p50);
            println!(
                "  miss overhead p50, {} thread(s): {} ns vs baseline {} ns, {r:.2}x; goal <= 1.20x: {}",
                row.threads,
                ours.p50,
                base.p50,
                verdict(r <= 1.2)
            );
        }
    }
}

fn print(rows: &[Row]) {
    println!(
        "{:<36} {:>7} | {:<31} | {:<31} | {:<13}",
        "", "", "RegCache", "baseline", "ratio"
    );
    println!(
        "{:<36} {:>7} | {:>9} {:>9} {:>11} | {:>9} {:>9} {:>11} | {:>6} {:>6}",
        "case",
        "threads",
        "p50 ns",
        "p99 ns",
        "calls/s",
        "p50 ns",
        "p99 ns",
        "calls/s",
        "p50",
        "p99"
    );
    for row in rows {
        let ours = &row.reg_cache;
        let (base, ratio) = match &row.baseline {
            Some(base) => (
                format!("{:>9} {:>9} {:>11.0}", base.p50, base.p99, base.calls_per_s),
                format!(
                    "{:>6.2} {:>6.2}",
                    ours.p50 as f64 / base.p50.max(1) as f64,
                    ours.p99 as f64 / base.p99.max(1) as f64
                ),
            ),
            None => (
                format!("{:>31}", "exact keys only: would miss"),
                format!("{:>13}", "-"),
            ),
        };
        println!(
            "{:<36} {:>7} | {:>9} {:>9} {:>11.0} | {base} | {ratio}",
            row.case, row.threads, ours.p50, ours.p99, ours.calls_per_s
        );
    }
}

fn main() -> ExitCode {
    let options = match options() {
        Ok(options) => options,
        Err(problem) => {
            eprintln!("regcache bench: {problem}; usage: regcache [--register-us N] [--threads N]");
            return ExitCode::from(2);
        }
    };
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let timer = timer_overhead();
    println!(
        "Registration cache: RegCache vs. a Mutex<HashMap<RegKey, Arc<Mr>>> baseline, same run"
    );
    println!(
        "  RegCache: peerdirect::RegCache, LRU, finds any cached range that contains the request"
    );
    println!("  baseline: exact keys only, never evicts; both register outside their lock");
    println!(
        "  RegCache is attached to a device (a stand-in file with a status page), so each request also checks that the device is not being revoked"
    );
    println!(
        "  fake registrar: register busy-waits {} us (a typical MR registration), deregister is free",
        options.register.as_micros()
    );
    println!(
        "  hits: {} registrations cached ({EXPORTS} exports x {CHUNKS} chunks of 2 MiB), random requests",
        EXPORTS * CHUNKS
    );
    println!(
        "  misses: a new export each call; RegCache is full ({} entries) and evicts one per miss",
        EXPORTS * CHUNKS
    );
    println!(
        "  latency of each call, timed with Instant (timing alone: {timer} ns); {} threads on {cpus} CPUs",
        options.threads
    );
    println!("  ratio: RegCache / baseline (below 1: RegCache is faster); the two take turns, {ROUNDS} rounds each");
    if options.threads > cpus {
        println!(
            "  with more threads than CPUs, p99 includes waiting for a CPU (preemption), not only the cache"
        );
    }
    println!();

    let full = CacheLimits {
        max_count: (EXPORTS * CHUNKS) as usize,
        ..CacheLimits::default()
    };
    let device = match StandInDevice::new() {
        Ok(device) => device,
        Err(problem) => {
            eprintln!("regcache bench: {problem}");
            return ExitCode::FAILURE;
        }
    };
    let filled = |nic: &Arc<FakeNic>| {
        let (ours, baseline) = (Arc::new(RegCache::new(full)), MapCache::default());
        // As a runtime's cache is: attached to the device, so every request also checks the
        // device's status page.
        ours.attach(&device.device);
        for chunk in chunks() {
            ours.fetch(nic, &chunk);
            baseline.fetch(nic, &chunk);
        }
        (ours, baseline)
    };
    let mut rows = Vec::new();
    for threads in [1, options.threads] {
        let nic = Arc::new(FakeNic {
            cost: options.register,
            next: AtomicU64::new(0),
        });
        let (ours, baseline) = filled(&nic);
        let hits = |sub_range| {
            move |round: usize| -> Vec<Vec<RegKey>> {
                (0..threads)
                    .map(|t| hit_requests((round * 64 + t) as u64, HITS_PER_ROUND, sub_range))
                    .collect()
            }
        };
        // Warm up.
        let ours = &*ours;
        run(ours, &nic, hits(false)(ROUNDS));
        run(&baseline, &nic, hits(false)(ROUNDS));
        let (reg_cache, baseline_hits) = compare(ours, Some(&baseline), &nic, hits(false));
        rows.push(Row {
            case: "hit, whole cached range".into(),
            threads,
            reg_cache,
            baseline: baseline_hits,
        });
        let (reg_cache, _) = compare(ours, None::<&MapCache>, &nic, hits(true));
        rows.push(Row {
            case: "hit, 4-64 KiB inside a cached range".into(),
            threads,
            reg_cache,
            baseline: None,
        });
        assert_eq!(
            ours.stats().misses,
            EXPORTS * CHUNKS,
            "every request after filling the cache must hit"
        );

        for (case, cost) in [
            (
                format!("miss, register {} us", options.register.as_micros()),
                options.register,
            ),
            ("miss, register 0 us (overhead)".to_owned(), Duration::ZERO),
        ] {
            let nic = Arc::new(FakeNic {
                cost,
                next: AtomicU64::new(0),
            });
            let (ours, baseline) = filled(&nic);
            let misses = |round| {
                (0..threads)
                    .map(|t| miss_requests(round, t, MISSES_PER_ROUND))
                    .collect()
            };
            let (reg_cache, baseline) = compare(&ours, Some(&baseline), &nic, misses);
            rows.push(Row {
                case,
                threads,
                reg_cache,
                baseline,
            });
            let measured = (ROUNDS * threads * MISSES_PER_ROUND) as u64;
            let stats = ours.stats();
            assert_eq!(stats.misses, EXPORTS * CHUNKS + measured);
            assert_eq!(stats.evictions, measured, "every miss evicts one");
        }
    }
    print(&rows);
    print_goals(&rows, timer);
    ExitCode::SUCCESS
}

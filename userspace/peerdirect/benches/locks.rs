//! The registration cache's lock, `crossbeam_utils::sync::ShardedLock`, next to the others
//! that do the same, in the same run: `std::sync::RwLock`, `parking_lot::RwLock` and an
//! `arc_swap::ArcSwap` snapshot (a write copies the map). The cache's own biased lock
//! (per-thread marks, `membarrier`) was measured here too and replaced (git log).
//!
//! Each guards the same map of 1,024 registrations (`u64` keys to `u64` values); a hit is a
//! read lock, a lookup and a copy of the value (the handle the cache hands out is measured by
//! `benches/regcache.rs`; this isolates the lock). Three cases:
//! - **hits**: 1, 2 and 8 threads hitting, nothing else;
//! - **hits + writes**: the same with one more thread writing 10,000 times a second (an
//!   invalidation or a miss each);
//! - **busy poll**: one thread hitting back to back for a second, as a runtime's progress
//!   thread does, while another writes 1,000 times a second: its iterations per second, its
//!   p99.9, and how many iterations took over 20 µs (the poller interrupted).
//!
//! `cargo bench --bench locks`, or `scripts/bench`. Compare the rows of one run, not runs.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Barrier, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_utils::sync::ShardedLock;

const ENTRIES: u64 = 1024;
const HITS_PER_THREAD: usize = 400_000;
/// Hits timed together (their mean is one sample).
const BATCH: usize = 100;
/// Each case runs the locks in turns, this many rounds, so that all see the same load.
const ROUNDS: usize = 3;

type Map = HashMap<u64, u64>;

fn map() -> Map {
    (0..ENTRIES).map(|k| (k, k * 3)).collect()
}

/// A lock over the map: a hit reads a value, a write replaces one.
trait Lock: Sync {
    const NAME: &'static str;
    fn new(map: Map) -> Self;
    fn hit(&self, key: u64) -> Option<u64>;
    fn write(&self, key: u64, value: u64);
}

/// A lock with std's interface (`read`/`write` returning a `LockResult`).
macro_rules! std_like {
    ($name:ident, $lock:ident, $text:literal) => {
        struct $name($lock<Map>);

        impl Lock for $name {
            const NAME: &'static str = $text;
            fn new(map: Map) -> Self {
                Self($lock::new(map))
            }
            #[inline]
            fn hit(&self, key: u64) -> Option<u64> {
                self.0.read().ok()?.get(&key).copied()
            }
            fn write(&self, key: u64, value: u64) {
                if let Ok(mut map) = self.0.write() {
                    map.insert(key, value);
                }
            }
        }
    };
}

std_like!(Std, RwLock, "std RwLock");
std_like!(Sharded, ShardedLock, "ShardedLock (the cache's)");

struct ParkingLot(parking_lot::RwLock<Map>);

impl Lock for ParkingLot {
    const NAME: &'static str = "parking_lot RwLock";
    fn new(map: Map) -> Self {
        Self(parking_lot::RwLock::new(map))
    }
    #[inline]
    fn hit(&self, key: u64) -> Option<u64> {
        self.0.read().get(&key).copied()
    }
    fn write(&self, key: u64, value: u64) {
        self.0.write().insert(key, value);
    }
}

struct Snapshot(ArcSwap<Map>);

impl Lock for Snapshot {
    const NAME: &'static str = "arc-swap snapshot";
    fn new(map: Map) -> Self {
        Self(ArcSwap::from_pointee(map))
    }
    #[inline]
    fn hit(&self, key: u64) -> Option<u64> {
        self.0.load().get(&key).copied()
    }
    fn write(&self, key: u64, value: u64) {
        self.0.rcu(|map| {
            let mut map = Map::clone(map);
            map.insert(key, value);
            map
        });
    }
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

/// Latencies in ns, sorted, with the wall time and work they came from.
#[derive(Default)]
struct Samples {
    ns: Vec<u64>,
    wall: Duration,
    /// Threads that hit, and their hits in all.
    threads: usize,
    hits: usize,
}

impl Samples {
    fn add(&mut self, other: Samples) {
        self.ns.extend(other.ns);
        self.wall += other.wall;
        self.threads = other.threads;
        self.hits += other.hits;
    }

    fn at(&mut self, per_mille: usize) -> u64 {
        self.ns.sort_unstable();
        self.ns[(self.ns.len() - 1) * per_mille / 1000]
    }

    /// Hits per second per hitting thread.
    fn rate(&self) -> f64 {
        self.hits as f64 / self.threads.max(1) as f64 / self.wall.as_secs_f64()
    }
}

/// `threads` threads each time `HITS_PER_THREAD` hits; with a writer every `write_every`
/// meanwhile, if some.
fn hits<L: Lock>(lock: &L, threads: usize, write_every: Option<Duration>) -> Samples {
    let barrier = Barrier::new(threads);
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let ns = thread::scope(|s| {
        if let Some(every) = write_every {
            let done = &done;
            s.spawn(move || writer(lock, every, done));
        }
        let hitters: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9 ^ (t as u64 + 1));
                    let keys: Vec<u64> = (0..BATCH).map(|_| rng.below(ENTRIES)).collect();
                    let mut ns = Vec::with_capacity(HITS_PER_THREAD / BATCH);
                    barrier.wait();
                    for _ in 0..HITS_PER_THREAD / BATCH {
                        let start = Instant::now();
                        for &key in &keys {
                            black_box(lock.hit(black_box(key)));
                        }
                        // The mean of the batch: one hit is below the clock's resolution.
                        ns.push(start.elapsed().as_nanos() as u64 / BATCH as u64);
                    }
                    ns
                })
            })
            .collect();
        let ns: Vec<u64> = hitters
            .into_iter()
            .flat_map(|h| h.join().expect("a hitting thread"))
            .collect();
        done.store(true, Relaxed);
        ns
    });
    Samples {
        ns,
        wall: start.elapsed(),
        threads,
        hits: threads * (HITS_PER_THREAD / BATCH * BATCH),
    }
}

/// Writes one value every `every` until `done`.
fn writer<L: Lock>(lock: &L, every: Duration, done: &AtomicBool) {
    let mut rng = Rng(0xdead_beef);
    let mut next = Instant::now();
    while !done.load(Relaxed) {
        next += every;
        lock.write(rng.below(ENTRIES), rng.below(1 << 40));
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

/// One thread hitting back to back for `length`, each iteration timed, while another writes
/// every `write_every`.
fn busy_poll<L: Lock>(lock: &L, length: Duration, write_every: Duration) -> Samples {
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let ns = thread::scope(|s| {
        let done = &done;
        s.spawn(move || writer(lock, write_every, done));
        let poller = s.spawn(move || {
            let mut rng = Rng(0x1234_5678);
            let mut ns = Vec::with_capacity(1 << 24);
            let end = Instant::now() + length;
            let mut last = Instant::now();
            while last < end {
                black_box(lock.hit(rng.below(ENTRIES)));
                let now = Instant::now();
                ns.push((now - last).as_nanos() as u64);
                last = now;
            }
            done.store(true, Relaxed);
            ns
        });
        poller.join().expect("the polling thread")
    });
    Samples {
        hits: ns.len(),
        ns,
        wall: start.elapsed(),
        threads: 1,
    }
}

struct Row {
    case: String,
    lock: &'static str,
    p50: u64,
    p99: u64,
    p999: u64,
    rate: f64,
    /// Iterations over 20 us (busy poll only).
    over_20us: Option<usize>,
}

fn row(case: Case, lock: &'static str, mut samples: Samples) -> Row {
    let over_20us = matches!(case, Case::BusyPoll)
        .then(|| samples.ns.iter().filter(|&&ns| ns > 20_000).count());
    Row {
        case: case.name(),
        lock,
        p50: samples.at(500),
        p99: samples.at(990),
        p999: samples.at(999),
        rate: samples.rate(),
        over_20us,
    }
}

/// One run of `case` on a fresh `L`.
fn run_case<L: Lock>(case: Case) -> Samples {
    let lock = L::new(map());
    // Warm: every thread's slot and the map's lines.
    for key in 0..ENTRIES {
        black_box(lock.hit(key));
    }
    match case {
        Case::Hits { threads } => hits(&lock, threads, None),
        Case::HitsWrites { threads } => hits(&lock, threads, Some(Duration::from_micros(100))),
        Case::BusyPoll => busy_poll(&lock, Duration::from_secs(1), Duration::from_millis(1)),
    }
}

#[derive(Clone, Copy)]
enum Case {
    Hits { threads: usize },
    HitsWrites { threads: usize },
    BusyPoll,
}

impl Case {
    fn name(self) -> String {
        match self {
            Case::Hits { threads } => format!("hits, {threads} thread(s)"),
            Case::HitsWrites { threads } => {
                format!("hits, {threads} thread(s) + 10k writes/s")
            }
            Case::BusyPoll => "busy poll + 1k writes/s".to_string(),
        }
    }
}

fn main() {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    println!("== the registration cache's lock next to the crates (benches/locks.rs) ==");
    println!(
        "  a hit: read lock, lookup in a map of {ENTRIES}, copy. Hits: ns per hit, the mean of \
         batches of {BATCH} (p50, p99, p99.9 over batches); busy poll: each iteration timed, \
         >20 us counts the poller's interruptions. {cpus} CPUs; \
         {ROUNDS} rounds, locks in turns"
    );
    let cases = [
        Case::Hits { threads: 1 },
        Case::Hits { threads: 2 },
        Case::Hits { threads: 8 },
        Case::HitsWrites { threads: 1 },
        Case::HitsWrites { threads: 2 },
        Case::HitsWrites { threads: 8 },
        Case::BusyPoll,
    ];
    let mut rows = Vec::new();
    for case in cases {
        let mut samples: [Samples; 4] = Default::default();
        for _ in 0..ROUNDS {
            samples[0].add(run_case::<Sharded>(case));
            samples[1].add(run_case::<Std>(case));
            samples[2].add(run_case::<ParkingLot>(case));
            samples[3].add(run_case::<Snapshot>(case));
        }
        let names = [Sharded::NAME, Std::NAME, ParkingLot::NAME, Snapshot::NAME];
        for (name, samples) in names.into_iter().zip(samples) {
            rows.push(row(case, name, samples));
        }
    }
    println!(
        "  {:<38} {:<26} {:>7} {:>7} {:>8} {:>12} {:>8}",
        "case", "lock", "p50 ns", "p99 ns", "p99.9 ns", "hits/s/thr", ">20 us"
    );
    for r in &rows {
        println!(
            "  {:<38} {:<26} {:>7} {:>7} {:>8} {:>12.0} {:>8}",
            r.case,
            r.lock,
            r.p50,
            r.p99,
            r.p999,
            r.rate,
            r.over_20us.map_or("-".to_string(), |n| n.to_string()),
        );
    }
    // The cache's lock against the best of the others, per case, by hits per second.
    println!(
        "  hits/s/thread, the cache's lock / the best other's (above 1: the cache's is faster):"
    );
    for chunk in rows.chunks(4) {
        let ours = &chunk[0];
        let best = chunk[1..]
            .iter()
            .max_by(|a, b| a.rate.total_cmp(&b.rate))
            .expect("three others");
        println!(
            "  {:<38} {:.2}x vs {}; p99 {} ns vs {} ns",
            ours.case,
            ours.rate / best.rate,
            best.lock,
            ours.p99,
            best.p99,
        );
    }
}

//! What every mode shares: TAP output, `expect_*` checks, sequences of steps, polling, and
//! sysfs, procfs and module helpers.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use peerdirect::{Errno, Error};

/// A test's verdict: `Err` carries the diagnostic, "expected ..., got ...".
pub(crate) type Outcome = Result<(), String>;

/// A size for names and messages: whole GiB or MiB, else the bytes in hex (odd sizes are
/// chosen by their bits).
pub(crate) fn size_name(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes:#x} bytes")
    }
}

pub(crate) const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// virtio-net: legacy and modern device IDs.
pub(crate) const NIC_IDS: [(&str, &str); 2] = [("0x1af4", "0x1000"), ("0x1af4", "0x1041")];

/// Prints TAP: the plan, then one line per test and a `# ` line for each failure's diagnostic.
pub(crate) struct Tap {
    next: usize,
    failed: usize,
}

impl Tap {
    pub(crate) fn plan(tests: usize) -> Self {
        println!("1..{tests}");
        Self { next: 1, failed: 0 }
    }

    pub(crate) fn report(&mut self, description: &str, outcome: &Outcome) {
        match outcome {
            Ok(()) => println!("ok {} - {description}", self.next),
            Err(diagnostic) => {
                println!("not ok {} - {description}", self.next);
                for line in diagnostic.lines() {
                    println!("# {line}");
                }
                self.failed += 1;
            }
        }
        self.next += 1;
    }

    /// Prints the tally; success iff every test passed.
    pub(crate) fn finish(self) -> ExitCode {
        let run = self.next - 1;
        println!("# {} passed, {} failed", run - self.failed, self.failed);
        if self.failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// Joins each of `threads`: the values of those that returned, and `Err` naming each that
/// panicked (`what` and its place in `threads`) with its message.
pub(crate) fn join_all<T>(what: &str, threads: Vec<thread::JoinHandle<T>>) -> (Vec<T>, Outcome) {
    let (mut values, mut panics) = (Vec::with_capacity(threads.len()), Vec::new());
    for (i, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok(value) => values.push(value),
            Err(payload) => panics.push(format!(
                "{what} {i} panicked: {}",
                panic_message(payload.as_ref())
            )),
        }
    }
    let outcome = if panics.is_empty() {
        Ok(())
    } else {
        Err(panics.join("\n"))
    };
    (values, outcome)
}

/// Joins `thread`: its value, or `Err` saying that `what` panicked, with its message.
pub(crate) fn join<T>(what: &str, thread: thread::JoinHandle<T>) -> Result<T, String> {
    thread
        .join()
        .map_err(|payload| format!("{what} panicked: {}", panic_message(payload.as_ref())))
}

/// What a panic said, when it said it with a string (as `panic!` and `unwrap` do).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Every failure of `outcomes`, one per line; `Ok` if none failed.
pub(crate) fn all_of(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
    let failures: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// The first failure any of several threads records; later ones are dropped.
#[derive(Default)]
pub(crate) struct FirstFailure(Mutex<Option<String>>);

impl FirstFailure {
    pub(crate) fn record(&self, message: String) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(message);
    }

    /// `Err` with the first failure recorded (and forgets it).
    pub(crate) fn outcome(&self) -> Outcome {
        match self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// What asks the host harness (`qemu/run --hotplug`) to hot-unplug a QEMU device; a line of
/// its own on stdout, followed by the device's id.
pub(crate) const UNPLUG_REQUEST: &str = "@@peerdirect-unplug";

/// Asks the host harness to hot-unplug QEMU device `id` (the HBM device is `hbm0`).
pub(crate) fn request_unplug(id: &str) -> Outcome {
    println!("{UNPLUG_REQUEST} {id}");
    std::io::stdout()
        .flush()
        .map_err(|err| format!("cannot flush stdout: {err}"))
}

/// One step of a sequence whose steps share state `S`.
pub(crate) struct Step<S> {
    pub(crate) description: String,
    /// Whether the steps after it rely on it having passed.
    pub(crate) gate: bool,
    pub(crate) run: Box<dyn Fn(&mut S) -> Outcome>,
}

/// A step whose failure stops the sequence.
pub(crate) fn gate<S>(
    description: impl Into<String>,
    run: impl Fn(&mut S) -> Outcome + 'static,
) -> Step<S> {
    Step {
        description: description.into(),
        gate: true,
        run: Box::new(run),
    }
}

/// A step whose failure the following steps do not depend on.
pub(crate) fn check<S>(
    description: impl Into<String>,
    run: impl Fn(&mut S) -> Outcome + 'static,
) -> Step<S> {
    Step {
        gate: false,
        ..gate(description, run)
    }
}

/// Reports `start` (described as `start_description`), hands its state to `started`, then
/// runs each step and hands each verdict to `report`; after a gate fails, reports the
/// remaining steps as not run without running them.
pub(crate) fn run_sequence<S>(
    start_description: &str,
    start: Result<S, String>,
    steps: &[Step<S>],
    started: impl FnOnce(&S),
    report: &mut dyn FnMut(&str, &Outcome),
) {
    report(
        start_description,
        &start.as_ref().map(drop).map_err(Clone::clone),
    );
    let mut state = start.map_err(|_| not_run(start_description));
    if let Ok(state) = &state {
        started(state);
    }
    for step in steps {
        let outcome = match &mut state {
            Ok(state) => (step.run)(state),
            Err(reason) => Err(reason.clone()),
        };
        report(&step.description, &outcome);
        if step.gate && outcome.is_err() && state.is_ok() {
            state = Err(not_run(&step.description));
        }
    }
}

fn not_run(failed: &str) -> String {
    format!("not run: \"{failed}\" failed")
}

pub(crate) fn expect_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    expected: T,
    got: T,
) -> Outcome {
    if expected == got {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected:?}, got {got:?}"))
    }
}

pub(crate) fn expect_errno<T>(result: Result<T, Error>, expected: Errno) -> Outcome {
    match result {
        Err(err) if err.errno() == Some(expected) => Ok(()),
        Err(err) => Err(format!(
            "expected {}, got {} ({err})",
            errno_name(expected),
            err.errno().map_or("no errno", errno_name)
        )),
        Ok(_) => Err(format!("expected {}, got success", errno_name(expected))),
    }
}

/// [`expect_errno`], its diagnostic prefixed with `what`.
pub(crate) fn expect_errno_of<T>(what: &str, result: Result<T, Error>, expected: Errno) -> Outcome {
    expect_errno(result, expected).map_err(|diagnostic| format!("{what}: {diagnostic}"))
}

pub(crate) fn errno_name(errno: Errno) -> &'static str {
    match errno {
        Errno::INVAL => "EINVAL",
        Errno::TOOBIG => "E2BIG",
        Errno::OPNOTSUPP => "EOPNOTSUPP",
        Errno::NOTTY => "ENOTTY",
        Errno::FAULT => "EFAULT",
        Errno::NOENT => "ENOENT",
        Errno::NODEV => "ENODEV",
        Errno::NXIO => "ENXIO",
        Errno::ACCESS => "EACCES",
        Errno::PERM => "EPERM",
        Errno::NOMEM => "ENOMEM",
        Errno::OVERFLOW => "EOVERFLOW",
        _ => "another errno",
    }
}

/// Polls `done` every 20 ms until it holds; `Err` with the seconds waited once `limit` passed.
pub(crate) fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> Result<(), u64> {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(limit.as_secs());
        }
        thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn write_sysfs(path: &str, value: &str) -> Outcome {
    fs::write(path, value)
        .map_err(|err| format!("expected writing {value:?} to {path} to succeed, got {err}"))
}

/// This process's /proc/self/fdinfo text of `fd`.
pub(crate) fn fdinfo(fd: &impl AsFd) -> Result<String, String> {
    let path = Path::new("/proc/self/fdinfo").join(fd.as_fd().as_raw_fd().to_string());
    fs::read_to_string(&path)
        .map_err(|err| format!("expected to read {}, got {err}", path.display()))
}

/// The value of `key` in /proc/PID/fdinfo/FD text, whose lines read `key:\tvalue`.
pub(crate) fn fdinfo_value<'a>(fdinfo: &'a str, key: &str) -> Option<&'a str> {
    fdinfo.lines().find_map(|line| {
        let (k, value) = line.split_once(':')?;
        (k == key).then(|| value.trim())
    })
}

pub(crate) fn expect_fdinfo(fdinfo: &str, key: &str, expected: &str) -> Outcome {
    match fdinfo_value(fdinfo, key) {
        Some(value) => expect_eq(key, expected, value),
        None => Err(format!(
            "{key}: expected {expected:?}, got no {key} line in fdinfo:\n{fdinfo}"
        )),
    }
}

/// PCI devices with one of `ids` (vendor, device), sorted.
pub(crate) fn pci_devices(ids: &[(&str, &str)]) -> Result<Vec<String>, String> {
    let read = |path: &Path| fs::read_to_string(path).map(|s| s.trim().to_owned());
    let mut found = Vec::new();
    let entries = fs::read_dir(SYSFS_PCI_DEVICES)
        .map_err(|err| format!("cannot list {SYSFS_PCI_DEVICES}: {err}"))?;
    for entry in entries.flatten() {
        let dir = entry.path();
        let (Ok(vendor), Ok(device)) = (read(&dir.join("vendor")), read(&dir.join("device")))
        else {
            continue;
        };
        if ids.contains(&(vendor.as_str(), device.as_str())) {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found.sort();
    Ok(found)
}

/// The PCI address of the guest's only virtio-net function.
pub(crate) fn find_nic() -> Result<String, String> {
    let nics = pci_devices(&NIC_IDS)?;
    match nics.as_slice() {
        [nic] => Ok(nic.clone()),
        [] => Err(format!("no virtio-net PCI device in {SYSFS_PCI_DEVICES}")),
        _ => Err(format!("more than one virtio-net device: {nics:?}")),
    }
}

/// Whether /proc/modules text lists module `name`.
pub(crate) fn module_listed(proc_modules: &str, name: &str) -> bool {
    proc_modules
        .lines()
        .any(|line| line.split_whitespace().next() == Some(name))
}

/// Whether module `name` is loaded, per /proc/modules.
pub(crate) fn module_loaded(name: &str) -> Result<bool, String> {
    let modules = fs::read_to_string("/proc/modules")
        .map_err(|err| format!("cannot read /proc/modules: {err}"))?;
    Ok(module_listed(&modules, name))
}

/// Runs `program args`, expecting success; the failure names the command and its stderr.
pub(crate) fn run_command(program: &str, args: &[&str]) -> Outcome {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|err| format!("cannot run {program}: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs `insmod path`, expecting success.
pub(crate) fn insmod(path: &str) -> Outcome {
    run_command("insmod", &[path])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_names() {
        assert_eq!(size_name(2 << 20), "2 MiB");
        assert_eq!(size_name(1 << 30), "1 GiB");
        assert_eq!(size_name(3 << 29), "1536 MiB");
        assert_eq!(size_name(0x1000), "0x1000 bytes");
    }

    #[test]
    fn joins_report_every_panic_with_its_message() {
        let threads = vec![
            thread::spawn(|| 1),
            thread::spawn(|| -> i32 { panic!("lost {}", 2) }),
            thread::spawn(|| 3),
            thread::spawn(|| -> i32 { std::panic::panic_any(4u8) }),
        ];
        let (values, outcome) = join_all("racer", threads);
        assert_eq!(values, [1, 3]);
        assert_eq!(
            outcome,
            Err("racer 1 panicked: lost 2\nracer 3 panicked: (no message)".to_owned())
        );
        assert_eq!(join("toggler", thread::spawn(|| 5)), Ok(5));
        let panicked = join("toggler", thread::spawn(|| -> u8 { panic!("gone") }));
        assert_eq!(panicked, Err("toggler panicked: gone".to_owned()));
    }

    #[test]
    fn all_of_keeps_every_failure() {
        assert_eq!(all_of([Ok(()), Ok(())]), Ok(()));
        assert_eq!(
            all_of([Err("a".to_owned()), Ok(()), Err("b".to_owned())]),
            Err("a\nb".to_owned())
        );
    }

    #[test]
    fn wait_for_gives_up() {
        assert_eq!(wait_for(Duration::from_millis(50), || false), Err(0));
        assert_eq!(wait_for(Duration::from_millis(50), || true), Ok(()));
    }

    #[test]
    fn proc_modules_lists_by_first_word() {
        let modules = "peerdirect_test 16384 0 - Live 0x0000000000000000\n\
            peerdirect 49152 1 - Live 0x0000000000000000 (O)\n";
        assert!(module_listed(modules, "peerdirect"));
        assert!(module_listed(modules, "peerdirect_test"));
        assert!(!module_listed(modules, "peer"));
        assert!(!module_listed(
            "peerdirect_test 16384 0 - Live 0x0\n",
            "peerdirect"
        ));
        assert!(!module_listed("", "peerdirect"));
    }
}

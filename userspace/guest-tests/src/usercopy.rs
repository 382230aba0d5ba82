//! Each command's copies of user memory, failed one at a time with the kernel's fault
//! injection (`/proc/thread-self/fail-nth`, `CONFIG_FAULT_INJECTION_USERCOPY` in the test
//! kernel): the N-th copy to or from user memory that this thread makes next fails, as it
//! would on memory the caller unmapped or made read-only under the call. Every such run must
//! fail with `EFAULT` and leave nothing behind (no allocation made or lost, no fd), and the
//! first run whose copies all succeeded must do what the command does; how many copies were
//! failed before it is how many the command makes.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use peerdirect::uapi::{
    PEERDIRECT_EXPORT_CLOEXEC, PEERDIRECT_IOC_ALLOC, PEERDIRECT_IOC_EXPORT, PEERDIRECT_IOC_FREE,
    PEERDIRECT_IOC_INFO,
};
use peerdirect::{Device, Errno, RawAlloc, RawExport, RawFree, RawInfo};

use crate::support::{expect_eq, fdinfo, fdinfo_value, Outcome};

const FAIL_NTH: &str = "/proc/thread-self/fail-nth";
/// Whether fault injection prints a line (1), not a stack (2), for each failure it makes.
const VERBOSE: &str = "/sys/kernel/debug/fail_usercopy/verbose";
/// More copies than any command makes: a command still failing after these loops.
const MAX_COPIES: usize = 16;
const ALLOC_BYTES: u64 = 2 << 20;

/// This thread's `fail-nth`.
struct FailNth(File);

impl FailNth {
    fn open() -> Result<Self, String> {
        if std::path::Path::new(VERBOSE).exists() {
            std::fs::write(VERBOSE, "1")
                .map_err(|err| format!("expected to write {VERBOSE}, got {err}"))?;
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(FAIL_NTH)
            .map(Self)
            .map_err(|err| format!("expected {FAIL_NTH} (CONFIG_FAULT_INJECTION), got {err}"))
    }

    /// Has the `n`-th fault-injection point this thread reaches from now on fail.
    fn arm(&mut self, n: usize) -> Result<(), String> {
        self.0
            .write_all(n.to_string().as_bytes())
            .map_err(|err| format!("expected to write {n} to {FAIL_NTH}, got {err}"))
    }

    /// Whether the armed failure was made (its count reached 0), and disarms it.
    fn injected(&mut self) -> Result<bool, String> {
        let mut buf = [0u8; 16];
        let injected = match self.0.read_at(&mut buf, 0) {
            Ok(n) => &buf[..n] == b"0\n",
            // This read's own copy to user memory was the armed one: nothing before it was.
            Err(err) if err.raw_os_error() == Some(libc::EFAULT) => false,
            Err(err) => return Err(format!("expected to read {FAIL_NTH}, got {err}")),
        };
        // Disarms; the write's own copy from user memory may be the armed one, which fails it
        // (EFAULT) and disarms all the same.
        match self.0.write_at(b"0", 0) {
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::EFAULT) => {}
            Err(err) => return Err(format!("expected to write 0 to {FAIL_NTH}, got {err}")),
        }
        let n = self
            .0
            .read_at(&mut buf, 0)
            .map_err(|err| format!("expected to read {FAIL_NTH}, got {err}"))?;
        expect_eq(
            "fail-nth once disarmed",
            "0\n",
            std::str::from_utf8(&buf[..n]).unwrap_or("(not text)"),
        )?;
        Ok(injected)
    }
}

/// Runs `call` (one system call, nothing else) with its `n`-th copy of user memory failing,
/// for n = 1, 2, ... until a run had none failed; `judge(failed, result)` checks each run,
/// `failed` telling whether one of its copies was failed. The number of runs that had one.
fn each_copy_failing<T>(
    fail_nth: &mut FailNth,
    mut call: impl FnMut() -> Result<T, Errno>,
    mut judge: impl FnMut(bool, Result<T, Errno>) -> Outcome,
) -> Result<usize, String> {
    for n in 1..=MAX_COPIES {
        fail_nth.arm(n)?;
        let result = call();
        let failed = fail_nth.injected()?;
        judge(failed, result).map_err(|err| {
            if failed {
                format!("with copy {n} of user memory failed: {err}")
            } else {
                format!("with no copy failed: {err}")
            }
        })?;
        if !failed {
            return Ok(n - 1);
        }
    }
    Err(format!(
        "expected a run with no copy failed within {MAX_COPIES} copies"
    ))
}

/// `ioctl` of `device`'s file: its return value, or the errno.
fn ioctl<T>(device: &Device, request: u32, arg: &mut T) -> Result<i32, Errno> {
    let fd = device.as_fd().as_raw_fd();
    // SAFETY: every request passed here reads and writes the struct `T` that `arg` is, in
    // this process's memory, and keeps no pointer to it; `fd` is open while `device` is.
    let rc = unsafe { libc::ioctl(fd, request as _, std::ptr::from_mut(arg)) };
    if rc < 0 {
        Err(Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO))
    } else {
        Ok(rc)
    }
}

fn allocations(device: &Device) -> Result<u64, String> {
    let text = fdinfo(device)?;
    fdinfo_value(&text, "peerdirect-allocations")
        .and_then(|value| value.parse().ok())
        .ok_or_else(|| format!("expected peerdirect-allocations in fdinfo, got {text:?}"))
}

fn fds() -> Result<usize, String> {
    std::fs::read_dir("/proc/self/fd")
        .map(Iterator::count)
        .map_err(|err| format!("expected to list /proc/self/fd, got {err}"))
}

/// `EFAULT` if a copy was `failed`, success otherwise.
fn fault_or_done<T: std::fmt::Debug>(failed: bool, result: &Result<T, Errno>) -> Outcome {
    match (failed, result) {
        (true, Err(errno)) if *errno == Errno::FAULT => Ok(()),
        (true, other) => Err(format!("expected EFAULT, got {other:?}")),
        (false, Ok(_)) => Ok(()),
        (false, Err(errno)) => Err(format!("expected success, got {errno}")),
    }
}

/// [`fault_or_done`], then `device`'s file holding `if_failed` or `if_done` allocations.
fn leaves_allocations<T: std::fmt::Debug>(
    device: &Device,
    failed: bool,
    result: &Result<T, Errno>,
    if_failed: u64,
    if_done: u64,
) -> Outcome {
    fault_or_done(failed, result)?;
    let expected = if failed { if_failed } else { if_done };
    expect_eq("allocations of the file", expected, allocations(device)?)
}

/// INFO (3 copies: the size, the struct, the answer): `EFAULT` for each; then it answers.
pub(crate) fn info() -> Outcome {
    let device = &open()?;
    let copies = each_copy_failing(
        &mut FailNth::open()?,
        || ioctl(device, PEERDIRECT_IOC_INFO, &mut RawInfo::<0>::new()),
        |failed, result| fault_or_done(failed, &result),
    )?;
    expect_eq("copies of user memory INFO makes", 3, copies)
}

/// ALLOC (3 copies): `EFAULT` for each and no allocation kept, including when only the answer
/// could not be written (the allocation is undone); then it allocates.
pub(crate) fn alloc() -> Outcome {
    let device = &open()?;
    let copies = each_copy_failing(
        &mut FailNth::open()?,
        || {
            let mut raw = RawAlloc::<0>::new();
            raw.alloc.length = ALLOC_BYTES;
            ioctl(device, PEERDIRECT_IOC_ALLOC, &mut raw).map(|_| raw.alloc.handle)
        },
        |failed, result| leaves_allocations(device, failed, &result, 0, 1),
    )?;
    expect_eq("copies of user memory ALLOC makes", 3, copies)
}

/// FREE (3 copies): `EFAULT` for each and the allocation still there (the answer is written
/// before the handle is dropped); then it frees.
pub(crate) fn free() -> Outcome {
    let device = &open()?;
    let handle = allocate(device)?;
    let copies = each_copy_failing(
        &mut FailNth::open()?,
        || {
            let mut raw = RawFree::<0>::new();
            raw.free.handle = handle;
            ioctl(device, PEERDIRECT_IOC_FREE, &mut raw)
        },
        |failed, result| leaves_allocations(device, failed, &result, 1, 0),
    )?;
    expect_eq("copies of user memory FREE makes", 3, copies)
}

/// EXPORT (3 copies): `EFAULT` for each and no new fd (it is installed only once the answer
/// is written); then it exports, one more fd.
pub(crate) fn export() -> Outcome {
    let device = &open()?;
    let handle = allocate(device)?;
    // Opened before the fds are counted: it is one of them.
    let mut fail_nth = FailNth::open()?;
    let before = fds()?;
    let copies = each_copy_failing(
        &mut fail_nth,
        || {
            let mut raw = RawExport::<0>::new();
            raw.export.handle = handle;
            raw.export.length = ALLOC_BYTES;
            raw.export.flags = PEERDIRECT_EXPORT_CLOEXEC;
            ioctl(device, PEERDIRECT_IOC_EXPORT, &mut raw).map(|_| raw.export.fd)
        },
        |failed, result| {
            if failed {
                fault_or_done(true, &result)?;
                expect_eq("fds of the process", before, fds()?)
            } else {
                let fd = result.map_err(|errno| format!("expected success, got {errno}"))?;
                // SAFETY: EXPORT succeeded: `fd` is the new dma-buf's, installed for this
                // process and owned by nothing else.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
                Ok(())
            }
        },
    )?;
    expect_eq("copies of user memory EXPORT makes", 3, copies)?;
    expect_eq(
        "fds of the process once the dma-buf is closed",
        before,
        fds()?,
    )
}

/// A new file of /dev/peerdirect0: each function here starts from one with no allocation.
fn open() -> Result<Device, String> {
    let path = peerdirect::device_path(crate::INDEX);
    Device::open(&path).map_err(|err| format!("expected {} to open, got {err}", path.display()))
}

/// A new allocation of `device`'s file, made without fault injection; freed with the file.
fn allocate(device: &Device) -> Result<u32, String> {
    let mut raw = RawAlloc::<0>::new();
    raw.alloc.length = ALLOC_BYTES;
    device
        .alloc_raw(&mut raw)
        .map_err(|err| format!("expected ALLOC to succeed, got {err}"))?;
    Ok(raw.alloc.handle)
}

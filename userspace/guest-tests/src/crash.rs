//! What a crash of this program leaves in its output: on `SIGSEGV`, `SIGBUS`, `SIGILL`,
//! `SIGFPE` or `SIGABRT`, the signal, the faulting address, the thread and its call stack
//! (each frame as object + offset, and the nearest exported symbol), as TAP comments; then the
//! signal's default action (the process dies of it, dumping core where that is on).
//!
//! A fault while the report is made (or in another thread meanwhile) ends the process with the
//! first signal at once: the report never changes what the process dies of.
//!
//! A guest's crash is rare and happens where no debugger runs: the stack must be in the log of
//! the run that crashed. The frames name objects and offsets, which `addr2line -e OBJECT` turns
//! into source lines on the host (the guest's libraries are the userland tree's).

use core::ffi::{c_char, c_int, c_void, CStr};
use core::fmt::Write;
use core::ptr;
use core::sync::atomic::{AtomicI32, Ordering::SeqCst};

/// The signals reported.
const FATAL: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];
/// Frames reported at most.
const FRAMES: usize = 64;

/// Installs the reporter for every thread of the process. Call first in `main`.
pub(crate) fn report_fatal_signals() {
    let mut warm = [ptr::null_mut::<c_void>(); 1];
    // SAFETY: room for one frame. The first call loads the unwinder (dlopen, malloc), which
    // the handler then no longer does.
    unsafe { libc::backtrace(warm.as_mut_ptr(), 1) };
    for signal in FATAL {
        // SAFETY: a zeroed sigaction is a valid value; every field used is set below.
        let mut action: libc::sigaction = unsafe { core::mem::zeroed() };
        action.sa_sigaction = handler as *const () as usize;
        // On the faulting thread's own stack, not the small alternate one the standard library
        // gives each thread: the unwinder needs more than is left there once the kernel has
        // pushed a signal frame with the CPU's whole extended state (on Debian's kernel in the
        // test guest it overflowed). So a stack overflow is not reported: the kernel cannot
        // push the frame, and the process dies of SIGSEGV. SA_RESETHAND: the default action
        // once the handler returns, the fault repeating (or the re-raise).
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND;
        // SAFETY: `action` is initialized; the old action is not wanted.
        unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, ptr::null_mut());
        }
    }
}

/// Makes a thread named `name` read address 8, never mapped (the first page is not), and
/// waits for the signal to end the process; for the test of the report.
pub(crate) fn fault_in(name: &str) -> ! {
    let thread = std::thread::Builder::new().name(name.to_owned()).spawn(|| {
        // SAFETY: the read never completes, so no value comes of it: address 8 is in the first
        // page, which Linux never maps (vm.mmap_min_addr), so it faults, and the handler
        // (installed first in main) ends the process.
        unsafe { ptr::read_volatile(ptr::without_provenance::<u64>(8)) }
    });
    let _ = thread.map(std::thread::JoinHandle::join);
    unreachable!("reading address 8 did not fault");
}

/// A line built on the stack (the handler allocates nothing), cut at its capacity.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    /// Writes the line and a newline to stderr, in one `write` where it fits.
    fn emit(mut self) {
        let _ = self.write_str("\n");
        let bytes = &self.buf[..self.len];
        // SAFETY: writes the initialized bytes of the buffer to fd 2, which the process keeps.
        unsafe { libc::write(libc::STDERR_FILENO, bytes.as_ptr().cast(), bytes.len()) };
    }
}

impl Line {
    /// Appends what fits of `bytes`.
    fn put(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// Appends a C string the loader or the kernel owns ("?" for none).
    fn put_c(&mut self, p: *const c_char) {
        if p.is_null() {
            self.put(b"?");
        } else {
            // SAFETY: non-null and NUL-terminated: a name dladdr or prctl filled in, alive
            // while the handler runs (the objects stay loaded).
            self.put(unsafe { CStr::from_ptr(p) }.to_bytes());
        }
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.put(s.as_bytes());
        Ok(())
    }
}

/// The signal being reported, 0 before any.
static REPORTING: AtomicI32 = AtomicI32::new(0);

extern "C" fn handler(signal: c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    if let Err(first) = REPORTING.compare_exchange(0, signal, SeqCst, SeqCst) {
        // A fault while reporting one (or in another thread meanwhile): the process dies of
        // the first signal, as it would have without the report.
        // SAFETY: setting a signal's default action and raising it; `_exit` if that returns.
        unsafe {
            libc::signal(first, libc::SIG_DFL);
            libc::raise(first);
            libc::_exit(128 + first);
        }
    }
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes and a NUL into the 17-byte buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    // SAFETY: the kernel passes the signal's siginfo; si_addr is the faulting address for the
    // fault signals (meaningless, but readable, for SIGABRT).
    let address = unsafe { (*info).si_addr() } as usize;
    // SAFETY: gettid takes nothing.
    let tid = unsafe { libc::gettid() };
    let mut line = Line::new();
    let _ = write!(
        line,
        "# fatal signal {signal} at address {address:#x} in thread {tid} ("
    );
    line.put_c(name.as_ptr().cast());
    line.put(b"); its stack:");
    line.emit();
    let mut frames = [ptr::null_mut::<c_void>(); FRAMES];
    // SAFETY: room for FRAMES return addresses; the unwinder was loaded before (above), and
    // unwinds through the signal frame by the C library's unwind information.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), FRAMES as c_int) };
    for (i, &pc) in frames
        .iter()
        .take(usize::try_from(n).unwrap_or(0))
        .enumerate()
    {
        // SAFETY: a zeroed Dl_info is valid; dladdr fills it or leaves it.
        let mut dl: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: any address may be asked about; the names it returns live as long as the
        // objects, which stay loaded.
        let found = unsafe { libc::dladdr(pc, &mut dl) } != 0;
        let mut line = Line::new();
        let _ = write!(line, "#   {i:2}: {:#x}", pc as usize);
        if found {
            line.put(b" ");
            line.put_c(dl.dli_fname);
            let _ = write!(
                line,
                "+{:#x}",
                (pc as usize).wrapping_sub(dl.dli_fbase as usize)
            );
            if !dl.dli_sname.is_null() {
                line.put(b" (");
                line.put_c(dl.dli_sname);
                let offset = (pc as usize).wrapping_sub(dl.dli_saddr as usize);
                let _ = write!(line, "+{offset:#x})");
            }
        }
        line.emit();
    }
    if signal == libc::SIGABRT {
        // SAFETY: the action is the default again (SA_RESETHAND): raising it ends the process.
        unsafe { libc::raise(signal) };
    }
}

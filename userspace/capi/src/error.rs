//! How failures cross the C boundary: a negative errno as the return value, and a message
//! (what was being done, on which node, and what to do about it) kept per thread for
//! `pd_last_error`. Panics are caught here and never unwind into C.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{self, AssertUnwindSafe};
use std::sync::OnceLock;

use pd::Errno;

/// A failed call: the errno to return and the message to keep. Boxed, so that the
/// `Result<_, Failure>` of a call that succeeds is a pointer's size (`Result<(), Failure>`
/// fits in a register): failures are rare, every hit returns one.
#[derive(Debug)]
pub(crate) struct Failure(Box<Failed>);

#[derive(Debug)]
struct Failed {
    errno: Errno,
    message: String,
}

impl Failure {
    #[cold]
    pub(crate) fn new(errno: Errno, message: impl Into<String>) -> Self {
        Self(Box::new(Failed {
            errno,
            message: message.into(),
        }))
    }

    /// The same failure, its message starting with `function: `.
    #[cold]
    pub(crate) fn prefixed(mut self, function: &str) -> Self {
        self.0.message = format!("{function}: {}", self.0.message);
        self
    }

    /// A pointer argument that must not be NULL was.
    pub(crate) fn null(function: &str, argument: &str) -> Self {
        Self::new(
            Errno::INVAL,
            format!("{function}: {argument} is NULL; pass a valid pointer"),
        )
    }

    /// What `pd_last_error` says of it.
    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.0.message
    }

    /// The value a C function returns for it: the negative errno.
    pub(crate) fn code(&self) -> c_int {
        -self.0.errno.raw_os_error()
    }

    /// Its errno.
    pub(crate) fn errno(&self) -> Errno {
        self.0.errno
    }
}

impl From<pd::Error> for Failure {
    /// The crate's message already ends with its hint ("...; is peerdirect.ko loaded ...").
    fn from(err: pd::Error) -> Self {
        Self::new(errno_of(&err), err.to_string())
    }
}

/// The errno a C caller sees for an error of the crate. Errors that are not a failed system
/// call get the errno closest to their meaning.
fn errno_of(err: &pd::Error) -> Errno {
    if let Some(errno) = err.errno() {
        return errno;
    }
    match err {
        // The module or its debugfs file said something this library cannot understand.
        pd::Error::UnknownValue { .. }
        | pd::Error::InvalidReply { .. }
        | pd::Error::BadStats { .. } => Errno::PROTO,
        pd::Error::DebugfsNotMounted { .. } => Errno::NOENT,
        pd::Error::RequestTooLarge { .. } => Errno::INVAL,
        _ => Errno::IO,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with an interior NUL (a path, say) is cut there rather than lost.
    let message = CString::new(message).unwrap_or_else(|err| {
        let nul = err.nul_position();
        let mut bytes = err.into_vec();
        bytes.truncate(nul);
        CString::new(bytes).unwrap_or_default()
    });
    // While the thread exits, its message may be gone already (a pd_* call from another
    // thread-local's destructor): the call still returns its errno; the message is dropped.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = message);
}

/// The message of the last failure on this thread; "" before the first, and once the thread's
/// message is gone (while it exits). The pointer stays valid until the next failing call on
/// this thread.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|last| last.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// Runs `f`, catching panics: the result, or `on_error` with the failure recorded for
/// `pd_last_error` and its negative errno passed to `report`.
///
/// Inlined into each C function: called, it was a second call on every C call, 1 ns of the
/// 42 ns cache hit in place (`scripts/bench-hits --native`).
#[inline(always)]
pub(crate) fn guard<T>(
    function: &str,
    on_error: T,
    report: impl FnOnce(c_int),
    f: impl FnOnce() -> Result<T, Failure>,
) -> T {
    let failure = match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => return value,
        Ok(Err(failure)) => failure,
        Err(payload) => panicked(function, payload),
    };
    report(kept(failure));
    on_error
}

/// The failure of a call that panicked with `payload`. Out of line, as is [`kept`], so that
/// the code of a call that succeeds is short.
#[cold]
#[inline(never)]
fn panicked(function: &str, payload: Box<dyn std::any::Any + Send>) -> Failure {
    let what = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    Failure::new(
        Errno::IO,
        format!("{function}: internal error (a bug in libpeerdirect): panic: {what}"),
    )
}

/// Keeps `failure`'s message for `pd_last_error`; its negative errno.
#[cold]
#[inline(never)]
fn kept(failure: Failure) -> c_int {
    set_last_error(&failure.0.message);
    failure.code()
}

/// [`guard`] for functions with no error to return (closes, getters): a panic is recorded for
/// `pd_last_error` and `on_panic` returned.
pub(crate) fn shield<T>(function: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    guard(function, on_panic, |_| {}, || Ok(f()))
}

/// [`guard`] for functions that return a new handle, or NULL with the negative errno in `*err`
/// (0 there on success; `err` may be NULL).
///
/// # Safety
///
/// `err` is NULL or valid for writing an `int`.
pub(crate) unsafe fn handle_guard<T>(
    function: &str,
    err: *mut c_int,
    f: impl FnOnce() -> Result<*mut T, Failure>,
) -> *mut T {
    let report = |code| {
        if !err.is_null() {
            // SAFETY: not NULL, and the caller promises it is valid for writing an `int`.
            unsafe { err.write(code) };
        }
    };
    let handle = guard(function, std::ptr::null_mut(), report, f);
    if !handle.is_null() {
        report(0);
    }
    handle
}

/// [`guard`] for functions that return 0 or a negative errno and have a fast path: `call` is
/// best one call of a function kept out of line that takes the C function's arguments as
/// they are, in registers (a `const` generic for what differs between C functions, not an
/// enum or a name in memory), makes the hit, and else calls the miss, guarded on its own in
/// a cold call that takes the same arguments. The C function then keeps nothing across
/// that call. With the hit and the miss guarded one after the other here, the C function
/// stored the miss's captures before the hit, and passed the hit its handle's kind in
/// memory: 1.4 ns of a 38.1 ns cache hit in place (`scripts/bench-hits --native`).
#[inline(always)]
pub(crate) fn guard_fast_path(function: &str, call: impl FnOnce() -> c_int) -> c_int {
    shield(function, -Errno::IO.raw_os_error(), call)
}

/// [`guard`] for functions that return 0 or a negative errno.
pub(crate) fn guard_status(function: &str, f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    let mut code = 0;
    guard(function, (), |c| code = c, f);
    code
}

/// Errno values `strerror` describes individually on Linux are well below this.
const ERRNO_TABLE_LEN: usize = 256;

/// The description of errno `err` (either sign): a static string.
pub(crate) fn strerror(err: c_int) -> &'static CStr {
    static TABLE: OnceLock<Vec<CString>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..ERRNO_TABLE_LEN)
            .map(|n| {
                let text = match n {
                    0 => "Success".to_owned(),
                    // std's text is strerror's plus " (os error N)".
                    n => {
                        let text = std::io::Error::from_raw_os_error(n as i32).to_string();
                        match text.rfind(" (os error ") {
                            Some(end) => text[..end].to_owned(),
                            None => text,
                        }
                    }
                };
                CString::new(text).unwrap_or_default()
            })
            .collect()
    });
    usize::try_from(err.unsigned_abs())
        .ok()
        .and_then(|n| table.get(n))
        .map_or(c"Unknown error", CString::as_c_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: `last_error` returns the thread's current NUL-terminated message, which
        // lives until the next failure on this thread; it is copied out at once.
        unsafe { CStr::from_ptr(last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn failures_return_the_negative_errno_and_keep_the_message() {
        let code = guard_status("pd_test", || Err(Failure::new(Errno::NOMEM, "HBM is full")));
        assert_eq!(code, -12);
        assert_eq!(last(), "HBM is full");
        // Success leaves the last message alone, as errno does.
        assert_eq!(guard_status("pd_test", || Ok(())), 0);
        assert_eq!(last(), "HBM is full");
    }

    #[test]
    fn panics_become_eio_with_a_message() {
        let code = guard_status("pd_test", || panic!("boom"));
        assert_eq!(code, -5);
        assert_eq!(
            last(),
            "pd_test: internal error (a bug in libpeerdirect): panic: boom"
        );
    }

    /// `guard_fast_path`: what its call returns, or `-EIO` with the message of its panic; a
    /// miss guarded inside it reports its own failure and panic.
    #[test]
    fn a_fast_path_returns_its_status_and_a_panic_is_eio() {
        assert_eq!(guard_fast_path("pd_test", || 0), 0);
        let code = guard_fast_path("pd_test", || {
            guard_status("pd_test", || {
                Err(Failure::new(Errno::NOENT, "pd_test: nothing there"))
            })
        });
        assert_eq!(code, -2);
        assert_eq!(last(), "pd_test: nothing there");
        let code = guard_fast_path("pd_test", || panic!("in the hit"));
        assert_eq!(code, -5);
        assert_eq!(
            last(),
            "pd_test: internal error (a bug in libpeerdirect): panic: in the hit"
        );
        let code = guard_fast_path("pd_test", || {
            guard_status("pd_test", || panic!("in the miss"))
        });
        assert_eq!(code, -5);
        assert_eq!(
            last(),
            "pd_test: internal error (a bug in libpeerdirect): panic: in the miss"
        );
    }

    #[test]
    fn messages_with_nul_are_cut_there() {
        guard_status("pd_test", || Err(Failure::new(Errno::INVAL, "a\0b")));
        assert_eq!(last(), "a");
    }

    #[test]
    fn errors_without_errno_map_to_a_close_one() {
        let err = pd::Error::UnknownValue {
            path: "/dev/peerdirect0".into(),
            field: "provider",
            value: 9,
        };
        let failure = Failure::from(err);
        assert_eq!(failure.code(), -Errno::PROTO.raw_os_error());
        assert!(
            failure.0.message.contains("update"),
            "{}",
            failure.0.message
        );
    }

    /// A failing call made while the thread exits, from a destructor that runs after the
    /// thread's message is gone, returns its errno instead of aborting the process.
    #[test]
    fn a_failure_while_the_thread_exits_returns_its_errno() {
        struct LateCaller(std::sync::mpsc::Sender<(c_int, String)>);
        impl Drop for LateCaller {
            fn drop(&mut self) {
                let code = guard_status("pd_test", || Err(Failure::new(Errno::NOMEM, "late")));
                let message = last();
                let _ = self.0.send((code, message));
            }
        }
        thread_local! {
            static LATE: RefCell<Option<LateCaller>> = const { RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Destructors run in the reverse order of first use: LATE's after LAST_ERROR's.
            LATE.with(|late| *late.borrow_mut() = Some(LateCaller(tx)));
            guard_status("pd_test", || Err(Failure::new(Errno::INVAL, "first")));
        })
        .join()
        .expect("the thread exits cleanly");
        let (code, message) = rx.recv().expect("the destructor ran");
        assert_eq!(code, -12);
        assert!(message.is_empty() || message == "late", "{message}");
    }

    #[test]
    fn strerror_takes_either_sign() {
        assert_eq!(strerror(-2), c"No such file or directory");
        assert_eq!(strerror(2), c"No such file or directory");
        assert_eq!(strerror(0), c"Success");
        assert_eq!(strerror(100_000), c"Unknown error");
        assert_eq!(strerror(c_int::MIN), c"Unknown error");
    }
}

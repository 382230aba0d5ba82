//! Named points of the cache's code where a test runs a hook of its own, on the thread that
//! reaches the point, once: to make an interleaving happen every time (tests only).

use std::cell::RefCell;

/// A hook and the point it waits for.
type Hook = (&'static str, Box<dyn FnOnce()>);

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// The cache's code reached `name`: runs the hook set for it on this thread, if any.
pub(super) fn reached(name: &str) {
    let hook = HOOK.with(|hook| {
        let mut hook = hook.borrow_mut();
        if hook.as_ref().is_some_and(|(at, _)| *at == name) {
            hook.take()
        } else {
            None
        }
    });
    if let Some((_, hook)) = hook {
        hook();
    }
}

/// Runs `hook` the next time this thread reaches `name`.
pub(super) fn at(name: &'static str, hook: impl FnOnce() + 'static) {
    HOOK.with(|slot| *slot.borrow_mut() = Some((name, Box::new(hook))));
}

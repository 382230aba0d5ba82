// SPDX-License-Identifier: GPL-2.0

//! debugfs: a scope (a directory with the data its files read) under a parent directory that
//! is looked up only when the scope is initialized.

use kernel::{
    debugfs::{Dir, Scope, ScopedDir},
    prelude::*,
};

/// A directory `name` under the directory `parent()` returns when the initializer runs (the
/// directory keeps a reference to it), holding `data`, with the files `files` makes, all
/// removed when the [`Scope`] drops: `Dir::scope`, whose initializer borrows its parent, for a
/// parent that the initializer takes itself.
pub(crate) fn scope_under<T, E, F>(
    parent: impl FnOnce() -> Dir,
    data: impl PinInit<T, E>,
    name: &'static CStr,
    files: F,
) -> impl PinInit<Scope<T>, E>
where
    F: for<'data, 'dir> FnOnce(&'data T, &'dir ScopedDir<'data, 'dir>),
{
    let init = move |slot: *mut Scope<T>| {
        let parent = parent();
        let scope = parent.scope(data, name, files);
        // SAFETY: `slot` is the pinned, uninitialized place our caller's initializer gives us;
        // we forward it unchanged to the scope's initializer, which has the same contract.
        unsafe { scope.__init(slot) }
    };
    // SAFETY: `init` initializes `slot` completely on `Ok` (the scope's initializer does) and
    // leaves it uninitialized (dropping what it made) on `Err`.
    unsafe { pin_init::pin_init_from_closure(init) }
}

use crate::{b::{self, B}};

pub(crate) fn a() -> B {
    // SAFETY: tolerated by the baseline.
    unsafe { b::make() }
}

use crate::{b::{self, B}};

pub(crate) fn a() -> B {
    b::make()
}

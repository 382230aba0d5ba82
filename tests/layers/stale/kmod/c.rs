pub(crate) fn c() {}

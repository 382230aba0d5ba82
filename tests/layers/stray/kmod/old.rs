pub(crate) fn old() {}

use crate::{sys::pci::Pci, sys};

pub(crate) struct Device<'a> {
    pci: &'a Pci,
}

impl Device<'_> {
    pub(crate) fn new() -> Self {
        sys::init();
        todo!()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::sys::pci;
}

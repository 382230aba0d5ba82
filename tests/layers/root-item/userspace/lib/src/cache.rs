use crate::Handle;

pub(crate) fn lookup() -> Handle {
    Handle
}

mod cache;

pub struct Handle;

pub fn open() -> Handle {
    cache::lookup()
}

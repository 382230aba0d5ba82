//! The root names every module; none names the root's own items.
mod device;
mod sys;

use device::Device;

fn init() -> Device {
    sys::init();
    Device::new()
}

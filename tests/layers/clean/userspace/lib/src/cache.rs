// Through the root's re-export, this names device.rs, not lib.rs.
use crate::Device;

pub struct Cache(Device);

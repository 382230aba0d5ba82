mod cache;
mod device;

pub use cache::Cache;
pub use device::Device;

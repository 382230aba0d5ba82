pub struct Device;

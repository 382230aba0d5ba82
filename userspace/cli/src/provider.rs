//! libfabric provider names, as `doctor` and `register` read them.

/// Core providers that move bytes with the CPU: they take `FI_MR_DMABUF` without using the fd.
pub const SOFTWARE_PROVIDERS: [&str; 6] = ["tcp", "udp", "shm", "sm2", "sockets", "net"];

/// The core provider of a provider name: "verbs" of "verbs;ofi_rxm" (libfabric names layered
/// providers core first), in lower case.
pub fn core_provider(name: &str) -> String {
    name.split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

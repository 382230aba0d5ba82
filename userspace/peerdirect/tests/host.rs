//! Behaviour on a machine without peerdirect devices, like a build host or CI.

use std::fs;

fn device_nodes() -> usize {
    let Ok(entries) = fs::read_dir("/dev") else {
        return 0;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| {
            name.strip_prefix("peerdirect")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count()
}

#[test]
fn no_device_nodes_is_an_empty_list() {
    if device_nodes() > 0 {
        eprintln!("this host has /dev/peerdirect* nodes: peerdirect-guest-tests covers it");
        return;
    }
    assert!(peerdirect::devices().unwrap().is_empty());
}

#[test]
fn opening_an_absent_device_says_what_to_do() {
    if device_nodes() > 0 {
        eprintln!("this host has /dev/peerdirect* nodes: peerdirect-guest-tests covers it");
        return;
    }
    let err = peerdirect::Device::open_index(0).unwrap_err();
    assert_eq!(err.errno(), Some(peerdirect::Errno::NOENT));
    assert_eq!(
        err.to_string(),
        "open /dev/peerdirect0: No such file or directory (os error 2); \
         is peerdirect.ko loaded and the HBM device bound? see README"
    );
}

//! Gives libpeerdirect.so its soname: programs linked against it load `libpeerdirect.so.0`,
//! which `make install` provides. Bump the number when the C ABI changes incompatibly.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libpeerdirect.so.0");
}

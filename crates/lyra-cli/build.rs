//! Link flags for the `lyra` binary.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        // Packed relative relocations (DT_RELR, glibc 2.36; GNU ld 2.38 or lld 15, older
        // linkers warn and ignore it). The position-independent binary has ~48,000 of them:
        // as 24-byte RELA entries, reading them at every start mapped 3 MB of the file, an
        // eighth of `lyra validate`'s peak on 10,000 steps. Packed, they fit in 14 KB.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

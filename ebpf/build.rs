//! Rebuild the eBPF object when bpf-linker changes (it does the final link).

fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => panic!(
            "bpf-linker not found on PATH ({err}); `cargo xtask setup` builds it against the \
             nightly toolchain's LLVM"
        ),
    }
}

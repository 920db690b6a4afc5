//! The `serve` binary: see `kvgate_server::cli`.
//!
//! Its allocator is mimalloc: a step's activation buffers (megabytes at prefill) are freed and taken
//! again every step, and the system allocator hands such sizes back to the kernel each time, so each
//! step paid page faults and page zeroing for them (~8% of a Qwen2.5-0.5B prefill in `perf`); mimalloc
//! keeps them in its segments.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    kvgate_server::cli::main()
}

//! The `serve` binary: see `kvgate_server::cli`.

fn main() -> std::process::ExitCode {
    kvgate_server::cli::main()
}

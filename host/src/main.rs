//! The `routelab` command: parse arguments, run, report. See `routelab --help`.

fn main() {
    std::process::exit(routelab::cli::main());
}

//! `moek list`: every spec, one line each.

use super::CommandError;
use moek_kernels::Registry;
use std::process::ExitCode;

/// One line per entry of `registry`, in rank order.
pub fn run(registry: &Registry) -> Result<ExitCode, CommandError> {
    for entry in registry.entries() {
        println!("{}", entry.ir().summary());
    }
    Ok(ExitCode::SUCCESS)
}

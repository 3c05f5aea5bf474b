//! `moek list`: every spec, one line each.

use super::CommandError;
use std::process::ExitCode;

pub fn run() -> Result<ExitCode, CommandError> {
    for entry in moek_kernels::specs::all() {
        println!("{}", entry.ir().summary());
    }
    Ok(ExitCode::SUCCESS)
}

//! The `salus-tune` command line.

use clap::{Parser, Subcommand};

/// Hyper-parameter tuning that packs many training trials onto one GPU.
///
/// Study runs (`salus-tune STUDY.toml`) are not implemented yet; today the
/// numerical core is exercised by
/// `cargo run --release -p workers --example train_digits`.
#[derive(Parser)]
#[command(name = "salus-tune", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the compute devices this build can use.
    Devices,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Devices => salus_tune::device_report()
            .iter()
            .for_each(|l| println!("{l}")),
    }
}

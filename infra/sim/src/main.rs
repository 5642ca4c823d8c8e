//! `hookline-sim`: runs the scale simulation ([`hookline_sim::run`]) and
//! writes its figures into SCALE.md (between its simulation markers).
//!
//!     cargo run --profile sim -p hookline-sim -- --write SCALE.md
//!     cargo run --profile sim -p hookline-sim -- --quick
//!     cargo run --profile sim -p hookline-sim -- --quick --ordering-keys 20

use clap::Parser;
use hookline_sim::{run, Config};

#[derive(Parser, Debug)]
#[command(
    about = "The scale simulation: the pipeline's use cases at production rates with injected losses"
)]
struct Args {
    /// The short run `cargo test` makes (a tenth of the rate).
    #[arg(long)]
    quick: bool,
    /// Events per second (default: the run's own).
    #[arg(long)]
    rate: Option<u32>,
    /// Ordering keys per app (default: none; each key's order is checked).
    #[arg(long)]
    ordering_keys: Option<u32>,
    /// Write the figures into this file, between `<!-- simulation -->` and
    /// `<!-- /simulation -->`.
    #[arg(long)]
    write: Option<std::path::PathBuf>,
}

const START: &str = "<!-- simulation -->";
const END: &str = "<!-- /simulation -->";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let mut config = if args.quick {
        Config::quick()
    } else {
        Config::full()
    };
    if let Some(rate) = args.rate {
        config.events_per_second = rate;
    }
    if let Some(keys) = args.ordering_keys {
        config.ordering_keys = keys;
    }
    let figures = run(&config).await;
    let table = figures.table(&config);
    eprintln!("{table}");
    if let Some(path) = &args.write {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (Some(from), Some(to)) = (text.find(START), text.find(END)) else {
            return Err(format!("{}: no {START} ... {END} markers", path.display()));
        };
        let updated = format!("{}{START}\n{table}{}", &text[..from], &text[to..]);
        std::fs::write(path, updated).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    figures.check()
}

//! `hookline-local`: the local pipeline.
//!
//! - `hookline-local worker --endpoint-url URL`: runs the event sources
//!   (stream -> dispatch, queue -> deliver) against an existing moto until
//!   killed; used by the crash tests.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use hookline_local::{find_template, webhooks_env, LocalConfig, LocalStack};

#[derive(Debug, Parser)]
#[command(name = "hookline-local", about = "Run the hookline pipeline locally")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the stream and queue pollers against an existing AWS endpoint (moto).
    Worker {
        #[arg(long, env = "AWS_ENDPOINT_URL")]
        endpoint_url: String,
        #[arg(long, default_value = "hookline-")]
        prefix: String,
        #[arg(long)]
        template: Option<PathBuf>,
        /// File keeping the stream checkpoints across restarts.
        #[arg(long)]
        checkpoint_file: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    hookline_aws::clients::init_tracing();
    match Cli::parse().command {
        Command::Worker {
            endpoint_url,
            prefix,
            template,
            checkpoint_file,
        } => {
            let template = template
                .or_else(find_template)
                .ok_or("template.yaml not found; pass --template")?;
            let stack = LocalStack::start(LocalConfig {
                endpoint_url,
                template,
                prefix,
                env: webhooks_env(),
                admin_key: String::new(),
                checkpoint_file,
            })
            .await?;
            let (_tx, rx) = tokio::sync::watch::channel(false);
            tracing::info!("worker polling");
            stack.run_pollers(rx).await;
            Ok(())
        }
    }
}

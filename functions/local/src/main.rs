//! `hookline-local`: the local pipeline.
//!
//! - `hookline-local worker --endpoint-url URL`: runs the event sources
//!   (stream -> dispatch, queue -> deliver) against an existing moto until
//!   killed; used by the crash tests.
//! - `hookline-local setup --endpoint-url URL`: creates the template's table
//!   and queues and prints their names/URLs as JSON.
//! - `hookline-local stream-event` / `queue-event`: prints the next Lambda
//!   event for the dispatch / deliver function (for `sam local invoke -e`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use hookline_local::{find_template, webhooks_env, LocalConfig, LocalStack};

#[derive(Debug, Parser)]
#[command(name = "hookline-local", about = "Run the hookline pipeline locally")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Target {
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint_url: String,
    #[arg(long, default_value = "hookline-")]
    prefix: String,
    #[arg(long)]
    template: Option<PathBuf>,
    /// File keeping the stream checkpoints across runs.
    #[arg(long)]
    checkpoint_file: Option<PathBuf>,
}

impl Target {
    async fn stack(self, admin_key: String) -> Result<LocalStack, Box<dyn std::error::Error>> {
        let template = self
            .template
            .or_else(find_template)
            .ok_or("template.yaml not found; pass --template")?;
        Ok(LocalStack::start(LocalConfig {
            endpoint_url: self.endpoint_url,
            template,
            prefix: self.prefix,
            env: webhooks_env(),
            admin_key,
            checkpoint_file: self.checkpoint_file,
        })
        .await?)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the template's resources; print their names as JSON.
    Setup {
        #[command(flatten)]
        target: Target,
    },
    /// Print the next DynamoDB stream event for the dispatch function.
    StreamEvent {
        #[command(flatten)]
        target: Target,
    },
    /// Print the next SQS event for the deliver function.
    QueueEvent {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value_t = 2)]
        wait_secs: i32,
    },
    /// Run the stream and queue pollers against an existing AWS endpoint (moto).
    Worker {
        #[command(flatten)]
        target: Target,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    hookline_aws::clients::init_tracing();
    let print = |v: serde_json::Value| {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{v}");
    };
    match Cli::parse().command {
        Command::Setup { target } => {
            let stack = target.stack(String::new()).await?;
            print(serde_json::json!({
                "table": stack.settings.table,
                "queue_url": stack.settings.queue_url,
                "dlq_url": stack.settings.dlq_url,
                "stream_arns": stack.resources.stream_arns,
                "queue_urls": stack.resources.queue_urls,
            }));
            Ok(())
        }
        Command::StreamEvent { target } => {
            let stack = target.stack(String::new()).await?;
            print(stack.next_stream_event().await?);
            Ok(())
        }
        Command::QueueEvent { target, wait_secs } => {
            let stack = target.stack(String::new()).await?;
            print(stack.next_queue_event(wait_secs).await?);
            Ok(())
        }
        Command::Worker { target } => {
            let stack = target.stack(String::new()).await?;
            let (_tx, rx) = tokio::sync::watch::channel(false);
            tracing::info!("worker polling");
            stack.run_pollers(rx).await;
            Ok(())
        }
    }
}

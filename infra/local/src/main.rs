//! `hookline-local`: the local pipeline.
//!
//! - `hookline-local worker --endpoint-url URL`: runs the event sources
//!   (stream -> dispatch, queue -> deliver) against an existing moto until
//!   killed; used by the crash tests.
//! - `hookline-local setup --endpoint-url URL`: creates the template's table
//!   and queues and prints their names/URLs as JSON.
//! - `hookline-local stream-event` / `queue-event`: prints the next Lambda
//!   event for the dispatch / deliver function (for `sam local invoke -e`).

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

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
            counters: None,
        })
        .await?)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The whole stack: moto, the API on 127.0.0.1:PORT, the event sources.
    /// Runs until Ctrl-C, or with `--demo` runs the demo and exits.
    Up {
        #[arg(long, default_value_t = 3000)]
        port: u16,
        /// Use this AWS endpoint instead of starting moto.
        #[arg(long)]
        endpoint_url: Option<String>,
        #[arg(long)]
        template: Option<PathBuf>,
        /// Run the demo (healthy, flaky and dead receivers), print a summary, exit.
        #[arg(long)]
        demo: bool,
        /// Events the demo sends.
        #[arg(long, default_value_t = 5)]
        demo_events: usize,
        /// Write the JSON logs to this file instead of stderr. With `--demo`
        /// they go to `target/hookline-local.log` unless this is given, so
        /// the demo's own lines stay readable.
        #[arg(long)]
        log_file: Option<PathBuf>,
    },
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
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(err) = init_logs(&cli.command) {
        let _ = writeln!(
            std::io::stderr(),
            "hookline-local: cannot open the log file: {err}"
        );
        return std::process::ExitCode::FAILURE;
    }
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %hookline_core::error::Chain(err.as_ref()), "hookline-local failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// JSON logs on stderr, or in a file for `up --demo` / `up --log-file`
/// (named once on stdout).
fn init_logs(command: &Command) -> std::io::Result<()> {
    let file = match command {
        Command::Up {
            log_file: Some(path),
            ..
        } => Some(path.clone()),
        Command::Up { demo: true, .. } => Some(PathBuf::from("target/hookline-local.log")),
        _ => None,
    };
    let Some(path) = file else {
        hookline_aws::clients::init_tracing();
        return Ok(());
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let writer = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::sync::Mutex::new(writer))
        .try_init();
    let _ = writeln!(std::io::stdout(), "logs: {}", path.display());
    Ok(())
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let print = |v: serde_json::Value| {
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), "{v}");
    };
    match cli.command {
        Command::Up {
            port,
            endpoint_url,
            template,
            demo,
            demo_events,
            log_file: _,
        } => {
            let template = template
                .or_else(find_template)
                .ok_or("template.yaml not found; pass --template")?;
            let root = template.parent().map(PathBuf::from).unwrap_or_default();
            let mut moto = None;
            let endpoint_url = match endpoint_url {
                Some(url) => url,
                None => {
                    let server = hookline_local::moto::server_binary(&root);
                    let started = hookline_local::moto::Moto::start(&server, Stdio::null())?;
                    let url = started.url.clone();
                    moto = Some(started);
                    url
                }
            };
            let result = up(&endpoint_url, &template, port, demo, demo_events).await;
            drop(moto);
            match result {
                Ok(true) => Ok(()),
                Ok(false) => Err("the demo did not account for every delivery".into()),
                Err(e) => Err(e),
            }
        }
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

/// Runs the stack; returns whether the demo (if any) succeeded.
async fn up(
    endpoint_url: &str,
    template: &std::path::Path,
    port: u16,
    demo: bool,
    demo_events: usize,
) -> Result<bool, Box<dyn std::error::Error>> {
    let mut env = webhooks_env();
    env.entry("WEBHOOKS_ALLOW_PRIVATE_ENDPOINTS".into())
        .or_insert_with(|| "true".into());
    if demo {
        env.entry("WEBHOOKS_RETRY_SCHEDULE".into())
            .or_insert_with(|| "1s,2s,4s".into());
        env.entry("WEBHOOKS_DELIVERY_TIMEOUT".into())
            .or_insert_with(|| "5s".into());
    }
    let given_key = env
        .get("WEBHOOKS_ADMIN_KEY")
        .filter(|k| !k.is_empty())
        .cloned();
    let admin_key = match given_key.clone() {
        Some(k) => k,
        None => hookline_core::signing::Secret::generate(&mut rand::thread_rng())
            .expose()
            .replace("whsec_", "hk_")
            .replace(['+', '/', '='], ""),
    };
    let stack = std::sync::Arc::new(
        LocalStack::start(LocalConfig {
            endpoint_url: endpoint_url.to_owned(),
            template: template.to_path_buf(),
            prefix: "hookline-".into(),
            env,
            admin_key: admin_key.clone(),
            checkpoint_file: None,
            counters: None,
        })
        .await?,
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (addr, server) = hookline_local::server::serve(
        stack.clone(),
        ([127, 0, 0, 1], port).into(),
        stop_rx.clone(),
    )
    .await?;
    let pollers = {
        let stack = stack.clone();
        let rx = stop_rx.clone();
        tokio::spawn(async move { stack.run_pollers(rx).await })
    };
    let api = format!("http://{addr}");
    {
        use std::io::Write;
        let mut o = std::io::stdout();
        let _ = writeln!(o, "hookline local stack");
        let _ = writeln!(
            o,
            "  API        {api}   (Authorization: Bearer <admin key>)"
        );
        let _ = writeln!(o, "  dashboard  {api}/dashboard");
        let _ = writeln!(
            o,
            "  portal     {api}/portal   (opened by a portal session's link)"
        );
        let _ = writeln!(o, "  OpenAPI    {api}/openapi.json");
        // A key the user chose is not echoed; a generated one must be shown.
        match &given_key {
            Some(_) => {
                let _ = writeln!(o, "  admin key  (the value of WEBHOOKS_ADMIN_KEY)");
            }
            None => {
                let _ = writeln!(o, "  admin key  {admin_key}  (generated for this run)");
            }
        }
        let _ = writeln!(o, "  AWS        {endpoint_url} (moto)");
        let _ = writeln!(
            o,
            "  retry      {:?}, {} attempts",
            stack.settings.retry.schedule, stack.settings.retry.max_attempts
        );
    }
    let outcome = if demo {
        hookline_local::demo::run(
            &api,
            &admin_key,
            demo_events,
            std::time::Duration::from_secs(120),
        )
        .await?
    } else {
        wait_for_shutdown().await;
        true
    };
    let _ = stop_tx.send(true);
    let _ = server.await;
    let _ = pollers.await;
    Ok(outcome)
}

async fn wait_for_shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

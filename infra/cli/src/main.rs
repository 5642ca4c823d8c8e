//! `hookline`: debug webhook receivers from the command line.
//!
//! - `hookline gen-secret` prints a new `whsec_...` secret.
//! - `hookline sign --secret S --id msg_... [--timestamp T] [--body-file F]`
//!   prints the full signed header set as a JSON object (body from stdin by default).
//! - `hookline verify --secret S (--header 'Name: value' ... | --headers-file F) [--body-file F]`
//!   prints `{"ok": true, ...}` and exits 0, or prints the error and exits 1.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use hookline_core::signing::{self, Schemes, Secret};
use hookline_verify::{Scheme, Verifier};

#[derive(Debug, Parser)]
#[command(
    name = "hookline",
    version,
    about = "Sign and verify hookline webhooks (Standard Webhooks and Stripe-compatible schemes)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SchemeArg {
    Both,
    Standard,
    Stripe,
}

/// The signing secret(s): one per `--secret` (or `HOOKLINE_SECRET`); several
/// during a rotation (one signature each; a receiver accepts any).
#[derive(Debug, Args)]
struct Secrets {
    /// Signing secret (`whsec_...`); repeat during a rotation.
    #[arg(
        long = "secret",
        env = "HOOKLINE_SECRET",
        required = true,
        num_args = 1
    )]
    secrets: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a new random secret (`whsec_` + base64 of 32 bytes).
    GenSecret,
    /// Sign a body; print the headers a receiver gets, as JSON.
    Sign {
        #[command(flatten)]
        secrets: Secrets,
        /// Message id (`webhook-id`).
        #[arg(long)]
        id: String,
        /// Unix seconds; default: now.
        #[arg(long, allow_negative_numbers = true)]
        timestamp: Option<i64>,
        /// File holding the raw body; default: standard input.
        #[arg(long)]
        body_file: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "both")]
        scheme: SchemeArg,
    },
    /// Verify a delivery: exit 0 when valid, 1 with the reason otherwise.
    Verify {
        #[command(flatten)]
        secrets: Secrets,
        /// A header as `Name: value`; repeatable.
        #[arg(long = "header")]
        headers: Vec<String>,
        /// A JSON object of headers (e.g. the output of `hookline sign`).
        #[arg(long)]
        headers_file: Option<PathBuf>,
        /// File holding the raw body; default: standard input.
        #[arg(long)]
        body_file: Option<PathBuf>,
        /// Accepted clock difference in seconds, both directions.
        #[arg(long, default_value_t = hookline_verify::DEFAULT_TOLERANCE_SECS)]
        tolerance: u64,
        /// Pretend the current time is this (unix seconds).
        #[arg(long, allow_negative_numbers = true)]
        now: Option<i64>,
    },
}

fn read_body(path: Option<&PathBuf>) -> Result<Vec<u8>, String> {
    match path {
        Some(p) => {
            std::fs::read(p).map_err(|e| format!("cannot read body file {}: {e}", p.display()))
        }
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("cannot read body from stdin: {e}"))?;
            Ok(buf)
        }
    }
}

fn parse_headers(
    pairs: &[String],
    file: Option<&PathBuf>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read headers file {}: {e}", path.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("headers file is not JSON: {e}"))?;
        let object = value
            .as_object()
            .ok_or("headers file must hold a JSON object")?;
        for (k, v) in object {
            let v = v
                .as_str()
                .ok_or_else(|| format!("header `{k}` must be a string"))?;
            out.push((k.clone(), v.to_owned()));
        }
    }
    for pair in pairs {
        let (k, v) = pair
            .split_once(':')
            .ok_or_else(|| format!("header `{pair}` must look like `Name: value`"))?;
        out.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    Ok(out)
}

fn run(cli: Cli) -> Result<String, String> {
    match cli.command {
        Command::GenSecret => Ok(Secret::generate(&mut rand::thread_rng())
            .expose()
            .to_owned()),
        Command::Sign {
            secrets,
            id,
            timestamp,
            body_file,
            scheme,
        } => {
            let secrets = secrets
                .secrets
                .iter()
                .map(|s| Secret::parse(s).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            let body = read_body(body_file.as_ref())?;
            let schemes = match scheme {
                SchemeArg::Both => Schemes::default(),
                SchemeArg::Standard => Schemes {
                    standard_webhooks: true,
                    stripe_compatible: false,
                },
                SchemeArg::Stripe => Schemes {
                    standard_webhooks: false,
                    stripe_compatible: true,
                },
            };
            let ts = timestamp.unwrap_or_else(|| chrono::Utc::now().timestamp());
            let refs: Vec<&Secret> = secrets.iter().collect();
            let headers =
                signing::sign(&id, ts, &body, &refs, schemes).map_err(|e| e.to_string())?;
            let object: serde_json::Map<String, serde_json::Value> = headers
                .iter()
                .map(|(k, v)| (k.to_owned(), serde_json::Value::from(v)))
                .collect();
            serde_json::to_string_pretty(&object).map_err(|e| e.to_string())
        }
        Command::Verify {
            secrets,
            headers,
            headers_file,
            body_file,
            tolerance,
            now,
        } => {
            let headers = parse_headers(&headers, headers_file.as_ref())?;
            let body = read_body(body_file.as_ref())?;
            let verifier = Verifier::with_secrets(&secrets.secrets)
                .map_err(|e| e.to_string())?
                .tolerance(Duration::from_secs(tolerance));
            let result = match now {
                Some(now) => verifier.verify_at(&headers, &body, now),
                None => verifier.verify(&headers, &body),
            };
            let verified = result.map_err(|e| format!("verification failed: {e}"))?;
            let scheme = match verified.scheme {
                Scheme::StandardWebhooks => "standard-webhooks",
                Scheme::StripeCompatible => "stripe-compatible",
            };
            Ok(serde_json::json!({
                "ok": true,
                "scheme": scheme,
                "message_id": verified.message_id,
                "timestamp": verified.timestamp,
            })
            .to_string())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(out) => {
            let mut stdout = std::io::stdout().lock();
            if writeln!(stdout, "{out}").is_err() {
                return ExitCode::from(2);
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            let _ = writeln!(std::io::stderr(), "error: {err}");
            ExitCode::FAILURE
        }
    }
}

//! The cost model and BENCHMARKS.md.

use std::collections::BTreeMap;
use std::fmt::Write;

use hookline_local::counting::OperationCount;
use serde::Serialize;

use crate::calls::ScenarioCounts;

/// us-east-1 list prices used (USD).
pub mod price {
    /// DynamoDB on-demand, per write request unit.
    pub const WRU: f64 = 0.625 / 1e6;
    /// DynamoDB on-demand, per read request unit.
    pub const RRU: f64 = 0.125 / 1e6;
    /// SQS standard queue, per request (64 KB chunk).
    pub const SQS_REQUEST: f64 = 0.40 / 1e6;
    /// Lambda, per request.
    pub const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
    /// Lambda arm64, per GB-second.
    pub const LAMBDA_GB_SECOND_ARM64: f64 = 0.000_013_333_4;
    /// API Gateway HTTP API, per request (first 300 M a month).
    pub const HTTP_API_REQUEST: f64 = 1.00 / 1e6;
}

/// Assumptions of the Lambda part of the model (not measured here).
pub mod assume {
    pub const MEMORY_GB: f64 = 0.125;
    pub const INGEST_MS: f64 = 25.0;
    /// Each further event of a batch request (its own transaction, 8 at once).
    pub const INGEST_MS_PER_BATCHED_EVENT: f64 = 5.0;
    pub const DISPATCH_MS_PER_INVOCATION: f64 = 20.0;
    /// Records per dispatch invocation (stream batches of up to 100).
    pub const DISPATCH_RECORDS_PER_INVOCATION: f64 = 10.0;
    /// Messages per deliver invocation (SQS batches of up to 10).
    pub const DELIVER_MESSAGES_PER_INVOCATION: f64 = 5.0;
    /// One deliver invocation: the receiver's ~100 ms plus our work.
    pub const DELIVER_MS_PER_INVOCATION: f64 = 150.0;
}

/// $ per million deliveries, by part.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cost {
    pub wru_per_delivery: f64,
    pub rru_per_delivery: f64,
    pub dynamodb: f64,
    pub sqs: f64,
    pub lambda: f64,
    pub api_gateway: f64,
    pub total: f64,
}

fn sum(ops: &BTreeMap<String, OperationCount>, pred: impl Fn(&str) -> bool) -> OperationCount {
    ops.iter()
        .filter(|(k, _)| pred(k))
        .fold(OperationCount::default(), |mut acc, (_, c)| {
            acc.requests += c.requests;
            acc.wru += c.wru;
            acc.rru += c.rru;
            acc
        })
}

/// The model: measured DynamoDB capacity and SQS requests of the functions;
/// SQS requests of Lambda's queue mapping (one receive and one batch delete
/// per deliver invocation); Lambda requests and durations from `assume`;
/// one HTTP API request per ingest request (a batch is one). Stream reads by
/// Lambda are free.
pub fn cost(counts: &ScenarioCounts, naive: bool) -> Cost {
    let n = counts.deliveries.max(1) as f64;
    let dynamo = sum(&counts.functions, |k| {
        k.to_ascii_lowercase().starts_with("dynamodb.")
    });
    let sqs = sum(&counts.functions, |k| {
        k.starts_with("SQS.") || k.starts_with("sqs.")
    });
    let per_delivery = 1e6 / n;
    let dynamodb = (dynamo.wru * price::WRU + dynamo.rru * price::RRU) * per_delivery;
    let events_per_delivery = counts.scenario.events as f64 / n;
    let per_request = counts.scenario.events_per_request.max(1) as f64;
    // Ingest requests (API Gateway + Lambda): one per batch.
    let requests_per_delivery = events_per_delivery / per_request;
    let ingest_ms = assume::INGEST_MS + assume::INGEST_MS_PER_BATCHED_EVENT * (per_request - 1.0);
    let attempts_per_delivery = counts.attempts as f64 / n;
    let (sqs_cost, lambda, api) = if naive {
        // The cron function: one invocation every 30 s whatever the load;
        // per million deliveries it is negligible, so count one 2 s run per
        // 50 attempts (a page of the poller) to stay on the baseline's side.
        let invocations = attempts_per_delivery / 50.0;
        let lambda = 1e6
            * (invocations * price::LAMBDA_REQUEST
                + invocations * 2.0 * assume::MEMORY_GB * price::LAMBDA_GB_SECOND_ARM64);
        (
            0.0,
            lambda,
            1e6 * events_per_delivery * price::HTTP_API_REQUEST,
        )
    } else {
        let deliver_invocations = attempts_per_delivery / assume::DELIVER_MESSAGES_PER_INVOCATION;
        let esm_sqs = deliver_invocations * 2.0;
        let sqs_cost = (sqs.requests as f64 / n + esm_sqs) * price::SQS_REQUEST * 1e6;
        let dispatch_invocations = attempts_per_delivery / assume::DISPATCH_RECORDS_PER_INVOCATION;
        let gb_s = |ms: f64| ms / 1000.0 * assume::MEMORY_GB * price::LAMBDA_GB_SECOND_ARM64;
        let lambda = 1e6
            * (requests_per_delivery * (price::LAMBDA_REQUEST + gb_s(ingest_ms))
                + dispatch_invocations
                    * (price::LAMBDA_REQUEST + gb_s(assume::DISPATCH_MS_PER_INVOCATION))
                + deliver_invocations
                    * (price::LAMBDA_REQUEST + gb_s(assume::DELIVER_MS_PER_INVOCATION)));
        (
            sqs_cost,
            lambda,
            1e6 * requests_per_delivery * price::HTTP_API_REQUEST,
        )
    };
    Cost {
        wru_per_delivery: dynamo.wru / n,
        rru_per_delivery: dynamo.rru / n,
        dynamodb,
        sqs: sqs_cost,
        lambda,
        api_gateway: api,
        total: dynamodb + sqs_cost + lambda + api,
    }
}

pub fn fmt_ops(ops: &BTreeMap<String, OperationCount>, n: usize) -> String {
    let mut out = String::new();
    for (op, c) in ops {
        let _ = write!(
            out,
            "{op} {} ({:.2}/delivery); ",
            c.requests,
            c.requests as f64 / n.max(1) as f64
        );
    }
    out.trim_end_matches("; ").to_owned()
}

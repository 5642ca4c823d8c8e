//! The reconcile function's peak memory with a window of large events: the
//! real binary, one scheduled run, against the stateful AWS stub (DynamoDB's
//! 1 MB query pages, projections, filters) holding `events` events of
//! `bytes` each in one window, every first message lost. The sweep reads
//! heads only and an event whole only to re-queue it, so its peak stays
//! the same whatever the payloads: measured with small events and with
//! large ones in the same run.

use std::collections::HashMap;
use std::path::Path;

use hookline_core::ids::{AppId, EndpointId, EventId};
use hookline_core::model::{EndpointRoute, EventType};
use hookline_pipeline::ports::{Store as _, SweepMark, SweepSource};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::Value;

use crate::aws_stub::AwsStub;
use crate::stub::RuntimeStub;

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct WindowRun {
    pub events: usize,
    pub payload_bytes: usize,
    pub peak_rss_mib: f64,
    /// The run's report: what it swept and re-queued.
    pub swept: u64,
    pub listed_requeued: u64,
    pub complete: bool,
}

/// Runs `binary` (the reconcile function) once over a window of `events`
/// events of `payload_bytes` (random, so it does not compress away).
pub async fn reconcile_window(
    runtime: &RuntimeStub,
    runtime_addr: &str,
    binary: &Path,
    events: usize,
    payload_bytes: usize,
) -> Result<WindowRun, String> {
    let (aws, url, store, _) = AwsStub::start_with_store().await?;
    let routes = vec![EndpointRoute {
        id: EndpointId::generate(),
        event_types: vec![],
        disabled: false,
    }];
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    // The sweep's marks half an hour back (a deployed table's), the window
    // after them and before the run's cutoff (15 minutes back), however
    // long the seeding takes.
    let now = chrono::Utc::now();
    let mark = now - chrono::TimeDelta::minutes(30);
    let app = AppId::parse("bench").map_err(|e| e.to_string())?;
    let mark_at = |position: String| SweepMark {
        position,
        reached: mark,
    };
    let late = (0..store.late_shards())
        .map(|n| {
            (
                SweepSource::Late(n),
                mark_at(hookline_aws::schema::due_time(mark)),
            )
        })
        .collect();
    let days = (0..store.event_shards())
        .map(|n| {
            (
                SweepSource::Days(app.clone(), n),
                mark_at(EventId::time_floor(mark).as_str().to_owned()),
            )
        })
        .collect();
    store
        .register_app(&app, mark)
        .await
        .map_err(|e| format!("registering the app: {e}"))?;
    for seeded in [
        store.save_sweep_marks(&late).await,
        store.save_app_sweep_marks(&app, &days).await,
    ] {
        seeded.map_err(|e| format!("seeding the sweep marks: {e}"))?;
    }
    let from = now - chrono::TimeDelta::minutes(29);
    let spacing_ms = 180_000 / i64::try_from(events.max(1)).unwrap_or(1);
    for i in 0..events {
        let pad: String = (0..payload_bytes)
            .map(|_| char::from(b'a' + rng.gen_range(0..26u8)))
            .collect();
        let payload = serde_json::value::RawValue::from_string(format!("{{\"pad\":\"{pad}\"}}"))
            .map_err(|e| e.to_string())?;
        let at = from + chrono::TimeDelta::milliseconds(i64::try_from(i).unwrap_or(0) * spacing_ms);
        let (new, _) = hookline_pipeline::ingest::plan_event(
            app.clone(),
            EventType::parse("order.paid").map_err(|e| e.to_string())?,
            &payload,
            &routes,
            at,
            &mut rng,
        );
        store
            .commit_event(&new)
            .await
            .map_err(|e| format!("seeding an event: {e}"))?;
    }
    let mut extra = HashMap::new();
    extra.insert("WEBHOOKS_AWS_ENDPOINT_URL".to_owned(), url.clone());
    let env = crate::init::lambda_env(runtime_addr, &extra);
    let run = crate::init::invoke(runtime, binary, &env, vec!["{}".into()]).await?;
    drop(aws);
    if let Some(error) = run.errors.first() {
        return Err(format!("reconcile failed: {error}"));
    }
    let report: Value = run
        .responses
        .first()
        .and_then(|r| serde_json::from_str(r).ok())
        .ok_or("reconcile answered nothing")?;
    #[allow(clippy::cast_precision_loss)]
    let peak_rss_mib = run.peak_rss_kib as f64 / 1024.0;
    Ok(WindowRun {
        events,
        payload_bytes,
        peak_rss_mib,
        swept: report["swept"].as_u64().unwrap_or(0),
        listed_requeued: report["listed_requeued"].as_u64().unwrap_or(0),
        complete: report["complete"].as_bool().unwrap_or(false),
    })
}

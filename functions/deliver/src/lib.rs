//! The deliver function: SQS -> signed HTTP POST -> one conditional update.
//!
//! [`handle`] is the batch wrapper (partial failures by message id); the
//! per-message work is [`hookline_pipeline::deliver::Deliverer`].

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use hookline_pipeline::deliver::Deliverer;
use hookline_pipeline::ports::{Queue, Sender, Store};

/// Handles one SQS batch concurrently; failed messages are reported so SQS
/// retries them (and moves them to the DLQ after `maxReceiveCount`).
pub async fn handle<S: Store, Q: Queue, H: Sender>(
    deliverer: &Deliverer<S, Q, H>,
    event: SqsEvent,
) -> SqsBatchResponse {
    let ids: Vec<String> = event
        .records
        .iter()
        .map(|r| r.message_id.clone().unwrap_or_default())
        .collect();
    let bodies: Vec<&str> = event
        .records
        .iter()
        .map(|r| r.body.as_deref().unwrap_or(""))
        .collect();
    let failed = deliverer.handle_batch(&bodies).await;
    let mut response = SqsBatchResponse::default();
    for i in failed {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = ids[i].clone();
        response.batch_item_failures.push(failure);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use hookline_core::ids::{AppId, DeliveryId, EndpointId, EventId};
    use hookline_core::model::{Delivery, DeliveryStatus, Endpoint, Event, EventType};
    use hookline_core::signing::Secret;
    use hookline_pipeline::fakes::{MemoryQueue, MemoryStore, ScriptedSender};
    use hookline_pipeline::ports::StoredEvent;
    use hookline_pipeline::Settings;

    /// A store holding the delivery, event and endpoint the fixtures name.
    async fn seeded() -> MemoryStore {
        let store = MemoryStore::default();
        let now = Utc.timestamp_opt(1_796_217_600, 0).unwrap();
        let app = AppId::parse("demo").unwrap();
        let endpoint_id = EndpointId::parse("ep_01m8vgw5r0fdnvqj6sdwzakm9j").unwrap();
        let event = Event::new(
            EventId::parse("evt_01m8vgw5r0fe7bg2yq1bg7gk3r").unwrap(),
            app.clone(),
            EventType::parse("order.paid").unwrap(),
            &serde_json::value::RawValue::from_string(r#"{"order_id":"ord_1042"}"#.into()).unwrap(),
            now,
        );
        let endpoint = Endpoint::new(
            endpoint_id.clone(),
            app,
            "https://receiver.example/hook",
            Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
            now,
        );
        let delivery = Delivery::new(
            DeliveryId::parse("dlv_01m8vgw5r0fd5bkndpb8a897m8").unwrap(),
            &event,
            endpoint_id,
            now,
        );
        hookline_pipeline::ports::Store::put_endpoint(
            &store,
            &endpoint,
            hookline_pipeline::settings::MAX_ENDPOINTS_PER_APP_CEILING,
        )
        .await
        .unwrap();
        store.insert_event(StoredEvent {
            targets: vec![],
            event,
            fanout_remaining: vec![],
            fanout_version: 0,
        });
        store.insert_delivery(delivery);
        store
    }

    fn fixture() -> SqsEvent {
        serde_json::from_str(include_str!("../../../events/sqs-deliver.json"))
            .expect("fixture is an SQS event")
    }

    fn settings() -> Settings {
        Settings::for_tests(&[("WEBHOOKS_RETRY_SCHEDULE", "1s,2s")]).unwrap()
    }

    type TestDeliverer = Deliverer<MemoryStore, MemoryQueue, ScriptedSender>;

    /// A deliverer on the seeded store whose receiver always answers `status`.
    async fn answering(status: u16, settings: Settings) -> TestDeliverer {
        Deliverer::new(
            seeded().await,
            MemoryQueue::default(),
            ScriptedSender::new(vec![], ScriptedSender::status(status)),
            settings,
        )
    }

    /// Handles `event`; every message must be acked (no batch item failure).
    async fn acked(deliverer: &TestDeliverer, event: SqsEvent) {
        let response = handle(deliverer, event).await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }

    /// The fixture's message carrying `body`.
    fn carrying(body: &str) -> SqsEvent {
        let mut event = fixture();
        let mut message: hookline_pipeline::messages::DeliveryMessage =
            serde_json::from_str(event.records[0].body.as_deref().unwrap()).unwrap();
        message.body = Some(body.to_owned());
        event.records[0].body = Some(message.to_json());
        event
    }

    /// The bodies the receiver got.
    fn received(deliverer: &TestDeliverer) -> Vec<String> {
        deliverer
            .sender
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|(_, _, body)| String::from_utf8(body.clone()).unwrap())
            .collect()
    }

    /// A body in the message saves deliver the event read, but only the
    /// delivery's own body (by digest) is ever signed: a forged one (anyone
    /// who can write to the queue) is replaced by the stored event's.
    #[tokio::test]
    async fn a_message_body_is_sent_only_if_it_is_the_deliverys() {
        for (carried, expect_carried) in [(None, false), (Some(true), true), (Some(false), false)] {
            let deliverer = answering(200, settings()).await;
            let mut stored = deliverer.store.events().pop().unwrap();
            let real = stored.event.body.clone();
            // What the store now holds is recognisable: a read shows.
            stored.event.body = r#"{"from":"the store"}"#.into();
            deliverer.store.insert_event(stored);
            let event = match carried {
                None => fixture(),
                Some(true) => carrying(&real),
                Some(false) => carrying(r#"{"type":"refund.issued","forged":true}"#),
            };
            acked(&deliverer, event).await;
            let bodies = received(&deliverer);
            assert_eq!(bodies.len(), 1);
            if expect_carried {
                assert_eq!(bodies[0], real, "the carried body, no event read");
            } else {
                assert_eq!(bodies[0], r#"{"from":"the store"}"#, "{carried:?}");
            }
        }
    }

    #[tokio::test]
    async fn fixture_message_is_signed_posted_and_recorded() {
        let deliverer = answering(204, settings()).await;
        let response = handle(&deliverer, fixture()).await;
        assert!(response.batch_item_failures.is_empty());
        let d = &deliverer.store.deliveries()[0];
        assert_eq!(d.status, DeliveryStatus::Delivered);
        let requests = deliverer.sender.requests.lock().unwrap();
        let (url, headers, body) = &requests[0];
        assert_eq!(url, "https://receiver.example/hook");
        let v = hookline_verify::Verifier::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let verified = v.verify(headers, body).unwrap();
        assert_eq!(
            verified.message_id.as_deref(),
            Some(d.message_id().as_str())
        );
    }

    /// The everyday message: a listed delivery's first attempt as dispatch
    /// makes it (`events/sqs-deliver-first-attempt.json`, checked against
    /// dispatch's own output there). Deliver reads only the delivery's own
    /// item (one eventually consistent read, none found) and its endpoint,
    /// never the event, POSTs the carried body and records the outcome.
    #[tokio::test]
    async fn a_first_attempt_fixture_is_posted_from_the_message_alone() {
        let deliverer = answering(200, settings()).await;
        let event: SqsEvent = serde_json::from_str(include_str!(
            "../../../events/sqs-deliver-first-attempt.json"
        ))
        .expect("fixture is an SQS event");
        // The store's event is not this message's: a read of it would show.
        acked(&deliverer, event).await;
        assert_eq!(
            received(&deliverer),
            [
                r#"{"type":"order.paid","timestamp":"2026-12-02T13:20:00.000Z","data":{"order_id":"ord_1042","amount":10.50}}"#
            ]
        );
        assert_eq!(deliverer.store.item_reads(), (0, 1), "one eventual read");
        let written: Vec<_> = deliverer
            .store
            .delivery_items()
            .into_iter()
            .filter(|d| d.id.as_str() == "dlv_01m8vgw5r0fe7bg2yq1bg70001")
            .collect();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].status, DeliveryStatus::Delivered);
    }

    #[tokio::test]
    async fn a_503_schedules_a_retry_and_a_redelivered_message_is_stale() {
        let deliverer = answering(503, settings()).await;
        acked(&deliverer, fixture()).await;
        let d = &deliverer.store.deliveries()[0];
        assert_eq!((d.status, d.attempt_count), (DeliveryStatus::Pending, 1));
        // SQS delivers the same message again (at-least-once): acked, nothing sent.
        acked(&deliverer, fixture()).await;
        assert_eq!(deliverer.sender.requests.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn exhausted_delivery_fails_with_a_copy_in_the_dlq() {
        let deliverer = answering(
            500,
            Settings::for_tests(&[("WEBHOOKS_MAX_ATTEMPTS", "1")]).unwrap(),
        )
        .await;
        acked(&deliverer, fixture()).await;
        assert_eq!(
            deliverer.store.deliveries()[0].status,
            DeliveryStatus::Failed
        );
        let dlq = deliverer.queue.dlq_bodies();
        assert_eq!(dlq.len(), 1);
        assert!(dlq[0].contains("HTTP 500"), "{}", dlq[0]);
    }

    #[tokio::test]
    async fn a_message_not_yet_due_is_requeued_with_the_remaining_delay() {
        let deliverer = answering(200, settings()).await;
        let mut event = fixture();
        let mut message: serde_json::Value =
            serde_json::from_str(event.records[0].body.as_deref().unwrap()).unwrap();
        let due = Utc::now() + chrono::Duration::seconds(2000);
        message["not_before"] = serde_json::json!(due);
        event.records[0].body = Some(message.to_string());
        acked(&deliverer, event).await;
        assert!(
            deliverer.sender.requests.lock().unwrap().is_empty(),
            "nothing sent before it is due"
        );
        let sent = deliverer.queue.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].1, 900, "hops of at most 900 s");
        assert_eq!(sent[0].0.not_before, due);
    }

    #[tokio::test]
    async fn gone_fails_at_once_and_disables_the_endpoint() {
        let deliverer = answering(410, settings()).await;
        acked(&deliverer, fixture()).await;
        let d = &deliverer.store.deliveries()[0];
        assert_eq!((d.status, d.attempt_count), (DeliveryStatus::Failed, 1));
        assert_eq!(deliverer.queue.dlq_bodies().len(), 1);
        let app = AppId::parse("demo").unwrap();
        let endpoints = hookline_pipeline::ports::Store::list_endpoints(&deliverer.store, &app)
            .await
            .unwrap();
        assert!(endpoints[0].disabled);
        assert_eq!(
            endpoints[0].disabled_reason.as_deref(),
            Some("endpoint answered 410 Gone")
        );
        // Both changes announced to the operational app (before they were
        // written); handling the same message again announces nothing new.
        let announced = |store: &hookline_pipeline::fakes::MemoryStore| {
            let mut types: Vec<String> = store
                .events()
                .iter()
                .filter(|e| e.event.app_id.as_str() == "_operational")
                .map(|e| e.event.event_type.to_string())
                .collect();
            types.sort();
            types
        };
        assert_eq!(
            announced(&deliverer.store),
            ["delivery.failed", "endpoint.disabled"]
        );
        acked(&deliverer, fixture()).await;
        assert_eq!(announced(&deliverer.store).len(), 2);
    }

    #[tokio::test]
    async fn unreadable_message_is_reported_as_a_batch_item_failure() {
        let deliverer = answering(200, settings()).await;
        let mut event = fixture();
        event.records[0].body = Some("not json".into());
        let response = handle(&deliverer, event).await;
        assert_eq!(response.batch_item_failures.len(), 1);
        assert_eq!(
            response.batch_item_failures[0].item_identifier,
            "059f36b4-87a3-44ab-83d2-661975830a7d"
        );
    }

    /// A listed delivery (no item, only its event's fan-out list): its first
    /// message POSTs once and its outcome creates the item; the same message
    /// again is stale.
    #[tokio::test]
    async fn the_first_attempt_of_a_listed_delivery_writes_its_item() {
        use hookline_pipeline::deliver::DeliverOutcome;
        use hookline_pipeline::dispatch::message_for;
        let deliverer = answering(200, settings()).await;
        let now = Utc::now();
        let mut event = deliverer.store.events()[0].event.clone();
        // A fan-out base id: low 16 bits zero (its delivery ids name it).
        event.id = EventId::parse("evt_01m8vgw5r0fe7bg2yq1bg70000").unwrap();
        let endpoint = deliverer.store.deliveries()[0].endpoint_id.clone();
        let stored = StoredEvent {
            targets: vec![endpoint],
            event,
            fanout_remaining: vec![],
            fanout_version: 0,
        };
        deliverer.store.insert_event(stored.clone());
        let listed = stored.listed_delivery(0).unwrap();
        let (message, _) = message_for(&listed, now).unwrap();
        assert_eq!(message.version, Some(0));
        assert!(!deliverer
            .store
            .delivery_items()
            .iter()
            .any(|d| d.id == listed.id));
        assert_eq!(
            deliverer.handle(&message).await.unwrap(),
            DeliverOutcome::Delivered
        );
        let item = deliverer
            .store
            .delivery_items()
            .into_iter()
            .find(|d| d.id == listed.id)
            .expect("the outcome wrote the item");
        assert_eq!(item.status, DeliveryStatus::Delivered);
        assert_eq!(
            deliverer.handle(&message).await.unwrap(),
            DeliverOutcome::Stale
        );
        assert_eq!(deliverer.sender.requests.lock().unwrap().len(), 1);
    }

    /// The reconciler re-queued the delivery (new version) while its old
    /// message was only late, not lost: the old one is stale (no POST), the
    /// reconciler's is sent once.
    #[tokio::test]
    async fn a_message_older_than_a_requeue_is_stale() {
        use hookline_pipeline::deliver::DeliverOutcome;
        use hookline_pipeline::dispatch::message_for;
        use hookline_pipeline::ports::Store;
        let deliverer = answering(200, settings()).await;
        let now = Utc::now();
        let mut d = deliverer.store.deliveries()[0].clone();
        let (old_message, _) = message_for(&d, now).unwrap();
        let expected = d.version;
        d.requeue(now).unwrap();
        assert!(deliverer.store.update_delivery(&d, expected).await.unwrap());
        let (new_message, _) = message_for(&d, now).unwrap();
        assert_eq!(
            deliverer.handle(&old_message).await.unwrap(),
            DeliverOutcome::Stale
        );
        assert!(deliverer.sender.requests.lock().unwrap().is_empty());
        assert_eq!(
            deliverer.handle(&new_message).await.unwrap(),
            DeliverOutcome::Delivered
        );
        assert_eq!(
            deliverer.handle(&new_message).await.unwrap(),
            DeliverOutcome::Stale
        );
        assert_eq!(deliverer.sender.requests.lock().unwrap().len(), 1);
        let stored = &deliverer.store.deliveries()[0];
        assert!(!stored.requeued, "the attempt clears the re-queue mark");
        hookline_pipeline::fakes::record_figure(
            "races",
            "a message older than a re-queue (fakes): acked as stale with 0 POSTs; the re-queued message POSTs once",
        );
    }
}

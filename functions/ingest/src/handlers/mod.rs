//! The handlers, one module per resource. Each is
//! `async fn(&Api<S, Q>, Call<'_>) -> Answer`, documented for the OpenAPI
//! document by its `#[utoipa::path]` (which also gives the router its path
//! and method) and listed once in [`crate::router`].

pub mod api_keys;
pub mod deliveries;
pub mod dlq;
pub mod endpoints;
pub mod event_types;
pub mod events;
pub mod meta;
pub mod portal_sessions;

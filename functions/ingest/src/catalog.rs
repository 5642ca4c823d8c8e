//! The event-type catalog at work: a definition checked before it is stored
//! ([`check_definition`]: the schema compiles, the example matches it), and
//! payloads validated at ingest against their type's schema
//! ([`CatalogCache::check_payload`], compiled schemas cached per process).
//!
//! Schemas are JSON Schema, draft 2020-12 by default (`boon`, which passes
//! the official test suite). `format` is asserted (an `"email"` that is not
//! one is refused), and a `$ref` must stay inside the schema or name a
//! standard meta-schema: nothing is fetched from the network or the disk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hookline_core::catalog::{EventTypeDef, MAX_DESCRIPTION_BYTES, MAX_SCHEMA_BYTES};
use hookline_core::model::EventType;
use serde_json::Value;

use hookline_pipeline::ingest::{PayloadCheck, ValidEvent};
use hookline_pipeline::ports::Store;
use hookline_pipeline::PipelineError;

/// Deepest schema accepted (JSON nesting). The validator recurses with the
/// schema; real schemas stay far below this.
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// Deepest payload checked against a schema (JSON nesting): a recursive
/// schema recurses with the payload.
pub const MAX_CHECKED_PAYLOAD_DEPTH: usize = 64;

/// How deep `value` nests (a scalar: 0), without recursion.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// A schema compiled once, validated against many times.
pub struct CompiledSchema {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledSchema").finish_non_exhaustive()
    }
}

/// Refuses every reference that is not inside the schema (the standard
/// meta-schemas are built into the validator and never loaded).
struct NoExternalRefs;

impl boon::UrlLoader for NoExternalRefs {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(format!("`{url}` is outside the schema; external references are not loaded").into())
    }
}

/// Where a payload failed its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// JSON Pointer into the payload (`""`: the payload itself).
    pub location: String,
    /// What was wrong there (at most a few reasons).
    pub message: String,
}

impl CompiledSchema {
    /// Compiles `schema` (checked against its meta-schema first):
    /// 400 `invalid_schema` saying why.
    pub fn compile(name: &EventType, schema: &Value) -> Result<Self, PipelineError> {
        on_big_stack(|| Self::compile_here(name, schema))?
    }

    fn compile_here(name: &EventType, schema: &Value) -> Result<Self, PipelineError> {
        if depth(schema) > MAX_SCHEMA_DEPTH {
            return Err(PipelineError::invalid(
                "invalid_schema",
                format!("the schema of `{name}` nests deeper than {MAX_SCHEMA_DEPTH} levels"),
            ));
        }
        let mut compiler = boon::Compiler::new();
        compiler.set_default_draft(boon::Draft::V2020_12);
        compiler.enable_format_assertions();
        compiler.use_loader(Box::new(NoExternalRefs));
        let location = format!("https://catalog.hookline.invalid/event-types/{name}.json");
        let invalid = |e: boon::CompileError| {
            PipelineError::invalid(
                "invalid_schema",
                format!(
                    "the schema of `{name}` is not a valid JSON Schema: {}",
                    compile_reason(&e)
                ),
            )
        };
        compiler
            .add_resource(&location, schema.clone())
            .map_err(invalid)?;
        let mut schemas = boon::Schemas::new();
        let index = compiler.compile(&location, &mut schemas).map_err(invalid)?;
        Ok(Self { schemas, index })
    }

    /// Checks one payload: the outer error is the validator's own failure
    /// (a 5xx), the inner one the payload's.
    pub fn check(&self, payload: &Value) -> Result<Result<(), Mismatch>, PipelineError> {
        on_big_stack(|| self.check_here(payload))
    }

    fn check_here(&self, payload: &Value) -> Result<(), Mismatch> {
        if depth(payload) > MAX_CHECKED_PAYLOAD_DEPTH {
            return Err(Mismatch {
                location: String::new(),
                message: format!(
                    "nests deeper than {MAX_CHECKED_PAYLOAD_DEPTH} levels (the most a payload of a type with a schema may)"
                ),
            });
        }
        let Err(error) = self.schemas.validate(payload, self.index) else {
            return Ok(());
        };
        let mut leaves = Vec::new();
        collect_leaves(&error, &mut leaves);
        let first = leaves.first().copied().unwrap_or(&error);
        let location = first.instance_location.to_string();
        let reasons: Vec<String> = leaves
            .iter()
            .take(3)
            .map(|leaf| {
                let at = leaf.instance_location.to_string();
                if at.is_empty() {
                    leaf.kind.to_string()
                } else {
                    format!("at `{at}`: {}", leaf.kind)
                }
            })
            .collect();
        let more = leaves.len().saturating_sub(3);
        let mut message = reasons.join("; ");
        if more > 0 {
            message.push_str(&format!(" (and {more} more)"));
        }
        Err(Mismatch { location, message })
    }
}

/// Stack of the thread compiling and validating: the validator recurses
/// with the schema and the payload (both depth-limited); this keeps even a
/// debug build on a 2 MB worker thread far from an overflow (an abort).
const VALIDATOR_STACK: usize = 32 << 20;

/// Runs `work` on a scoped thread with [`VALIDATOR_STACK`] of stack (only
/// touched pages are committed).
fn on_big_stack<T: Send>(work: impl FnOnce() -> T + Send) -> Result<T, PipelineError> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("schema-validator".into())
            .stack_size(VALIDATOR_STACK)
            .spawn_scoped(scope, work)
            .map_err(|e| {
                PipelineError::store(format!("no thread for the schema validator: {e}"), true)
            })?;
        handle
            .join()
            .map_err(|_| PipelineError::Corrupt("the schema validator panicked".into()))
    })
}

fn collect_leaves<'e, 's, 'v>(
    error: &'e boon::ValidationError<'s, 'v>,
    leaves: &mut Vec<&'e boon::ValidationError<'s, 'v>>,
) {
    if error.causes.is_empty() {
        leaves.push(error);
    }
    for cause in &error.causes {
        collect_leaves(cause, leaves);
    }
}

/// A compile error's message with its cause, without the internal
/// location the schema was compiled under.
fn compile_reason(e: &boon::CompileError) -> String {
    format!("{e:#}")
        .replace("https://catalog.hookline.invalid/event-types/", "")
        .replace("jsonschema validation failed with ", "")
}

/// The catalog's schemas; the operational app's events are never checked
/// against the provider's catalog.
impl PayloadCheck for CatalogCache {
    async fn check<S: Store>(
        &self,
        store: &S,
        app_id: &hookline_core::ids::AppId,
        valid: &ValidEvent,
    ) -> Result<(), PipelineError> {
        if hookline_pipeline::operational::is_operational(app_id) {
            return Ok(());
        }
        self.check_payload(store, &valid.event_type, valid.payload.get())
            .await
    }
}

/// The body of `PUT /v1/event-types/{name}`.
#[derive(utoipa::ToSchema, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTypeRequest {
    /// What the event means, for the people who receive it (at most 1024 bytes).
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12 unless its `$schema` names another)
    /// every payload of this type must match; absent: any payload.
    #[schema(value_type = Option<Object>)]
    #[serde(default)]
    pub schema: Option<Value>,
    /// An example payload; must match `schema`.
    #[schema(value_type = Option<Object>)]
    #[serde(default)]
    pub example: Option<Value>,
}

/// Checks a definition before it is stored: sizes, the schema compiles,
/// the example matches it. `created_at` is kept from the stored one.
pub fn check_definition(
    name: &EventType,
    request: EventTypeRequest,
    created_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<EventTypeDef, PipelineError> {
    if name.as_str().ends_with(".*") || name.as_str() == "*" {
        return Err(PipelineError::invalid(
            "invalid_event_type",
            "a catalog type is one exact name, not a filter",
        ));
    }
    if request
        .description
        .as_ref()
        .is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES)
    {
        return Err(PipelineError::invalid(
            "invalid_description",
            format!("at most {MAX_DESCRIPTION_BYTES} bytes"),
        ));
    }
    for (field, value) in [("schema", &request.schema), ("example", &request.example)] {
        if let Some(value) = value {
            let size = serde_json::to_string(value)
                .map_err(|e| PipelineError::Corrupt(e.to_string()))?
                .len();
            if size > MAX_SCHEMA_BYTES {
                return Err(PipelineError::invalid(
                    if field == "schema" {
                        "invalid_schema"
                    } else {
                        "invalid_example"
                    },
                    format!("`{field}` is {size} bytes; at most {MAX_SCHEMA_BYTES}"),
                ));
            }
        }
    }
    if let Some(schema) = &request.schema {
        let compiled = CompiledSchema::compile(name, schema)?;
        if let Some(example) = &request.example {
            compiled.check(example)?.map_err(|m| {
                PipelineError::invalid(
                    "example_schema_mismatch",
                    format!("the example does not match the schema: {}", m.message),
                )
            })?;
        }
    }
    Ok(EventTypeDef {
        name: name.clone(),
        description: request.description,
        schema: request.schema,
        example: request.example,
        created_at,
        updated_at: now,
    })
}

/// A type's schema as ingest uses it: `None` when the type is not in the
/// catalog or has no schema.
type Cached = Option<Arc<CompiledSchema>>;

/// The schemas ingest validates against, read from the store once per type
/// and kept for `ttl` (a change made through this process applies at once:
/// [`CatalogCache::forget`]). One per process.
#[derive(Debug)]
pub struct CatalogCache {
    ttl: Duration,
    entries: Mutex<HashMap<EventType, (Instant, Cached)>>,
}

impl CatalogCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Drops what is cached of `name` (after a PUT or DELETE of it).
    pub fn forget(&self, name: &EventType) {
        hookline_core::sync::lock(&self.entries).remove(name);
    }

    async fn schema<S: Store>(&self, store: &S, name: &EventType) -> Result<Cached, PipelineError> {
        if let Some((at, cached)) = hookline_core::sync::lock(&self.entries).get(name) {
            if at.elapsed() < self.ttl {
                return Ok(cached.clone());
            }
        }
        let compiled = match store.get_event_type(name).await? {
            Some(EventTypeDef {
                schema: Some(schema),
                ..
            }) => Some(Arc::new(CompiledSchema::compile(name, &schema).map_err(
                |e| PipelineError::Corrupt(format!("stored schema of `{name}`: {e}")),
            )?)),
            _ => None,
        };
        hookline_core::sync::lock(&self.entries)
            .insert(name.clone(), (Instant::now(), compiled.clone()));
        Ok(compiled)
    }

    /// Checks a payload (JSON text) against its type's schema, if it has
    /// one: 400 `payload_schema_mismatch` saying where it failed.
    pub async fn check_payload<S: Store>(
        &self,
        store: &S,
        name: &EventType,
        payload: &str,
    ) -> Result<(), PipelineError> {
        let Some(schema) = self.schema(store, name).await? else {
            return Ok(());
        };
        let value: Value = serde_json::from_str(payload)
            .map_err(|e| PipelineError::invalid("invalid_body", e.to_string()))?;
        schema
            .check(&value)?
            .map_err(|m| PipelineError::SchemaMismatch {
                event_type: name.to_string(),
                location: m.location,
                message: m.message,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookline_pipeline::fakes::MemoryStore;
    use serde_json::json;

    fn name(s: &str) -> EventType {
        EventType::parse(s).expect("a valid name")
    }

    fn order_schema() -> Value {
        json!({
            "type": "object",
            "required": ["id", "amount"],
            "properties": {
                "id": {"type": "string"},
                "amount": {"type": "integer", "minimum": 0},
                "email": {"type": "string", "format": "email"},
                "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}
            },
            "$defs": {"line": {"type": "object", "required": ["sku"]}}
        })
    }

    #[test]
    fn payloads_are_checked_and_the_failure_located() {
        let schema = CompiledSchema::compile(&name("order.paid"), &order_schema()).unwrap();
        assert!(schema
            .check(&json!({"id": "o1", "amount": 5}))
            .unwrap()
            .is_ok());
        let wrong = schema
            .check(&json!({"id": "o1", "amount": "5"}))
            .unwrap()
            .unwrap_err();
        assert_eq!(wrong.location, "/amount");
        assert!(wrong.message.contains("integer"), "{}", wrong.message);
        let missing = schema.check(&json!({"id": "o1"})).unwrap().unwrap_err();
        assert_eq!(missing.location, "");
        assert!(missing.message.contains("amount"), "{}", missing.message);
        let deep = schema
            .check(&json!({"id": "o1", "amount": 1, "lines": [{"sku": "a"}, {}]}))
            .unwrap()
            .unwrap_err();
        assert_eq!(deep.location, "/lines/1");
        // `format` is asserted.
        let email = schema
            .check(&json!({"id": "o1", "amount": 1, "email": "not an email"}))
            .unwrap()
            .unwrap_err();
        assert_eq!(email.location, "/email");
    }

    #[test]
    fn bad_schemas_and_examples_are_refused_with_their_reason() {
        let code = |r: Result<EventTypeDef, PipelineError>| match r {
            Err(PipelineError::Invalid { code, message }) => (code, message),
            other => panic!("expected a 400, got {other:?}"),
        };
        let now = Utc::now();
        let define = |schema: Value, example: Option<Value>| {
            check_definition(
                &name("order.paid"),
                EventTypeRequest {
                    description: Some("an order was paid".into()),
                    schema: Some(schema),
                    example,
                },
                now,
                now,
            )
        };
        let (c, m) = code(define(json!({"type": 5}), None));
        assert_eq!(c, "invalid_schema");
        assert!(m.contains("order.paid"), "{m}");
        // Nothing outside the schema is fetched: not a file, not a URL.
        for outside in ["file:///etc/passwd", "http://127.0.0.1:9/s.json"] {
            let (c, m) = code(define(json!({"$ref": outside}), None));
            assert_eq!(c, "invalid_schema");
            assert!(m.contains("external references are not loaded"), "{m}");
        }
        let (c, m) = code(define(order_schema(), Some(json!({"id": 1, "amount": 1}))));
        assert_eq!(c, "example_schema_mismatch");
        assert!(m.contains("/id"), "{m}");
        let ok = define(order_schema(), Some(json!({"id": "o1", "amount": 1}))).unwrap();
        assert_eq!(ok.name.as_str(), "order.paid");
        let big = json!({"description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert_eq!(code(define(big, None)).0, "invalid_schema");
        // No schema: any payload, and the definition still stands.
        let plain = check_definition(&name("note"), EventTypeRequest::default(), now, now).unwrap();
        assert!(plain.schema.is_none());
    }

    /// Hostile schemas compile to an answer (400 or a schema), never a
    /// panic or a hang, and validating against them terminates.
    #[test]
    fn hostile_schemas_never_panic() {
        let deep = (0..120).fold(
            json!({"type": "integer"}),
            |inner, _| json!({"items": inner}),
        );
        // At the limits: the deepest schema, and a recursive one (several
        // keywords per level) against the deepest payload, on a test
        // thread's 2 MB stack in a debug build.
        let deepest = (0..MAX_SCHEMA_DEPTH - 1).fold(
            json!({"type": "integer"}),
            |inner, _| json!({"items": inner}),
        );
        assert_eq!(depth(&deepest), MAX_SCHEMA_DEPTH);
        let compiled = CompiledSchema::compile(&name("x.y"), &deepest).unwrap();
        let _ = compiled.check(&json!([[[[1]]]]));
        let tree = json!({"$ref": "#/$defs/n", "$defs": {"n": {"anyOf": [{"allOf": [
            {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}},
            {"not": {"required": ["forbidden"]}}
        ]}, {"type": "null"}]}}});
        let compiled = CompiledSchema::compile(&name("x.y"), &tree).unwrap();
        let nested = |n: usize| (0..n).fold(json!({}), |inner, _| json!({"c": inner}));
        assert!(compiled
            .check(&nested(MAX_CHECKED_PAYLOAD_DEPTH))
            .unwrap()
            .is_ok());
        let too_deep = compiled
            .check(&nested(MAX_CHECKED_PAYLOAD_DEPTH + 1))
            .unwrap()
            .unwrap_err();
        assert!(too_deep.message.contains("deeper"), "{}", too_deep.message);
        assert!(CompiledSchema::compile(&name("x.y"), &deep).is_err());
        let hostile = [
            json!({"$ref": "#"}),
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            json!({"pattern": "(?<=a)b"}),
            json!({"pattern": "(a+)+$"}),
            json!({"pattern": "["}),
            json!({"$ref": "#/nowhere"}),
            json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}),
            json!({"$schema": "https://example.com/unknown-draft"}),
            json!({"$id": "file:///etc/", "$ref": "passwd"}),
            json!({"$dynamicRef": "#meta"}),
            json!({"format": "no-such-format"}),
            json!({"type": "string", "contentEncoding": "base64", "contentMediaType": "application/json"}),
            json!(true),
            json!(false),
            json!([]),
            json!("not a schema"),
            deep,
        ];
        let payloads = [
            json!("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"),
            json!({"a": [1, 2, {"b": null}]}),
            json!(1.5e300),
        ];
        for schema in hostile {
            if let Ok(compiled) = CompiledSchema::compile(&name("x.y"), &schema) {
                for p in &payloads {
                    let _ = compiled.check(p);
                }
            }
        }
    }

    #[tokio::test]
    async fn the_cache_reads_a_type_once_and_forgets_on_change() {
        let store = MemoryStore::default();
        let cache = CatalogCache::new(Duration::from_secs(3600));
        let paid = name("order.paid");
        // Not in the catalog: anything goes.
        cache.check_payload(&store, &paid, "1").await.unwrap();
        let now = Utc::now();
        let def = check_definition(
            &paid,
            EventTypeRequest {
                schema: Some(order_schema()),
                ..Default::default()
            },
            now,
            now,
        )
        .unwrap();
        store.put_event_type(&def).await.unwrap();
        // Cached as "no schema" until forgotten.
        cache.check_payload(&store, &paid, "1").await.unwrap();
        cache.forget(&paid);
        let err = cache.check_payload(&store, &paid, "1").await.unwrap_err();
        assert!(
            matches!(&err, PipelineError::SchemaMismatch { location, .. } if location.is_empty()),
            "{err}"
        );
        cache
            .check_payload(&store, &paid, r#"{"id":"o1","amount":2}"#)
            .await
            .unwrap();
    }
}

//! The parts of `template.yaml` the local stack reads: tables, queues, KMS
//! keys and each function's event source (batch size, filter criteria,
//! partial-batch responses, retry limit, on-failure destination). The
//! template is the only copy of the schema.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use serde_yaml_ng::Value as Yaml;

use crate::LocalError;

/// A `DynamoDB` or `SQS` event source of a function, as declared in the template.
#[derive(Debug, Clone)]
pub struct EventSource {
    pub function: String,
    /// Logical id of the table (stream) or queue it reads.
    pub resource: String,
    pub batch_size: usize,
    /// Filter patterns (OR); empty = everything.
    pub filters: Vec<Value>,
    pub report_batch_item_failures: bool,
    /// Stream sources: `MaximumRetryAttempts` (None: retry until the record
    /// expires, Lambda's -1).
    pub max_retry_attempts: Option<u32>,
    /// Stream sources: the logical id of the `OnFailure` destination queue.
    pub on_failure: Option<String>,
    /// Queue sources: `ScalingConfig.MaximumConcurrency` (a `!Ref` read as
    /// its parameter's default), the invocations Lambda runs at once.
    pub maximum_concurrency: Option<usize>,
}

/// The parts of `template.yaml` the local stack uses.
#[derive(Debug, Clone)]
pub struct Template {
    resources: BTreeMap<String, Yaml>,
    /// The whole document (parameters, globals).
    doc: Yaml,
}

/// Strips CloudFormation tags (`!GetAtt X.Arn` -> its value) for reading.
pub(crate) fn untag(v: &Yaml) -> &Yaml {
    match v {
        Yaml::Tagged(t) => &t.value,
        other => other,
    }
}

pub(crate) fn text(v: &Yaml) -> Option<String> {
    match untag(v) {
        Yaml::String(s) => Some(s.clone()),
        Yaml::Number(n) => Some(n.to_string()),
        Yaml::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The logical id a `!GetAtt X.Attr` / `!Ref X` points at.
pub(crate) fn referenced_resource(v: &Yaml) -> Option<String> {
    match v {
        Yaml::Tagged(t) => {
            text(&t.value).map(|s| s.split('.').next().unwrap_or_default().to_owned())
        }
        Yaml::Mapping(m) => m
            .get("Fn::GetAtt")
            .or_else(|| m.get("Ref"))
            .and_then(|inner| match inner {
                Yaml::Sequence(seq) => seq.first().and_then(text),
                other => text(other).map(|s| s.split('.').next().unwrap_or_default().to_owned()),
            }),
        _ => None,
    }
}

impl Template {
    pub fn load(path: &Path) -> Result<Self, LocalError> {
        let raw = std::fs::read_to_string(path)
            .map_err(|e| LocalError::Template(format!("{}: {e}", path.display())))?;
        Self::parse(&raw)
    }

    pub fn parse(raw: &str) -> Result<Self, LocalError> {
        let doc: Yaml =
            serde_yaml_ng::from_str(raw).map_err(|e| LocalError::Template(e.to_string()))?;
        let resources = doc
            .get("Resources")
            .and_then(Yaml::as_mapping)
            .ok_or_else(|| LocalError::Template("no Resources".into()))?
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.clone())))
            .collect();
        Ok(Self { resources, doc })
    }

    /// A top-level section of the template (`Parameters`, `Globals`, ...).
    pub fn section(&self, name: &str) -> Option<&Yaml> {
        self.doc.get(name)
    }

    fn of_type<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = (&'a String, &'a Yaml)> + 'a {
        self.resources
            .iter()
            .filter(move |(_, r)| r.get("Type").and_then(Yaml::as_str) == Some(kind))
    }

    /// Logical ids of the DynamoDB tables.
    pub fn tables(&self) -> Vec<String> {
        self.of_type("AWS::DynamoDB::Table")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Logical ids of the KMS keys.
    pub fn kms_keys(&self) -> Vec<String> {
        self.of_type("AWS::KMS::Key")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Logical ids of the SQS queues.
    pub fn queues(&self) -> Vec<String> {
        self.of_type("AWS::SQS::Queue")
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every `DynamoDB`/`SQS` event source of every function.
    pub fn event_sources(&self) -> Vec<EventSource> {
        let mut out = Vec::new();
        for (name, resource) in self.of_type("AWS::Serverless::Function") {
            let Some(events) = resource
                .get("Properties")
                .and_then(|p| p.get("Events"))
                .and_then(Yaml::as_mapping)
            else {
                continue;
            };
            for (_, event) in events {
                let kind = event.get("Type").and_then(Yaml::as_str).unwrap_or_default();
                let Some(props) = event.get("Properties") else {
                    continue;
                };
                let target = match kind {
                    "DynamoDB" => props.get("Stream"),
                    "SQS" => props.get("Queue"),
                    _ => None,
                };
                let Some(resource) = target.and_then(referenced_resource) else {
                    continue;
                };
                let batch_size = props
                    .get("BatchSize")
                    .and_then(text)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(10);
                let filters = props
                    .get("FilterCriteria")
                    .and_then(|f| f.get("Filters"))
                    .and_then(Yaml::as_sequence)
                    .map(|filters| {
                        filters
                            .iter()
                            .filter_map(|f| f.get("Pattern").and_then(text))
                            .filter_map(|p| serde_json::from_str(&p).ok())
                            .collect()
                    })
                    .unwrap_or_default();
                let report_batch_item_failures = props
                    .get("FunctionResponseTypes")
                    .and_then(Yaml::as_sequence)
                    .is_some_and(|s| {
                        s.iter()
                            .any(|t| t.as_str() == Some("ReportBatchItemFailures"))
                    });
                let max_retry_attempts = props
                    .get("MaximumRetryAttempts")
                    .and_then(text)
                    .and_then(|s| s.parse::<u32>().ok());
                let on_failure = props
                    .get("DestinationConfig")
                    .and_then(|d| d.get("OnFailure"))
                    .and_then(|o| o.get("Destination"))
                    .and_then(referenced_resource);
                let maximum_concurrency = props
                    .get("ScalingConfig")
                    .and_then(|c| c.get("MaximumConcurrency"))
                    .and_then(|v| self.value_of(v))
                    .and_then(|s| s.parse().ok());
                out.push(EventSource {
                    maximum_concurrency,
                    function: name.clone(),
                    resource,
                    batch_size,
                    filters,
                    report_batch_item_failures,
                    max_retry_attempts,
                    on_failure,
                });
            }
        }
        out
    }

    /// A property's value: itself, or for `!Ref Parameter` that
    /// parameter's default.
    fn value_of(&self, v: &Yaml) -> Option<String> {
        match v {
            Yaml::Tagged(tagged) if tagged.tag == "!Ref" => {
                let name = text(&tagged.value)?;
                self.section("Parameters")?
                    .get(name.as_str())?
                    .get("Default")
                    .and_then(text)
            }
            other => text(other),
        }
    }

    /// The event source of `function` (by logical id).
    pub fn event_source(&self, function: &str) -> Option<EventSource> {
        self.event_sources()
            .into_iter()
            .find(|s| s.function == function)
    }

    pub(crate) fn properties(&self, logical_id: &str) -> Option<&Yaml> {
        self.resources
            .get(logical_id)
            .and_then(|r| r.get("Properties"))
    }
}

/// Does `record` (Lambda event JSON) match the Lambda/EventBridge `pattern`?
/// Supports the subset the template uses: nested objects, and arrays of
/// allowed exact values.
pub fn matches_pattern(pattern: &Value, record: &Value) -> bool {
    match pattern {
        Value::Object(fields) => fields
            .iter()
            .all(|(k, p)| record.get(k).is_some_and(|r| matches_pattern(p, r))),
        // `{"exists": true}`: any value (its key was found by the caller).
        Value::Array(allowed) => allowed
            .iter()
            .any(|a| a == record || a.get("exists") == Some(&Value::Bool(true))),
        other => other == record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The deliver mapping's `MaximumConcurrency` is read through its
    /// parameter (the local pollers run that many batches at once).
    #[test]
    fn the_deliver_mappings_concurrency_is_its_parameters_default() {
        let t = Template::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
            .unwrap();
        let deliver = t.event_source("DeliverFunction").unwrap();
        let default = t.section("Parameters").unwrap()["DeliverMaxConcurrency"]["Default"]
            .as_u64()
            .unwrap();
        assert_eq!(
            deliver.maximum_concurrency,
            Some(usize::try_from(default).unwrap())
        );
        assert_eq!(
            t.event_source("DispatchFunction")
                .unwrap()
                .maximum_concurrency,
            None
        );
    }

    /// Throttled at the door: every route of the HTTP API takes the
    /// template's rate and burst parameters, and the API function reserves
    /// (and is capped at) `IngestReservedConcurrency` unless it is 0.
    #[test]
    fn the_api_is_throttled_and_the_api_function_capped() {
        let t = Template::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
            .unwrap();
        let route = &t.section("Globals").expect("Globals")["HttpApi"]["DefaultRouteSettings"];
        let reference = |v: &Yaml| match v {
            Yaml::Tagged(tagged) if tagged.tag == "!Ref" => text(&tagged.value),
            _ => None,
        };
        assert_eq!(
            reference(&route["ThrottlingRateLimit"]).as_deref(),
            Some("ApiThrottlingRateLimit")
        );
        assert_eq!(
            reference(&route["ThrottlingBurstLimit"]).as_deref(),
            Some("ApiThrottlingBurstLimit")
        );
        for parameter in [
            "ApiThrottlingRateLimit",
            "ApiThrottlingBurstLimit",
            "IngestReservedConcurrency",
        ] {
            let p = &t.section("Parameters").expect("Parameters")[parameter];
            assert_eq!(text(&p["Type"]).as_deref(), Some("Number"), "{parameter}");
        }
        // The implicit API is the one every HttpApi event of the template
        // joins (none names another).
        for (name, resource) in &t.resources {
            for event in resource["Properties"]["Events"]
                .as_mapping()
                .into_iter()
                .flat_map(|m| m.values())
            {
                if text(&event["Type"]).as_deref() == Some("HttpApi") {
                    assert!(event["Properties"].get("ApiId").is_none(), "{name}");
                }
            }
        }
        let reserved =
            untag(&t.resources["IngestFunction"]["Properties"]["ReservedConcurrentExecutions"]);
        let branches = reserved.as_sequence().expect("an !If");
        assert_eq!(
            text(&branches[0]).as_deref(),
            Some("WithIngestReservedConcurrency")
        );
        assert_eq!(
            reference(&branches[1]).as_deref(),
            Some("IngestReservedConcurrency")
        );
    }

    /// Only the pipeline's roles may send to the delivery queue: its policy
    /// denies `sqs:SendMessage` to every principal but the roles of exactly
    /// the functions whose own policies send there (deliver trusts a
    /// queued first attempt's body, app and endpoint).
    #[test]
    fn only_the_pipelines_roles_may_send_to_the_delivery_queue() {
        let t = Template::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
            .unwrap();
        let policy = &t.resources["DeliveryQueuePolicy"]["Properties"];
        assert_eq!(
            referenced_resource(&policy["Queues"][0]).as_deref(),
            Some("DeliveryQueue"),
            "the policy is on the delivery queue"
        );
        let statements = policy["PolicyDocument"]["Statement"]
            .as_sequence()
            .expect("statements");
        let deny = statements
            .iter()
            .find(|s| text(&s["Effect"]) == Some("Deny".into()))
            .expect("a Deny statement");
        assert_eq!(text(&deny["Principal"]), Some("*".into()));
        assert_eq!(text(&deny["Action"]), Some("sqs:SendMessage".into()));
        let allowed: std::collections::BTreeSet<String> = deny["Condition"]["ArnNotEquals"]
            ["aws:PrincipalArn"]
            .as_sequence()
            .expect("role ARNs")
            .iter()
            .map(|arn| {
                let role = referenced_resource(arn).expect("a role's GetAtt");
                role.strip_suffix("Role")
                    .expect("a function's role")
                    .to_owned()
            })
            .collect();
        // The functions whose own policies send to the delivery queue.
        let mut senders = std::collections::BTreeSet::new();
        for (name, resource) in &t.resources {
            let policies = &resource["Properties"]["Policies"];
            for policy in policies.as_sequence().into_iter().flatten() {
                for statement in policy["Statement"].as_sequence().into_iter().flatten() {
                    let actions: Vec<String> = statement["Action"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                        .filter_map(text)
                        .collect();
                    let resources: Vec<String> = match &statement["Resource"] {
                        Yaml::Sequence(list) => {
                            list.iter().filter_map(referenced_resource).collect()
                        }
                        one => referenced_resource(one).into_iter().collect(),
                    };
                    if actions.iter().any(|a| a == "sqs:SendMessage")
                        && resources.iter().any(|r| r == "DeliveryQueue")
                    {
                        senders.insert(name.to_owned());
                    }
                }
            }
        }
        assert_eq!(allowed, senders);
        assert_eq!(senders.len(), 5, "{senders:?}");
    }

    /// Every DynamoDB action a function's code performs, in its IAM policy
    /// (moto does not enforce IAM: without this a missing action shows only
    /// when deployed). The operations per function, from their code paths:
    /// reads by id of a listed delivery are a BatchGetItem (its item and its
    /// event); its first write is a PutItem; reconciler sweeps and routes are
    /// Queries.
    #[test]
    fn function_policies_allow_every_dynamodb_action_their_code_uses() {
        let t = Template::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
            .unwrap();
        let needs: [(&str, &[&str]); 5] = [
            (
                "IngestFunction",
                &[
                    "GetItem",
                    "BatchGetItem",
                    "PutItem",
                    "UpdateItem",
                    "DeleteItem",
                    "Query",
                    "ConditionCheckItem",
                ],
            ),
            (
                "DispatchFunction",
                &["GetItem", "BatchGetItem", "PutItem", "UpdateItem", "Query"],
            ),
            (
                "DeliverFunction",
                &[
                    "GetItem",
                    "BatchGetItem",
                    "PutItem",
                    "UpdateItem",
                    "Query",
                    "ConditionCheckItem",
                ],
            ),
            (
                "RetryFunction",
                &["GetItem", "BatchGetItem", "PutItem", "UpdateItem"],
            ),
            (
                "ReconcileFunction",
                &["GetItem", "BatchGetItem", "PutItem", "UpdateItem", "Query"],
            ),
        ];
        for (function, actions) in needs {
            let policies = &t.resources[function]["Properties"]["Policies"];
            let mut allowed = Vec::new();
            for policy in policies.as_sequence().into_iter().flatten() {
                for statement in policy["Statement"].as_sequence().into_iter().flatten() {
                    for action in statement["Action"].as_sequence().into_iter().flatten() {
                        allowed.extend(text(action));
                    }
                }
            }
            for action in actions {
                assert!(
                    allowed.contains(&format!("dynamodb:{action}")),
                    "{function} lacks dynamodb:{action}: {allowed:?}"
                );
            }
        }
    }

    #[test]
    fn reads_the_project_template() {
        let t = Template::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"))
            .unwrap();
        assert!(t.tables().contains(&"Table".to_string()));
        assert!(t.queues().contains(&"DeliveryQueue".to_string()));
        let dispatch = t.event_source("DispatchFunction").unwrap();
        assert_eq!(dispatch.resource, "Table");
        assert_eq!(dispatch.batch_size, 100);
        assert_eq!(dispatch.filters.len(), 5);
        assert!(dispatch.report_batch_item_failures);
        assert_eq!(dispatch.max_retry_attempts, Some(50));
        assert_eq!(dispatch.on_failure.as_deref(), Some("DispatchFailureQueue"));
        assert_eq!(t.kms_keys(), ["SecretsKey"]);
        let deliver = t.event_source("DeliverFunction").unwrap();
        assert_eq!(deliver.resource, "DeliveryQueue");
        assert_eq!(deliver.batch_size, 10);
    }

    /// API Gateway reaches the ingest function only on the paths the
    /// template declares: every public route of the router (the pages and
    /// their scripts) has its own `HttpApi` event, every other route is
    /// under `/v1/{proxy+}`.
    #[test]
    fn the_template_routes_every_api_route_to_ingest() {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml"),
        )
        .unwrap();
        let doc: Yaml = serde_yaml_ng::from_str(&text).unwrap();
        let events = doc["Resources"]["IngestFunction"]["Properties"]["Events"]
            .as_mapping()
            .unwrap();
        let declared: Vec<(String, String)> = events
            .values()
            .filter(|e| e["Type"].as_str() == Some("HttpApi"))
            .map(|e| {
                let p = &e["Properties"];
                (
                    p["Method"].as_str().unwrap().to_ascii_uppercase(),
                    p["Path"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert!(declared.contains(&("ANY".into(), "/v1/{proxy+}".into())));
        for route in hookline_ingest::router::routes() {
            if route.access == hookline_ingest::router::Access::Public {
                let want = (route.method.as_str().to_owned(), route.path.clone());
                assert!(declared.contains(&want), "template.yaml lacks {want:?}");
            } else {
                assert!(route.path.starts_with("/v1/"), "{}", route.path);
            }
        }
    }

    #[test]
    fn filter_patterns() {
        let pattern: Value = serde_json::from_str(
            r#"{"dynamodb":{"NewImage":{"kind":{"S":["delivery"]},"status":{"S":["pending"]}}}}"#,
        )
        .unwrap();
        let rec = |kind: &str, status: &str| json!({"dynamodb": {"NewImage": {"kind": {"S": kind}, "status": {"S": status}}}});
        assert!(matches_pattern(&pattern, &rec("delivery", "pending")));
        assert!(!matches_pattern(&pattern, &rec("delivery", "failed")));
        assert!(!matches_pattern(&pattern, &rec("endpoint", "pending")));
        assert!(!matches_pattern(&pattern, &json!({"dynamodb": {}})));
        // `exists`: the attribute with any value, never its absence.
        let waking: Value = serde_json::from_str(
            r#"{"dynamodb":{"NewImage":{"status":{"S":["delivered","failed"]},"wake":{"S":[{"exists":true}]}}}}"#,
        )
        .unwrap();
        let ended = |wake: Option<&str>| {
            let mut image = json!({"status": {"S": "failed"}});
            if let Some(w) = wake {
                image["wake"] = json!({"S": w});
            }
            json!({"dynamodb": {"NewImage": image}})
        };
        assert!(matches_pattern(&waking, &ended(Some("dlv_1"))));
        assert!(!matches_pattern(&waking, &ended(None)));
    }
}

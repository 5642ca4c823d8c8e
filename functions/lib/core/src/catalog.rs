//! The event-type catalog: the types a provider sends, each with a
//! description, an optional JSON Schema of its payload and an example.
//!
//! Pure parts only: the definition, the limits, and the name checks of an
//! endpoint's subscriptions against the catalog with the closest names
//! suggested ([`check_subscriptions`]). Schemas are compiled and payloads
//! validated in `hookline-pipeline` (`catalog`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::EventType;

/// Largest schema or example, as JSON text (an item holds both, well under
/// DynamoDB's 400 KB).
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest description.
pub const MAX_DESCRIPTION_BYTES: usize = 1024;

/// One type of the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventTypeDef {
    pub name: EventType,
    pub description: Option<String>,
    /// A JSON Schema (draft 2020-12 unless its `$schema` says otherwise)
    /// every payload of this type must match; none: any payload.
    pub schema: Option<Value>,
    /// An example payload (matches `schema`).
    pub example: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Why an endpoint's `event_types` do not fit the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownEventType {
    /// The entry as given (`order.payed`, `ordr.*`).
    pub given: String,
    /// The closest catalog names, best first (at most 3).
    pub suggestions: Vec<String>,
}

impl std::fmt::Display for UnknownEventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` matches no type of the catalog", self.given)?;
        if !self.suggestions.is_empty() {
            let names: Vec<String> = self.suggestions.iter().map(|s| format!("`{s}`")).collect();
            write!(f, "; did you mean {}?", names.join(", "))?;
        }
        Ok(())
    }
}

/// Checks an endpoint's subscriptions against a non-empty catalog: an
/// exact name must be a catalog type, `prefix.*` must match at least one,
/// `*` always fits. An empty catalog accepts everything (no catalog yet).
pub fn check_subscriptions<'a>(
    event_types: &[String],
    catalog: impl IntoIterator<Item = &'a str> + Clone,
) -> Result<(), UnknownEventType> {
    if catalog.clone().into_iter().next().is_none() {
        return Ok(());
    }
    for given in event_types {
        let fits = if given == "*" {
            true
        } else if let Some(prefix) = given.strip_suffix(".*") {
            catalog.clone().into_iter().any(|name| {
                name.len() > prefix.len() + 1 && name.starts_with(&format!("{prefix}."))
            })
        } else {
            catalog.clone().into_iter().any(|name| name == given)
        };
        if !fits {
            let suggestions = match given.strip_suffix(".*") {
                // A prefix: the closest prefixes the catalog has.
                Some(prefix) => {
                    let mut prefixes: Vec<&str> = catalog
                        .clone()
                        .into_iter()
                        .flat_map(|name| name.match_indices('.').map(move |(i, _)| &name[..i]))
                        .collect();
                    prefixes.sort_unstable();
                    prefixes.dedup();
                    closest(prefix, prefixes)
                        .into_iter()
                        .map(|p| format!("{p}.*"))
                        .collect()
                }
                None => closest(given, catalog),
            };
            return Err(UnknownEventType {
                given: given.clone(),
                suggestions,
            });
        }
    }
    Ok(())
}

/// The catalog names closest to `probe` by edit distance, best first: at
/// most 3, each within a third of the longer name (at least 2 edits), or
/// names starting with `probe.` (a prefix given without its `.*`).
pub fn closest<'a>(probe: &str, catalog: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut scored: Vec<(usize, &str)> = catalog
        .into_iter()
        .filter_map(|name| {
            let distance = edit_distance(probe, name);
            let bound = (probe.len().max(name.len()) / 3).max(2);
            if distance <= bound {
                Some((distance, name))
            } else if name.starts_with(probe) && name[probe.len()..].starts_with('.') {
                Some((bound + 1, name))
            } else {
                None
            }
        })
        .collect();
    scored.sort_unstable();
    scored
        .into_iter()
        .take(3)
        .map(|(_, name)| name.to_owned())
        .collect()
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: [&str; 4] = [
        "order.paid",
        "order.refunded",
        "invoice.created",
        "user.signup",
    ];

    #[test]
    fn subscriptions_fit_the_catalog_or_get_suggestions() {
        let ok = |types: &[&str]| {
            let types: Vec<String> = types.iter().map(|s| (*s).to_owned()).collect();
            check_subscriptions(&types, CATALOG)
        };
        assert!(ok(&["order.paid", "invoice.*", "*"]).is_ok());
        assert!(ok(&[]).is_ok());
        let typo = ok(&["order.payd"]).unwrap_err();
        assert_eq!(typo.suggestions[0], "order.paid");
        assert!(
            typo.to_string().contains("did you mean `order.paid`"),
            "{typo}"
        );
        let prefix = ok(&["ordr.*"]).unwrap_err();
        assert_eq!(prefix.given, "ordr.*");
        assert_eq!(prefix.suggestions, ["order.*"]);
        assert!(prefix.to_string().contains("`ordr.*`"));
        // A prefix with no type under it.
        assert!(ok(&["payment.*"]).is_err());
        // A bare prefix is not a type, but the types under it are offered.
        let bare = ok(&["order"]).unwrap_err();
        assert_eq!(bare.suggestions, ["order.paid", "order.refunded"]);
        let far = ok(&["shipment.delivered"]).unwrap_err();
        assert!(far.suggestions.is_empty(), "{far:?}");
        // An empty catalog accepts anything.
        assert!(check_subscriptions(&["anything".to_owned()], std::iter::empty::<&str>()).is_ok());
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("order.paid", "order.paid"), 0);
        assert_eq!(edit_distance("order.payd", "order.paid"), 1);
        assert_eq!(edit_distance("ordre.paid", "order.paid"), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}

//! Case-insensitive header lookup over whatever your HTTP stack hands you.

use std::collections::{BTreeMap, HashMap};

/// Read access to request headers. Lookups are case-insensitive.
pub trait Headers {
    /// The first value of header `name`, if present and valid UTF-8.
    fn header(&self, name: &str) -> Option<&str>;
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for [(K, V)] {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for Vec<(K, V)> {
    fn header(&self, name: &str) -> Option<&str> {
        self.as_slice().header(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>, S> Headers for HashMap<K, V, S> {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for BTreeMap<K, V> {
    fn header(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }
}

impl<H: Headers + ?Sized> Headers for &H {
    fn header(&self, name: &str) -> Option<&str> {
        (**self).header(name)
    }
}

#[cfg(feature = "http")]
impl Headers for http::HeaderMap {
    fn header(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| v.to_str().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_case_insensitive() {
        let pairs = [("Webhook-Id", "a"), ("X-Other", "b")];
        assert_eq!(pairs[..].header("webhook-id"), Some("a"));
        assert_eq!(pairs[..].header("WEBHOOK-ID"), Some("a"));
        assert_eq!(pairs[..].header("missing"), None);
        let map: HashMap<String, String> = [("X-Webhook-ID".to_string(), "c".to_string())].into();
        assert_eq!(map.header("x-webhook-id"), Some("c"));
    }

    #[cfg(feature = "http")]
    #[test]
    fn header_map_lookup() {
        let mut map = http::HeaderMap::new();
        map.insert("webhook-id", http::HeaderValue::from_static("msg_x"));
        assert_eq!(map.header("Webhook-ID"), Some("msg_x"));
    }
}

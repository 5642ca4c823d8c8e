//! The delivery dashboard: one static page (HTML with its CSS) and its
//! script, no build step, embedded in the binary. It talks to the same API with the
//! key the operator types in, kept in the tab's session storage only.

use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Response};

/// The page's source.
pub const HTML: &str = include_str!("dashboard/index.html");
/// The page's script (`GET /dashboard/app.js`): no inline script, so the
/// page's policy allows scripts from its own origin only.
pub const SCRIPT: &str = include_str!("dashboard/app.js");

/// The page, with headers that keep it to its own origin.
pub fn page() -> Response<Body> {
    static_file(HTML, "text/html; charset=utf-8")
}

/// The page's script.
pub fn script() -> Response<Body> {
    static_file(SCRIPT, "text/javascript; charset=utf-8")
}

/// The page's only stylesheet: its one `<style>` element.
fn style_block(html: &str) -> &str {
    let start = html
        .find("<style>")
        .map(|i| i + "<style>".len())
        .expect("the page has a <style> element");
    let end = html[start..]
        .find("</style>")
        .expect("its <style> element ends");
    &html[start..start + end]
}

/// The policy of the page and its script: scripts from this origin only,
/// styles only the page's own `<style>` element, allowed by its SHA-256
/// (no `'unsafe-inline'`: an injected `style` attribute or element does
/// nothing), nothing framed, no form posts, no base URL changes.
pub fn content_security_policy() -> &'static str {
    use base64::Engine;
    use sha2::Digest;
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        let digest = sha2::Sha256::digest(style_block(HTML).as_bytes());
        let hash = base64::engine::general_purpose::STANDARD.encode(digest);
        format!(
            "default-src 'none'; script-src 'self'; style-src 'sha256-{hash}'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        )
    })
}

fn static_file(text: &str, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::Text(text.to_owned()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static(content_type));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(content_security_policy()),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert("cache-control", HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_allows_only_the_pages_own_stylesheet_and_scripts_from_its_origin() {
        use base64::Engine;
        use sha2::Digest;
        let policy = content_security_policy();
        assert!(
            !policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"),
            "{policy}"
        );
        let hash = base64::engine::general_purpose::STANDARD
            .encode(sha2::Sha256::digest(style_block(HTML).as_bytes()));
        assert!(
            policy.contains(&format!("style-src 'sha256-{hash}';")),
            "{policy}"
        );
        assert!(style_block(HTML).contains(".hidden"));
        // What such a policy would block must not be relied on: no inline
        // style attributes or scripts, no style attributes set from the
        // script, no HTML parsed from strings.
        assert_eq!(HTML.matches("<style").count(), 1);
        assert!(!HTML.contains("<script>"), "an inline script");
        for tag in HTML.split('<').skip(1) {
            let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
            let inline_handler = tag
                .split_whitespace()
                .any(|attr| attr.starts_with("on") && attr.contains('='));
            assert!(!tag.contains("style=") && !inline_handler, "page: <{tag}>");
        }
        for banned in [
            "style:",
            "\"style\"",
            ".style",
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(banned), "script uses {banned}");
        }
        let response = page();
        assert_eq!(
            response.headers()["content-security-policy"]
                .to_str()
                .unwrap(),
            policy
        );
    }
}

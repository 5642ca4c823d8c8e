//! The embedded pages, each one HTML file with its one `<style>` element and
//! one script, no build step:
//! - [`DASHBOARD`] (`GET /dashboard`): the operator's delivery dashboard; it
//!   asks for an API key, kept in the tab's session storage only.
//! - [`PORTAL`] (`GET /portal`): the consumer portal an app's customers open
//!   by a portal session's link; the token rides in the URL fragment, which
//!   browsers never send to a server.
//!
//! What both share is written once: `pages/common.css` goes into each page's
//! `<style>` element (where it says `/* common.css */`) and
//! `pages/common.js` ahead of each page's own script. Both pages run under
//! the same strict policy (see [`Page::content_security_policy`]).

use std::sync::OnceLock;

use lambda_http::http::{HeaderValue, StatusCode};
use lambda_http::{Body, Response};

/// The stylesheet both pages share.
const COMMON_CSS: &str = include_str!("pages/common.css");
/// Where a page's `<style>` takes [`COMMON_CSS`].
const COMMON_CSS_MARKER: &str = "/* common.css */";

/// One embedded page: its HTML and its script (`{path}/app.js`).
#[derive(Debug)]
pub struct Page {
    source: &'static str,
    script: &'static str,
    html: OnceLock<String>,
    policy: OnceLock<String>,
}

/// The operator's delivery dashboard.
pub static DASHBOARD: Page = Page::new(
    include_str!("pages/dashboard.html"),
    concat!(
        include_str!("pages/common.js"),
        include_str!("pages/dashboard.js")
    ),
);

/// The consumer portal.
pub static PORTAL: Page = Page::new(
    include_str!("pages/portal.html"),
    concat!(
        include_str!("pages/common.js"),
        include_str!("pages/portal.js")
    ),
);

impl Page {
    const fn new(source: &'static str, script: &'static str) -> Self {
        Self {
            source,
            script,
            html: OnceLock::new(),
            policy: OnceLock::new(),
        }
    }

    /// The page's HTML, the shared stylesheet in place.
    pub fn html(&self) -> &str {
        self.html
            .get_or_init(|| self.source.replacen(COMMON_CSS_MARKER, COMMON_CSS, 1))
    }

    /// The page's script: the shared part, then its own.
    pub fn script(&self) -> &'static str {
        self.script
    }

    /// The page, with headers that keep it to its own origin.
    pub fn page(&self) -> Response<Body> {
        self.respond(self.html().to_owned(), "text/html; charset=utf-8")
    }

    /// The page's script, under the same headers.
    pub fn script_file(&self) -> Response<Body> {
        self.respond(self.script.to_owned(), "text/javascript; charset=utf-8")
    }

    /// The policy of the page and its script: scripts from this origin
    /// only, styles only the page's own `<style>` element, allowed by its
    /// SHA-256 (no `'unsafe-inline'`: an injected `style` attribute or
    /// element does nothing), nothing framed, no form posts, no base URL
    /// changes.
    pub fn content_security_policy(&self) -> &str {
        self.policy.get_or_init(|| {
            use base64::Engine;
            use sha2::Digest;
            let digest = sha2::Sha256::digest(style_block(self.html()).as_bytes());
            let hash = base64::engine::general_purpose::STANDARD.encode(digest);
            format!(
                "default-src 'none'; script-src 'self'; style-src 'sha256-{hash}'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
            )
        })
    }

    fn respond(&self, body: String, content_type: &'static str) -> Response<Body> {
        let mut response = Response::new(Body::Text(body));
        *response.status_mut() = StatusCode::OK;
        let policy = HeaderValue::from_str(self.content_security_policy())
            .expect("the policy is ASCII text without control characters");
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static(content_type));
        headers.insert("content-security-policy", policy);
        headers.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        // The portal's URL carries its token in the fragment: no referrer
        // ever repeats the page's address.
        headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
        headers.insert("cache-control", HeaderValue::from_static("no-store"));
        response
    }
}

/// A page's only stylesheet: its one `<style>` element.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a strict policy would block must not be relied on: no inline
    /// style attributes or scripts, no style set from the script, no HTML
    /// parsed from strings; every form control labelled.
    fn check_page(name: &str, page: &Page, script_src: &str) {
        use base64::Engine;
        use sha2::Digest;
        let policy = page.content_security_policy();
        assert!(
            !policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"),
            "{name}: {policy}"
        );
        let html = page.html();
        let hash = base64::engine::general_purpose::STANDARD
            .encode(sha2::Sha256::digest(style_block(html).as_bytes()));
        assert!(
            policy.contains(&format!("style-src 'sha256-{hash}';")),
            "{name}: {policy}"
        );
        assert!(style_block(html).contains(".hidden"), "{name}: common.css");
        assert!(!html.contains(COMMON_CSS_MARKER), "{name}");
        assert_eq!(html.matches("<style").count(), 1, "{name}");
        assert_eq!(html.matches("<script").count(), 1, "{name}");
        assert!(
            html.contains(&format!(r#"<script src="{script_src}"></script>"#)),
            "{name}"
        );
        for tag in html.split('<').skip(1) {
            let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
            let inline_handler = tag
                .split_whitespace()
                .any(|attr| attr.starts_with("on") && attr.contains('='));
            assert!(
                !tag.contains("style=") && !inline_handler,
                "{name}: <{tag}>"
            );
        }
        for banned in [
            "style:",
            "\"style\"",
            ".style",
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ] {
            assert!(
                !page.script().contains(banned),
                "{name} script uses {banned}"
            );
        }
        // Accessibility: every input, select and textarea sits in a <label>
        // or carries an aria-label.
        let mut open_labels = 0usize;
        for tag in html.split('<').skip(1) {
            let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
            if tag.starts_with("label") {
                open_labels += 1;
            } else if tag.starts_with("/label") {
                open_labels -= 1;
            } else if ["input", "select", "textarea"]
                .iter()
                .any(|t| tag.starts_with(&format!("{t} ")) || tag == *t)
            {
                assert!(
                    open_labels > 0 || tag.contains("aria-label"),
                    "{name}: unlabelled <{tag}>"
                );
            }
        }
        let response = page.page();
        assert_eq!(
            response.headers()["content-security-policy"]
                .to_str()
                .unwrap(),
            policy
        );
    }

    #[test]
    fn the_pages_allow_only_their_own_stylesheet_and_scripts_from_their_origin() {
        check_page("dashboard", &DASHBOARD, "/dashboard/app.js");
        check_page("portal", &PORTAL, "/portal/app.js");
        assert_ne!(
            DASHBOARD.content_security_policy(),
            PORTAL.content_security_policy(),
            "each page's policy allows its own stylesheet only"
        );
    }
}

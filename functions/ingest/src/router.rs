//! Every route, declared once. An entry of [`routes!`] names a handler and
//! who may call it; the path and method come from the handler's
//! `#[utoipa::path]`, so the route table ([`routes`]), the dispatch and the
//! OpenAPI document ([`document`]) are generated from the same list and
//! cannot disagree. The router also authorises: a route's [`Access`] is
//! checked, and an `{app_id}` in its path against the key's scope, before
//! any handler runs.

use std::sync::OnceLock;

use hookline_core::ids::AppId;
use hookline_pipeline::ports::{Queue, Store};
use lambda_http::http::{Method, StatusCode};
use lambda_http::Request;
use utoipa::openapi::path::HttpMethod;
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::auth::Scope;
use crate::call::{Answer, Call, Params};
use crate::error::ApiError;
use crate::handlers::{
    api_keys, deliveries, dlq, endpoints, event_types, events, meta, portal_sessions,
};
use crate::Api;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No key (liveness, this document, the dashboard and portal pages).
    Public,
    /// The admin key, or a key scoped to the path's `{app_id}` (any key
    /// when the path has none: reading the catalog).
    AppKey,
    /// As [`Access::AppKey`], and open to the app's portal sessions too:
    /// what the app's customers manage themselves (endpoints, deliveries,
    /// replays, stats) and the catalog they read.
    Portal,
    /// The admin key only.
    Admin,
}

/// One route: a method and a path template (`{name}` matches one segment).
#[derive(Debug)]
pub struct Route {
    pub method: Method,
    pub path: String,
    pub op: Op,
    pub access: Access,
}

impl Route {
    fn of<P: utoipa::Path>(op: Op, access: Access) -> impl Iterator<Item = Route> {
        let path = P::path();
        P::methods().into_iter().map(move |m| Route {
            method: method_of(&m),
            path: path.clone(),
            op,
            access,
        })
    }
}

fn method_of(m: &HttpMethod) -> Method {
    match m {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
        HttpMethod::Options => Method::OPTIONS,
        HttpMethod::Head => Method::HEAD,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Trace => Method::TRACE,
    }
}

/// The table, the dispatch and the document from one list of
/// `access module::handler` entries. Every handler is
/// `async fn(&Api<S, Q>, Call<'_>) -> Answer` with a `#[utoipa::path]`.
macro_rules! routes {
    ($( $access:ident $module:ident :: $handler:ident ),* $(,)?) => {
        pastey::paste! {
            /// What a route does: one per handler.
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            pub enum Op { $( [<$handler:camel>], )* }

            fn declared() -> Vec<Route> {
                let mut routes = Vec::new();
                $( routes.extend(Route::of::<$module::[<__path_ $handler>]>(
                    Op::[<$handler:camel>],
                    Access::$access,
                )); )*
                routes
            }

            async fn dispatch<S: Store, Q: Queue>(op: Op, api: &Api<S, Q>, call: Call<'_>) -> Answer {
                match op {
                    $( Op::[<$handler:camel>] => $module::$handler(api, call).await, )*
                }
            }

            #[derive(Debug, OpenApi)]
            #[openapi(
                info(
                    title = "hookline",
                    description = "Serverless webhook delivery with guaranteed delivery: endpoints, events, deliveries and their attempt logs, manual and bulk recovery, the DLQ. Every route except /health, /openapi.json, /dashboard and /portal needs `Authorization: Bearer <api key>`: the admin key (every app), an app-scoped key (one app) or a portal session's token (one app's portal routes)."
                ),
                paths( $( $module::$handler ),* ),
                modifiers(&Security),
                security(("bearer" = [])),
            )]
            pub struct ApiDoc;
        }
    };
}

routes! {
    Public meta::health,
    Public meta::openapi,
    Public meta::dashboard,
    Public meta::dashboard_script,
    Public meta::portal,
    Public meta::portal_script,
    AppKey events::create_event,
    AppKey events::create_event_batch,
    AppKey events::get_event,
    Portal endpoints::create_endpoint,
    Portal endpoints::list_endpoints,
    Portal endpoints::get_endpoint,
    Portal endpoints::update_endpoint,
    Portal endpoints::delete_endpoint,
    Portal endpoints::rotate_secret,
    Portal endpoints::send_test_event,
    Portal endpoints::recover,
    Portal endpoints::endpoint_stats,
    Portal endpoints::replay,
    Portal endpoints::get_replay,
    Portal deliveries::list_deliveries,
    Portal deliveries::get_delivery,
    Portal deliveries::retry_delivery,
    Admin api_keys::create_api_key,
    Admin api_keys::list_api_keys,
    Admin api_keys::delete_api_key,
    AppKey portal_sessions::create_portal_session,
    AppKey portal_sessions::list_portal_sessions,
    AppKey portal_sessions::delete_portal_session,
    Admin dlq::dlq_status,
    Admin dlq::dlq_redrive,
    Admin event_types::put_event_type,
    Portal event_types::get_event_type,
    Admin event_types::delete_event_type,
    Portal event_types::list_event_types,
}

/// Every route (built on first use).
pub fn routes() -> &'static [Route] {
    static ROUTES: OnceLock<Vec<Route>> = OnceLock::new();
    ROUTES.get_or_init(declared)
}

/// The bearer scheme, and no security on public routes.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        for route in routes().iter().filter(|r| r.access == Access::Public) {
            let operation =
                openapi
                    .paths
                    .paths
                    .get_mut(&route.path)
                    .and_then(|item| match route.method {
                        Method::GET => item.get.as_mut(),
                        Method::POST => item.post.as_mut(),
                        _ => None,
                    });
            if let Some(operation) = operation {
                operation.security = Some(Vec::<SecurityRequirement>::new());
            }
        }
    }
}

/// The OpenAPI document served at `GET /openapi.json`: [`generate_document`]'s
/// output, committed as `functions/ingest/openapi.json`. The function serves
/// the file instead of building it, so its bootstrap does not link the
/// document builder (about 0.3 MB, loaded on every cold start). The unit
/// test `openapi_json_is_the_generated_document` fails when the file is
/// stale and says how to refresh it.
pub const DOCUMENT: &str = include_str!("../openapi.json");

/// The served document (see [`DOCUMENT`]).
pub fn document() -> &'static str {
    DOCUMENT
}

/// Builds the OpenAPI document from the route table: every route's
/// `#[utoipa::path]`, the security of its access level.
pub fn generate_document() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the generated document serialises")
}

/// Why no route matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    NotFound,
    /// The path exists with other methods.
    MethodNotAllowed,
}

fn match_template<'a>(template: &'a str, path: &'a str) -> Option<Params<'a>> {
    let mut want = template.split('/').filter(|s| !s.is_empty());
    let mut have = path.split('/').filter(|s| !s.is_empty());
    let mut params = Params::default();
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Some(params),
            (Some(w), Some(h)) => {
                if let Some(name) = w.strip_prefix('{').and_then(|n| n.strip_suffix('}')) {
                    params.pairs.push((name, h));
                } else if w != h {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

/// Finds the route of a request (a trailing `/` is ignored).
pub fn match_route<'a>(
    method: &Method,
    path: &'a str,
) -> Result<(&'static Route, Params<'a>), Miss> {
    let mut path_exists = false;
    for route in routes() {
        if let Some(params) = match_template(&route.path, path) {
            if route.method == *method {
                return Ok((route, params));
            }
            path_exists = true;
        }
    }
    Err(if path_exists {
        Miss::MethodNotAllowed
    } else {
        Miss::NotFound
    })
}

/// Matches, authorises and runs one request.
pub async fn route<S: Store, Q: Queue>(
    api: &Api<S, Q>,
    request: &Request,
    now: chrono::DateTime<chrono::Utc>,
    rng: &mut (dyn rand::RngCore + Send),
) -> Answer {
    let (route, params) =
        match_route(request.method(), request.uri().path()).map_err(|miss| match miss {
            Miss::NotFound => ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route"),
            Miss::MethodNotAllowed => ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            ),
        })?;
    let mut caller = None;
    if route.access != Access::Public {
        let header = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let (scope, key) = api.keys.authenticate_key(header, &api.store, now).await?;
        caller = key;
        match route.access {
            Access::Admin => scope.require_admin()?,
            Access::AppKey => scope.require_key()?,
            Access::Public | Access::Portal => {}
        }
        authorise_app(&scope, &params)?;
    }
    let call = Call {
        request,
        params,
        now,
        rng,
        document,
        caller,
    };
    dispatch(route.op, api, call).await
}

/// The path's `{app_id}`, if any, must be one the key may touch.
fn authorise_app(scope: &Scope, params: &Params<'_>) -> Result<(), ApiError> {
    match params.get("app_id") {
        Some(app) => scope.allows(&AppId::parse(app)?),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_templates_and_tells_405_from_404() {
        let (route, params) =
            match_route(&Method::POST, "/v1/apps/acme/deliveries/dlv_1/retry/").unwrap();
        assert_eq!(route.op, Op::RetryDelivery);
        assert_eq!(params.get("app_id"), Some("acme"));
        assert_eq!(params.get("delivery_id"), Some("dlv_1"));
        assert_eq!(params.get("nope"), None);
        assert_eq!(
            match_route(&Method::PUT, "/v1/apps/acme/endpoints").unwrap_err(),
            Miss::MethodNotAllowed
        );
        for missing in [
            "/",
            "/v1",
            "/v1/apps/acme",
            "/v1/apps/acme/endpoints/a/b/c",
            "/v2/dlq",
        ] {
            assert_eq!(
                match_route(&Method::GET, missing).unwrap_err(),
                Miss::NotFound,
                "{missing}"
            );
        }
        let (route, _) = match_route(&Method::GET, "/v1/dlq").unwrap();
        assert_eq!(route.op, Op::DlqStatus);
    }

    #[test]
    fn every_route_is_reachable_and_unique() {
        let routes = routes();
        assert_eq!(routes.len(), 35);
        for (i, a) in routes.iter().enumerate() {
            for b in &routes[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
            let concrete = a.path.replace('{', "x").replace('}', "");
            let (found, _) = match_route(&a.method, &concrete).unwrap();
            assert_eq!(found.op, a.op, "{} {}", a.method, a.path);
        }
    }
}

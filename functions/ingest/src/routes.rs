//! The route table: every route the API serves, in one place. The router
//! matches requests against it and the OpenAPI test checks the generated
//! document lists exactly these routes.

use lambda_http::http::Method;

/// What a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Health,
    OpenApi,
    Dashboard,
    CreateEvent,
    GetEvent,
    CreateEndpoint,
    ListEndpoints,
    GetEndpoint,
    UpdateEndpoint,
    DeleteEndpoint,
    RotateSecret,
    RecoverEndpoint,
    ListDeliveries,
    GetDelivery,
    RetryDelivery,
    CreateApiKey,
    ListApiKeys,
    DeleteApiKey,
    DlqStatus,
    DlqRedrive,
}

/// One route: a method, a path template (`{name}` matches one segment).
#[derive(Debug)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub op: Op,
    /// Whether a bearer API key is required.
    pub authenticated: bool,
}

const fn route(method: Method, path: &'static str, op: Op) -> Route {
    Route {
        method,
        path,
        op,
        authenticated: true,
    }
}

const fn public(method: Method, path: &'static str, op: Op) -> Route {
    Route {
        method,
        path,
        op,
        authenticated: false,
    }
}

/// Every route, public ones first.
pub const ROUTES: &[Route] = &[
    public(Method::GET, "/health", Op::Health),
    public(Method::GET, "/openapi.json", Op::OpenApi),
    public(Method::GET, "/dashboard", Op::Dashboard),
    route(Method::POST, "/v1/apps/{app_id}/events", Op::CreateEvent),
    route(
        Method::GET,
        "/v1/apps/{app_id}/events/{event_id}",
        Op::GetEvent,
    ),
    route(
        Method::POST,
        "/v1/apps/{app_id}/endpoints",
        Op::CreateEndpoint,
    ),
    route(
        Method::GET,
        "/v1/apps/{app_id}/endpoints",
        Op::ListEndpoints,
    ),
    route(
        Method::GET,
        "/v1/apps/{app_id}/endpoints/{endpoint_id}",
        Op::GetEndpoint,
    ),
    route(
        Method::PATCH,
        "/v1/apps/{app_id}/endpoints/{endpoint_id}",
        Op::UpdateEndpoint,
    ),
    route(
        Method::DELETE,
        "/v1/apps/{app_id}/endpoints/{endpoint_id}",
        Op::DeleteEndpoint,
    ),
    route(
        Method::POST,
        "/v1/apps/{app_id}/endpoints/{endpoint_id}/rotate-secret",
        Op::RotateSecret,
    ),
    route(
        Method::POST,
        "/v1/apps/{app_id}/endpoints/{endpoint_id}/recover",
        Op::RecoverEndpoint,
    ),
    route(
        Method::GET,
        "/v1/apps/{app_id}/deliveries",
        Op::ListDeliveries,
    ),
    route(
        Method::GET,
        "/v1/apps/{app_id}/deliveries/{delivery_id}",
        Op::GetDelivery,
    ),
    route(
        Method::POST,
        "/v1/apps/{app_id}/deliveries/{delivery_id}/retry",
        Op::RetryDelivery,
    ),
    route(Method::POST, "/v1/apps/{app_id}/api-keys", Op::CreateApiKey),
    route(Method::GET, "/v1/apps/{app_id}/api-keys", Op::ListApiKeys),
    route(
        Method::DELETE,
        "/v1/apps/{app_id}/api-keys/{key_id}",
        Op::DeleteApiKey,
    ),
    route(Method::GET, "/v1/dlq", Op::DlqStatus),
    route(Method::POST, "/v1/dlq/redrive", Op::DlqRedrive),
];

/// The path parameters of a matched route.
#[derive(Debug, Default)]
pub struct Params<'a> {
    pairs: Vec<(&'static str, &'a str)>,
}

impl<'a> Params<'a> {
    /// A parameter the route template names (empty if it does not).
    pub fn get(&self, name: &str) -> &'a str {
        self.pairs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .unwrap_or("")
    }
}

/// Why no route matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    NotFound,
    /// The path exists with other methods.
    MethodNotAllowed,
}

fn match_template<'a>(template: &'static str, path: &'a str) -> Option<Params<'a>> {
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
    for route in ROUTES {
        if let Some(params) = match_template(route.path, path) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_templates_and_tells_405_from_404() {
        let (route, params) =
            match_route(&Method::POST, "/v1/apps/acme/deliveries/dlv_1/retry/").unwrap();
        assert_eq!(route.op, Op::RetryDelivery);
        assert_eq!(params.get("app_id"), "acme");
        assert_eq!(params.get("delivery_id"), "dlv_1");
        assert_eq!(params.get("nope"), "");
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
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
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

//! The real [`Sender`]: reqwest, no redirects, a per-request timeout, a bounded
//! read of the response, and a guard against private addresses (SSRF) that
//! checks literal IPs and every address a name resolves to, at every send.

use std::error::Error as StdError;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookline_core::model::RESPONSE_BODY_LIMIT;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::ports::{OutgoingRequest, SendResult, Sender};

/// Whether `ip` is a globally routable unicast address. Loopback, private,
/// link-local (cloud metadata `169.254.169.254` included), CGNAT, unspecified,
/// multicast, documentation and reserved ranges are not; IPv6 forms that embed
/// an IPv4 address (mapped, SIIT-translated, NAT64, 6to4, Teredo) are judged
/// by that address.
pub fn is_public_ip(ip: IpAddr) -> bool {
    non_public_range(ip).is_none()
}

/// The range that makes `ip` not public (what a refusal names: the rule,
/// never a resolved address), or `None` for a public one.
pub fn non_public_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(if ip.is_unspecified() || a == 0 {
        "unspecified (0.0.0.0/8)"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private (RFC 1918)"
    } else if ip.is_link_local() {
        "link-local (cloud metadata included)"
    } else if ip.is_broadcast() || ip.is_multicast() {
        "multicast or broadcast"
    } else if ip.is_documentation() {
        "documentation"
    } else if a == 100 && (64..128).contains(&b) {
        "shared address space (CGNAT)"
    } else if a == 192 && b == 0 && c == 0 {
        "IETF protocol assignments"
    } else if a == 198 && (18..20).contains(&b) {
        "benchmarking"
    } else if a >= 240 {
        "reserved"
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 form embeds, for the forms that reach it:
/// IPv4-mapped `::ffff:a.b.c.d`, SIIT-translated `::ffff:0:a.b.c.d`, NAT64
/// (`64:ff9b::/96` and the local-use `64:ff9b:1::/48`), 6to4 `2002::/16`,
/// and Teredo `2001::/32` (its client, the address traffic goes to, stored
/// inverted in the last 32 bits).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let seg = ip.segments();
    let o = ip.octets();
    let last = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if seg[..4] == [0, 0, 0, 0] && seg[4] == 0xffff && seg[5] == 0 {
        return Some(last);
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && (seg[2..6] == [0, 0, 0, 0] || seg[2] == 1) {
        return Some(last);
    }
    if seg[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    if seg[0] == 0x2001 && seg[1] == 0 {
        return Some(Ipv4Addr::new(!o[12], !o[13], !o[14], !o[15]));
    }
    None
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = embedded_v4(ip) {
        return non_public_v4(v4);
    }
    let seg = ip.segments();
    Some(if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_multicast() {
        "multicast"
    } else if (seg[0] & 0xfe00) == 0xfc00 {
        "unique local (fc00::/7)"
    } else if (seg[0] & 0xffc0) == 0xfe80 {
        "link-local"
    } else if seg[0] == 0x2001 && seg[1] == 0x0db8 {
        "documentation"
    } else if seg[..6] == [0, 0, 0, 0, 0, 0] {
        "IPv4-compatible (deprecated)"
    } else {
        return None;
    })
}

/// Checks an endpoint URL without resolving it: `http`/`https` only (`https`
/// only when private endpoints are not allowed), a host, no credentials, and a
/// literal IP address (any spelling the URL standard accepts, e.g. decimal
/// `http://2130706433/`) must be public unless private endpoints are allowed.
pub fn check_endpoint_url(raw: &str, allow_private: bool) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a valid URL: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_private => {}
        "http" => return Err("only https URLs are allowed".into()),
        other => return Err(format!("scheme `{other}` is not allowed")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("URLs with credentials are not allowed".into());
    }
    let ip = match url.host() {
        None => return Err("URL has no host".into()),
        Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
        Some(url::Host::Domain(d)) => {
            // `localhost.` (fully qualified) is `localhost` too.
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            if !allow_private && (d == "localhost" || d.ends_with(".localhost") || d.is_empty()) {
                return Err("localhost is not allowed".into());
            }
            None
        }
    };
    if let Some(ip) = ip {
        if let Some(range) = non_public_range(ip).filter(|_| !allow_private) {
            return Err(format!(
                "the address is in a {range} range: endpoints must be public addresses"
            ));
        }
    }
    Ok(url)
}

/// How host names are looked up: the system resolver, with optional fixed
/// answers laid over it (like curl's `--resolve`). Tests use an override to
/// make a DNS name resolve to loopback whatever `/etc/hosts` holds, so the
/// "name resolving to a private address" guard is always exercised.
#[derive(Debug, Clone, Default)]
pub struct Lookup {
    overrides: Arc<std::collections::HashMap<String, Vec<IpAddr>>>,
}

impl Lookup {
    /// The system resolver only.
    pub fn system() -> Self {
        Self::default()
    }

    /// Answers `name` with `ips` instead of asking the system.
    pub fn with_override(mut self, name: &str, ips: Vec<IpAddr>) -> Self {
        Arc::make_mut(&mut self.overrides).insert(name.to_ascii_lowercase(), ips);
        self
    }

    /// The addresses of `host` (with `port`).
    pub async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        if let Some(ips) = self.overrides.get(&host.to_ascii_lowercase()) {
            return Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        }
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// Registration-time DNS check of an endpoint URL (private endpoints not
/// allowed): a name that resolves now to any non-public address is refused.
/// A name that does not resolve (yet) is accepted: every send resolves again
/// through the guarded resolver, which is the check that cannot be raced.
pub async fn check_resolved_host(url: &url::Url, lookup: &Lookup) -> Result<(), String> {
    let Some(url::Host::Domain(host)) = url.host() else {
        return Ok(());
    };
    let port = url.port_or_known_default().unwrap_or(443);
    let resolved = tokio::time::timeout(Duration::from_secs(2), lookup.resolve(host, port)).await;
    if let Ok(Ok(addrs)) = resolved {
        // The rule, never the address: a registration must not become a
        // way to read private DNS.
        if let Some(range) = addrs.iter().find_map(|a| non_public_range(a.ip())) {
            return Err(format!(
                "the host name resolves to a {range} address: endpoints must resolve to public addresses only"
            ));
        }
    }
    Ok(())
}

/// The error the guarded resolver returns for a name resolving to a private address.
#[derive(Debug)]
struct BlockedAddress(String);

impl fmt::Display for BlockedAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} resolves to a non-public address", self.0)
    }
}

impl StdError for BlockedAddress {}

/// Resolves through a [`Lookup`], then refuses non-public addresses.
#[derive(Debug)]
struct GuardedResolver(Lookup);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let lookup = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs = lookup.resolve(&host, 0).await?;
            if addrs.is_empty() || addrs.iter().any(|a| !is_public_ip(a.ip())) {
                return Err(Box::new(BlockedAddress(host)) as Box<dyn StdError + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// The HTTP sender used by the deliver function.
#[derive(Debug, Clone)]
pub struct HttpSender {
    client: reqwest::Client,
    allow_private: bool,
}

impl HttpSender {
    /// Builds the client once (connection pool shared by every delivery).
    pub fn new(allow_private: bool) -> Result<Self, reqwest::Error> {
        Self::with_lookup(allow_private, Lookup::system())
    }

    /// [`Self::new`] resolving names through `lookup`.
    pub fn with_lookup(allow_private: bool, lookup: Lookup) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(30));
        if !allow_private {
            builder = builder.dns_resolver(Arc::new(GuardedResolver(lookup)));
        }
        let client = builder.build()?;
        Ok(Self {
            client,
            allow_private,
        })
    }
}

/// TLS for receivers: Mozilla's root program compiled in (`webpki-roots`,
/// already parsed), TLS 1.2 and 1.3, HTTP/1.1. Loading and parsing the
/// system's root store instead cost ~4 ms of every cold start.
pub fn tls_config() -> rustls::ClientConfig {
    tls_config_trusting(rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    })
}

/// TLS 1.2 and 1.3 on aws-lc-rs, HTTP/1.1, trusting `roots` only (the AWS
/// clients pass the Amazon Trust Services roots).
pub fn tls_config_trusting(roots: rustls::RootCertStore) -> rustls::ClientConfig {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("aws-lc-rs supports TLS 1.2 and 1.3")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

fn describe(err: &reqwest::Error, timeout: Duration) -> (String, bool) {
    let mut source: Option<&(dyn StdError + 'static)> = err.source();
    while let Some(s) = source {
        if let Some(blocked) = s.downcast_ref::<BlockedAddress>() {
            return (format!("blocked: {blocked}"), true);
        }
        source = s.source();
    }
    let kind = if err.is_timeout() {
        format!("timeout after {} ms", timeout.as_millis())
    } else if err.is_connect() {
        "connection failed".to_owned()
    } else if err.is_body() || err.is_decode() {
        "error reading the response".to_owned()
    } else {
        "request failed".to_owned()
    };
    // Never include the URL (it may carry a token in its query).
    let mut detail = String::new();
    let mut source: Option<&(dyn StdError + 'static)> = err.source();
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        (kind, false)
    } else {
        (format!("{kind}: {detail}"), false)
    }
}

impl Sender for HttpSender {
    async fn send(&self, request: OutgoingRequest<'_>) -> SendResult {
        let started = Instant::now();
        let url = match check_endpoint_url(request.url, self.allow_private) {
            Ok(url) => url,
            Err(reason) => {
                return SendResult {
                    error: Some(format!("blocked: {reason}")),
                    blocked: true,
                    ..SendResult::default()
                }
            }
        };
        // The URL as checked (parsed once, not again by reqwest).
        let mut builder = self
            .client
            .post(url)
            .timeout(request.timeout)
            .body(request.body.to_vec());
        // The endpoint's headers first; the signed ones after (reserved
        // names are refused at registration, so none is overridden).
        for (name, value) in request.custom_headers {
            builder = builder.header(name, value);
        }
        for (name, value) in request.headers.iter() {
            builder = builder.header(name, value);
        }
        let response = match builder.send().await {
            Ok(r) => r,
            Err(err) => {
                let (error, blocked) = describe(&err, request.timeout);
                return SendResult {
                    error: Some(error),
                    blocked,
                    latency: started.elapsed(),
                    ..SendResult::default()
                };
            }
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Read at most RESPONSE_BODY_LIMIT bytes, then drop the connection.
        let mut response = response;
        let mut prefix: Vec<u8> = Vec::new();
        let mut error = None;
        while prefix.len() < RESPONSE_BODY_LIMIT {
            match response.chunk().await {
                Ok(Some(chunk)) => prefix.extend_from_slice(
                    &chunk[..chunk.len().min(RESPONSE_BODY_LIMIT - prefix.len())],
                ),
                Ok(None) => break,
                Err(err) => {
                    error = Some(describe(&err, request.timeout).0);
                    break;
                }
            }
        }
        SendResult {
            status: Some(status),
            retry_after,
            body_prefix: Some(prefix),
            error,
            latency: started.elapsed(),
            blocked: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compiled-in roots really verify: a receiver on loopback with a
    /// self-signed certificate (for localhost and 127.0.0.1) is refused at
    /// the handshake, and the attempt is a retryable connection failure.
    #[tokio::test]
    async fn receivers_certificates_are_verified() {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let cert = CertificateDer::from_pem_slice(include_bytes!("../tests/certs/self-signed.crt"))
            .expect("test certificate");
        let key = PrivateKeyDer::from_pem_slice(include_bytes!("../tests/certs/self-signed.key"))
            .expect("test key");
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let handshake = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            acceptor.accept(tcp).await.map(|_| ())
        });
        let sender = HttpSender::new(true).unwrap();
        let headers =
            hookline_core::signing::SignedHeaders(vec![("webhook-id", "msg_1".to_owned())]);
        let url = format!("https://localhost:{port}/hook");
        let result = sender
            .send(OutgoingRequest {
                custom_headers: &std::collections::BTreeMap::new(),
                url: &url,
                headers: &headers,
                body: b"{}",
                timeout: Duration::from_secs(5),
            })
            .await;
        assert_eq!(result.status, None);
        let error = result.error.expect("the handshake fails");
        assert!(error.starts_with("connection failed"), "{error}");
        assert!(error.to_lowercase().contains("certificate"), "{error}");
        assert!(!result.blocked);
        let server_side = tokio::time::timeout(Duration::from_secs(5), handshake)
            .await
            .expect("the server saw the handshake")
            .unwrap();
        assert!(server_side.is_err(), "the client aborted the handshake");
        let config = tls_config();
        assert!(webpki_roots::TLS_SERVER_ROOTS.len() > 100);
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.51.100.2",
            "203.0.113.3",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "::127.0.0.1",
            "::ffff:0:7f00:1",
            "::ffff:0:a00:1",
            "64:ff9b:1::a9fe:a9fe",
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "2001:0:4136:e378:8000:63bf:f5ff:fffe",
        ] {
            assert!(!is_public_ip(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "::ffff:0:808:808",
            "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
        ] {
            assert!(is_public_ip(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn url_checks() {
        assert!(check_endpoint_url("https://example.com/hook", false).is_ok());
        for bad in [
            "http://example.com/",
            "ftp://example.com/",
            "https://user:pw@example.com/",
            "https://127.0.0.1/",
            "https://2130706433/",
            "https://0x7f.1/",
            "https://0177.0.0.1/",
            "https://[::1]/",
            "https://[::ffff:7f00:1]/",
            "https://169.254.169.254/latest/meta-data",
            "https://localhost/",
            "https://localhost./",
            "https://LOCALHOST.:8443/",
            "https://api.localhost./",
            "https://a.localhost/",
            "https://0.0.0.0/",
            "https://10.0.0.1:8443/x",
            "not a url",
            "https://",
        ] {
            assert!(check_endpoint_url(bad, false).is_err(), "{bad}");
        }
        assert!(check_endpoint_url("http://127.0.0.1:9000/hook", true).is_ok());
    }
}

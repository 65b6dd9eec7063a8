//! A small, bounded HTTP/1.1 server for the metrics endpoint and the status page: axum's router
//! on hyper's HTTP/1.1 connections, each driven by our own accept loop so that every limit is
//! explicit.
//!
//! Limits ([`HttpLimits`]): connections at once (one more is answered 503 and closed, without
//! queueing), bytes of a request head (more: 431, from hyper), time to send a head (the
//! connection is closed), a connection's whole lifetime, the time a handler may take (503), and
//! the size of a response (500). Requests carry no body here: one that announces one gets 413.
//! Only GET (and HEAD) are served; an unknown path gets 404, another method 405.
//!
//! Routes may require a token ([`Routes::require_token`]): a request without it is answered 401
//! before any handler runs. Prometheus sends it as `Authorization: Bearer TOKEN`; a browser
//! opening the status page is asked for it (HTTP Basic, any user name, the token as password)
//! and sends it again with the page's own requests.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The bounds of one HTTP server.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Connections served at once; one more is answered 503 and closed.
    pub connections_max: usize,
    /// Bytes of a request's line and headers; more is answered 431.
    pub request_head_bytes_max: usize,
    /// How long a client may take to send a request's head before the connection is closed.
    pub header_read_timeout: Duration,
    /// How long one connection may stay open, keep-alive included.
    pub connection_lifetime_max: Duration,
    /// How long a handler may take before the request is answered 503.
    pub handler_timeout: Duration,
    /// Bytes of a response body; a larger one is answered 500 instead (and logged).
    pub response_bytes_max: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            // A few Prometheus servers and a few open status pages.
            connections_max: 32,
            request_head_bytes_max: 8 << 10,
            header_read_timeout: Duration::from_secs(5),
            connection_lifetime_max: Duration::from_secs(120),
            handler_timeout: Duration::from_secs(10),
            response_bytes_max: 8 << 20,
        }
    }
}

/// What a handler answers.
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Headers besides `Content-Type`, `Content-Length`, `Cache-Control: no-store` and
    /// `X-Content-Type-Options: nosniff` (which every reply has). Names in lower case.
    pub extra_headers: &'static [(&'static str, &'static str)],
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// 200 with `body` of `content_type`.
    pub fn ok(content_type: &'static str, body: impl Into<Bytes>) -> Reply {
        Reply { status: 200, content_type, extra_headers: &[], body: body.into() }
    }

    /// `status` with a one-line plain-text explanation.
    pub fn error(status: u16, message: &str) -> Reply {
        let body = Bytes::from(format!("{message}\n"));
        Reply { status, content_type: "text/plain; charset=utf-8", extra_headers: &[], body }
    }
}

/// A boxed future that answers one request.
pub type ReplyFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// A request handler: called once per request (GET has no body and no parameter here).
pub type Handler = Arc<dyn Fn() -> ReplyFuture + Send + Sync>;

/// The paths a server answers, each with its handler, and the token they require, if any.
#[derive(Default)]
pub struct Routes {
    entries: Vec<(&'static str, Handler)>,
    token: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for Routes {
    /// The paths, and whether a token is required (never the token).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("paths", &self.entries.iter().map(|(path, _)| path).collect::<Vec<_>>())
            .field("token_required", &self.token.is_some())
            .finish()
    }
}

impl Routes {
    /// No route: every path is 404.
    pub fn new() -> Routes {
        Routes::default()
    }

    /// Answers GET (and HEAD) of `path` with `handler`.
    pub fn get<F, R>(mut self, path: &'static str, handler: F) -> Routes
    where
        F: Fn() -> R + Send + Sync + 'static,
        R: Future<Output = Reply> + Send + 'static,
    {
        let handler: Handler = Arc::new(move || Box::pin(handler()) as ReplyFuture);
        self.entries.push((path, handler));
        self
    }

    /// Every path (and an unknown one) answers 401 unless the request carries `token`, as
    /// `Authorization: Bearer TOKEN` or as the password of `Authorization: Basic`.
    pub fn require_token(mut self, token: &str) -> Routes {
        self.token = Some(Arc::from(token.as_bytes()));
        self
    }
}

/// True if `request` carries `token` (compared in constant time).
fn carries_token(request: &Request, token: &[u8]) -> bool {
    use base64::Engine;
    let Some(value) = request.headers().get(header::AUTHORIZATION) else { return false };
    let value = value.as_bytes();
    if let Some(bearer) = value.strip_prefix(b"Bearer ") {
        return constant_time_equal(bearer.trim_ascii(), token);
    }
    if let Some(basic) = value.strip_prefix(b"Basic ") {
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(basic.trim_ascii())
        else {
            return false;
        };
        // "user:password"; the user name is not checked.
        let Some(colon) = decoded.iter().position(|&byte| byte == b':') else { return false };
        return constant_time_equal(&decoded[colon + 1..], token);
    }
    false
}

/// Equality whose time depends on the lengths only, not on where the bytes differ.
fn constant_time_equal(left: &[u8], right: &[u8]) -> bool {
    if left.len() != right.len() {
        return false;
    }
    left.iter().zip(right).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
}

/// Answers 401 (asking a browser for the token) unless the request carries it.
async fn require_token(token: Arc<[u8]>, request: Request, next: Next) -> Response {
    if carries_token(&request, &token) {
        return next.run(request).await;
    }
    let mut response = into_response(Reply::error(401, "this endpoint needs its access token"));
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"stratus\", charset=\"UTF-8\""),
    );
    response
}

/// Binds `address` for [`serve`].
pub async fn bind(address: &str) -> Result<TcpListener, String> {
    TcpListener::bind(address).await.map_err(|error| format!("listen on {address}: {error}"))
}

/// What a connection over [`HttpLimits::connections_max`] is told before it is closed.
const BUSY_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
content-length: 36\r\nretry-after: 1\r\nconnection: close\r\n\r\ntoo many connections; try again soon\n";

/// Connections over the limit being told so at once; more are closed without a word.
const REFUSALS_IN_FLIGHT_MAX: usize = 16;

/// How long telling a connection over the limit may take.
const REFUSAL_PATIENCE: Duration = Duration::from_secs(1);

/// Bytes read (and dropped) from a refused connection before it is closed.
const REFUSAL_DRAIN_BYTES_MAX: usize = 64 << 10;

/// Serves `routes` on `listener` forever; with `tls`, every connection runs a TLS handshake
/// first (on its own task, within the handshake timeout, holding one of the connection
/// permits).
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    limits: HttpLimits,
    tls: Option<Arc<stratus_tls::ServerTls>>,
) {
    let router = router(routes, &limits);
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let refusals = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT_MAX));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors is transient: back off instead of spinning.
                tracing::warn!(%error, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // No queue: a short answer, then the connection is closed (in plain text only:
            // a TLS client would not understand it, and is simply closed).
            if tls.is_none() {
                if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        let _refusal = refusal;
                        let _ = tokio::time::timeout(REFUSAL_PATIENCE, refuse(stream)).await;
                    });
                }
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let limits = limits.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_connection(stream, router, &limits).await,
                Some(tls) => {
                    if let Ok(stream) = tls.accept(stream, &peer.to_string()).await {
                        serve_connection(stream, router, &limits).await;
                    }
                }
            }
        });
    }
}

/// Serves one connection (plain or TLS) for at most its lifetime limit.
async fn serve_connection<S>(stream: S, router: Router, limits: &HttpLimits)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(router);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.request_head_bytes_max)
        // Room for a head over the limit to be read whole, so the client gets its 431 rather
        // than a reset of a connection closed with unread bytes.
        .max_buf_size((2 * limits.request_head_bytes_max).max(8 << 10));
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(limits.connection_lifetime_max, connection).await;
}

/// Answers 503 and closes: the answer, then end of stream, then whatever the client sent is
/// read and dropped until it closes too (closing with unread bytes would reset the connection,
/// and the client could lose the answer).
async fn refuse(mut stream: tokio::net::TcpStream) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(BUSY_RESPONSE).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < REFUSAL_DRAIN_BYTES_MAX {
        match stream.read(&mut sink).await? {
            0 => break,
            read => drained += read,
        }
    }
    Ok(())
}

fn router(routes: Routes, limits: &HttpLimits) -> Router {
    let token = routes.token.clone();
    let mut router = Router::new();
    for (path, handler) in routes.entries {
        let (timeout, bytes_max) = (limits.handler_timeout, limits.response_bytes_max);
        router = router.route(
            path,
            get(move || {
                let handler = handler.clone();
                async move { answer(path, &handler, timeout, bytes_max).await }
            }),
        );
    }
    let mut router = router.fallback(|| async { into_response(Reply::error(404, "not found")) });
    if let Some(token) = token {
        router = router.layer(axum::middleware::from_fn(move |request: Request, next: Next| {
            require_token(token.clone(), request, next)
        }));
    }
    router.layer(axum::middleware::from_fn(refuse_bodies))
}

async fn answer(path: &str, handler: &Handler, timeout: Duration, bytes_max: usize) -> Response {
    let reply = match tokio::time::timeout(timeout, handler()).await {
        Ok(reply) if reply.body.len() > bytes_max => {
            tracing::error!(path, bytes = reply.body.len(), bytes_max, "HTTP response too large");
            Reply::error(500, "response too large")
        }
        Ok(reply) => reply,
        Err(_) => Reply::error(503, "the answer took too long"),
    };
    into_response(reply)
}

fn into_response(reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Body::from(reply.body)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    for (name, value) in reply.extra_headers {
        match HeaderName::from_lowercase(name.as_bytes()) {
            Ok(name) => {
                headers.insert(name, HeaderValue::from_static(value));
            }
            Err(_) => debug_assert!(false, "invalid header name {name:?}"),
        }
    }
    response
}

/// Requests here carry no body: one that announces one is refused before it is read, and the
/// connection closed.
async fn refuse_bodies(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers.get(header::CONTENT_LENGTH).is_some_and(|length| length.as_bytes() != b"0");
    if has_body {
        let mut response =
            into_response(Reply::error(413, "requests to this server carry no body"));
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Bound on every wait in these tests.
    const PATIENCE: Duration = Duration::from_secs(20);

    async fn start(limits: HttpLimits) -> String {
        let routes = Routes::new()
            .get("/metrics", || async { Reply::ok(crate::exposition::CONTENT_TYPE, "up 1\n") })
            .get("/slow", || async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Reply::ok("text/plain", "never")
            })
            .get("/big", || async { Reply::ok("text/plain", vec![b'x'; 4096]) });
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(serve(listener, routes, limits, None));
        address
    }

    /// Sends `request` and reads until the server closes the connection.
    async fn exchange(address: &str, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream.write_all(request).await.expect("send");
        let mut response = Vec::new();
        tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
            .await
            .expect("the server closes the connection in time")
            .expect("read");
        String::from_utf8_lossy(&response).into_owned()
    }

    fn status_of(response: &str) -> &str {
        response.split(' ').nth(1).unwrap_or("")
    }

    fn small_limits() -> HttpLimits {
        HttpLimits {
            handler_timeout: Duration::from_millis(200),
            response_bytes_max: 1024,
            ..HttpLimits::default()
        }
    }

    #[tokio::test]
    async fn a_token_is_required_when_set_as_bearer_or_basic_password() {
        let token = "a-metrics-token-0123456789";
        let routes = Routes::new()
            .get("/metrics", || async { Reply::ok(crate::exposition::CONTENT_TYPE, "up 1\n") })
            .require_token(token);
        assert!(!format!("{routes:?}").contains(token));
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(serve(listener, routes, small_limits(), None));
        let get = |authorization: &str, path: &str| {
            format!("GET {path} HTTP/1.1\r\nhost: x\r\n{authorization}connection: close\r\n\r\n")
        };
        let response = exchange(&address, get("", "/metrics").as_bytes()).await;
        assert_eq!(status_of(&response), "401", "{response}");
        assert!(response.to_ascii_lowercase().contains("www-authenticate: basic realm="));
        assert!(!response.contains("up 1"));
        // An unknown path does not tell that it is unknown.
        let response = exchange(&address, get("", "/nothing").as_bytes()).await;
        assert_eq!(status_of(&response), "401", "{response}");
        for wrong in [
            "authorization: Bearer a-metrics-token-012345678\r\n".to_string(),
            "authorization: Bearer \r\n".to_string(),
            "authorization: Basic !!!\r\n".to_string(),
            "authorization: Basic dXNlcjp3cm9uZw==\r\n".to_string(),
            format!("authorization: Token {token}\r\n"),
        ] {
            let response = exchange(&address, get(&wrong, "/metrics").as_bytes()).await;
            assert_eq!(status_of(&response), "401", "{wrong}: {response}");
        }
        let bearer = format!("authorization: Bearer {token}\r\n");
        let response = exchange(&address, get(&bearer, "/metrics").as_bytes()).await;
        assert_eq!(status_of(&response), "200", "{response}");
        assert!(response.ends_with("up 1\n"));
        // "anyone:a-metrics-token-0123456789", as a browser sends it.
        use base64::Engine;
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("anyone:{token}").as_bytes());
        let basic = format!("authorization: Basic {encoded}\r\n");
        let response = exchange(&address, get(&basic, "/metrics").as_bytes()).await;
        assert_eq!(status_of(&response), "200", "{response}");
    }

    #[tokio::test]
    async fn a_route_is_served_with_its_type_and_no_caching() {
        let address = start(small_limits()).await;
        let response =
            exchange(&address, b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
        assert_eq!(status_of(&response), "200", "{response}");
        let lower = response.to_ascii_lowercase();
        assert!(lower.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(lower.contains("cache-control: no-store\r\n"));
        assert!(lower.contains("content-length: 5\r\n"));
        assert!(response.ends_with("\r\n\r\nup 1\n"), "{response}");
        // A query string does not change the route.
        let response = exchange(
            &address,
            b"GET /metrics?x=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status_of(&response), "200", "{response}");
    }

    #[tokio::test]
    async fn head_has_no_body_and_other_methods_are_refused() {
        let address = start(small_limits()).await;
        let response =
            exchange(&address, b"HEAD /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
        assert_eq!(status_of(&response), "200", "{response}");
        assert!(response.ends_with("\r\n\r\n"), "no body: {response}");
        let response =
            exchange(&address, b"DELETE /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
        assert_eq!(status_of(&response), "405", "{response}");
    }

    #[tokio::test]
    async fn an_unknown_path_is_404() {
        let address = start(small_limits()).await;
        let response =
            exchange(&address, b"GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
        assert_eq!(status_of(&response), "404", "{response}");
        assert!(response.ends_with("not found\n"));
    }

    #[tokio::test]
    async fn an_oversized_request_head_is_431() {
        let address = start(small_limits()).await;
        let mut request = b"GET /metrics HTTP/1.1\r\nhost: x\r\nx-filler: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 12 << 10));
        request.extend_from_slice(b"\r\n\r\n");
        let response = exchange(&address, &request).await;
        assert_eq!(status_of(&response), "431", "{response}");
        // Just under the limit is fine.
        let mut request =
            b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-filler: ".to_vec();
        request.extend(std::iter::repeat_n(b'a', 7 << 10));
        request.extend_from_slice(b"\r\n\r\n");
        assert_eq!(status_of(&exchange(&address, &request).await), "200");
    }

    #[tokio::test]
    async fn a_request_with_a_body_is_413() {
        let address = start(small_limits()).await;
        let response = exchange(
            &address,
            b"GET /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello",
        )
        .await;
        assert_eq!(status_of(&response), "413", "{response}");
        let response = exchange(
            &address,
            b"GET /metrics HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        .await;
        assert_eq!(status_of(&response), "413", "{response}");
    }

    #[tokio::test]
    async fn a_slow_handler_is_503_and_a_large_response_500() {
        let address = start(small_limits()).await;
        let response =
            exchange(&address, b"GET /slow HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await;
        assert_eq!(status_of(&response), "503", "{response}");
        let response =
            exchange(&address, b"GET /big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await;
        assert_eq!(status_of(&response), "500", "{response}");
        assert!(response.ends_with("response too large\n"));
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_head_is_disconnected() {
        let limits =
            HttpLimits { header_read_timeout: Duration::from_millis(300), ..small_limits() };
        let address = start(limits).await;
        let mut stream = TcpStream::connect(&address).await.expect("connect");
        stream.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n").await.expect("send");
        let mut response = Vec::new();
        let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response)).await;
        assert!(read.is_ok(), "the connection was not closed");
        // hyper answers 408 before closing, or just closes: either way no 200.
        assert!(!String::from_utf8_lossy(&response).contains(" 200 "));
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_refused_until_one_closes() {
        let limits = HttpLimits { connections_max: 2, ..small_limits() };
        let address = start(limits).await;
        // Two idle connections hold both places (accepted in the order they connected).
        let first = TcpStream::connect(&address).await.expect("connect");
        let mut second = TcpStream::connect(&address).await.expect("connect");
        let response =
            exchange(&address, b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await;
        assert_eq!(status_of(&response), "503", "{response}");
        assert!(response.contains("too many connections"));
        // The second connection is served (keep-alive: read one response).
        second.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("send");
        let mut buffer = vec![0u8; 4096];
        let read = tokio::time::timeout(PATIENCE, second.read(&mut buffer)).await;
        let read = read.expect("answered in time").expect("read");
        assert_eq!(status_of(&String::from_utf8_lossy(&buffer[..read])), "200");
        // Once one closes, a new connection is served again.
        drop(first);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let response = exchange(
                &address,
                b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
            )
            .await;
            if status_of(&response) == "200" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no place freed: {response}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

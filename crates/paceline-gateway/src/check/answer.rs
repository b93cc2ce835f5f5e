//! One check request, answered: a sealed refusal opened, or the
//! described request rebuilt, screened, and run through the gateway's shed
//! and limit layers to [`Allow`]; a refusal sealed when the proxy asked
//! for a deny status.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty, Full};
use paceline_core::Clock;
use paceline_server::RateLimit;
use paceline_wire::problem::{self, Problem, ProblemKind};
use tower::ServiceExt;

use super::rebuild::rebuild;
use super::seal::{Seal, Unopened, SEALED_FOR_S};
use super::{ANSWER, DENY_STATUS};
use crate::server::GatewayHandle;

/// The statuses [`DENY_STATUS`] may ask for.
const DENY_STATUSES: [u16; 2] = [401, 403];

/// [`ANSWER`] and [`DENY_STATUS`] as names (looked up on every call).
static ANSWER_NAME: HeaderName = HeaderName::from_static(ANSWER);
static DENY_STATUS_NAME: HeaderName = HeaderName::from_static(DENY_STATUS);

/// The layers a described request goes through: the gateway's shed
/// layer, its key lookup (`keys.rs`) and limit layer, then [`Allow`].
pub(super) type Stack = crate::shed::LoadShed<
    crate::keys::Resolve<RateLimit<Allow, crate::GatewayStore, Arc<dyn Clock>>>,
>;

/// The body of the stack's answers.
type StackBody = crate::shed::ShedBody<paceline_server::RateLimitBody<Empty<Bytes>>>;

/// The stack's call, boxed (so the answer's future is plainly `Send`).
type Calling =
    std::pin::Pin<Box<dyn Future<Output = Result<Response<StackBody>, Infallible>> + Send>>;

/// A body being read whole, boxed likewise.
type Collecting = std::pin::Pin<
    Box<dyn Future<Output = Result<http_body_util::Collected<Bytes>, Infallible>> + Send>,
>;

/// The future of one check request's answer.
pub(super) type Answering =
    std::pin::Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

/// What every connection of a check shares.
pub(super) struct Shared {
    pub(super) handle: GatewayHandle,
    pub(super) seal: Seal,
}

impl Shared {
    /// The answer to one check request.
    pub(super) fn answer<B>(self: Arc<Self>, req: Request<B>, stack: Stack) -> Answering {
        // the body, if any, is never read
        let (mut parts, _body) = req.into_parts();
        if parts.version == Version::HTTP_2 && !parts.headers.contains_key(HOST) {
            // HTTP/2 names the check request's host in its target (its
            // `:authority`), where HTTP/1.1 sends `Host`: the described
            // request's host when the proxy names none
            if let Some(a) = parts.uri.authority() {
                if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                    parts.headers.insert(HOST, v);
                }
            }
        }
        let limits = self.handle.limiter().limits();
        let base = limits.problem_base();
        let now = self.handle.limiter().clock().now();
        let ready = |res: Response<Bytes>| -> Answering {
            Box::pin(std::future::ready(Ok(res.map(Full::new))))
        };
        if let Some(sealed) = parts.headers.get(&ANSWER_NAME) {
            return ready(match self.seal.open(sealed.as_bytes(), now) {
                Ok(res) => res,
                Err(why) => bad(base, unopened(why)),
            });
        }
        let deny = match deny_status(&parts.headers) {
            Ok(d) => d,
            Err(detail) => return ready(bad(base, detail)),
        };
        let call = match described(&parts.headers, &self.handle, base) {
            Ok(req) => stack.oneshot(req),
            Err(res) => return ready(self.refused(*res, deny, now)),
        };
        let call: Calling = Box::pin(call);
        Box::pin(async move {
            let res = match call.await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let allowed = res.extensions().get::<Allowed>().is_some();
            let (parts, body) = res.into_parts();
            // every body here is the layers' own, whole at once (or empty)
            let collect: Collecting = Box::pin(body.collect());
            let body = match collect.await {
                Ok(c) => c.to_bytes(),
                Err(never) => match never {},
            };
            let res = Response::from_parts(parts, body);
            let res = match allowed {
                true => res,
                false => self.refused(res, deny, now),
            };
            Ok(res.map(Full::new))
        })
    }

    /// A refusal (or the usage document) as the proxy is to get it: the
    /// check request's own connection stays open (a refusal's unread body
    /// is the proxy's to deal with, not the check's), and, when the proxy
    /// asked for a deny status, a refusal gets it and is sealed.
    fn refused(
        &self,
        mut res: Response<Bytes>,
        deny: Option<StatusCode>,
        now: paceline_core::Nanos,
    ) -> Response<Bytes> {
        res.headers_mut().remove(CONNECTION);
        match deny {
            Some(status) if res.status().as_u16() >= 400 => {
                let sealed = self.seal.seal(&res, now);
                *res.status_mut() = status;
                res.headers_mut().insert(ANSWER, sealed);
                // the refusal travels in the seal: a deny answer has no
                // body, so a proxy that never reads one (nginx's
                // auth_request) keeps its connection to the check open
                // instead of closing it on every refusal
                *res.body_mut() = Bytes::new();
                res.headers_mut().remove(http::header::CONTENT_LENGTH);
                res.headers_mut().remove(http::header::CONTENT_TYPE);
                res
            }
            _ => res,
        }
    }
}

/// The status a check request asks refusals to be answered with, if any.
fn deny_status(h: &http::HeaderMap) -> Result<Option<StatusCode>, String> {
    let mut all = h.get_all(&DENY_STATUS_NAME).iter();
    let (Some(v), None) = (all.next(), all.next()) else {
        return match h.contains_key(&DENY_STATUS_NAME) {
            true => Err("Paceline-Deny-Status is sent twice.".to_string()),
            false => Ok(None),
        };
    };
    let code = std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(|s| s.trim().parse::<u16>().ok())
        .filter(|c| DENY_STATUSES.contains(c))
        .ok_or_else(|| "Paceline-Deny-Status takes 401 or 403.".to_string())?;
    Ok(StatusCode::from_u16(code).ok())
}

/// The described request, rebuilt and screened as the gateway screens
/// its own heads; or the answer refusing it.
fn described(
    check: &http::HeaderMap,
    handle: &GatewayHandle,
    base: &str,
) -> Result<Request<()>, Box<Response<Bytes>>> {
    let mut req = rebuild(check).map_err(|e| Box::new(bad(base, e.detail().to_string())))?;
    crate::front::screen(&mut req, &handle.paths())
        .map_err(|r| Box::new(crate::front::answer(&r, base)))?;
    Ok(req)
}

/// A `400` problem answer with `detail`.
fn bad(base: &str, detail: String) -> Response<Bytes> {
    problem::answer(&Problem::new(ProblemKind::BadRequest, base, detail))
}

fn unopened(why: Unopened) -> String {
    match why {
        Unopened::Forged => "Paceline-Answer is not an answer this check sealed.".to_string(),
        Unopened::Expired => {
            format!("Paceline-Answer expired: a sealed answer is opened within {SEALED_FOR_S} s.")
        }
    }
}

/// Marks the answer of [`Allow`]: a request the layers passed on.
#[derive(Clone, Copy, Debug)]
struct Allowed;

/// What the limit layer passes an admitted request on to: an empty `200`,
/// marked [`Allowed`], which the layer decorates with the fields.
#[derive(Clone, Copy, Debug)]
pub(super) struct Allow;

impl tower_service::Service<Request<()>> for Allow {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Empty<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let mut res = Response::new(Empty::new());
        res.extensions_mut().insert(Allowed);
        res.headers_mut().insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        std::future::ready(Ok(res))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::PathSettings;
    use crate::front::tests::{as_an_upstream_reads, limits, path_segments, spelled};
    use http::HeaderMap;

    proptest::proptest! {
        /// Through a proxy the upstream reads the path as the client wrote
        /// it (the gateway forwards its normal form instead): the route the
        /// check charges for is still the one the upstream routes on.
        #[test]
        fn what_the_check_charges_for_is_what_the_upstream_routes_on_as_written(
            segs in path_segments(),
            encode in proptest::prelude::any::<u64>(),
            query in proptest::option::of("[a-z=&]{0,6}"),
        ) {
            let written = spelled(&segs, encode);
            let target = match &query {
                Some(q) => format!("{written}?{q}"),
                None => written.clone(),
            };
            let mut check = HeaderMap::new();
            check.insert("x-original-method", "POST".parse().unwrap());
            check.insert("x-original-uri", target.parse().unwrap());
            check.insert("host", "check".parse().unwrap());
            let limits = limits();
            let Ok(mut req) = super::rebuild(&check) else {
                return Err(proptest::test_runner::TestCaseError::fail(format!("{target} not rebuilt")));
            };
            proptest::prop_assert_eq!(req.uri().query(), query.as_deref());
            if crate::front::screen(&mut req, &PathSettings::default()).is_ok() {
                let charged = limits.classify(&req);
                let routed = http::Request::post(as_an_upstream_reads(&written)).body(()).unwrap();
                proptest::prop_assert_eq!(&charged, &limits.classify(&routed), "{} charged as {}", written, req.uri());
            }
        }
    }
}

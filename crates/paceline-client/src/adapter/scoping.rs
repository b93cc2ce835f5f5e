//! Which pacing scope a request belongs to (see [`Scoping`]).

use std::fmt;
use std::sync::Arc;

use http::header::{HeaderName, AUTHORIZATION};
use http::{Extensions, HeaderMap, Method};

use crate::Client;

/// A scope chosen for one request: put it in the request's extensions and
/// the adapter paces the request in that scope, whatever the defaults say.
///
/// ```
/// use paceline_client::adapter::PacingScope;
///
/// let mut req = http::Request::get("http://api.test/v1/rates").body(()).unwrap();
/// req.extensions_mut().insert(PacingScope::new("account-42"));
/// assert_eq!(req.extensions().get::<PacingScope>().unwrap().name(), "account-42");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PacingScope(String);

impl PacingScope {
    /// A scope called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        PacingScope(name.into())
    }
    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// What a scope function sees of a request.
#[derive(Debug)]
#[non_exhaustive]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The authority (`host:port`, or the `Host` header for a relative
    /// URI).
    pub authority: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The scope the defaults give it (authority and credential hash), to
    /// build on.
    pub default_scope: &'a str,
}

/// A scope function: names the scope of every request.
pub type ScopeFn = Arc<dyn Fn(&RequestHead<'_>) -> String + Send + Sync>;

/// How an adapter names the scope of a request.
///
/// Why per credential: a server keeps one limit per API key, so one client
/// that sends with two keys must pace two buckets, not one. Pacing both
/// as one spends the first key's answers on the second key's requests and
/// finishes far later than the two limits allow.
///
/// By default both adapters name a request's scope after its authority
/// (`host:port`) and, when it carries a credential, a hash of it:
/// `api.example.com#3f9a1c2b7d10e4a5`. The credential is the
/// `Authorization` header, or the header [`Scoping::key_header`] names
/// (for APIs that take `X-Api-Key`). The hash is keyed per [`Client`], so
/// no key can be read or guessed back from a scope name in diagnostics.
///
/// Two ways to choose otherwise:
///
/// - for every request, a function of its [`RequestHead`]
///   ([`Scoping::scope_fn`], through the adapters' `scope_fn`);
/// - for one request, a [`PacingScope`] in its extensions (with
///   `reqwest-middleware`, `RequestBuilder::with_extension`), which wins
///   over both.
#[derive(Clone)]
pub struct Scoping {
    key_header: HeaderName,
    scope_fn: Option<ScopeFn>,
}

impl fmt::Debug for Scoping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoping")
            .field("key_header", &self.key_header)
            .field("scope_fn", &self.scope_fn.is_some())
            .finish()
    }
}

impl Default for Scoping {
    fn default() -> Self {
        Scoping {
            key_header: AUTHORIZATION,
            scope_fn: None,
        }
    }
}

impl Scoping {
    /// Reads the credential from `header` instead of `Authorization`.
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.key_header = header;
        self
    }

    /// The header the credential is read from.
    pub fn credential_header(&self) -> &HeaderName {
        &self.key_header
    }

    /// Names every request's scope with `f`.
    pub fn scope_fn(
        mut self,
        f: impl Fn(&RequestHead<'_>) -> String + Send + Sync + 'static,
    ) -> Self {
        self.scope_fn = Some(Arc::new(f));
        self
    }

    /// The scope of a request: its [`PacingScope`] extension, else the
    /// scope function's answer, else the authority and the credential's
    /// hash.
    pub fn scope_of(
        &self,
        client: &Client,
        method: &Method,
        authority: &str,
        path: &str,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> String {
        if let Some(s) = extensions.get::<PacingScope>() {
            return s.0.clone();
        }
        let default_scope = match headers.get(&self.key_header) {
            Some(credential) => format!(
                "{authority}#{}",
                client.credential_tag(credential.as_bytes())
            ),
            None => authority.to_string(),
        };
        match &self.scope_fn {
            Some(f) => f(&RequestHead {
                method,
                authority,
                path,
                headers,
                default_scope: &default_scope,
            }),
            None => default_scope,
        }
    }
}

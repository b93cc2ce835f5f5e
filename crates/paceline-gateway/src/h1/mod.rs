//! HTTP/1.x on the client side of the gateway, read and written by the
//! gateway itself: the request head parser (`request.rs`), with the same
//! field scan as the upstream client's answer parser (`scan.rs`).
//!
//! Why: on the gateway's cheapest paths (a `429` from the head, a request
//! proxied to an instant upstream) hyper's server connection is the
//! largest single cost, about 6,000 of the 12,500 instructions of a
//! refused request (BENCHMARKS.md). The gateway needs less of it than
//! hyper offers: heads into the `http` types, bodies framed by length or
//! chunks, answers written as they come. The parser here is the first
//! piece of a connection of its own, built beside hyper's and held to it
//! by a differential test; the connection that uses it comes next. The
//! parse alone costs what hyper's does (the same `httparse`, the same
//! `Uri` and `HeaderMap`): the saving such a connection can make is in
//! hyper's dispatcher, buffers and answer encoding.

#[cfg(test)]
mod differential;
mod places;
// read by its tests only until the connection that uses it lands
#[cfg_attr(not(test), allow(dead_code))]
mod request;
mod scan;

pub(crate) use places::Places;
#[cfg(test)]
pub(crate) use places::FEW;
pub(crate) use scan::Scan;

//! HTTP/1.1 on the client side of the gateway, read and written by the
//! gateway itself: the connection (`conn.rs`) that serves requests
//! without a body and hands the rest over to hyper, the request head
//! parser (`request.rs`, with the same field scan as the upstream
//! client's answer parser: `scan.rs`, `places.rs`), and the body type the
//! stages read whoever served the request (`body.rs`).
//!
//! Why: on the gateway's cheapest paths (a `429` from the head, a request
//! proxied to an instant upstream) hyper's server connection was the
//! largest single cost: about 6,000 of the 12,600 instructions of a
//! refused request (BENCHMARKS.md). The parse itself is no cheaper than
//! hyper's (the same `httparse`, the same `Uri` and `HeaderMap`, the
//! values checked once more); the saving is in hyper's dispatcher, its
//! buffers and its answer encoding. The
//! parser is held to hyper's by a differential test (`differential.rs`),
//! the connection by `tests/http1.rs`.

mod body;
mod conn;
mod date;
#[cfg(test)]
mod differential;
mod places;
mod request;
mod scan;
mod stock;

pub(crate) use body::ClientBody;
pub(crate) use conn::connection;
pub(crate) use places::Places;
#[cfg(test)]
pub(crate) use places::FEW;
pub(crate) use scan::Scan;
pub(crate) use stock::give as give_map;

//! A per-thread stock of emptied header maps: the maps of requests and
//! answers that went through the gateway, cleared and kept for the next
//! ones.
//!
//! Why: a proxied request builds two maps (its own fields, the upstream's
//! answer) and frees both once the answer is written. Each map is two
//! allocations, and an answer's, sized for the fields the stages add on
//! the way back, is over a kilobyte: the allocator's slower size class.
//! Taking an emptied map from the stock costs a thread-local look-up;
//! clearing one costs what dropping its fields costs anyway.

use std::cell::RefCell;

use http::HeaderMap;

/// The most maps kept per thread: more than the heads a thread has in
/// flight at once on a busy gateway, so the stock rarely runs dry.
const KEPT: usize = 128;
/// A map with room for more fields than this, or that held more values
/// (a long head, or one name repeated: its extra values keep their own
/// room), is dropped rather than kept. So a kept map takes at most about
/// 10 KiB (48 entries of 104 bytes, up to 64 extra values of 72) and a
/// thread's stock about 1.3 MiB; the usual map (room for 12 fields)
/// takes 1.3 KiB.
const LARGEST: usize = 48;

thread_local! {
    static STOCK: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for `fields` fields: one from the stock when
/// there is one, else a new one.
pub(crate) fn take(fields: usize) -> HeaderMap {
    let kept = STOCK
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    match kept {
        Some(mut map) => {
            map.reserve(fields);
            map
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Gives `map` back: its fields are dropped, and its room kept for a
/// later [`take`] on this thread (unless the stock is full or the map too
/// large).
pub(crate) fn give(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > LARGEST || map.len() > LARGEST {
        return;
    }
    map.clear();
    let _ = STOCK.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.len() < KEPT {
                s.push(map);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{HeaderValue, HOST};

    fn stocked() -> usize {
        STOCK.with(|s| s.borrow().len())
    }

    #[test]
    fn a_map_given_back_is_taken_again_empty() {
        let mut m = take(4);
        let room = m.capacity();
        m.insert(HOST, HeaderValue::from_static("a"));
        m.append("x-a", HeaderValue::from_static("1"));
        let before = stocked();
        give(m);
        assert_eq!(stocked(), before + 1);
        let again = take(2);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), room, "the same room, not a new map");
        assert_eq!(stocked(), before);
    }

    #[test]
    fn a_taken_map_has_the_room_asked_for() {
        give(HeaderMap::with_capacity(1));
        let m = take(20);
        assert!(m.capacity() >= 20);
    }

    #[test]
    fn large_maps_and_a_full_stock_are_not_kept() {
        let before = stocked();
        give(HeaderMap::with_capacity(LARGEST * 2));
        give(HeaderMap::new());
        // room for few fields, but one name repeated past the bound
        let mut repeated = HeaderMap::with_capacity(4);
        for i in 0..=LARGEST {
            repeated.append("x-a", HeaderValue::from(i));
        }
        assert!(repeated.capacity() <= LARGEST);
        give(repeated);
        assert_eq!(stocked(), before);
        for _ in 0..KEPT + 10 {
            give(HeaderMap::with_capacity(4));
        }
        assert_eq!(stocked(), KEPT);
        // a stock of emptied maps: every one is empty
        STOCK.with(|s| assert!(s.borrow().iter().all(HeaderMap::is_empty)));
    }
}

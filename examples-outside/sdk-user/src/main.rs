//! paceline-client's README example, as a user's crate builds it.

include!(concat!(env!("OUT_DIR"), "/readme.rs"));

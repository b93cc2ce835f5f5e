//! Runs N checks of one kind, for instruction counting under callgrind:
//! `valgrind --tool=callgrind target/release/examples/icount MODE N`.
//! MODE: ours1, ours2, governor. Keys cycle over KEYS (1,000 unless a
//! third argument says otherwise).

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::{Quota, RateLimiter};
use paceline_core::{Limiter, Plan, Policy};

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "ours1".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let nkeys: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1_000);
    let keys: Vec<String> = (0..nkeys).map(|i| format!("sk_live_{i:08}")).collect();
    let one = Plan::new("p", vec![Policy::token_bucket("burst", 50, 1).unwrap()]).unwrap();
    let two = Plan::new(
        "p2",
        vec![
            Policy::token_bucket("burst", 50, 1).unwrap(),
            Policy::daily("daily", 1_000_000_000).unwrap(),
        ],
    )
    .unwrap();
    let lim = Limiter::in_memory();
    let q = NonZeroU32::new(50).unwrap();
    let gov = RateLimiter::keyed(Quota::per_second(q).allow_burst(q));
    for k in &keys {
        let _ = lim.check_sync(&one, k, 1);
        let _ = lim.check_sync(&two, k, 1);
        let _ = gov.check_key(k);
    }
    let mut ok = 0usize;
    let run = |f: &mut dyn FnMut(&String) -> bool| {
        let mut ok = 0usize;
        for i in 0..n {
            ok += f(&keys[i % nkeys]) as usize;
        }
        ok
    };
    ok += match mode.as_str() {
        "ours1" => run(&mut |k: &String| lim.check_sync(&one, k, 1).unwrap().is_allowed()),
        "ours2" => run(&mut |k: &String| lim.check_sync(&two, k, 1).unwrap().is_allowed()),
        _ => run(&mut |k: &String| gov.check_key(k).is_ok()),
    };
    black_box(ok);
}

//! A configuration saved while serving is picked up without a counter
//! lost; one that does not load leaves the rules in force.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use paceline_core::{ManualClock, MemoryStore};
use paceline_rls::{Reload, RlsService, Watcher};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("paceline-rls-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn limits(rpu: u32) -> String {
    format!("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: day\n      requests_per_unit: {rpu}\n")
}

#[tokio::test]
async fn a_saved_file_is_picked_up_while_serving_without_a_counter_lost() {
    let d = dir("saved");
    std::fs::write(d.join("api.yaml"), limits(10)).unwrap();
    let (watcher, config) = Watcher::start(&d).unwrap();
    let clock = ManualClock::at_unix_secs(START);
    let svc = RlsService::new(config, MemoryStore::new(), clock);
    let s = serve(svc.clone()).await;
    tokio::spawn(watcher.run(svc, Duration::from_millis(20)));
    let mut c = client(s.addr).await;
    let req = request("api", &[&[("tenant", "t1")]]);
    for _ in 0..4 {
        ask(&mut c, &req).await;
    }
    // saved: a new limit, and a second domain beside it
    std::fs::write(d.join("api.yaml"), limits(20)).unwrap();
    std::fs::write(
        d.join("other.yml"),
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let r = loop {
        let r = ask(&mut c, &request("other", &[&[("k", "v")]])).await;
        if r.statuses[0].current_limit.is_some() {
            break ask(&mut c, &req).await;
        }
        assert!(
            Instant::now() < until,
            "the saved file was not picked up in 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        20
    );
    // 4 counted before the reload, 1 now
    assert_eq!(r.statuses[0].limit_remaining, 15);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_file_that_does_not_load_leaves_the_rules_in_force() {
    let d = dir("broken");
    let f = d.join("api.yaml");
    std::fs::write(&f, limits(10)).unwrap();
    let (mut w, config) = Watcher::start(&f).unwrap();
    let svc = RlsService::new(config, MemoryStore::new(), ManualClock::at_unix_secs(START));
    assert!(matches!(w.poll(&svc), Reload::Unchanged));
    std::fs::write(&f, limits(10).replace("day", "fortnight")).unwrap();
    match w.poll(&svc) {
        Reload::Refused(e) => {
            assert_eq!(e.line, 5, "{e}");
            assert!(e.to_string().contains("api.yaml:5: unknown unit"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let rule = svc
        .config()
        .domain("api")
        .unwrap()
        .find([("tenant", "x")])
        .unwrap();
    assert_eq!(rule.rule.requests_per_unit, 10);
    std::fs::write(&f, limits(30)).unwrap();
    assert!(matches!(w.poll(&svc), Reload::Applied(1)));
    let _ = std::fs::remove_dir_all(&d);
}

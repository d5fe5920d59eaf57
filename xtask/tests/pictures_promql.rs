//! The PromQL evaluator of the dashboard's pictures (xtask/src/pictures/promql.rs), on recordings made
//! here with known answers: what Prometheus returns for the same scrapes.

use xtask::pictures::promql::{EvalError, Query, Value, extrapolated_rate};
use xtask::pictures::recording::{Point, Recording};

/// A recording of one scrape a second from t = 1000 s, each scrape's text from `scrape(i)`.
fn recording(scrapes: usize, scrape: impl Fn(usize) -> String) -> Recording {
    let mut recording = Recording::default();
    for i in 0..scrapes {
        recording
            .push(1_000_000 + 1_000 * i as i64, &scrape(i))
            .expect("a valid exposition");
    }
    recording
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn last_scrape(recording: &Recording) -> i64 {
    *recording.scrapes.last().expect("scrapes")
}

/// The single value of a query at the last scrape.
fn single(recording: &Recording, query: &str) -> f64 {
    match Query::parse(query)
        .unwrap()
        .at(recording, last_scrape(recording))
        .unwrap()
    {
        Value::Scalar(value) => value,
        Value::Vector(elements) => {
            assert_eq!(elements.len(), 1, "{query}: {elements:?}");
            elements.into_values().next().unwrap()
        }
    }
}

#[test]
fn the_rate_of_a_steady_counter_is_its_slope() {
    let r = recording(30, |i| {
        format!("requests_total{{verb=\"get\"}} {}\n", 10 * i)
    });
    // Five samples in (t-5s, t], 4 s apart at the ends: extrapolated by a second to the window's start.
    assert_eq!(single(&r, "rate(requests_total[5s])"), 10.0);
    assert_eq!(single(&r, "increase(requests_total[5s])"), 50.0);
}

#[test]
fn a_counter_reset_adds_the_value_before_it_back() {
    let points: Vec<Point> = [100.0, 110.0, 120.0, 5.0, 15.0]
        .iter()
        .enumerate()
        .map(|(i, v)| Point {
            at_ms: 1_000 * (i as i64 + 1),
            value: *v,
        })
        .collect();
    // 20 before the reset, then 15 more: 35 over 4 s of samples, extrapolated to the 5 s window.
    let increase = extrapolated_rate(&points, 0, 5_000, false).unwrap();
    assert!((increase - 35.0 * 5.0 / 4.0).abs() < 1e-9, "{increase}");
    assert_eq!(extrapolated_rate(&points[..1], 0, 5_000, false), None);
}

#[test]
fn a_counter_is_not_extrapolated_below_zero() {
    // A counter that starts at 2 and grows by 10 a second from its first sample (at 3 s, window from 0):
    // extrapolated back by at most the 0.2 s to where it would be 0, not by the average half interval.
    let points = [
        Point {
            at_ms: 3_000,
            value: 2.0,
        },
        Point {
            at_ms: 4_000,
            value: 12.0,
        },
        Point {
            at_ms: 5_000,
            value: 22.0,
        },
    ];
    let increase = extrapolated_rate(&points, 0, 5_000, false).unwrap();
    assert!((increase - 20.0 * 2.2 / 2.0).abs() < 1e-9, "{increase}");
}

#[test]
fn fewer_than_two_samples_in_the_window_give_no_rate() {
    let r = recording(3, |_| "requests_total 1\n".to_owned());
    let value = Query::parse("rate(requests_total[1s])")
        .unwrap()
        .at(&r, last_scrape(&r))
        .unwrap();
    assert_eq!(value, Value::Vector(Default::default()));
}

#[test]
fn a_series_missing_from_the_latest_scrape_is_stale() {
    // Pod b is gone from the last scrape (a scale-down): a sum counts pod a only.
    let r = recording(3, |i| {
        let mut text = "items{pod=\"a\"} 5\n".to_owned();
        if i < 2 {
            text.push_str("items{pod=\"b\"} 7\n");
        }
        text
    });
    assert_eq!(single(&r, "sum(items)"), 5.0);
    assert_eq!(single(&r, "count(items)"), 1.0);
    let earlier = Query::parse("sum(items)")
        .unwrap()
        .at(&r, r.scrapes[1])
        .unwrap();
    assert_eq!(
        earlier,
        Value::Vector([(Default::default(), 12.0)].into_iter().collect())
    );
}

/// The dashboard's hit ratio, variables at "All": hits over gets, by instance, over the pods of each.
#[test]
fn the_hit_ratio_divides_the_sums_of_each_instance() {
    let r = recording(20, |i| {
        let i = i as f64;
        [
            // Instance one: pod a 3 hits and 1 miss a second, pod b 1 hit and 3 misses: 4 of 8.
            format!("memcached_commands_total{{namespace=\"ns\",memcached=\"one\",pod=\"a\",command=\"get\",status=\"hit\"}} {}", 3.0 * i),
            format!("memcached_commands_total{{namespace=\"ns\",memcached=\"one\",pod=\"a\",command=\"get\",status=\"miss\"}} {}", i),
            format!("memcached_commands_total{{namespace=\"ns\",memcached=\"one\",pod=\"b\",command=\"get\",status=\"hit\"}} {}", i),
            format!("memcached_commands_total{{namespace=\"ns\",memcached=\"one\",pod=\"b\",command=\"get\",status=\"miss\"}} {}", 3.0 * i),
            // Instance two: only hits.
            format!("memcached_commands_total{{namespace=\"ns\",memcached=\"two\",pod=\"c\",command=\"get\",status=\"hit\"}} {}", 2.0 * i),
            "memcached_commands_total{namespace=\"ns\",memcached=\"two\",pod=\"c\",command=\"get\",status=\"miss\"} 0".to_owned(),
        ]
        .join("\n")
    });
    let query = "sum by (namespace, memcached) (rate(memcached_commands_total{namespace=~\".*\", memcached=~\".*\", command=\"get\", status=\"hit\"}[10s]))\n/\nsum by (namespace, memcached) (rate(memcached_commands_total{namespace=~\".*\", memcached=~\".*\", command=\"get\"}[10s]))";
    let Value::Vector(ratios) = Query::parse(query)
        .unwrap()
        .at(&r, last_scrape(&r))
        .unwrap()
    else {
        panic!("a vector")
    };
    let by_instance: Vec<(String, f64)> = ratios
        .iter()
        .map(|(labels, v)| (labels["memcached"].clone(), *v))
        .collect();
    assert_eq!(by_instance.len(), 2, "{by_instance:?}");
    assert_eq!(
        (by_instance[0].0.as_str(), by_instance[1].0.as_str()),
        ("one", "two")
    );
    assert!(
        close(by_instance[0].1, 0.5) && close(by_instance[1].1, 1.0),
        "{by_instance:?}"
    );
    assert!(ratios.keys().all(|l| l.len() == 2), "{ratios:?}");
}

#[test]
fn sums_by_labels_keep_only_those_labels() {
    let r = recording(12, |i| {
        format!(
            "kube_requests_total{{verb=\"get\",code=\"200\",resource=\"pods\"}} {i}\n\
             kube_requests_total{{verb=\"get\",code=\"200\",resource=\"services\"}} {i}\n\
             kube_requests_total{{verb=\"patch\",code=\"409\",resource=\"pods\"}} {}\n",
            2 * i
        )
    });
    let Value::Vector(rates) = Query::parse("sum by (verb, code) (rate(kube_requests_total[10s]))")
        .unwrap()
        .at(&r, last_scrape(&r))
        .unwrap()
    else {
        panic!("a vector")
    };
    let keys: Vec<(&str, &str)> = rates
        .keys()
        .map(|l| (l["verb"].as_str(), l["code"].as_str()))
        .collect();
    assert_eq!(keys, [("get", "200"), ("patch", "409")]);
    assert!(rates.values().all(|v| close(*v, 2.0)), "{rates:?}");
}

#[test]
fn a_range_query_has_a_point_per_scrape_where_the_series_had_a_value() {
    let r = recording(5, |i| format!("up {}\n", i % 2));
    let series = Query::parse("max(up)").unwrap().over(&r).unwrap();
    let points = &series[&Default::default()];
    let values: Vec<f64> = points.iter().map(|p| p.value).collect();
    assert_eq!(values, [0.0, 1.0, 0.0, 1.0, 0.0]);
    assert_eq!(points[4].at_ms, 1_004_000);
}

#[test]
fn what_the_evaluator_does_not_know_is_refused_by_name() {
    let r = recording(3, |i| format!("h_bucket{{le=\"1\"}} {i}\n"));
    for query in [
        "histogram_quantile(0.5, sum by (le) (rate(h_bucket[5s])))",
        "h_bucket @ 1000",
        "h_bucket and h_bucket",
        "topk(1, h_bucket)",
        "h_bucket > 1",
    ] {
        let error = Query::parse(query)
            .unwrap()
            .at(&r, last_scrape(&r))
            .unwrap_err();
        assert!(
            matches!(error, EvalError::Unsupported(_)),
            "{query}: {error:?}"
        );
    }
    assert!(matches!(
        Query::parse("sum(").unwrap_err(),
        EvalError::Parse(_)
    ));
}

#[test]
fn offset_reads_the_scrape_that_long_before() {
    let r = recording(30, |i| format!("copied_total {}\n", 10 * i));
    assert_eq!(single(&r, "copied_total offset 5s"), 240.0);
    assert_eq!(single(&r, "copied_total - copied_total offset 5s"), 50.0);
    // Before the first scrape there is nothing to read.
    let at_start = Query::parse("copied_total offset 5s")
        .unwrap()
        .at(&r, 1_002_000)
        .unwrap();
    assert_eq!(at_start, Value::Vector(Default::default()));
}

#[test]
fn or_adds_the_right_hand_elements_whose_labels_the_left_lacks() {
    let r = recording(3, |_| {
        "x{pod=\"a\"} 1\nx{pod=\"b\"} 2\ny{pod=\"b\"} 20\ny{pod=\"c\"} 30\n".to_owned()
    });
    let Value::Vector(union) = Query::parse("sum by (pod) (x) or sum by (pod) (y)")
        .unwrap()
        .at(&r, last_scrape(&r))
        .unwrap()
    else {
        panic!("a vector")
    };
    let values: Vec<(String, f64)> = union
        .iter()
        .map(|(labels, value)| (labels["pod"].clone(), *value))
        .collect();
    assert_eq!(
        values,
        [("a".into(), 1.0), ("b".into(), 2.0), ("c".into(), 30.0)]
    );
}

#[test]
fn clamp_min_raises_and_clamp_max_lowers_to_the_bound() {
    let r = recording(3, |_| "d{pod=\"a\"} -3\nd{pod=\"b\"} 5\n".to_owned());
    let query = |q: &str| match Query::parse(q).unwrap().at(&r, last_scrape(&r)).unwrap() {
        Value::Vector(v) => v.into_values().collect::<Vec<f64>>(),
        Value::Scalar(s) => vec![s],
    };
    assert_eq!(query("clamp_min(d, 0)"), [0.0, 5.0]);
    assert_eq!(query("clamp_max(d, 0)"), [-3.0, 0.0]);
}

/// The handover panels count what a counter added over the interval before each point, a new series'
/// first copy included, as `xtask/tests/alerts_evaluated.rs` has Prometheus's promtool check of the same
/// query.
#[test]
fn a_new_counters_first_increase_counts_in_the_interval_after_it_appears() {
    let query =
        "sum by (outcome) (clamp_min(items_total - (items_total offset 5s or items_total * 0), 0))";
    // Absent for 10 s, then 5000 copied, 2000 more at 20 s.
    let r = recording(30, |i| match i {
        0..10 => "other 1\n".to_owned(),
        10..20 => "other 1\nitems_total{outcome=\"copied\"} 5000\n".to_owned(),
        _ => "other 1\nitems_total{outcome=\"copied\"} 7000\n".to_owned(),
    });
    let series = Query::parse(query).unwrap().over(&r).unwrap();
    assert_eq!(series.len(), 1, "{series:?}");
    let (labels, points) = series.into_iter().next().unwrap();
    assert_eq!(labels["outcome"], "copied");
    let at = |second: i64| {
        points
            .iter()
            .find(|p| p.at_ms == 1_000_000 + 1_000 * second)
            .map(|p| p.value)
    };
    assert_eq!(at(9), None, "no series yet");
    assert_eq!(at(10), Some(5000.0));
    assert_eq!(at(14), Some(5000.0), "within the interval after it");
    assert_eq!(at(15), Some(0.0));
    assert_eq!(at(20), Some(2000.0));
    assert_eq!(at(25), Some(0.0));
}

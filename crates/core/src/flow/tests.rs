use super::*;
use chrono::TimeZone;

fn fields<'a>(
    concurrency: &'a [ConcurrencySpec],
    rate_limit: &'a [RateLimitSpec],
) -> FlowFields<'a> {
    FlowFields {
        concurrency,
        rate_limit,
        debounce: None,
        dedup: None,
    }
}

fn own(key: &str, limit: u32) -> ConcurrencySpec {
    ConcurrencySpec {
        key: Some(key.into()),
        limit: Some(limit),
        uses: None,
    }
}

fn at(ms: i64) -> Instant {
    chrono::Utc
        .timestamp_millis_opt(1_800_000_000_000 + ms)
        .unwrap()
}

#[test]
fn bad_keys_and_bounds_are_refused_naming_the_field() {
    let field =
        |c: &[ConcurrencySpec], r: &[RateLimitSpec]| fields(c, r).validate().unwrap_err().field;
    assert_eq!(
        field(&[own("c={{customer}}", 3)], &[]),
        "concurrency[0].key"
    );
    assert_eq!(
        field(&[own("k", 1), own("k", 0)], &[]),
        "concurrency[1].limit"
    );
    let nine: Vec<ConcurrencySpec> = (0..9).map(|i| own(&format!("k{i}"), 1)).collect();
    assert_eq!(field(&nine, &[]), "concurrency");
    let both = ConcurrencySpec {
        uses: Some("partner".into()),
        ..own("k", 2)
    };
    assert_eq!(field(&[both], &[]), "concurrency[0].use");
    let neither = ConcurrencySpec {
        key: Some("k".into()),
        limit: None,
        uses: None,
    };
    assert_eq!(field(&[neither], &[]), "concurrency[0].limit");
    let zero_per = RateLimitSpec {
        key: Some("api".into()),
        limit: Some(10),
        per: Some(HumanDuration(Duration::ZERO)),
        burst: None,
        uses: None,
    };
    assert_eq!(field(&[], &[zero_per]), "rate_limit[0].per");
    let debounce = DebounceSpec {
        key: "{{job}}".into(),
        period: HumanDuration::from_secs(60),
        max_wait: Some(HumanDuration::from_secs(30)),
    };
    let flow = FlowFields {
        debounce: Some(&debounce),
        ..fields(&[], &[])
    };
    assert_eq!(flow.validate().unwrap_err().field, "debounce.period");
}

#[test]
fn a_run_waits_at_a_keys_limit_and_the_first_key_that_holds_it_says_why() {
    let specs = [own("customer={{event.payload.customer}}", 2)];
    let e = crate::event::RunEvent {
        key: "orders".into(),
        id: "1".into(),
        payload: serde_json::json!({"customer": 42}),
    };
    let gates = fields(&specs, &[]).gates(&KeyContext {
        namespace: "shop",
        job: "invoice",
        event: Some(&e),
        ..KeyContext::default()
    });
    assert_eq!(gates.keys().collect::<Vec<_>>(), vec!["customer=42"]);
    let mut book = Book::default();
    assert!(book.admit("shop", &gates, at(0)).is_ok());
    assert!(book.admit("shop", &gates, at(0)).is_ok());
    let hold = book.admit("shop", &gates, at(0)).unwrap_err();
    assert_eq!(
        hold.describe(),
        "waiting for concurrency key customer=42: 2 of 2 running"
    );
    // Another namespace's key of the same text is another key.
    assert!(book.admit("other", &gates, at(0)).is_ok());
}

#[test]
fn a_run_held_by_one_key_spends_none_of_the_others() {
    let conc = [own("one", 1)];
    let rate = [RateLimitSpec {
        key: Some("api".into()),
        limit: Some(1),
        per: Some(HumanDuration::from_secs(1)),
        burst: None,
        uses: None,
    }];
    let ctx = KeyContext::default();
    let gates = fields(&conc, &rate).gates(&ctx);
    let mut book = Book::default();
    assert!(book.admit("ns", &gates, at(0)).is_ok());
    let before = book.tats.clone();
    assert!(matches!(
        book.admit("ns", &gates, at(10)),
        Err(Hold::Concurrency { .. })
    ));
    assert_eq!(book.tats, before, "a refused run moves no rate key");
    // The holder ends: the rate now decides, and names when.
    book.holding.clear();
    match book.admit("ns", &gates, at(10)).unwrap_err() {
        Hold::Rate { key, at: when } => {
            assert_eq!(key, "api");
            assert_eq!(when, at(1000));
        }
        other => panic!("{other:?}"),
    }
    assert!(book.admit("ns", &gates, at(1000)).is_ok());
}

#[test]
fn a_named_limit_is_read_from_the_book_and_a_missing_one_holds_the_run() {
    let uses = [ConcurrencySpec {
        key: Some("{{params.customer}}".into()),
        limit: None,
        uses: Some("per-customer".into()),
    }];
    let params = std::collections::BTreeMap::from([("customer".to_string(), "7".to_string())]);
    let gates = fields(&uses, &[]).gates(&KeyContext {
        params: Some(&params),
        ..KeyContext::default()
    });
    assert_eq!(gates.keys().collect::<Vec<_>>(), vec!["per-customer/7"]);
    let mut book = Book::default();
    assert!(matches!(
        book.admit("ns", &gates, at(0)),
        Err(Hold::Undefined { .. })
    ));
    book.limits.insert(
        ("ns".into(), "per-customer".into()),
        LimitSpec {
            description: None,
            concurrency: Some(1),
            rate: None,
        },
    );
    assert!(book.admit("ns", &gates, at(0)).is_ok());
    assert!(matches!(
        book.admit("ns", &gates, at(0)),
        Err(Hold::Concurrency { limit: 1, .. })
    ));
}

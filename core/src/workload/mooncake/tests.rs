use super::*;

fn err(text: &str) -> InputError {
    parse(text, Path::new("m.jsonl")).unwrap_err()
}

#[test]
fn rows_parse_with_seconds_from_the_first() {
    let text = "{\"timestamp\": 1000, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [3, 4]}\n\n\
                {\"timestamp\": 3500, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [3]}\n";
    let rows = parse(text, Path::new("m.jsonl")).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!((rows[0].at_s, rows[1].at_s), (0.0, 2.5));
    assert_eq!((rows[0].block_tokens(0), rows[0].block_tokens(1)), (512, 88));
    assert_eq!(rows[1].line, 3);
}

#[test]
fn malformed_rows_name_line_and_field() {
    let ok = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n";
    let e = err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10\n"));
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("not valid JSON"), "{}", e.message);
    assert!(e.to_string().starts_with("m.jsonl:2"), "{e}");
    let e = err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10, \"hash_ids\": [1]}}\n"));
    assert_eq!((e.line, e.path.as_str()), (Some(2), "output_length"));
    let e = err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1}}\n"));
    assert_eq!((e.line, e.path.as_str()), (Some(2), "hash_ids"));
    let e = err(&format!(
        "{ok}{{\"timestamp\": \"soon\", \"input_length\": 10, \"output_length\": 1, \"hash_ids\": []}}\n"
    ));
    assert_eq!((e.line, e.path.as_str()), (Some(2), "timestamp"));
    let e =
        err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, -2]}}\n"));
    assert_eq!((e.line, e.path.as_str()), (Some(2), "hash_ids[1]"));
    let e = err(&format!("{{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}}\n{ok}"));
    assert_eq!((e.line, e.path.as_str()), (Some(2), "timestamp"));
}

#[test]
fn more_hash_ids_than_the_prompt_fills_is_refused() {
    // 1025 tokens fill 3 blocks (512 + 512 + 1): 3 ids are fine, 4 are not.
    assert!(
        parse(
            "{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}",
            Path::new("m")
        )
        .is_ok()
    );
    let e = err("{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [0, 1, 2, 3]}");
    assert_eq!((e.line, e.path.as_str()), (Some(1), "hash_ids"));
    assert!(e.message.contains("fills only 3 blocks"), "{}", e.message);
}

#[test]
fn session_fields_number_sessions_and_calls_and_bad_ones_name_line_and_field() {
    let row = |extra: &str| {
        format!("{{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]{extra}}}\n")
    };
    let a0 = row(", \"session_id\": \"a\", \"call_index\": 0");
    let b0 = row(", \"session_id\": 4, \"call_index\": 0");
    let a1 = row(", \"session_id\": \"a\", \"call_index\": 1, \"wait_s\": 2.5");
    let rows = parse(&format!("{a0}{b0}{}{a1}", row("")), Path::new("m")).unwrap();
    let calls: Vec<Option<(u32, u32, f64)>> =
        rows.iter().map(|r| r.session.map(|s| (s.session, s.call, s.wait_s))).collect();
    assert_eq!(calls, [Some((0, 0, 0.0)), Some((1, 0, 0.0)), None, Some((0, 1, 2.5))]);
    let cases = [
        (format!("{a0}{}", row(", \"session_id\": \"a\", \"call_index\": 2")), "call_index", "expected call_index 1"),
        (format!("{a0}{a0}"), "call_index", "call 0 on line 1"),
        (row(", \"session_id\": \"a\", \"call_index\": 1"), "call_index", "no call before it"),
        (row(", \"session_id\": \"a\""), "call_index", "missing"),
        (row(", \"call_index\": 0"), "call_index", "needs a `session_id`"),
        (row(", \"wait_s\": 1"), "wait_s", "needs a `session_id`"),
        (row(", \"session_id\": -1, \"call_index\": 0"), "session_id", "non-negative"),
        (row(", \"session_id\": \"\", \"call_index\": 0"), "session_id", "non-empty"),
        (format!("{a0}{}", row(", \"session_id\": \"a\", \"call_index\": 1, \"wait_s\": -2")), "wait_s", "seconds in"),
        (
            format!("{a0}{}", row(", \"session_id\": \"a\", \"call_index\": 1, \"wait_s\": \"2\"")),
            "wait_s",
            "seconds in",
        ),
        (row(", \"session_id\": \"a\", \"call_index\": 0, \"wait_s\": 1"), "wait_s", "arrives at its timestamp"),
    ];
    for (text, field, says) in cases {
        let e = err(&text);
        let last = text.lines().count();
        assert_eq!((e.line, e.path.as_str()), (Some(last), field), "{text}");
        assert!(e.message.contains(says), "{text}: {}", e.message);
    }
}

#[test]
fn bad_parents_and_adapters_name_line_and_field() {
    let row = |extra: &str| {
        format!("{{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]{extra}}}\n")
    };
    let a0 = row(", \"session_id\": \"a\", \"call_index\": 0");
    let a1 = row(", \"session_id\": \"a\", \"call_index\": 1");
    let ok = parse(
        &format!("{a0}{a1}{}", row(", \"session_id\": \"a\", \"call_index\": 2, \"parents\": [0, 1], \"adapter\": 3")),
        Path::new("m"),
    )
    .unwrap();
    assert_eq!((ok[2].parents.as_slice(), ok[2].adapter), (&[0, 1][..], Some(3)));
    assert_eq!((ok[1].parents.is_empty(), ok[1].adapter), (true, None));
    let cases = [
        (
            format!("{a0}{}", row(", \"session_id\": \"a\", \"call_index\": 1, \"parents\": [1]")),
            "parents[0]",
            "earlier call",
        ),
        (format!("{a0}{}", row(", \"session_id\": \"a\", \"call_index\": 1, \"parents\": []")), "parents", "non-empty"),
        (
            format!("{a0}{a1}{}", row(", \"session_id\": \"a\", \"call_index\": 2, \"parents\": [0, 0]")),
            "parents[1]",
            "twice",
        ),
        (row(", \"session_id\": \"a\", \"call_index\": 0, \"parents\": [0]"), "parents", "arrives at its timestamp"),
        (row(", \"parents\": [0]"), "parents", "needs a `session_id`"),
        (row(", \"adapter\": -1"), "adapter", "adapter index"),
        (row(", \"adapter\": \"x\""), "adapter", "adapter index"),
    ];
    for (text, field, says) in cases {
        let e = err(&text);
        let last = text.lines().count();
        assert_eq!((e.line, e.path.as_str()), (Some(last), field), "{text}");
        assert!(e.message.contains(says), "{text}: {}", e.message);
    }
    // Adapters against the workload's `lora:`: an index past its adapters, or no section.
    let rows = parse(&format!("{}{}", row(", \"adapter\": null"), row(", \"adapter\": 4")), Path::new("m")).unwrap();
    let lora: super::super::cluster::lora::Lora = serde_norway::from_str("{adapters: 4}").unwrap();
    let e = check_adapters(&rows, Some(&lora), Path::new("m")).unwrap_err();
    assert_eq!((e.line, e.path.as_str()), (Some(2), "adapter"));
    assert!(e.message.contains("not one of the workload's 4 adapters"), "{}", e.message);
    let e = check_adapters(&rows, None, Path::new("m")).unwrap_err();
    assert_eq!((e.line, e.path.as_str()), (Some(1), "adapter"));
    let five: super::super::cluster::lora::Lora = serde_norway::from_str("{adapters: 5}").unwrap();
    assert!(check_adapters(&rows, Some(&five), Path::new("m")).is_ok());
}

#[test]
fn an_id_with_two_block_lengths_is_refused() {
    let e = err("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 1]}\n\
                 {\"timestamp\": 0, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [0, 1]}\n");
    assert_eq!((e.line, e.path.as_str()), (Some(2), "hash_ids[1]"));
    assert!(e.message.contains("line 1"), "{}", e.message);
}

#[test]
fn class_and_tenant_fields_parse_and_bad_ones_name_line_and_field() {
    let row = |extra: &str| {
        format!("{{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]{extra}}}\n")
    };
    let rows = parse(
        &format!("{}{}{}", row(", \"class\": 1, \"tenant\": 3"), row(""), row(", \"tenant\": 0")),
        Path::new("m"),
    )
    .unwrap();
    let labels: Vec<_> = rows.iter().map(|r| (r.class, r.tenant)).collect();
    assert_eq!(labels, [(Some(1), Some(3)), (None, None), (None, Some(0))]);
    let cases = [
        (row(", \"class\": -1"), "class", "class index"),
        (row(", \"class\": \"critical\""), "class", "class index"),
        (row(", \"class\": 1.5"), "class", "class index"),
        (row(", \"class\": 65536"), "class", "[0, 65535]"),
        (row(", \"tenant\": null"), "tenant", "tenant index"),
        (format!("{}{}", row(""), row(", \"class\": 0, \"tenant\": [1]")), "tenant", "tenant index"),
    ];
    for (text, field, says) in cases {
        let e = err(&text);
        let last = text.lines().count();
        assert_eq!((e.line, e.path.as_str()), (Some(last), field), "{text}");
        assert!(e.message.contains(says) && !e.fix.is_empty(), "{text}: {}", e.message);
    }
    // Indices against the workload's `classes:` and `tenants:`.
    let spec = |extra: &str| -> super::super::cluster::ClusterSpec {
        serde_norway::from_str(&format!(
            "{{replicas: 1, gpu: a6000, model: mistral-7b, generator: {{suffix_tokens: 1, output_tokens: 1}}, \
             arrivals: {{poisson: {{rate: 1}}}}{extra}}}"
        ))
        .unwrap()
    };
    let two = spec(", classes: [{name: a, share: 1}, {name: b, share: 1}]");
    let text = format!("{}{}{}", row(", \"class\": 1"), row(", \"class\": 0, \"tenant\": 0"), row(", \"class\": 2"));
    let rows = parse(&text, Path::new("m")).unwrap();
    let e = check_labels(&rows, &two, Path::new("m.jsonl")).unwrap_err();
    assert_eq!((e.line, e.path.as_str()), (Some(3), "class"));
    assert!(e.message.contains("class 2 is not one of the workload's 2 classes (valid: 0..1)"), "{}", e.message);
    assert!(e.to_string().starts_with("m.jsonl:3"), "{e}");
    assert!(check_labels(&rows[..2], &two, Path::new("m")).is_ok());
    // Without `classes:` only class 0 is valid (the CSV's rule); without `tenants:`, tenant 0.
    let e = check_labels(&rows, &spec(""), Path::new("m")).unwrap_err();
    assert_eq!((e.line, e.path.as_str()), (Some(1), "class"));
    assert!(e.message.contains("no `cluster.classes`"), "{}", e.message);
    let rows = parse(&format!("{}{}", row(", \"tenant\": 0"), row(", \"tenant\": 1")), Path::new("m")).unwrap();
    let e = check_labels(&rows, &two, Path::new("m")).unwrap_err();
    assert_eq!((e.line, e.path.as_str()), (Some(2), "tenant"));
    assert!(e.message.contains("no `cluster.tenants`"), "{}", e.message);
}

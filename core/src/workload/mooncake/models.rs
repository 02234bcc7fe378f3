//! A trace row's optional `"model"` (the model's name in `cluster.models`), read and checked
//! against the replaying workload as `"adapter"` is against `cluster.lora`.

use std::path::Path;

use super::MooncakeRow;
use crate::workload::InputError;
use crate::workload::cluster::ClusterSpec;

/// The row's optional `"model"`: a non-empty string (`None`: absent).
pub fn read_model(
    obj: &serde_json::Map<String, serde_json::Value>,
    file: &Path,
    line: usize,
) -> Result<Option<String>, InputError> {
    match obj.get("model") {
        None => Ok(None),
        Some(serde_json::Value::String(s)) if !s.is_empty() && s.len() <= 64 => Ok(Some(s.clone())),
        Some(v) => Err(InputError::new(
            file,
            format!("must be a model's name, a non-empty string of at most 64 characters (got {v})"),
            "give the name of the request's model in the workload's `cluster.models`",
        )
        .in_field("model")
        .at_line(line)),
    }
}

/// Checks the rows' models against the workload's `cluster.models`: a trace that gives models
/// gives every row's, each one of the workload's names; a workload without `models:` serves one
/// model, and a trace naming models needs the section.
pub fn check_models(rows: &[MooncakeRow], spec: &ClusterSpec, file: &Path) -> Result<(), InputError> {
    let Some(first) = rows.iter().find(|r| r.model.is_some()) else { return Ok(()) };
    let bad =
        |line: usize, message: String, fix: String| InputError::new(file, message, fix).in_field("model").at_line(line);
    if spec.models.is_empty() {
        return Err(bad(
            first.line,
            format!("the trace names model `{}`, but the workload has no `cluster.models` section", first.model.as_deref().unwrap_or("")),
            "add `models: [{name: …, replicas: …, share: …}, …]` under `cluster:` naming every model of the trace, or drop \"model\" from the rows".into(),
        ));
    }
    let names = || spec.models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ");
    for r in rows {
        match r.model.as_deref() {
            None => {
                return Err(bad(
                    r.line,
                    format!(
                        "the row has no \"model\", but line {} gives one: a trace that names models names every row's",
                        first.line
                    ),
                    format!("add \"model\" (one of: {}) to the row", names()),
                ));
            }
            Some(m) if spec.model_index(m).is_none() => {
                return Err(bad(
                    r.line,
                    format!("model `{m}` is not one of the workload's models ({})", names()),
                    format!("add `{m}` to `cluster.models`, or fix the row"),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::export::write_mooncake_with_models;
    use crate::workload::generate::{apply_models, generate, mooncake_stream};
    use crate::workload::mooncake::parse;

    fn spec(models: &str) -> ClusterSpec {
        let spec: ClusterSpec = serde_norway::from_str(&format!(
            "{{replicas: 3, generator: {{system_prompt_tokens: 300, suffix_tokens: {{uniform: {{min: 50, max: 200}}}}, \
             output_tokens: 20, turns: {{uniform: {{min: 1, max: 3}}}}}}, arrivals: {{poisson: {{rate: 20}}}}, requests: 300{models}}}"
        ))
        .unwrap();
        spec.validate().unwrap();
        spec
    }

    const TWO: &str = ", models: [{name: chat, replicas: 2, share: 0.7}, {name: coder-v2, replicas: 1, share: 0.3}]";

    /// A stream of two models, exported, names each row's model; the replay under the same
    /// workload keeps every request's model (not drawn again: another seed's draw would differ),
    /// and one model writes no field.
    #[test]
    fn models_survive_export_and_replay() {
        let s = spec(TWO);
        let mut stream = generate(&s, None, 4).unwrap();
        apply_models(&s, &mut stream, 4);
        assert!(stream.models.contains(&0) && stream.models.contains(&1));
        let mut text = Vec::new();
        write_mooncake_with_models(&stream, &["chat", "coder-v2"], &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.lines().all(|l| l.contains("\"model\": \"chat\"") || l.contains("\"model\": \"coder-v2\"")));
        let rows = parse(&text, Path::new("m.jsonl")).unwrap();
        check_models(&rows, &s, Path::new("m.jsonl")).unwrap();
        let mut replay = mooncake_stream(&s, &rows);
        apply_models(&s, &mut replay, 99);
        assert_eq!(replay.models, stream.models);
        let mut plain = Vec::new();
        write_mooncake_with_models(&stream, &["only"], &mut plain).unwrap();
        assert!(!String::from_utf8(plain).unwrap().contains("\"model\""));
    }

    /// Bad models in a trace: each error names the file, the line and the field, and says how
    /// to fix it.
    #[test]
    fn bad_models_name_file_line_and_field() {
        let row = |extra: &str| {
            format!("{{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]{extra}}}\n")
        };
        let file = Path::new("t.jsonl");
        let e = parse(&row(", \"model\": 7"), file).err().unwrap().to_string();
        assert!(e.contains("t.jsonl:1") && e.contains("model") && e.contains("got 7"), "{e}");
        let check = |text: String, s: &ClusterSpec| {
            check_models(&parse(&text, file).unwrap(), s, file).err().unwrap().to_string()
        };
        let e = check(row(", \"model\": \"chat\"") + &row(", \"model\": \"vision\""), &spec(TWO));
        assert!(e.contains("t.jsonl:2") && e.contains("model") && e.contains("`vision`"), "{e}");
        assert!(e.contains("chat, coder-v2"), "{e}");
        let e = check(row(", \"model\": \"chat\"") + &row(""), &spec(TWO));
        assert!(e.contains("t.jsonl:2") && e.contains("names every row's"), "{e}");
        let e = check(row(", \"model\": \"chat\""), &spec(""));
        assert!(e.contains("t.jsonl:1") && e.contains("no `cluster.models`"), "{e}");
        assert!(check_models(&parse(&row(""), file).unwrap(), &spec(TWO), file).is_ok(), "no models: drawn");
    }
}

//! The JSON Schema of workload files (`routelab schema`), derived from the same Rust types that
//! parse them, and the field reference in docs/workloads.md generated from it.

use serde_json::{Map, Value};

use crate::workload::Workload;

/// The schema of a workload file: the `Workload` type plus `base:`, which is merged away before
/// parsing (`workload::load_text`).
pub fn workload() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(Workload)).expect("a schema is JSON");
    let root = schema.as_object_mut().expect("an object");
    root.insert("title".into(), "routelab workload".into());
    if let Some(Value::Object(props)) = root.get_mut("properties") {
        props.insert(
            "base".into(),
            serde_json::json!({
                "type": "string",
                "description": "Another workload file (relative to this one) to start from; this file's fields override its fields, mappings merged key by key."
            }),
        );
    }
    schema
}

/// A `$ref`'s target, or the schema itself.
fn deref<'a>(defs: &'a Map<String, Value>, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => defs.get(r.trim_start_matches("#/$defs/")).unwrap_or(s),
        None => s,
    }
}

/// The schema without its `null` alternative (an `Option`), and whether there was one.
fn non_null<'a>(defs: &'a Map<String, Value>, s: &'a Value) -> &'a Value {
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            let rest: Vec<&Value> = alts.iter().filter(|a| a.get("type") != Some(&Value::from("null"))).collect();
            if rest.len() == 1 && alts.len() == 2 {
                return deref(defs, rest[0]);
            }
        }
    }
    deref(defs, s)
}

fn type_name(defs: &Map<String, Value>, s: &Value) -> String {
    let s = non_null(defs, s);
    if let Some(Value::Array(vs)) = s.get("enum") {
        return vs.iter().map(|v| format!("`{}`", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(" \\| ");
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            return alts.iter().map(|a| variant_name(defs, a)).collect::<Vec<_>>().join(" \\| ");
        }
    }
    match s.get("type") {
        Some(Value::String(t)) if t == "array" => {
            format!("list of {}", s.get("items").map(|i| type_name(defs, i)).unwrap_or_default())
        }
        Some(Value::String(t)) if t == "object" && s.get("properties").is_none() => "mapping".into(),
        Some(Value::String(t)) if t == "object" => "mapping (below)".into(),
        Some(Value::String(t)) if t == "integer" => "integer".into(),
        Some(Value::String(t)) if t == "number" => "number".into(),
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => {
            // `Option<T>` of a plain type: `["array", "null"]` and the rest of T's schema.
            let rest: Vec<&Value> = ts.iter().filter(|t| t.as_str() != Some("null")).collect();
            let mut single = s.clone();
            match rest.as_slice() {
                [one] => {
                    single["type"] = (*one).clone();
                    type_name(defs, &single)
                }
                _ => rest.iter().filter_map(|t| t.as_str()).collect::<Vec<_>>().join(" or "),
            }
        }
        _ => "any".into(),
    }
}

/// One alternative of an enum: `` `poisson` `` or `` `{gamma: {...}}` ``.
fn variant_name(defs: &Map<String, Value>, s: &Value) -> String {
    let s = deref(defs, s);
    if let Some(c) = s.get("const").and_then(Value::as_str) {
        return format!("`{c}`");
    }
    if let Some(Value::Array(vs)) = s.get("enum") {
        return vs.iter().map(|v| format!("`{}`", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(" \\| ");
    }
    if let Some(Value::Object(props)) = s.get("properties") {
        if props.len() == 1 {
            let (k, v) = props.iter().next().expect("one");
            let v = deref(defs, v);
            let inner: Vec<String> = match v.get("properties") {
                Some(Value::Object(p)) => p.keys().map(|k| k.to_string()).collect(),
                None => vec![type_name(defs, v)],
                _ => vec![],
            };
            return format!("`{{{k}: {{{}}}}}`", inner.join(", "));
        }
    }
    type_name(defs, s)
}

fn range(s: &Value) -> String {
    let lo = s.get("minimum").and_then(Value::as_f64);
    let hi = s.get("maximum").and_then(Value::as_f64);
    match (lo, hi) {
        (Some(l), Some(h)) => format!("{l} … {h}"),
        (Some(l), None) => format!("≥ {l}"),
        (None, Some(h)) => format!("≤ {h}"),
        (None, None) => String::new(),
    }
}

fn one_line(text: &str) -> String {
    // Rustdoc links (`[`x`]`) read as plain code in Markdown tables.
    let text = text.replace("[`", "`").replace("`]", "`");
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The alternatives of an enum schema, nested enums flattened.
fn alternatives<'a>(defs: &'a Map<String, Value>, s: &'a Value) -> Vec<&'a Value> {
    let mut out = Vec::new();
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            for a in alts {
                let a = deref(defs, a);
                if a.get("oneOf").is_some() || a.get("anyOf").is_some() {
                    out.extend(alternatives(defs, a));
                } else {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// Appends a table of `s`'s fields (and, after it, one per nested mapping) to `out`.
fn fields(defs: &Map<String, Value>, prefix: &str, s: &Value, about: Option<&Value>, out: &mut String) {
    let s = non_null(defs, s);
    let Some(Value::Object(props)) = s.get("properties") else { return };
    let required: Vec<&str> = s
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str(&format!("\n### `{}`\n\n", if prefix.is_empty() { "(top level)" } else { prefix }));
    if let Some(d) = about.or_else(|| s.get("description")).and_then(Value::as_str) {
        out.push_str(&format!("{}\n\n", one_line(d)));
    }
    out.push_str("| field | type | default | range | meaning |\n|---|---|---|---|---|\n");
    let mut nested = Vec::new();
    for (name, field) in props {
        let target = non_null(defs, field);
        let default = match field.get("default") {
            Some(v) => format!("`{}`", serde_json::to_string(v).expect("JSON")),
            None if required.contains(&name.as_str()) => "required".into(),
            None => "none".into(),
        };
        let description =
            field.get("description").or_else(|| target.get("description")).and_then(Value::as_str).unwrap_or("");
        out.push_str(&format!(
            "| `{name}` | {} | {default} | {} | {} |\n",
            type_name(defs, field),
            range(target),
            one_line(description)
        ));
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        if target.get("properties").is_some() {
            nested.push((path.clone(), target, None));
        }
        // A list of mappings: `compound.models[]`.
        if let Some(items) = target.get("items").map(|i| deref(defs, i)).filter(|i| i.get("properties").is_some()) {
            nested.push((format!("{path}[]"), items, None));
        }
        // The mappings inside an enum's variants (`arrivals: {gamma: {rate, cv}}`), and a custom
        // mapping offered beside a name (`gpu: {name, memory_gb, ...}`).
        for a in alternatives(defs, target) {
            match a.get("properties") {
                Some(Value::Object(p))
                    if p.len() == 1
                        && a.get("required").is_some_and(|r| r.as_array().is_some_and(|r| r.len() == 1)) =>
                {
                    let (k, v) = p.iter().next().expect("one");
                    let v = deref(defs, v);
                    if v.get("properties").is_some() {
                        nested.push((format!("{path}.{k}"), v, a.get("description")));
                    }
                }
                Some(Value::Object(_)) => nested.push((path.clone(), a, None)),
                _ => {}
            }
        }
    }
    for (path, s, about) in nested {
        fields(defs, &path, s, about, out);
    }
}

/// The field reference of docs/workloads.md: a table per mapping, generated from the schema.
pub fn reference() -> String {
    let schema = workload();
    let empty = Map::new();
    let defs = schema.get("$defs").and_then(Value::as_object).unwrap_or(&empty);
    let mut out = String::new();
    fields(defs, "", &schema, None, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/workloads.md carries the field reference generated from the schema; a field added,
    /// renamed or re-documented without regenerating it fails here. Regenerate with
    /// `ROUTELAB_REGENERATE_DOCS=1 cargo test -p routelab-core --lib schema`.
    #[test]
    fn workloads_doc_has_the_generated_reference() {
        const BEGIN: &str = "<!-- BEGIN GENERATED FIELD REFERENCE (routelab schema) -->\n";
        const END: &str = "<!-- END GENERATED FIELD REFERENCE -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/workloads.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let (head, rest) = doc.split_once(BEGIN).expect("docs/workloads.md has the BEGIN marker");
        let (_, tail) = rest.split_once(END).expect("docs/workloads.md has the END marker");
        let fresh = format!("{head}{BEGIN}{}{END}{tail}", reference());
        if std::env::var_os("ROUTELAB_REGENERATE_DOCS").is_some() {
            std::fs::write(&path, &fresh).unwrap();
            return;
        }
        assert!(
            fresh == doc,
            "docs/workloads.md's field reference is stale: ROUTELAB_REGENERATE_DOCS=1 cargo test -p routelab-core --lib schema"
        );
    }

    #[test]
    fn schema_describes_every_world_and_base() {
        let s = workload();
        for k in ["dispatch", "cluster", "compound", "seed", "policies", "base"] {
            assert!(s["properties"][k].is_object(), "no {k} in the schema");
        }
        assert_eq!(s["additionalProperties"], Value::Bool(false));
    }
}

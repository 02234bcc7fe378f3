//! Command-line edits of workloads and policy lists: `--set field=value` and comma-separated
//! policy arguments.

use std::path::Path;

use crate::workload::{InputError, Workload};

/// `path`'s keys from the document's top: a path that does not start at a top-level field
/// starts inside the world section.
fn full_path<'a>(doc: &serde_norway::Value, path: &'a str) -> Vec<&'a str> {
    let keys: Vec<&str> = path.split('.').collect();
    let top_level = doc.get(keys[0]).is_some() || ["name", "seed", "seeds", "policies"].contains(&keys[0]);
    let world = ["dispatch", "cluster", "compound"].into_iter().find(|k| doc.get(k).is_some()).unwrap_or("dispatch");
    let mut full: Vec<&str> = if top_level { Vec::new() } else { vec![world] };
    full.extend(keys);
    full
}

/// The first key of `path` that `doc` lacks while a sibling it has is a near miss
/// (`arrivals.poison` beside `poisson`): its full path, and the message.
fn near_miss(doc: &serde_norway::Value, path: &str) -> Option<(String, String)> {
    let full = full_path(doc, path);
    let mut at = doc;
    for (i, k) in full.iter().enumerate() {
        let map = at.as_mapping()?;
        match map.get(*k) {
            Some(v) => at = v,
            None => {
                let c = crate::suggest::closest(k, map.keys().filter_map(serde_norway::Value::as_str))?;
                let within = if i == 0 { "the workload".to_string() } else { format!("`{}`", full[..i].join(".")) };
                return Some((full[..=i].join("."), format!("{within} has no field `{k}` (did you mean `{c}`?)")));
            }
        }
    }
    None
}

/// The workload document `doc` (read from `file`) with every `(field, value)` set, parsed. The
/// file parsed before the sets, so an error now is theirs: it names them, not a line of the
/// generated text, and a field the file lacks beside a near miss it has is named as the typo it
/// likely is (`arrivals.poison.rate` is not blamed on its value).
pub fn parse_with_sets(doc: &serde_norway::Value, file: &Path, sets: &[(&str, &str)]) -> Result<Workload, InputError> {
    let mut edited = doc.clone();
    for (field, value) in sets {
        with_field(&mut edited, file, field, value)?;
    }
    let text = serde_norway::to_string(&edited).expect("a YAML document serialises");
    let label = sets.iter().map(|(f, v)| format!("{f}={v}")).collect::<Vec<_>>().join(", ");
    crate::workload::parse(&text, file).map_err(|e| {
        let (path, message, fix) = match sets.iter().find_map(|(f, _)| near_miss(doc, f)) {
            Some((path, message)) => (path, message, "correct the field's name in --set".to_string()),
            None => (if e.path.is_empty() { label.clone() } else { e.path }, e.message, e.fix),
        };
        InputError::new("--set", format!("{message} (setting {label} in {})", file.display()), fix).in_field(path)
    })
}

/// Sets the field at dotted `path` of a workload document (the file's YAML, before parsing) to
/// `value` (YAML text, or `xF` for the current value times F). The path may start inside the world section: `arrivals.poisson.rate`
/// means `cluster.arrivals.poisson.rate` in a cluster workload.
pub fn with_field(doc: &mut serde_norway::Value, file: &Path, path: &str, value: &str) -> Result<(), InputError> {
    let err = |message: String, fix: &str| InputError::new(file, message, fix).in_field(path);
    let factor = value.strip_prefix('x').and_then(|f| f.parse::<f64>().ok());
    let new: serde_norway::Value = match factor {
        Some(_) => serde_norway::Value::Null, // filled in below from the current value
        None => {
            serde_norway::from_str(value).map_err(|e| err(format!("bad value `{value}`: {e}"), "give a YAML value"))?
        }
    };
    let full = full_path(doc, path);
    let mut at = doc;
    for (i, k) in full.iter().enumerate() {
        let map = at.as_mapping_mut().ok_or_else(|| {
            err(format!("`{}` is not a mapping", full[..i].join(".")), "set a field inside a mapping")
        })?;
        let key = serde_norway::Value::String(k.to_string());
        if i + 1 == full.len() {
            let new = match factor {
                Some(f) => {
                    let current = map.get(&key).and_then(serde_norway::Value::as_f64).ok_or_else(|| {
                        err(
                            format!("`{value}` scales the current value, but the field has no number"),
                            "give a plain value",
                        )
                    })?;
                    serde_norway::Value::from(current * f)
                }
                None => new.clone(),
            };
            map.insert(key, new);
            break;
        }
        at = map.entry(key).or_insert_with(|| serde_norway::Value::Mapping(Default::default()));
    }
    Ok(())
}

/// Splits `a,b{x: 1, y: 2},c` at top-level commas.
pub fn split_policies(arg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in arg.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_split_at_top_level_commas_only() {
        assert_eq!(
            split_policies("random, power_of_two{d: 3, x: [1, 2]},./lib.so:x"),
            vec!["random", "power_of_two{d: 3, x: [1, 2]}", "./lib.so:x"]
        );
    }
}

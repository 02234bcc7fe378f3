//! `routelab docs [TOPIC]`: the repository's `docs/` built into the binary, so an installed
//! `routelab` carries the documents its help and error messages point at.

use routelab_core::workload::InputError;

/// Every document in `docs/`: (topic, text). A test keeps the list equal to the folder.
const DOCS: &[(&str, &str)] = &[
    ("accuracy", include_str!("../../../docs/accuracy.md")),
    ("architecture", include_str!("../../../docs/architecture.md")),
    ("exercises", include_str!("../../../docs/exercises.md")),
    ("experiments", include_str!("../../../docs/experiments.md")),
    ("output", include_str!("../../../docs/output.md")),
    ("performance", include_str!("../../../docs/performance.md")),
    ("plugins", include_str!("../../../docs/plugins.md")),
    ("scale", include_str!("../../../docs/scale.md")),
    ("serving", include_str!("../../../docs/serving.md")),
    ("workloads", include_str!("../../../docs/workloads.md")),
    ("your-traffic", include_str!("../../../docs/your-traffic.md")),
];

/// The document `topic` names (with or without `docs/` and `.md`), or the list of topics with
/// each one's title when `topic` is `None`; a topic with no document is bad input.
pub fn show(topic: Option<&str>) -> Result<String, InputError> {
    let Some(topic) = topic else {
        let mut out = String::from("documents (routelab docs TOPIC prints one):\n");
        for (name, text) in DOCS {
            out.push_str(&format!("  {name:<13} {}\n", title(text)));
        }
        return Ok(out);
    };
    let key = topic.trim_start_matches("docs/").trim_end_matches(".md").to_ascii_lowercase();
    DOCS.iter().find(|(name, _)| *name == key).map(|(_, text)| text.to_string()).ok_or_else(|| {
        let hint = routelab_core::suggest::did_you_mean(&key, DOCS.iter().map(|(n, _)| *n));
        InputError::command_line(
            "topic",
            format!("no document `{topic}`{hint}; `routelab docs` lists them"),
            "run `routelab docs` for the list",
        )
    })
}

/// A document's first heading.
fn title(text: &str) -> &str {
    text.lines().find_map(|l| l.strip_prefix("# ")).unwrap_or("").trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file in docs/ is built in, under its file name; none is listed that is not there.
    #[test]
    fn every_document_in_the_folder_is_built_in_and_titled() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str().and_then(|n| n.strip_suffix(".md")).map(str::to_string))
            .collect();
        on_disk.sort();
        let built_in: Vec<String> = DOCS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(built_in, on_disk);
        for (name, text) in DOCS {
            assert!(!title(text).is_empty(), "docs/{name}.md has no `# ` heading");
            assert_eq!(show(Some(&format!("docs/{name}.md"))).unwrap(), *text);
        }
        let e = show(Some("workload")).unwrap_err();
        assert!(e.message.contains("did you mean `workloads`"), "{e}");
    }
}

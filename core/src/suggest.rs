//! "Did you mean …?": the closest of a list of names to a misspelt one.

/// Edit distance (insertions, deletions, substitutions) between `a` and `b`.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The candidate closest to `typed`, if it is close enough to be a plausible typo (at most a
/// third of its letters wrong) or `typed` is a prefix of it.
pub fn closest<'a>(typed: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let typed_lower = typed.to_lowercase();
    candidates
        .into_iter()
        .map(|c| {
            (
                if c.starts_with(&typed_lower) && !typed.is_empty() {
                    0
                } else {
                    distance(&typed_lower, &c.to_lowercase())
                },
                c,
            )
        })
        .filter(|(d, c)| *d <= (c.chars().count().max(typed.chars().count()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `" (did you mean `x`?)"`, or nothing.
pub fn did_you_mean<'a>(typed: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(typed, candidates).map(|c| format!(" (did you mean `{c}`?)")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_name_and_nonsense_finds_none() {
        let names = ["round_robin", "least_requests", "power_of_two", "preble"];
        assert_eq!(closest("round_robbin", names), Some("round_robin"));
        assert_eq!(closest("least_request", names), Some("least_requests"));
        assert_eq!(closest("prebel", names), Some("preble"));
        assert_eq!(closest("power", names), Some("power_of_two"));
        assert_eq!(closest("xyzzy", names), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}

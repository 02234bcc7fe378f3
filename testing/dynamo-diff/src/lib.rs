//! Nothing here: the differential test is `tests/diff.rs`.

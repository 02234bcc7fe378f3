//! The course exercises (exercises.md), computed: each returns the text `routelab exercise N`
//! prints, every number from a function or a run.

pub mod compound;

//! Prints exercises 6 and 7 with their default parameters.
fn main() {
    use routelab::exercises::compound::*;
    println!("{}", exercise_6(&Exercise6::default()).unwrap_or_else(|e| e.0));
    println!("{}", exercise_7(&Exercise7::default()).unwrap_or_else(|e| e.0));
}

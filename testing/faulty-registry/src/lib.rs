//! A plugin whose registry function panics (for the loader's tests; a library on its own, since
//! the registry runs once per library, when it loads).

use routelab_policy_api::*;

fn registry() -> Vec<Entry> {
    panic!("deliberate panic in the registry")
}

export_policies!(registry);

routelab_policy_api::export_policies!(registry); fn registry() -> Vec<routelab_policy_api::Entry> { vec![] }

//! Every built-in policy of `routelab-policies`, exported through the plugin ABI, so the very
//! same code runs linked into the host and loaded from `libroutelab_builtin_plugin.so`.
routelab_policy_api::export_policies!(routelab_policies::registry);

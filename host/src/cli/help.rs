//! Help texts shared by several commands' flags (`args`, `slo_setup`): a leaf module, so the
//! modules that declare flags do not reach into each other for them.

/// The full policy syntax, shown by `--policies`/`--policy` help.
macro_rules! policy_syntax {
    () => {
        "\
A policy argument is

  [LABEL=]POLICY[@SCHEDULER]

POLICY is a built-in name (`routelab policies` lists them), `path/to/libfoo.so:name` for a policy
in a plugin library, or just `path/to/libfoo.so` when the library exports one policy of the kind
needed; optionally followed by its config as a YAML flow mapping: `power_of_two{d: 3}`.
@SCHEDULER (cluster workloads only) names the local scheduler every replica runs under this
router, in the same syntax: `preble@priority_groups`, `round_robin@./libsched.so:mine`; without
it, the workload's `cluster.scheduler` is used.
LABEL= names the policy in tables, JSON and plots: `mine=./target/release/libfoo.so:foo{k: 2}`.
Without a label a built-in is shown as typed and a plugin policy by its name, not its path (the
JSON's `spec` keeps the full argument).
Separate policies with commas; quote the list in the shell when it has braces or spaces.
The first policy is the baseline of the ratio column."
    };
}

pub(super) const POLICIES_HELP: &str =
    concat!("Comma-separated policies to compare (default: each workload's `policies:` list).\n\n", policy_syntax!());
pub(super) const POLICY_HELP: &str = concat!("The policy to run.\n\n", policy_syntax!());

pub(super) const WORKLOAD_ARG: &str = "A workload file, or the name of a built-in workload (`routelab workloads` lists them: e.g. \
cache_vs_balance, cluster/long_doc_qa)";
pub(super) const WORKLOADS_ARG: &str = "Workload files or built-in names (`routelab workloads` lists them), or folders of workload \
files: a folder on disk or a built-in one (`preble_grid`) stands for the .yaml files directly inside it";

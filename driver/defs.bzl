"""pp_experiment_binary: pipe's experiments, built from any package with extra plugins.

Every experiment's main() is a library in //experiments (`<experiment>_main`,
alwayslink). This macro links it with `deps`, typically alwayslink targets that
register schedules (PP_REGISTER_SCHEDULE) or partitioners, which the binary then
offers by name (--schedule=..., --partition=..., --list) like the built-in ones:

    load("//driver:defs.bzl", "pp_experiment_binary")

    pp_experiment_binary(
        name = "train_gpt_with_my_schedule",
        experiment = "train_gpt",
        deps = [":my_schedule"],
    )
"""

load("//tools:pp.bzl", "pp_cc_binary")

# Experiment -> whether it reads the shipped configs (experiments/configs).
_EXPERIMENTS = {
    "schedule_explorer": False,
    "train_bert": True,
    "train_gpt": True,
    "train_llama": True,
}

def pp_experiment_binary(name, experiment, deps = [], data = [], **kwargs):
    """A binary running `experiment`'s main() with `deps` linked in.

    Args:
      name: the binary's name.
      experiment: one of "train_gpt", "train_bert", "train_llama", "schedule_explorer".
      deps: extra libraries to link (schedules, partitioners: alwayslink).
      data: extra runtime files.
      **kwargs: passed to cc_binary (visibility, tags, ...).
    """
    if experiment not in _EXPERIMENTS:
        fail("pp_experiment_binary: experiment '%s' is not one of %s" %
             (experiment, ", ".join(sorted(_EXPERIMENTS.keys()))))
    configs = ["//experiments:configs"] if _EXPERIMENTS[experiment] else []
    pp_cc_binary(
        name = name,
        data = configs + data,
        deps = ["//experiments:%s_main" % experiment] + deps,
        **kwargs
    )

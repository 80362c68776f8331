"""Scoring a model with EleutherAI's lm-evaluation-harness (the optional ``eval`` extra).

What the eval recipe (and the finetune recipe's ``eval_after_training``) composes::

    settings = evaluation.eval_settings(cfg)                 # the config's keys, checked
    tasks = evaluation.resolve_tasks(settings.tasks)         # names or YAML paths; unknown -> close matches
    lm = evaluation.build_lm(model, tokenizer, settings)     # TuneLM: a TemplateLM on our model
    results = evaluation.run_tasks(lm, tasks, settings)      # lm-eval's simple_evaluate
    print(evaluation.results_table(results))
    evaluation.write_results(results, path)

Importing this package does not import lm-eval; the functions above do, with an install hint when it
is missing. ``TuneLM`` itself lives in ``torchtune.evaluation._lm`` (it subclasses lm-eval's class).
"""

from torchtune.evaluation._harness import (
    BUNDLED_TASKS_DIR,
    INSTALL_COMMAND,
    EvalSettings,
    ResolvedTasks,
    build_lm,
    eval_settings,
    import_lm_eval,
    primary_scores,
    resolve_tasks,
    results_table,
    run_tasks,
    write_results,
)

__all__ = [
    "BUNDLED_TASKS_DIR",
    "EvalSettings",
    "INSTALL_COMMAND",
    "ResolvedTasks",
    "build_lm",
    "eval_settings",
    "import_lm_eval",
    "primary_scores",
    "resolve_tasks",
    "results_table",
    "run_tasks",
    "write_results",
]

"""gbdoctor: graph-break diagnostics for ``torch.compile`` under real distributed training setups.

Stage packages, imports pointing down only (``tests/test_layering.py`` keeps it so)::

    cli/                         typer app, shared options, one thin module per command
    report/                      formatters over records only
    gate/  plan/  run/           gate (baseline codec, comparison), plan (planner, emitters),
                                 run (driver, modes, stats, assemble, worker)
    scan/                        environment (in-process / spawned / simulated), rank, dedupe, merge
    capture/                     the only Dynamo-internals user: session, blocks, locate, counters
    setup/  models/              training setup (recipes) and the model zoo
    causes/  summary.py spec.py  taxonomy, registry, parsing, rules; counts; spec loading
    records/  errors.py          frozen records, StrEnums, JSON reader/writer; error classes
"""

__version__ = "0.1.0"
